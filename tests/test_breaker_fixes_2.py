"""A second new user's breakages, each with its clean twin.

1. a trace file its writer never closed (a killed ``import vt -``; the SIGKILLed ``capture``
   is tests/hooks/test_capture.py's) is missing work: ``capture_incomplete``, exit 1;
2. a VT log whose request goes back to a position it had passed (a line printed twice with
   another draft, or the whole log twice) is not one run's record: ``capture_incomplete``
   naming the first chain break, exit 1, in ``check`` and both ``diff`` orders;
3. ``--timeout`` NaN, infinity, 0 or below, ``-o ''`` and a named pipe given as a trace are
   bad usage or input: exit 2, one line, before anything runs;
4. a log cut short and imported without its requests file: the requests whose
   ``[spec-update]`` lines never said ``finished=1`` are ``unfinished`` (requests_incomplete),
   on the bulk and the line path alike.

The bundled log's line 20 (1-based) is ``req=0 pos=11 ... draft=[ 318 351 372 63 ]``, accepted
2 (ns=3), so the next block of request 0 is expected at position 14.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spectrace.tracer.store import TraceWriter, open_trace

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "traces" / "reference.vt.log"
REQS = ROOT / "traces" / "reference.requests.jsonl"
REF = ROOT / "traces" / "reference.h5"
SPECTRACE = [sys.executable, "-m", "spectrace.tracer"]
LINE_20 = "[SPECTRACE] req=0 pos=11 k=4 ns=3 acc=2 draft=[ 318 351 372 63 ] emit=[ 318 351 385 ]"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SPECTRACE, *map(str, args)], capture_output=True, text=True)


def _capture_findings(*args: str) -> tuple[int, list[dict]]:
    r = _run(*args, "--format", "json")
    assert r.returncode in (0, 1), r.stderr[-2000:]
    doc = json.loads(r.stdout)
    return r.returncode, [f for f in doc["findings"] if f["kind"] == "capture_incomplete"]


def _import(tmp_path: Path, name: str, lines: list[str]) -> Path:
    log, out = tmp_path / f"{name}.vt.log", tmp_path / f"{name}.h5"
    log.write_text("".join(lines))
    r = _run("import", "vt", log, "-o", out, "--requests", REQS)
    assert r.returncode == 0, r.stderr
    return out


def test_bundled_line_20_is_the_block_the_cases_edit():
    assert LOG.read_text().splitlines()[19] == LINE_20


# -- 1. a file never closed ---------------------------------------------------------------------


def _import_trace(path: Path, close: bool) -> None:
    """An import's trace of 3 blocks; ``close`` False leaves it as a killed writer does
    (the rows flushed, the file ``NAME.h5.partial`` with status ``recording``)."""
    w = TraceWriter(path, {"k": 2, "import": {"source": "x.log"}}, flush_interval=0)
    # full sequence 1 2 3 | 5 7 5 7 5 7: from anchors 3, 7, 7 at positions 2, 4, 6 the
    # drafts [5, 6] match one token each (then 7, the bonus token)
    w.request("r", prompt_ids=[1, 2, 3], output_ids=[5, 7, 5, 7, 5, 7], finish_reason="length")
    for i, anchor in enumerate((3, 7, 7)):
        w.add_block("r", i, 2 + 2 * i, anchor, [5, 6], verified=[5, 6], accepted=1)
    w.close(complete=close)


@pytest.mark.parametrize("closed", [False, True], ids=["killed", "closed"])
def test_unclosed_import_is_missing_work(tmp_path, closed):
    path = tmp_path / "t.h5"
    _import_trace(path, closed)
    assert path.exists() == closed and (tmp_path / "t.h5.partial").exists() != closed
    rc, found = _capture_findings("check", path)
    if closed:
        assert (rc, found) == (0, [])
        return
    assert rc == 1 and len(found) == 1
    ev = found[0]["evidence"]
    assert (ev["ended"], ev["exit_status"], ev["signal"]) == ("capture-killed", None, None)
    assert "the trace file was never closed" in found[0]["message"]


# -- 2. chain breaks ----------------------------------------------------------------------------


def test_a_line_printed_twice_with_another_draft_is_not_one_runs_record(tmp_path):
    lines = LOG.read_text().splitlines(keepends=True)
    edited = lines[:20] + [lines[19].replace("372 63 ]", "372 996 ]")] + lines[20:]
    bad = _import(tmp_path, "twice", edited)
    for args, side in (
        (["check", bad], "trace"),
        (["diff", bad, REF], "ours"),
        (["diff", REF, bad], "theirs"),
    ):
        rc, found = _capture_findings(*args)
        assert rc == 1 and len(found) == 1, args
        assert found[0]["side"] == side
        ev = found[0]["evidence"]
        assert (ev["chain_breaks"], ev["dropped_lines"], ev["ended"]) == (1, 0, None)
        assert ev["first_chain_break"].startswith(f"{tmp_path / 'twice.vt.log'}:21: chain break")
        assert "req=0 pos=11, expected 14" in ev["first_chain_break"]
        assert "not one run's record" in found[0]["message"]


def test_the_whole_log_twice_counts_every_block_of_the_second_copy(tmp_path):
    lines = LOG.read_text().splitlines(keepends=True)
    blocks = sum(x.startswith("[SPECTRACE]") for x in lines)
    rc, found = _capture_findings("check", _import(tmp_path, "doubled", lines + lines))
    assert blocks == 139 and rc == 1
    # every request's first block in the copy goes back to its start: one break per request,
    # and the rest of each copied chain follows it (no further break)
    assert found[0]["evidence"]["chain_breaks"] == 5


def test_untouched_log_has_no_chain_break(tmp_path):
    rc, found = _capture_findings(
        "check", _import(tmp_path, "clean", LOG.read_text().splitlines(True))
    )
    assert (rc, found) == (0, [])
    rc, found = _capture_findings("diff", _import(tmp_path, "clean2", [LOG.read_text()]), REF)
    assert (rc, found) == (0, [])


# -- 3. bad usage -------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
@pytest.mark.parametrize("cmd", ["replay", "capture vllm"])
def test_timeout_must_be_a_positive_finite_number(tmp_path, cmd, value):
    marker = tmp_path / "ran"
    engine = ["--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    args = ["replay", REF, "--engine", "cmd"] if cmd == "replay" else cmd.split()
    r = _run(*args, "-o", tmp_path / "o.h5", "--timeout", value, *engine)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "'--timeout'" in r.stderr
    assert not marker.exists()


def test_a_finite_timeout_is_accepted(tmp_path):
    r = _run("capture", "vllm", "-o", tmp_path / "o.h5", "--timeout", "30", "--", "true")
    assert "'--timeout'" not in r.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["import", "vt", LOG, "-o", ""],
        ["capture", "-o", "", "--", "true"],
        ["export", REF, "-o", ""],
    ],
    ids=["import", "capture", "export"],
)
def test_empty_output_path_is_bad_input(tmp_path, args):
    r = subprocess.run([*SPECTRACE, *map(str, args)], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip() == "spectrace: error: -o: an empty path; name the file to write"
    assert list(tmp_path.iterdir()) == []


def test_named_pipe_is_not_a_trace(tmp_path):
    fifo = tmp_path / "t.h5"
    os.mkfifo(fifo)
    r = subprocess.run([*SPECTRACE, "info", str(fifo)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert (
        r.stderr.strip()
        == f"spectrace: error: {fifo}: not a regular file (a pipe or a device), not a trace file"
    )


# -- 4. a log cut short, imported without its requests file ------------------------------------


def _finish_reasons(path: Path) -> dict[str, str]:
    with open_trace(path) as t:
        return dict(zip(t.requests.req_id, t.requests.finish_reason))


@pytest.mark.parametrize("cut", [620, None], ids=["cut_at_620", "whole"])
def test_log_cut_short_without_requests_file_is_missing_work(tmp_path, cut):
    """The bundled log prints ``finished=1`` for requests 3, 1, 0, 2, 4 at lines 539, 616,
    663, 664, 697: cut after line 620, requests 0, 2 and 4 never finish."""
    text = "".join(LOG.read_text().splitlines(keepends=True)[:cut])
    log = tmp_path / "cut.vt.log"
    log.write_text(text)
    unfinished = {"0", "2", "4"} if cut else set()
    expected = {r: "unfinished" if r in unfinished else "" for r in "01234"}
    saved, piped = tmp_path / "saved.h5", tmp_path / "piped.h5"
    assert _run("import", "vt", log, "-o", saved).returncode == 0  # the bulk path
    r = subprocess.run([*SPECTRACE, "import", "vt", "-", "-o", str(piped)], input=text, text=True)
    assert r.returncode == 0  # the line path
    assert _finish_reasons(saved) == _finish_reasons(piped) == expected
    d = _run("diff", saved, REF, "--format", "json")
    kinds = [f["kind"] for f in json.loads(d.stdout)["findings"] if f["severity"] == "error"]
    if cut:
        assert d.returncode == 1 and kinds[0] == "requests_incomplete"
    else:
        assert (d.returncode, kinds) == (0, [])
