"""``spectrace import vt`` of this tree against another source tree (``--base DIR``, e.g. a
checkout of the previous commit): the same exit code, stdout, stderr and written trace (every
dataset's values, dtype, shape, chunks and filters, every attribute; not ``t_ns`` and
``created_utc``) over a corpus of logs, and whether the bulk path took each log.

The corpus: the bundled logs (``traces/``, ``tests/hooks/data``, ``tests/data_verdicts``),
each with and without its requests file and with and without ``--strict``, and perturbed
copies of them (deterministic): cut short mid-line and at a line end, lines duplicated,
deleted and swapped, digits changed, ids made negative or long (9, 17, 20 digits), leading
zeros, double spaces and tabs, foreign and binary lines, request ids renamed, margins added
(valid and not), CRLF line ends, and random mixes of these. With ``--big LOG`` one big log
too (``make_big_vt_log.py``).

Usage: ``python benchmarks/equiv_import_vt.py --base DIR [--fuzz 40] [--big LOG]``; DIR holds
a ``spectrace`` package (put first on ``PYTHONPATH``), as for ``bench_import_vt.py --base``.
Prints one line per differing case and a summary; exit status 1 when any case differs.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOGS = (
    [ROOT / "traces" / "reference.vt.log"]
    + sorted((ROOT / "tests" / "hooks" / "data").glob("*.log"))
    + sorted((ROOT / "tests" / "data_verdicts").glob("*.log"))
)


def _requests_of(log: Path) -> Path | None:
    stem = log.name.removesuffix(".log").removesuffix(".vt")
    req = log.with_name(stem + ".requests.jsonl")
    return req if req.exists() else None


# -- perturbations: text -> text (bytes where noted) ----------------------------------------


def _lines(t: str) -> list[str]:
    return t.split("\n")


def _pick(rng: random.Random, ls: list[str], pat: str = "") -> int:
    idx = [i for i, s in enumerate(ls) if pat in s and s]
    return rng.choice(idx) if idx else 0


def _sub_number(rng: random.Random, t: str, new) -> str:
    ls = _lines(t)
    i = _pick(rng, ls, "=")
    nums = list(re.finditer(r"(?<=[=\[ ])-?\d+(?=[ \]\n]|$)", ls[i]))
    if nums:
        m = rng.choice(nums)
        ls[i] = ls[i][: m.start()] + new(m.group()) + ls[i][m.end() :]
    return "\n".join(ls)


def _mutations() -> dict:
    def cut(rng, t):
        return t[: rng.randrange(1, max(len(t), 2))]

    def cut_line(rng, t):
        ls = _lines(t)
        return "\n".join(ls[: rng.randrange(1, max(len(ls), 2))]) + "\n"

    def dup(rng, t):
        ls = _lines(t)
        i = _pick(rng, ls)
        return "\n".join(ls[: i + 1] + [ls[i]] + ls[i + 1 :])

    def dup_run(rng, t):
        ls = _lines(t)
        i = _pick(rng, ls)
        n = rng.randrange(2, 25)
        return "\n".join(ls[: i + n] + ls[i : i + n] + ls[i + n :])

    def delete(rng, t):
        ls = _lines(t)
        del ls[_pick(rng, ls)]
        return "\n".join(ls)

    def swap(rng, t):
        ls = _lines(t)
        i = min(_pick(rng, ls), len(ls) - 2)
        ls[i], ls[i + 1] = ls[i + 1], ls[i]
        return "\n".join(ls)

    def digit(rng, t):
        return _sub_number(rng, t, lambda s: s[:-1] + str(rng.randrange(10)))

    def neg(rng, t):
        return _sub_number(rng, t, lambda s: "-1")

    def long9(rng, t):
        return _sub_number(rng, t, lambda s: "123456789")

    def long17(rng, t):
        return _sub_number(rng, t, lambda s: "12345678901234567")

    def long20(rng, t):
        return _sub_number(rng, t, lambda s: "12345678901234567890")

    def zero(rng, t):
        return _sub_number(rng, t, lambda s: "0" + s)

    def space(rng, t):
        ls = _lines(t)
        i = _pick(rng, ls, " ")
        if " " not in ls[i]:
            return t
        j = rng.choice([m.start() for m in re.finditer(" ", ls[i])])
        ls[i] = ls[i][:j] + rng.choice(["  ", "\t", " \t"]) + ls[i][j + 1 :]
        return "\n".join(ls)

    def junk(rng, t):
        ls = _lines(t)
        i = _pick(rng, ls)
        extra = rng.choice(["INFO engine started", "req=7 something", "[SPECTRACE]", "\ufffd\u00e9",
                            "[spec-sched] req=", "rows=3 nqpr=4 first=[1 2 ]"])  # fmt: skip
        return "\n".join(ls[:i] + [extra] + ls[i:])

    def rename(rng, t):
        ls = _lines(t)
        i = _pick(rng, ls, "req=")
        ls[i] = re.sub(r"req=\S+", "req=zz9", ls[i], count=1)
        return "\n".join(ls)

    def margin(rng, t):
        ls = _lines(t)
        i = _pick(rng, ls, "first=[")
        if "first=[" not in ls[i]:
            return t
        n = ls[i].split("first=[", 1)[1].count(" ")
        vals = [f"{rng.random():.3f}" for _ in range(n + rng.choice([0, 0, 0, 1, -1]))]
        if vals and rng.random() < 0.3:
            vals[0] = rng.choice(["nan", "1e3", "0.5", "-0.250"])
        ls[i] += " margin=[ " + "".join(v + " " for v in vals) + "]"
        return "\n".join(ls)

    def pos(rng, t):
        ls = _lines(t)
        i = _pick(rng, ls, "[SPECTRACE]")
        ls[i] = re.sub(r"pos=(\d+)", lambda m: f"pos={max(1, int(m.group(1)) + rng.choice([-3, -1, 2, 9]))}", ls[i])  # fmt: skip
        return "\n".join(ls)

    def finished(rng, t):
        return (
            t.replace("finished=0", "finished=1", 1)
            if rng.random() < 0.5
            else t.replace("finished=1", "finished=0")
        )

    return dict(cut=cut, cut_line=cut_line, dup=dup, dup_run=dup_run, delete=delete, swap=swap,
                digit=digit, neg=neg, long9=long9, long17=long17, long20=long20, zero=zero,
                space=space, junk=junk, rename=rename, margin=margin, pos=pos,
                finished=finished)  # fmt: skip


def build_corpus(d: Path, fuzz: int, big: Path | None) -> list[dict]:
    """Write the perturbed logs under ``d``; returns the cases (log, requests, strict)."""
    cases: list[dict] = []

    def add(log: Path, req: Path | None, name: str) -> None:
        for strict in (False, True):
            for r in [None, req] if req else [None]:
                cases.append({"name": f"{name}{'+req' if r else ''}{' strict' if strict else ''}",
                              "log": str(log), "requests": str(r) if r else None,
                              "strict": strict})  # fmt: skip

    muts = _mutations()
    for log in LOGS:
        req = _requests_of(log)
        add(log, req, log.name)
        text = log.read_text(encoding="utf-8")
        for mname, f in muts.items():
            for seed in range(2):
                rng = random.Random(f"{log.name}/{mname}/{seed}")
                p = d / f"{log.stem}.{mname}{seed}.log"
                p.write_text(f(rng, text), encoding="utf-8")
                add(p, req, p.name)
        for seed in range(fuzz):
            rng = random.Random(f"{log.name}/fuzz/{seed}")
            t = text
            for _ in range(rng.randrange(1, 6)):
                t = muts[rng.choice(sorted(muts))](rng, t)
            p = d / f"{log.stem}.fuzz{seed}.log"
            p.write_text(t, encoding="utf-8")
            add(p, req, p.name)
    ref = LOGS[0].read_bytes()
    extra = {
        "crlf": ref.replace(b"\n", b"\r\n"),
        "nul": ref[:5000] + b"\x00" + ref[5000:],
        "latin1": ref[:3000] + b"\xe9\xff" + ref[3000:],
        "empty": b"",
        "binary": bytes(range(256)) * 4,
        "no_trace": b"hello\nworld\n",
        "no_newline": ref.rstrip(b"\n"),
        "blank_lines": ref.replace(b"\n", b"\n\n", 40),
    }
    for name, data in extra.items():
        p = d / f"extra.{name}.log"
        p.write_bytes(data)
        add(p, _requests_of(LOGS[0]), p.name)
    if big is not None:
        cases.append({"name": "big", "log": str(big), "requests": None, "strict": False})
    return cases


# -- the worker: runs every case in this process, with whichever spectrace comes first -------


def _digest(path: Path) -> dict:
    import h5py
    import numpy as np

    out: dict = {}
    with h5py.File(path, "r") as f:

        def attrs(name, obj) -> None:
            a = {k: repr(v.tolist() if hasattr(v, "tolist") else v) for k, v in obj.attrs.items()}
            a.pop("created_utc", None)
            out[f"{name}@attrs"] = a
            if isinstance(obj, h5py.Dataset):
                meta = [str(obj.dtype), obj.shape, obj.chunks, obj.compression,
                        obj.compression_opts, obj.shuffle, obj.maxshape]  # fmt: skip
                out[f"{name}@ds"] = repr(meta)
                if name.endswith("t_ns"):
                    return
                v = obj[()]
                if isinstance(v, np.ndarray) and v.dtype != object:
                    out[name] = hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()
                else:
                    vals = v.tolist() if hasattr(v, "tolist") else v
                    out[name] = repr([x.tolist() if hasattr(x, "tolist") else x for x in vals]
                                     if isinstance(vals, list) else vals)  # fmt: skip

        attrs("/", f)
        f.visititems(attrs)
    return out


def _bulk_took(case: dict) -> bool | None:
    """Whether the bulk path took the log (None: it cannot be read)."""
    from spectrace.hooks.vt.bulk import bulk_feed
    from spectrace.hooks.vt.parser import VtTraceParser
    from spectrace.hooks.vt.requests import read_requests
    from spectrace.tracer.store import TraceWriter

    with tempfile.TemporaryDirectory() as d:
        w = TraceWriter(Path(d) / "t.h5", {"source": "x"})
        p = VtTraceParser(w, strict=case["strict"], source_name=case["log"])
        try:
            if case["requests"]:
                p.set_requests(read_requests(case["requests"]), source=case["requests"])
            took = bulk_feed(p, Path(case["log"]).read_bytes()) is not None
        except Exception as exc:  # the import reports it
            took = f"error {type(exc).__name__}"
        w.close(complete=False)
    return took


def worker(cases_path: Path, out_path: Path, tag: str) -> None:
    from spectrace.tracer.cli.main import main

    cases = json.loads(cases_path.read_text())
    results = {}
    work = Path(tempfile.mkdtemp(prefix=f"equiv-{tag}-"))
    for i, case in enumerate(cases):
        out = work / f"c{i}" / "t.h5"
        out.parent.mkdir()
        args = ["import", "vt", case["log"], "-o", str(out)]
        args += ["--requests", case["requests"]] if case["requests"] else []
        args += ["--strict"] if case["strict"] else []
        so, se = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
            try:
                main(args)
                rc = 0
            except SystemExit as exc:
                rc = exc.code if isinstance(exc.code, int) else 1
        files = sorted(p.name for p in out.parent.iterdir())
        res = {"rc": rc, "stdout": so.getvalue(), "files": files,
               "stderr": se.getvalue().replace(str(out.parent), "OUT")}  # fmt: skip
        if out.exists():
            res["trace"] = _digest(out)
        res["bulk"] = _bulk_took(case)
        results[case["name"]] = res
    out_path.write_text(json.dumps(results))


def _spawn(tree: Path | None, cases: Path, out: Path, tag: str) -> dict:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, __file__, "--worker", str(cases), str(out), tag]
    subprocess.run(cmd, check=True, env=env)
    return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path)
    ap.add_argument("--fuzz", type=int, default=40)
    ap.add_argument("--big", type=Path)
    ap.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(Path(a.worker[0]), Path(a.worker[1]), a.worker[2])
        return 0
    if a.base is None:
        ap.error("--base DIR is required")
    with tempfile.TemporaryDirectory() as d:
        dd = Path(d)
        cases = build_corpus(dd, a.fuzz, a.big)
        (dd / "cases.json").write_text(json.dumps(cases))
        base = _spawn(a.base, dd / "cases.json", dd / "base.json", "base")
        new = _spawn(None, dd / "cases.json", dd / "new.json", "new")
    bad = 0
    for name in base:
        b, n = base[name], new[name]
        if b != n:
            bad += 1
            keys = sorted(k for k in set(b) | set(n) if b.get(k) != n.get(k))
            detail = []
            for k in keys:
                if k == "trace" and "trace" in b and "trace" in n:
                    detail += [x for x in set(b[k]) | set(n[k]) if b[k].get(x) != n[k].get(x)]
                else:
                    detail.append(f"{k}: {str(b.get(k))[:300]!r} != {str(n.get(k))[:300]!r}")
            print(f"DIFF {name}: {detail}")
    took = {k: sum(1 for r in res.values() if r["bulk"] is True) for k, res in
            (("base", base), ("new", new))}  # fmt: skip
    rcs = sorted({r["rc"] for r in base.values()})
    print(f"{len(base)} cases, {bad} differ; bulk path took {took['base']} (base) and "
          f"{took['new']} (new); exit codes seen {rcs}")  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
