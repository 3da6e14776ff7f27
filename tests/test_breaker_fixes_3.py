"""A third new user's breakages, each with its clean twin.

1. ``import vt --strict`` took a line with a wrong request id as a chain gap: on a sync log
   (one that prints the ``[spec-update]`` payload) a block must belong to the request it
   names: a gap needs a step without drafts, the request a ``[spec-sched]`` line before, no
   ``finished=1`` before, no second block in one step;
2. a damaged chunk (fletcher32) of a column a command reads is exit 2 with one line naming
   the file it is in and the column (``blocks/request`` at open said "damaged trace file",
   and a trace of several files named only its first);
3. a request id with bytes that are not UTF-8 is a malformed line (two such ids merged into
   one U+FFFD request);
4. ``--strict`` takes any float text that fits float32 as a margin (``%.3f`` only before, and
   ``3.4028235e38``, float32's max as ``%g`` prints it, was out of range);
5. one file twice, or a copy of it, is not one run (exit 2); ``validate`` reports a block
   anchored inside the prompt;
6. ``capture`` records the engine as unknown, as ``import vt`` of the same log does.

The bundled log (traces/reference.vt.log, 1-based lines): line 20 is request 0's first
block (pos=11, ns=3), line 21 request 1's (pos=15, ns=1: its next is expected at 16), line 45
request 1's second (pos=16), line 69 its third (pos=18); request 0 says ``finished=1`` at
line 663 and request 4 prints a block at line 692 (pos=75). Every step's payload gives every
running request 4 drafts (line 31: request 1's row of the step whose drafts line 45 verifies).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from inproc import run_inproc

from spectrace.tracer.store import TraceWriter, open_trace

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "traces" / "reference.vt.log"
REQS = ROOT / "traces" / "reference.requests.jsonl"
REF, VLLM = ROOT / "traces" / "reference.h5", ROOT / "traces" / "vllm.h5"
LINES = LOG.read_text().splitlines(keepends=True)


def _error(err: str) -> str:
    """The one ``spectrace: error:`` line of stderr (and no traceback)."""
    assert "Traceback" not in err, err
    lines = [x for x in err.splitlines() if x.startswith("spectrace: error:")]
    assert len(lines) == 1, err
    return lines[0]


def _log(tmp_path: Path, lines: list[str], name: str = "w") -> Path:
    p = tmp_path / f"{name}.vt.log"
    p.write_text("".join(lines))
    return p


def _edit(lineno: int, old: str, new: str) -> list[str]:
    """The bundled log with ``old`` replaced by ``new`` on 1-based line ``lineno``."""
    out = list(LINES)
    assert old in out[lineno - 1], out[lineno - 1]
    out[lineno - 1] = out[lineno - 1].replace(old, new)
    return out


def test_the_bundled_lines_the_cases_edit():
    at = {n: LINES[n - 1] for n in (20, 21, 31, 45, 69, 663, 692)}
    assert at[20].startswith("[SPECTRACE] req=0 pos=11 k=4 ns=3 ")
    assert at[21].startswith("[SPECTRACE] req=1 pos=15 k=4 ns=1 ")
    assert at[31] == "[spec-update] req=1 found=1 finished=0 prefill_chunk=0 drafts=4\n"
    assert at[45].startswith("[SPECTRACE] req=1 pos=16 ")
    assert at[69].startswith("[SPECTRACE] req=1 pos=18 ")
    assert at[663].startswith("[spec-update] req=0 found=1 finished=1 ")
    assert at[692].startswith("[SPECTRACE] req=4 pos=75 ")


# -- 1. a block names the wrong request ---------------------------------------------------------


def _strict(log: Path, out: Path, *extra: object):
    return run_inproc("import", "vt", log, "-o", out, "--strict", *extra)


def test_strict_clean_log_imports(tmp_path):
    for extra in ((), ("--requests", REQS)):
        r = _strict(LOG, tmp_path / "t.h5", "--force", *extra)
        assert r.returncode == 0, r.stderr
        assert len(open_trace(tmp_path / "t.h5").blocks) == 139


@pytest.mark.parametrize(
    "lineno,old,new,where,message",
    [
        # req 1's first block printed for req 0's: req 1's own block follows in one step
        (20, "req=0 ", "req=1 ", 21, "block twice: req=1 pos=15: a second block of req=1 in "
         "one step"),
        # an id the scheduler never named (req 1's block: req 1 then has an unexplained gap)
        (45, "req=1 ", "req=9 ", 45, "unscheduled: req=9 pos=16: no [spec-sched] line named "
         "req=9 before"),
        # req 4's block printed for req 0, which finished at line 663
        (692, "req=4 ", "req=0 ", 692, "after finish: req=0 pos=75: req=0 finished at line "
         "663"),
    ],
)  # fmt: skip
def test_strict_refuses_a_block_of_the_wrong_request(tmp_path, lineno, old, new, where, message):
    log, out = _log(tmp_path, _edit(lineno, old, new)), tmp_path / "t.h5"
    for extra in ((), ("--requests", REQS)):
        r = _strict(log, out, *extra)
        assert r.returncode == 2
        assert _error(r.stderr) == (
            f"spectrace: error: {log}:{where}: {message} (partial trace {out}.partial removed)"
        )
        assert not out.exists() and not (tmp_path / "t.h5.partial").exists()


def test_strict_refuses_a_gap_no_step_explains(tmp_path):
    # line 45 dropped: req 1 jumps from pos 15 (ns 1, line 21) to pos 18 (line 69, now 68)
    # while every step's payload gave it 4 drafts
    log, out = _log(tmp_path, LINES[:44] + LINES[45:]), tmp_path / "t.h5"
    r = _strict(log, out)
    assert r.returncode == 2
    assert _error(r.stderr) == (
        f"spectrace: error: {log}:68: chain gap: req=1 pos=18, expected 16 (block at line "
        f"21), but every step since gave req=1 drafts (partial trace {out}.partial removed)"
    )
    lenient = run_inproc("import", "vt", log, "-o", out)  # lenient: counted, as before
    assert lenient.returncode == 0 and "138 blocks" in lenient.stderr
    assert "1 chain gaps" in lenient.stderr


def test_strict_takes_a_gap_a_step_without_drafts_explains(tmp_path):
    # the twin: req 1's payload row says drafts=0, so it decodes plain in the next step
    lines = LINES[:44] + LINES[45:]
    lines[30] = lines[30].replace("drafts=4", "drafts=0")
    r = _strict(_log(tmp_path, lines), tmp_path / "t.h5")
    assert r.returncode == 0, r.stderr
    assert "138 blocks" in r.stderr and "1 chain gaps" in r.stderr


# -- 2. a damaged chunk --------------------------------------------------------------------------


def _damage(src: Path, dst: Path, column: str) -> Path:
    """A copy of ``src`` with two bytes flipped in the middle of ``column``'s first chunk
    (its fletcher32 checksum no longer matches)."""
    shutil.copy(src, dst)
    with h5py.File(dst, "r") as f:
        info = f[column].id.get_chunk_info(0)
        assert f[column].fletcher32
    with open(dst, "r+b") as fh:
        fh.seek(info.byte_offset + info.size // 2)
        two = fh.read(2)
        fh.seek(info.byte_offset + info.size // 2)
        fh.write(bytes(b ^ 0xFF for b in two))
    return dst


@pytest.mark.parametrize("column", ["proposed", "request", "accepted"])
def test_a_damaged_chunk_is_bad_input_naming_file_and_column(tmp_path, column):
    bad = _damage(REF, tmp_path / "bad.h5", f"blocks/{column}")
    start = f"spectrace: error: {bad}: damaged column blocks/{column} ("
    for args in (["info", bad], ["check", bad], ["diff", VLLM, bad], ["diff", bad, VLLM]):
        r = run_inproc(*args, "--format", "json")
        assert (r.returncode, r.stdout) == (2, ""), args
        assert _error(r.stderr).startswith(start), (args, r.stderr)
    v = run_inproc("validate", bad)
    assert v.returncode == 1 and f"field=blocks/{column}" in v.stdout


def test_an_undamaged_copy_reads(tmp_path):
    good = tmp_path / "good.h5"
    shutil.copy(REF, good)
    for args in (["info", good], ["check", good], ["validate", good]):
        assert run_inproc(*args).returncode == 0, args
    assert run_inproc("diff", VLLM, good).returncode == 0


def _rank(path: Path, rank: int) -> Path:
    with TraceWriter(path, {"k": 2, "dp_rank": rank}, flush_interval=0) as w:
        w.request(f"q{rank}", prompt_ids=[1, 2], output_ids=[3, 4, 5], finish_reason="length")
        w.add_block(f"q{rank}", 0, 1, 2, [3, 4], verified=[3, 4], accepted=2, emitted=[3, 4, 5])
    return path


def test_a_damaged_rank_is_named_not_the_first_file(tmp_path):
    a = _rank(tmp_path / "run.dp0.h5", 0)
    b = _rank(tmp_path / "run.dp1.h5", 1)
    ok = run_inproc("info", a, b, "--format", "json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["blocks"] == 2
    _damage(b, tmp_path / "x.h5", "blocks/proposed")
    shutil.move(tmp_path / "x.h5", b)
    r = run_inproc("check", a, b)
    assert r.returncode == 2
    assert _error(r.stderr).startswith(f"spectrace: error: {b}: damaged column blocks/proposed (")


# -- 3. request ids that are not UTF-8 ----------------------------------------------------------


_NON_UTF8 = (
    b"[SPECTRACE] req=\xff pos=4 k=1 ns=1 acc=0 draft=[ 7 ] emit=[ 8 ]\n"
    b"[SPECTRACE] req=\xfe pos=9 k=1 ns=1 acc=0 draft=[ 7 ] emit=[ 8 ]\n"
    b"[SPECTRACE] req=ok pos=9 k=1 ns=1 acc=0 draft=[ 7 ] emit=[ 8 ]\n"
)


@pytest.mark.parametrize("ids", [(b"\xff", b"\xfe"), (b"a", b"b")], ids=["not-utf8", "ascii"])
def test_request_ids_are_never_merged(tmp_path, ids):
    log = tmp_path / "n.log"
    log.write_bytes(_NON_UTF8.replace(b"\xff", ids[0]).replace(b"\xfe", ids[1]))
    r = run_inproc("import", "vt", log, "-o", tmp_path / "n.h5")
    assert r.returncode == 0, r.stderr
    t = open_trace(tmp_path / "n.h5")
    if ids == (b"a", b"b"):
        assert (t.requests.req_id, t.blocks.request.tolist()) == (["a", "b", "ok"], [0, 1, 2])
        return
    # before: one request '\ufffd' held both blocks; now both lines are malformed (counted)
    assert (t.requests.req_id, t.blocks.request.tolist()) == (["ok"], [0])
    assert "2 malformed lines" in r.stderr
    s = run_inproc("import", "vt", log, "-o", tmp_path / "s.h5", "--strict")
    assert s.returncode == 2
    assert _error(s.stderr).startswith(
        f"spectrace: error: {log}:1: malformed trace line: req holds bytes not UTF-8 "
        "(field=req, value=b'\\xff')"
    )
    found = json.loads(run_inproc("check", tmp_path / "n.h5", "--format", "json").stdout)
    assert [f["kind"] for f in found["findings"]] == ["capture_incomplete"]


# -- 4. margins ---------------------------------------------------------------------------------

_F32_MAX = (2 - 2**-23) * 2**127  # 3.4028234663852886e38
_F32_ROUNDS_TO_INF = (2 - 2**-24) * 2**127  # halfway to 2**128: this and above overflow


def _margins(tmp_path: Path, text: str):
    """The bundled log with ``margin=[ text ]`` on its first ``[spec-propose]`` (line 2, the
    proposal request 0's first block, block row 0, joins), imported with --strict."""
    assert LINES[1].startswith("[spec-propose] ") and _F32_MAX < 3.4028235e38 < _F32_ROUNDS_TO_INF
    log = _log(tmp_path, _edit(2, "63 ]\n", f"63 ] margin=[ {text} ]\n"), "m")
    r = _strict(log, tmp_path / "m.h5")
    return r, log


@pytest.mark.parametrize(
    "text,stored",
    [
        ("0.523 0.010 0.100 0.200", [0.523, 0.010, 0.100, 0.200]),  # the engine's %.3f
        ("0.5 1e-3 +2 .25", [0.5, 0.001, 2.0, 0.25]),
        ("3.4028235e38 -3.4028235e38 nan -nan", [_F32_MAX, -_F32_MAX, np.nan, np.nan]),
    ],
)
def test_strict_takes_any_float32_margin_text(tmp_path, text, stored):
    r, _ = _margins(tmp_path, text)
    assert r.returncode == 0, r.stderr
    got = open_trace(tmp_path / "m.h5").blocks.draft_margin[0]
    np.testing.assert_array_equal(got, np.array(stored, np.float32))


@pytest.mark.parametrize("text", ["3.4028236e38 0 0 0", "1e39 0 0 0"])
def test_strict_refuses_a_margin_beyond_float32(tmp_path, text):
    r, log = _margins(tmp_path, text)
    assert r.returncode == 2
    value = float(text.split()[0])
    assert value >= _F32_ROUNDS_TO_INF
    assert _error(r.stderr).startswith(
        f"spectrace: error: {log}:2: malformed trace line: margin out of range for float32 "
        f"(field=margin, value={value})"
    )


# -- 5. copies of one trace, blocks inside the prompt -------------------------------------------


def test_one_file_twice_is_bad_input(tmp_path):
    r = run_inproc("info", REF, REF)
    assert r.returncode == 2
    assert _error(r.stderr) == f"spectrace: error: {REF}: one file given twice as one trace"


def test_a_copy_is_not_another_rank(tmp_path):
    copy = tmp_path / "copy.h5"
    shutil.copy(REF, copy)
    for cmd in ("info", "check"):
        r = run_inproc(cmd, REF, copy)
        assert r.returncode == 2
        assert _error(r.stderr) == (
            f"spectrace: error: reference.h5 +1: files of different runs given as one trace "
            f"(request '0' in {REF} and {copy}: a copy of one file, or two runs); pass the "
            "files of one run"
        )


def test_rankless_files_of_distinct_requests_are_one_trace(tmp_path):
    # the twin: two files without a rank whose requests differ (q0, q1) read as one
    files = []
    for r in range(2):
        files.append(tmp_path / f"part{r}.h5")
        with TraceWriter(files[-1], {"k": 2}, flush_interval=0) as w:
            w.request(f"q{r}", prompt_ids=[1, 2], output_ids=[3, 4, 5], finish_reason="length")
            w.add_block(f"q{r}", 0, 1, 2, [3, 4], verified=[3, 4], accepted=2, emitted=[3, 4, 5])
    r = run_inproc("info", *files, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["blocks"] == 2


@pytest.mark.parametrize("position,valid", [(2, False), (4, True), (5, True)])
def test_validate_reports_a_block_anchored_inside_the_prompt(tmp_path, position, valid):
    # prompt 1..5 (5 tokens, last at index 4), output 6..9; drafts the two next tokens
    seq = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    path = tmp_path / "p.h5"
    with TraceWriter(path, {"k": 2}, flush_interval=0) as w:
        w.request("r", prompt_ids=seq[:5], output_ids=seq[5:], finish_reason="length")
        nxt = seq[position + 1 : position + 3]
        w.add_block("r", 0, position, seq[position], nxt, verified=nxt, accepted=2,
                    emitted=seq[position + 1 : position + 4])  # fmt: skip
    r = run_inproc("validate", path)
    if valid:
        assert (r.returncode, r.stdout) == (0, f"{path}: valid\n")
        return
    assert r.returncode == 1
    assert r.stdout == (
        f"{path}: position inside the prompt (before its last token, len(prompt) - 1) at row 0 "
        "(field=blocks/position, value=2)\n"
    )


def test_bundled_traces_anchor_every_block_at_or_after_the_prompt_end():
    # the rule's evidence: real engines anchor a request's first block on its first output
    # token, at len(prompt); validate allows one earlier (the last prompt token)
    for path in (REF, VLLM):
        t = open_trace(path)
        prompt = np.array([len(p) for p in t.requests.prompt_ids])
        assert int((t.blocks.position - prompt[t.blocks.request]).min()) == 0
        assert run_inproc("validate", path).returncode == 0


# -- 6. the engine a capture records ------------------------------------------------------------


@pytest.mark.parametrize("meta", [[], ["--meta", "engine=ours"]], ids=["unknown", "given"])
def test_capture_and_import_record_the_same_engine(tmp_path, meta):
    cmd = [sys.executable, "-c", f"import sys; sys.stderr.write(open({str(LOG)!r}).read())"]
    cap = run_inproc("capture", "-o", tmp_path / "c.h5", *meta, "--", *cmd)
    imp = run_inproc("import", "vt", LOG, "-o", tmp_path / "i.h5", *meta)
    assert (cap.returncode, imp.returncode) == (0, 0), cap.stderr + imp.stderr
    want = None if not meta else "ours"
    for p in ("c.h5", "i.h5"):
        t = open_trace(tmp_path / p)
        assert (t.meta["engine"], t.meta["method"], len(t.blocks)) == (want, None, 139), p


# -- found while breaking main: misleading messages ---------------------------------------------


def test_a_text_that_names_the_format_is_not_called_a_log(tmp_path):
    # traces/README.md names VT_SPEC_TRACE and quotes [SPECTRACE] inside a line: not a log
    for path, log in ((ROOT / "traces" / "README.md", False), (LOG, True)):
        r = run_inproc("info", path)
        assert r.returncode == 2
        said = "a VT_SPEC_TRACE log, not a trace file" in _error(r.stderr)
        assert said == log, r.stderr


def test_validate_checks_a_file_given_twice_once():
    # validate checks files one at a time (not as one trace): a repeat is no error
    r = run_inproc("validate", REF, REF, VLLM)
    assert (r.returncode, r.stdout) == (0, f"{REF}: valid\n{VLLM}: valid\n")


def test_an_existing_file_is_no_pattern(tmp_path):
    # run[1].h5 exists: it is read itself, not the file its name matches as a glob (run1.h5)
    literal, other = tmp_path / "run[1].h5", tmp_path / "run1.h5"
    shutil.copy(REF, literal)
    shutil.copy(VLLM, other)
    r = run_inproc("info", literal, "--format", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["files"] == [str(literal)]
    glob = run_inproc("info", tmp_path / "run[12].h5", "--format", "json")  # the twin: a glob
    assert json.loads(glob.stdout)["files"] == [str(other)]
