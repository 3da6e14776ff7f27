"""The fifth new user's defects, each with its clean twin (expected values derived by hand).

1. ``export --force`` removed the output folder whole, an input trace inside it included:
   an input inside ``OUT`` (or ``OUT.partial``) is bad input, and the input stays.
2. Ragged token-id columns stored wider than int32 (``vlen int64``) were read as int32, a
   token 2**40 becoming 0, and ``validate`` called the file valid: unreadable, as a 1-D
   column of a wider type already was.
3. ``validate`` passed an anchor below the -1 pad that ``check`` calls impossible.
4. A golden whose placed blocks fall short of its own vLLM counters (drafts) passed
   ``check`` (exit 0): blocks vLLM counted are missing, ``capture_incomplete``.
5. Two golden records with one request id merged into one request silently (the later
   prompt and output replacing the earlier's): bad input naming the line. A request id that
   is no UTF-8 text (a lone surrogate escape) crashed the import (exit 3): a counted
   invalid record.
6. A llama-dump import that lost steps (a line that is not JSON, a step no request holds)
   passed ``check``: the lost steps are ``capture_incomplete``, as a VT log's are.
7. A safetensors header whose ``data_offsets`` span another size than shape x dtype was read
   as is (an internal error, exit 3, when the inspector read a lying ``d2t``): bad input.
   ``-o`` a symbolic link to an earlier export with ``--force`` was an internal error
   (exit 3) that left ``OUT.partial`` behind: bad input, nothing written.
8. CSV list columns wrote an infinite margin as ``Infinity``, which is no JSON.
9. ``--max-errors N`` (``max_error_findings``) tolerated missing work: a dead engine's trace
   passed ``check`` and ``diff`` (exit 0, "no divergence") when N covered its
   ``capture_incomplete``. A count tolerates findings about what was recorded; missing work
   fails unless ``--ignore`` names its kind.
10. ``replay --engine reference`` of a reference holding a token id outside the target's
    vocabulary was an internal error (exit 3, torch's IndexError); a negative id in a
    requests JSONL said "no position to replay". Both are bad input naming the request.
11. A request id stored as bytes that are not UTF-8, or a ``/phases`` ``names`` attribute
    that is not a list of UTF-8 strings, was an internal error (exit 3) of every reading
    command while ``validate`` called the file valid (or "damaged trace file (field=/)"):
    bad input naming the field and row, and a ``validate`` problem.
12. A diagnostic quoting a request id with a newline or a terminal escape (``--request``'s
    list of known ids) broke the one stderr line in two and wrote the escape to the
    terminal: control characters are written as their escapes.
"""

from __future__ import annotations

import csv
import json
import shutil
import struct
from pathlib import Path

import h5py
import numpy as np
import pytest
from inproc import run_inproc

from spectrace.tracer.store import TraceWriter

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data_importers"
GOLDEN = DATA / "golden_small.json"
DUMP, DUMP_REQS = DATA / "llama_spec_dump.jsonl", DATA / "llama.requests.jsonl"
DRAFT = ROOT / "engine" / "models" / "draft"


def _error(err: str) -> str:
    """The one ``spectrace: error:`` line of stderr (and no traceback)."""
    assert "Traceback" not in err, err
    lines = [x for x in err.splitlines() if x.startswith("spectrace: error:")]
    assert len(lines) == 1, err
    return lines[0]


def _trace(path: Path, anchor: int = 3, margins=(0.5, 0.25)) -> Path:
    """One request (prompt [1, 2, 3], output [4, 5, 6]) and one block at position 2: anchor
    3, proposed [4, 5], both accepted, emitted [4, 5, 6]."""
    with TraceWriter(path, {"engine": "e", "method": "ngram", "k": 2}, flush_interval=0) as w:
        w.request("r0", [1, 2, 3], [4, 5, 6], "length")
        w.add_block("r0", 0, 2, anchor, [4, 5], verified=[4, 5], accepted=2,
                    emitted=[4, 5, 6], draft_margin=list(margins))  # fmt: skip
    return path


# -- 1. export never removes its input ---------------------------------------------------------


@pytest.mark.parametrize("folder", ["out", "out.partial"])
def test_an_input_inside_the_export_folder_is_bad_input(tmp_path, folder):
    out = tmp_path / "out"
    assert run_inproc("export", _trace(tmp_path / "a.h5"), "-o", out).returncode == 0
    inside = tmp_path / folder / "blocks" / "keep.h5"  # "blocks": an export folder's entry
    inside.parent.mkdir(parents=True, exist_ok=True)
    _trace(inside)
    before = inside.read_bytes()
    r = run_inproc("export", inside, "-o", out, "--force")
    assert r.returncode == 2
    assert _error(r.stderr) == (
        f"spectrace: error: {inside}: the input TRACE lies inside the output folder "
        f"{tmp_path / folder}, which the export replaces; choose another output path"
    )
    assert inside.read_bytes() == before
    assert sorted(p.name for p in (out / "blocks").iterdir()) == (
        ["keep.h5", "run=a"] if folder == "out" else ["run=a"]
    )


def test_an_input_beside_the_export_folder_is_exported_with_force(tmp_path):
    """Twin: the input outside OUT; --force replaces the earlier export (run a by keep)."""
    out = tmp_path / "out"
    assert run_inproc("export", _trace(tmp_path / "a.h5"), "-o", out).returncode == 0
    r = run_inproc("export", _trace(tmp_path / "keep.h5"), "-o", out, "--force")
    assert r.returncode == 0, r.stderr
    assert [p.name for p in (out / "blocks").iterdir()] == ["run=keep"]
    assert (tmp_path / "keep.h5").is_file()


def test_a_symlinked_export_folder_is_bad_input_and_left_whole(tmp_path):
    """``-o LINK --force`` with LINK -> an earlier export was an internal error (exit 3: rmtree
    refuses a link) after writing ``LINK.partial``; now one line, nothing written."""
    real, link = tmp_path / "real", tmp_path / "lnk"
    assert run_inproc("export", _trace(tmp_path / "a.h5"), "-o", real).returncode == 0
    link.symlink_to("real")
    r = run_inproc("export", tmp_path / "a.h5", "-o", link, "--force")
    assert r.returncode == 2
    assert _error(r.stderr) == (
        f"spectrace: error: {link}: a symbolic link (to real); name the folder itself"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.h5", "lnk", "real"]
    assert [p.name for p in (real / "blocks").iterdir()] == ["run=a"]
    r = run_inproc("export", tmp_path / "a.h5", "-o", real, "--force")  # twin: the folder
    assert r.returncode == 0, r.stderr


# -- 2. ragged ids wider than int32 ------------------------------------------------------------


def _ragged_prompt(path: Path, dtype, ids) -> Path:
    """``path`` with requests/prompt_ids rewritten as a ragged column of ``dtype``."""
    with h5py.File(path, "r+") as f:
        del f["requests/prompt_ids"]
        ds = f["requests"].create_dataset(
            "prompt_ids", (1,), dtype=h5py.vlen_dtype(dtype), maxshape=(None,)
        )
        ds[0] = np.array(ids, dtype)
    return path


def test_ragged_ids_wider_than_int32_are_unreadable(tmp_path):
    p = _ragged_prompt(_trace(tmp_path / "a.h5"), np.int64, [1, 2, 2**40])
    for cmd in ("info", "check", "export"):
        args = (cmd, p) + (("-o", tmp_path / "x") if cmd == "export" else ())
        r = run_inproc(*args)
        assert r.returncode == 2, (cmd, r.stderr)
        assert _error(r.stderr) == (
            f"spectrace: error: {p}: stored as ragged int64, expected ragged int32 "
            f"(field=requests/prompt_ids)"
        )
    r = run_inproc("validate", p)
    assert (r.returncode, r.stdout) == (
        1,
        f"{p}: stored as ragged int64, expected ragged int32 (field=requests/prompt_ids)\n",
    )


def test_ragged_ids_of_a_narrower_type_read(tmp_path):
    """Twin: uint16 ids fit int32: the prompt reads as stored."""
    p = _ragged_prompt(_trace(tmp_path / "a.h5"), np.uint16, [1, 2, 3])
    assert run_inproc("validate", p).stdout == f"{p}: valid\n"
    r = run_inproc("export", p, "--format", "jsonl", "-o", tmp_path / "x")
    assert r.returncode == 0, r.stderr
    row = json.loads((tmp_path / "x" / "requests.jsonl").read_text())
    assert row["prompt_ids"] == [1, 2, 3]


# -- 3. validate and the anchor column ---------------------------------------------------------


@pytest.mark.parametrize("anchor, valid", [(-7, False), (-1, True)])
def test_validate_reports_an_anchor_below_the_pad(tmp_path, anchor, valid):
    p = _trace(tmp_path / "a.h5", anchor=anchor)
    r = run_inproc("validate", p)
    if valid:  # -1: the anchor is unknown
        assert (r.returncode, r.stdout) == (0, f"{p}: valid\n")
    else:
        assert (r.returncode, r.stdout) == (
            1,
            f"{p}: token id below the -1 pad at row 0 (field=blocks/anchor, value=-7)\n",
        )


# -- 4. a golden short of its own counters -----------------------------------------------------


def _golden(tmp_path: Path, edit=None) -> Path:
    """The bundled golden (edited), written with its run keys on line 1 and record i alone
    on line i + 2."""
    doc = json.loads(GOLDEN.read_text())
    if edit:
        edit(doc)
    records = doc.pop("records")
    head = json.dumps(doc)[:-1]  # without its closing brace
    body = ",\n".join(json.dumps(r) for r in records)
    src = tmp_path / "g.json"
    src.write_text(f'{head}, "records": [\n{body}\n]}}\n')
    return src


def _check_errors(path: Path) -> tuple[int, list[str]]:
    r = run_inproc("check", path, "--format", "json")
    doc = json.loads(r.stdout)
    return r.returncode, [f["kind"] for f in doc["findings"] if f["severity"] == "error"]


def test_a_golden_short_of_its_draft_counter_is_missing_work(tmp_path):
    # the golden counted 10 drafts; the walk places 6 verified (test_importers derives
    # them): 4 missing
    src = _golden(tmp_path, lambda d: d["metrics"].update({"vllm:spec_decode_num_drafts": 10}))
    out = tmp_path / "g.h5"
    assert run_inproc("import", "golden", src, "-o", out).returncode == 0
    with h5py.File(out) as f:
        checks = json.loads(f["meta"][()])["checks"]
    assert (checks["status"], checks["mismatch"]) == ("mismatch", ["drafts"])
    assert _check_errors(out) == (1, ["capture_incomplete"])


def test_a_golden_whose_drafts_equal_its_counters_passes_check(tmp_path):
    """Twin: the bundled golden: drafts 6 = 6 placed and verified, draft tokens 18 = 18;
    its accepted tokens (9 vs 8) differ where a block's bonus falls past max_tokens, which
    is no loss."""
    out = tmp_path / "g.h5"
    assert run_inproc("import", "golden", _golden(tmp_path), "-o", out).returncode == 0
    assert _check_errors(out) == (0, [])


# -- 5. golden request ids ---------------------------------------------------------------------


def test_two_golden_records_of_one_request_id_are_bad_input(tmp_path):
    src = _golden(tmp_path, lambda d: d["records"][1].update({"request_id": "0"}))
    r = run_inproc("import", "golden", src, "-o", tmp_path / "g.h5")
    assert r.returncode == 2
    assert _error(r.stderr) == (  # record 1 is on line 3
        f"spectrace: error: {src}:3: request id '0' of record 1 is also record 0's "
        f"(field=request_id): give each record its own (partial trace {tmp_path / 'g.h5'}"
        f".partial removed)"
    )
    assert list(tmp_path.iterdir()) == [src]


def test_golden_records_of_distinct_request_ids_import(tmp_path):
    """Twin: ids a, b and the third and fourth records' indexes 2, 3."""

    def name(doc):
        doc["records"][0]["request_id"], doc["records"][1]["request_id"] = "a", "b"

    out = tmp_path / "g.h5"
    assert run_inproc("import", "golden", _golden(tmp_path, name), "-o", out).returncode == 0
    with h5py.File(out) as f:
        assert [x.decode() for x in f["requests/req_id"][:]] == ["a", "b", "2", "3"]


def test_a_golden_request_id_that_is_no_text_is_an_invalid_record(tmp_path):
    # json.dumps writes ASCII: the lone surrogate as the escape \ud800 (valid JSON)
    src = _golden(tmp_path, lambda d: d["records"][0].update({"request_id": "a\ud800"}))
    r = run_inproc("import", "golden", src, "-o", tmp_path / "g.h5")
    assert r.returncode == 0, r.stderr
    with h5py.File(tmp_path / "g.h5") as f:  # records 1..3 remain, with their indexes
        assert [x.decode() for x in f["requests/req_id"][:]] == ["1", "2", "3"]
        imp = json.loads(f["meta"][()])["import"]
    assert imp["unplaced"]["invalid_record"] == 4  # record 0's four blocks
    r = run_inproc("import", "golden", src, "-o", tmp_path / "s.h5", "--strict")
    assert r.returncode == 2
    assert _error(r.stderr).startswith(f"spectrace: error: {src}:2: request id is not UTF-8")


# -- 6. llama-dump lost steps ------------------------------------------------------------------


def test_a_dump_that_lost_steps_is_missing_work(tmp_path):
    # the bundled dump: line 5 is not JSON, line 7's seq 7 has no request: 2 steps lost
    out = tmp_path / "l.h5"
    r = run_inproc("import", "llama-dump", DUMP, "--requests", DUMP_REQS, "-o", out)
    assert r.returncode == 0, r.stderr
    r = run_inproc("check", out, "--format", "json")
    assert r.returncode == 1
    (f,) = [f for f in json.loads(r.stdout)["findings"] if f["severity"] == "error"]
    assert f["kind"] == "capture_incomplete"
    assert f["evidence"]["dropped_lines"] == 2
    assert f["evidence"]["first_dropped"].startswith(f"{DUMP}:5: not JSON (")


def test_a_dump_without_lost_steps_passes_check(tmp_path):
    """Twin: lines 1-4 and 6 (the readable, placed steps) alone."""
    lines = DUMP.read_text().splitlines()
    src = tmp_path / "clean.jsonl"
    src.write_text("\n".join(lines[:4] + lines[5:6]) + "\n")
    out = tmp_path / "l.h5"
    r = run_inproc("import", "llama-dump", src, "--requests", DUMP_REQS, "-o", out, "--strict")
    assert r.returncode == 0, r.stderr
    assert _check_errors(out) == (0, [])


# -- 7. safetensors headers that lie about a tensor's size -------------------------------------


def _draft_with(tmp_path: Path, name: str, **entry) -> Path:
    """The bundled draft model with one header entry changed (the data bytes as they were)."""
    d = tmp_path / "draft"
    shutil.copytree(DRAFT, d)
    raw = (d / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header[name].update(entry)
    new = json.dumps(header).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n :])
    return d


def test_a_header_whose_span_is_not_its_shape_is_bad_input(tmp_path):
    # the layernorm is F32 [64]: 256 bytes at [1048576, 1048832); as F16 it would need 128
    d = _draft_with(tmp_path, "model.layers.0.input_layernorm.weight", dtype="F16")
    r = run_inproc("inspect-draft", d)
    assert r.returncode == 2
    assert _error(r.stderr) == (
        f"spectrace: error: {d}/model.safetensors: not a safetensors header: tensor "
        "'model.layers.0.input_layernorm.weight' spans 256 bytes, its shape [64] of F16 "
        "needs 128 (field=data_offsets, value=[1048576, 1048832])"
    )


def test_a_header_rewritten_truthfully_inspects_clean(tmp_path):
    """Twin: the same entry rewritten with its true dtype."""
    d = _draft_with(tmp_path, "model.layers.0.input_layernorm.weight", dtype="F32")
    r = run_inproc("inspect-draft", d)
    assert r.returncode == 0, r.stdout + r.stderr


# -- 8. CSV list columns are JSON --------------------------------------------------------------


@pytest.mark.parametrize(
    "margins, cell, parsed",
    [((float("inf"), float("nan")), "[1e999, null]", [float("inf"), None]),
     ((0.5, 0.25), "[0.5, 0.25]", [0.5, 0.25])],
)  # fmt: skip
def test_csv_margin_lists_are_json(tmp_path, margins, cell, parsed):
    p = _trace(tmp_path / "a.h5", margins=margins)
    r = run_inproc("export", p, "--format", "csv", "-o", tmp_path / "x")
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "x" / "blocks.csv", newline="") as fh:
        (row,) = list(csv.DictReader(fh))
    assert row["draft_margin"] == cell
    assert json.loads(row["draft_margin"]) == parsed


# -- 9. --max-errors never tolerates missing work ---------------------------------------------


def _killed(path: Path) -> Path:
    """:func:`_trace` whose writer never closed it (status recording): capture_incomplete."""
    _trace(path)
    with h5py.File(path, "r+") as f:
        f.attrs["status"] = "recording"
    return path


def test_max_errors_does_not_tolerate_missing_work(tmp_path, spectrace_assert_drafts_match):
    p = _killed(tmp_path / "k.h5")
    r = run_inproc("check", p, "--max-errors", "1", "--format", "json")
    doc = json.loads(r.stdout)
    assert r.returncode == 1
    assert doc["gate"]["problems"] == [
        "missing work (capture_incomplete): --max-errors tolerates none; --ignore KIND does"
    ]
    r = run_inproc("diff", _trace(tmp_path / "a.h5"), p, "--max-errors", "5")
    assert r.returncode == 1
    assert r.stdout.splitlines()[2] == (
        "DIVERGED: missing work (capture_incomplete): --max-errors tolerates none; "
        "--ignore KIND does"
    )
    with pytest.raises(pytest.fail.Exception, match="missing work"):
        spectrace_assert_drafts_match(tmp_path / "a.h5", p, max_error_findings=5)
    # naming the kind is the way to accept it
    assert run_inproc("check", p, "--ignore", "capture_incomplete").returncode == 0


def test_max_errors_tolerates_findings_about_recorded_work(tmp_path):
    """Twin: an impossible anchor (-7) is one error about what was recorded; --max-errors 1
    tolerates it, the default does not."""
    p = _trace(tmp_path / "a.h5", anchor=-7)
    assert _check_errors(p) == (1, ["impossible_values"])
    assert run_inproc("check", p, "--max-errors", "1").returncode == 0


# -- 10. replay of ids the target cannot embed -------------------------------------------------


def _ref(tmp_path: Path, prompt: list[int]) -> Path:
    src = tmp_path / "ref.jsonl"
    src.write_text(json.dumps({"req_id": "a", "prompt_ids": prompt, "output_ids": [4, 5, 6]}))
    return src


@pytest.mark.parametrize(
    "prompt, message",
    [
        # the bundled target's vocabulary is 2048 ids (engine/models/target/config.json)
        ([1, 2, 2048], "request a: token id 2048 outside the target's vocabulary [0, 2048) "
         "(field=prompt_ids/output_ids)"),
        ([1, -2, 3], "{src}:1: request a has a negative token id"),
    ],
)  # fmt: skip
def test_a_reference_id_outside_the_vocabulary_is_bad_input(tmp_path, prompt, message):
    src = _ref(tmp_path, prompt)
    r = run_inproc("replay", src, "--engine", "reference", "--positions", "1",
                   "-o", tmp_path / "r.h5")  # fmt: skip
    assert r.returncode == 2
    assert _error(r.stderr) == "spectrace: error: " + message.format(src=src)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref.jsonl"]


def test_a_reference_inside_the_vocabulary_replays(tmp_path):
    """Twin: id 2047, the last of the vocabulary; one position (3, the first output token)."""
    r = run_inproc("replay", _ref(tmp_path, [1, 2, 2047]), "--engine", "reference",
                   "--positions", "1", "-o", tmp_path / "r.h5")  # fmt: skip
    assert r.returncode == 0, r.stderr
    with h5py.File(tmp_path / "r.h5") as f:
        assert f["blocks/position"][:].tolist() == [3]


# -- 11. text that is not UTF-8 ----------------------------------------------------------------


def _raw_req_id(path: Path, raw: bytes) -> Path:
    """``path`` with request 0's id written as the bytes ``raw`` into the UTF-8 column."""
    with h5py.File(path, "r+") as f:
        ds = f["requests/req_id"]
        ds.id.write(h5py.h5s.ALL, h5py.h5s.ALL, np.array([raw], dtype=object))
    return path


@pytest.mark.parametrize("raw, valid", [(b"\xff\xfe", False), (b"r\xc3\xa9", True)])
def test_a_request_id_that_is_not_utf8_is_bad_input(tmp_path, raw, valid):
    p = _raw_req_id(_trace(tmp_path / "a.h5"), raw)
    r, v = run_inproc("info", p, "--format", "json"), run_inproc("validate", p)
    if valid:  # twin: "r\u00e9" in UTF-8
        assert r.returncode == 0, r.stderr
        assert (v.returncode, v.stdout) == (0, f"{p}: valid\n")
        return
    want = f"{p}: not UTF-8 text at row 0 (field=requests/req_id, value=b'\\xff\\xfe')"
    assert r.returncode == 2 and _error(r.stderr) == f"spectrace: error: {want}"
    assert (v.returncode, v.stdout) == (1, want + "\n")


def _phases(path: Path, names) -> Path:
    """``path`` with one phase row (step 0, code 0, 1.5 ms, level 1) and ``names``."""
    with h5py.File(path, "r+") as f:
        g = f["phases"]
        for col, value in (("step", 0), ("name", 0), ("ms", 1.5), ("level", 1)):
            g[col].resize((1,))
            g[col][0] = value
        g.attrs["names"] = names
    return path


@pytest.mark.parametrize(
    "names, what",
    [(5, "not a list of strings (field=/phases.names, value=5)"),
     (np.array([b"\xff"], "S1"), "not UTF-8 text at row 0 (field=/phases.names, value=b'\\xff')"),
     (["backbone"], None)],
)  # fmt: skip
def test_phase_names_that_are_not_strings_are_bad_input(tmp_path, names, what):
    p = _phases(_trace(tmp_path / "a.h5"), names)
    r, v = run_inproc("check", p), run_inproc("validate", p)
    if what is None:  # twin: the writer's own layout, a list of str
        assert r.returncode == 0, r.stderr
        assert (v.returncode, v.stdout) == (0, f"{p}: valid\n")
        return
    assert r.returncode == 2 and _error(r.stderr) == f"spectrace: error: {p}: {what}"
    assert (v.returncode, v.stdout) == (1, f"{p}: {what}\n")


# -- 12. one diagnostic line, whatever a request id holds --------------------------------------


def _trace_of(path: Path, req_id: str) -> Path:
    with TraceWriter(path, {"k": 2}, flush_interval=0) as w:
        w.request(req_id, [1, 2, 3], [4, 5, 6], "length")
        w.add_block(req_id, 0, 2, 3, [4, 5], verified=[4, 5], accepted=2, emitted=[4, 5, 6])
    return path


@pytest.mark.parametrize(
    "req_id, shown",
    [("a\nb\x1b[31m", "a\\nb\\x1b[31m"), ("r\u00e9", "r\u00e9")],  # twin: printable as is
)
def test_a_diagnostic_is_one_line_whatever_an_id_holds(tmp_path, req_id, shown):
    p = _trace_of(tmp_path / "a.h5", req_id)
    r = run_inproc("check", p, "--request", "x")
    assert r.returncode == 2
    assert r.stderr == (
        f"spectrace: error: Invalid value for --request: no request 'x' (known: {shown}) "
        "(see 'spectrace check --help')\n"
    )
