"""Seeded fuzzer of spectrace's input paths: mutated VT_SPEC_TRACE logs and damaged traces.

Each case mutates a real log (``traces/reference.vt.log``, ``tests/hooks/data/*.log``: flipped
digits, huge numbers, cut lines, dropped fields, duplicated or shuffled lines, binary junk,
requests JSONL damage) or copies ``traces/reference.h5`` and breaks one thing (meta type,
column rank, dtype, value range, length, format version, file bytes), then runs the CLI
in-process (``import vt``, ``info``, ``check``, ``diff``, ``validate``) and checks what a user
and a CI rely on: no traceback, an exit code in {0, 1, 2}, exit 2 with exactly one
``spectrace: error:`` line naming the file, and ``diff --format json`` valid against the
published schema (``spectrace schema --diff``).

    python scripts/fuzz.py --cases 5000 [--seed 0]   # prints outcomes by exit code

``tests/test_fuzz.py`` runs a few hundred cases of the same generator.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import jsonschema
import numpy as np

from spectrace.tracer.cli.main import main as cli_main
from spectrace.tracer.diff_schema import SCHEMA

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "traces" / "reference.h5"
LOGS = [ROOT / "traces" / "reference.vt.log", *sorted((ROOT / "tests/hooks/data").glob("*.log"))]
HUGE = [
    "40000",
    "32768",
    "2147483648",
    "-2147483649",
    str(2**40),
    "99999999999999999999999",
    "9" * 100000,
    "-1",
    "-7",
    "0",
]
_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


@dataclass
class Run:
    """One CLI invocation and what it printed."""

    argv: list[str]
    rc: int
    out: str
    err: str


@dataclass
class Case:
    """One fuzz case: how the input was damaged and the runs made on it."""

    kind: str
    damage: str
    runs: list[Run] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def run_cli(argv: list[str]) -> Run:
    """Run ``spectrace ARGV`` in this process; returns its exit code, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    rc = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli_main(argv)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 3)
        except BaseException as exc:  # noqa: BLE001 - a crash is what we look for
            rc = 99
            err.write(f"Traceback (escaped main): {type(exc).__name__}: {exc}\n")
    return Run(argv, rc, out.getvalue(), err.getvalue())


def check_run(run: Run, files: list[str]) -> list[str]:
    """What is wrong with one run (empty when it behaved)."""
    bad = []
    cmd = " ".join(run.argv[:2])
    if "Traceback" in run.err or "internal error" in run.err:
        bad.append(f"{cmd}: crash: {run.err.strip().splitlines()[-1][:200]}")
    if run.rc not in (0, 1, 2):
        bad.append(f"{cmd}: exit {run.rc}")
    stray = [ln for ln in run.err.splitlines() if not ln.startswith("spectrace: ")]
    if stray:
        bad.append(f"{cmd}: stderr line without the spectrace: prefix: {stray[0][:200]!r}")
    if run.rc == 2:
        errors = [ln for ln in run.err.splitlines() if ln.startswith("spectrace: error:")]
        if len(errors) != 1:
            bad.append(f"{cmd}: exit 2 with {len(errors)} error lines: {run.err[:200]!r}")
        elif not any(Path(f).name in errors[0] for f in files):
            bad.append(f"{cmd}: exit 2 line names no input file: {errors[0][:200]}")
    if run.rc in (0, 1) and "--format" in run.argv and run.out.strip():
        bad += _check_json(cmd, run)
    return bad


def _check_json(cmd: str, run: Run) -> list[str]:
    try:
        doc = json.loads(run.out)
    except ValueError as exc:
        return [f"{cmd}: --format json printed no JSON ({exc})"]
    if run.argv[0] == "diff":
        errs = sorted(_VALIDATOR.iter_errors(doc), key=lambda e: list(e.path))
        if errs:
            where = "/".join(map(str, errs[0].path))
            return [f"{cmd}: JSON breaks the diff schema at {where}: {errs[0].message[:120]}"]
    elif not isinstance(doc, dict) or "schema" not in doc:
        return [f"{cmd}: JSON document without a schema key"]
    return []


# -- log mutations ---------------------------------------------------------------------------

_Mutation = Callable[[random.Random, list[bytes]], list[bytes]]


def _pick(rng: random.Random, lines: list[bytes]) -> int:
    return rng.randrange(len(lines)) if lines else 0


def _flip_digit(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    i = _pick(rng, lines)
    digits = [j for j, ch in enumerate(lines[i]) if 48 <= ch <= 57] if lines else []
    if digits:
        j = rng.choice(digits)
        lines[i] = lines[i][:j] + bytes([48 + rng.randrange(10)]) + lines[i][j + 1 :]
    return lines


def _huge_number(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    i = _pick(rng, lines)
    if not lines:
        return lines
    tokens = lines[i].split(b" ")
    nums = [j for j, t in enumerate(tokens) if any(48 <= ch <= 57 for ch in t)]
    if nums:
        j = rng.choice(nums)
        head, sep, _ = tokens[j].partition(b"=")
        value = rng.choice(HUGE).encode()
        tokens[j] = head + sep + value if sep else value
        lines[i] = b" ".join(tokens)
    return lines


def _truncate_line(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    i = _pick(rng, lines)
    if lines:
        lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)].rstrip(b"\n") + b"\n"
    return lines


def _drop_field(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    i = _pick(rng, lines)
    if lines:
        tokens = lines[i].rstrip(b"\n").split(b" ")
        if len(tokens) > 1:
            del tokens[rng.randrange(1, len(tokens))]
        lines[i] = b" ".join(tokens) + b"\n"
    return lines


def _duplicate(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    i = _pick(rng, lines)
    return lines[: i + 1] + lines[i : i + rng.randrange(1, 8)] + lines[i + 1 :]


def _shuffle(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    i = _pick(rng, lines)
    window = lines[i : i + rng.randrange(2, 12)]
    rng.shuffle(window)
    return lines[:i] + window + lines[i + len(window) :]


def _junk(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    i = _pick(rng, lines)
    junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64)))
    if lines and rng.random() < 0.5:
        j = rng.randrange(len(lines[i]) + 1)
        lines[i] = lines[i][:j] + junk + lines[i][j:]
        return lines
    return lines[:i] + [junk + b"\n"] + lines[i:]


def _delete(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    i = _pick(rng, lines)
    return lines[:i] + lines[i + rng.randrange(1, 30) :]


def _empty(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    return [] if rng.random() < 0.5 else [bytes(rng.randrange(256) for _ in range(200))]


LOG_MUTATIONS: dict[str, _Mutation] = {
    "flip_digit": _flip_digit,
    "huge_number": _huge_number,
    "truncate_line": _truncate_line,
    "drop_field": _drop_field,
    "duplicate": _duplicate,
    "shuffle": _shuffle,
    "junk": _junk,
    "delete": _delete,
    "empty": _empty,
}


def _damage_requests(rng: random.Random, src: Path, dst: Path) -> str:
    lines = src.read_text().splitlines()
    i = rng.randrange(len(lines))
    obj = json.loads(lines[i])
    how = rng.choice(["huge_id", "negative_id", "not_json", "no_req_id", "wrong_id", "float_id"])
    if how == "huge_id":
        obj["output_ids"][0] = 2**40
    elif how == "negative_id":
        obj["prompt_ids"][0] = -3
    elif how == "no_req_id":
        del obj["req_id"]
    elif how == "wrong_id":
        obj["req_id"] = "nope"
    elif how == "float_id":
        obj["output_ids"][0] = 1.5
    lines[i] = "{not json" if how == "not_json" else json.dumps(obj)
    dst.write_text("\n".join(lines) + "\n")
    return f"requests:{how}"


def log_case(rng: random.Random, tmp: Path, strict: bool | None = None) -> Case:
    """Mutate one real log (1-3 mutations), import it, and run a reader command on it."""
    src = rng.choice(LOGS)
    lines = src.read_bytes().splitlines(keepends=True)
    names = []
    for _ in range(rng.randint(1, 3)):
        name = rng.choice(list(LOG_MUTATIONS))
        names.append(name)
        lines = LOG_MUTATIONS[name](rng, lines)
    log = tmp / "in.log"
    log.write_bytes(b"".join(lines))
    out = tmp / "out.h5"
    argv = ["import", "vt", str(log), "-o", str(out)]
    req = src.with_name(src.name.split(".")[0] + ".requests.jsonl")
    if req.exists() and rng.random() < 0.7:
        req_in = tmp / "in.requests.jsonl"
        if rng.random() < 0.2:
            names.append(_damage_requests(rng, req, req_in))
        else:
            shutil.copy(req, req_in)
        argv += ["--requests", str(req_in)]
    if strict if strict is not None else rng.random() < 0.3:
        argv.append("--strict")
    case = Case("log", "+".join(names))
    _record(case, run_cli(argv), [str(log), str(out), *argv[6:7]])
    if out.exists():
        for cmd in _reader_commands(rng, out):
            _record(case, run_cli(cmd), [str(out), str(REFERENCE)])
    return case


def _reader_commands(rng: random.Random, trace: Path) -> list[list[str]]:
    t, ref = str(trace), str(REFERENCE)
    menu = [
        ["info", t, "--format", "json"],
        ["info", t],
        ["check", t, "--format", "json"],
        ["validate", t],
        ["diff", t, ref, "--format", "json"],
        ["diff", ref, t, "--format", "json"],
        ["diff", t, ref],
    ]
    return rng.sample(menu, 2)


def _record(case: Case, run: Run, files: list[str]) -> None:
    case.runs.append(run)
    case.failures += check_run(run, files)


# -- trace damage ----------------------------------------------------------------------------


def _replace(g: h5py.Group, name: str, data) -> None:
    del g[name]
    g.create_dataset(name, data=data)


def _set_meta(f: h5py.File, text: str) -> None:
    del f["meta"]
    f.create_dataset("meta", data=text, dtype=h5py.string_dtype("utf-8"))


def _meta_with(f: h5py.File, **items) -> str:
    meta = json.loads(f["meta"][()])
    meta.update(items)
    return json.dumps(meta)


def _damage_meta(rng: random.Random, f: h5py.File) -> str:
    how = rng.choice(
        ["null", "list", "string", "number", "bad_json", "k_str", "k_neg", "k_float",
         "dp_list", "import_str", "tokenizer_int", "int_dataset", "deleted"]
    )  # fmt: skip
    texts = {
        "null": "null",
        "list": "[1, 2]",
        "string": '"meta"',
        "number": "4",
        "bad_json": "{not json",
        "k_str": _meta_with(f, k="four"),
        "k_neg": _meta_with(f, k=-3),
        "k_float": _meta_with(f, k=4.5),
        "dp_list": _meta_with(f, dp_rank=[0, 1]),
        "import_str": _meta_with(f, **{"import": "x"}),
        "tokenizer_int": _meta_with(f, tokenizer=5),
    }
    if how in texts:
        _set_meta(f, texts[how])
    elif how == "int_dataset":
        del f["meta"]
        f.create_dataset("meta", data=np.arange(3))
    else:
        del f["meta"]
    return f"meta:{how}"


def _damage_column(rng: random.Random, f: h5py.File) -> str:
    g = f["blocks"]
    name = rng.choice(["proposed", "verified", "emitted", "request", "accepted", "k", "position"])
    data = g[name][()]
    how = rng.choice(["rank_down", "rank_up", "strings", "float", "int64", "empty_width"])
    if how == "rank_down":
        new = data.reshape(-1)[: len(data)] if data.ndim == 2 else data[:1]
    elif how == "rank_up":
        new = data.reshape(data.shape + (1,))
    elif how == "strings":
        new = np.array([str(x) for x in data.reshape(len(data), -1)[:, 0]], dtype="S")
    elif how == "float":
        new = data.astype(np.float64) + 0.5
    elif how == "int64":
        new = data.astype(np.int64)
    else:
        new = np.zeros((len(data), 0), np.int32)
    _replace(g, name, new)
    return f"column:{name}:{how}"


def _damage_values(rng: random.Random, f: h5py.File) -> str:
    g = f["blocks"]
    n = g["request"].shape[0]
    row = rng.randrange(n)
    nreq = f["requests"]["req_id"].shape[0]
    name, value = rng.choice(
        [("request", -1), ("request", nreq), ("request", nreq + 1000), ("request", -(2**31)),
         ("accepted", 100), ("accepted", -5), ("num_verified", 50), ("num_emitted", 9),
         ("k", 30000), ("k", -2), ("position", -5), ("position", 2**31 - 1), ("step", -3),
         ("batch_row", 40), ("proposal_source", 7), ("anchor", -9), ("t_ns", -1)]
    )  # fmt: skip
    ds = g[name]
    ds[row] = value
    return f"value:{name}={value}@{row}"


def _damage_matrix(rng: random.Random, f: h5py.File) -> str:
    g = f["blocks"]
    name = rng.choice(["proposed", "verified", "emitted"])
    row = rng.randrange(g[name].shape[0])
    value = rng.choice([-7, 2**31 - 1, -(2**31), 10**9])
    g[name][row, rng.randrange(g[name].shape[1])] = value
    return f"matrix:{name}={value}@{row}"


def _damage_length(rng: random.Random, f: h5py.File) -> str:
    table = rng.choice(["blocks", "blocks", "requests", "phases"])
    g = f[table]
    name = rng.choice(list(g))
    keep = rng.randrange(g[name].shape[0] + 1)
    data = g[name][:keep]
    dtype = g[name].dtype
    del g[name]
    g.create_dataset(name, data=data, dtype=dtype, maxshape=(None,) + data.shape[1:])
    if rng.random() < 0.3:
        f.attrs["status"] = "recording"
        return f"length:{table}/{name}={keep}:recording"
    return f"length:{table}/{name}={keep}"


def _damage_attrs(rng: random.Random, f: h5py.File) -> str:
    how = rng.choice(["1.banana", "2.0", "", "1", "x.1", "del_version", "format", "status"])
    if how == "del_version":
        del f.attrs["format_version"]
    elif how == "format":
        f.attrs["format"] = "something.else"
    elif how == "status":
        f.attrs["status"] = "recording"
    else:
        f.attrs["format_version"] = how
    return f"attrs:{how}"


def _damage_tables(rng: random.Random, f: h5py.File) -> str:
    how = rng.choice(
        ["del_blocks", "del_column", "req_ids_float", "neg_prompt", "phase_name", "phase_ms",
         "blocks_dataset", "del_requests"]
    )  # fmt: skip
    if how == "del_blocks":
        del f["blocks"]
    elif how == "del_requests":
        del f["requests"]
    elif how == "blocks_dataset":
        del f["blocks"]
        f.create_dataset("blocks", data=np.arange(4))
    elif how == "del_column":
        del f["blocks"][rng.choice(["request", "proposed", "t_ns", "accepted"])]
    elif how == "req_ids_float":
        _replace(f["requests"], "output_ids", np.arange(f["requests"]["req_id"].shape[0]) + 0.5)
    elif how == "neg_prompt":
        f["requests"]["prompt_ids"][0] = np.array([-4, 5], np.int32)
    elif how == "phase_name":
        f["phases"]["name"][0] = 99
    else:
        f["phases"]["ms"][0] = np.inf
    return f"tables:{how}"


TRACE_DAMAGE = {
    "meta": _damage_meta,
    "column": _damage_column,
    "values": _damage_values,
    "matrix": _damage_matrix,
    "length": _damage_length,
    "attrs": _damage_attrs,
    "tables": _damage_tables,
}


def _damage_bytes(rng: random.Random, path: Path) -> str:
    data = bytearray(path.read_bytes())
    if rng.random() < 0.3:
        cut = rng.randrange(len(data))
        path.write_bytes(bytes(data[:cut]))
        return f"bytes:truncate@{cut}"
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    return "bytes:flip"


def trace_case(rng: random.Random, tmp: Path, kind: str | None = None) -> Case:
    """Copy the reference trace, break one thing, and run 2 reader commands on it."""
    path = tmp / "damaged.h5"
    shutil.copy(REFERENCE, path)
    kind = kind or rng.choice([*TRACE_DAMAGE, "bytes"])
    if kind == "bytes":
        damage = _damage_bytes(rng, path)
    else:
        with h5py.File(path, "r+") as f:
            damage = TRACE_DAMAGE[kind](rng, f)
    case = Case("trace", damage)
    for cmd in _reader_commands(rng, path):
        _record(case, run_cli(cmd), [str(path), str(REFERENCE)])
    return case


def fuzz(cases: int, seed: int = 0) -> list[Case]:
    """Run ``cases`` seeded cases (half logs, half damaged traces); returns them all."""
    rng = random.Random(seed)
    out = []
    for i in range(cases):
        with tempfile.TemporaryDirectory(prefix="spectrace-fuzz-") as d:
            case_rng = random.Random(rng.randrange(2**32))
            make = log_case if i % 2 == 0 else trace_case
            out.append(make(case_rng, Path(d)))
    return out


def outcome_table(cases: list[Case]) -> str:
    """Outcomes by kind of input, command and exit code, then the failures."""
    counts: Counter = Counter()
    for c in cases:
        for r in c.runs:
            cmd = " ".join(r.argv[:2]) if r.argv[0] == "import" else r.argv[0]
            counts[(c.kind, cmd, r.rc)] += 1
    rows = [f"{'input':<6} {'command':<10} {'exit':>4} {'runs':>6}"]
    rows += [f"{k:<6} {cmd:<10} {rc:>4} {n:>6}" for (k, cmd, rc), n in sorted(counts.items())]
    by_rc = Counter(r.rc for c in cases for r in c.runs)
    rows.append(
        "total runs by exit code: " + ", ".join(f"{rc}: {n}" for rc, n in sorted(by_rc.items()))
    )
    failed = [c for c in cases if c.failures]
    rows.append(f"cases: {len(cases)}, failed: {len(failed)}")
    for c in failed[:50]:
        rows.append(f"  {c.kind} {c.damage}: {c.failures[0]}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """``python scripts/fuzz.py --cases N --seed S``: print the outcome table; exit 1 on a
    failure."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    cases = fuzz(args.cases, args.seed)
    print(outcome_table(cases))
    print(f"{time.perf_counter() - t0:.1f} s")
    return 1 if any(c.failures for c in cases) else 0


if __name__ == "__main__":
    sys.exit(main())
