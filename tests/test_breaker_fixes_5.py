"""The fourth new user's defects left in files it did not own, each with its clean twin.

1. A requests JSONL naming one ``req_id`` on two lines kept the last silently (which line
   holds the request's ids is unknown): bad input, naming both lines.
2. A trace with no block and no request passed ``check`` (exit 0, "findings: none") when no
   capture or import record said how it was written (the plugin, the API): it recorded no
   work, so it is ``capture_incomplete``, exit 1.
3. ``--request`` on a trace without requests said ``(known: )``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from inproc import run_inproc

from spectrace.tracer.store import TraceWriter

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "traces" / "reference.vt.log"
REQS = ROOT / "traces" / "reference.requests.jsonl"


def _requests_with_line_2_as(tmp_path: Path, req_id: str) -> Path:
    """The bundled requests file (5 lines, ids 0..4) with line 2's id replaced."""
    lines = REQS.read_text().splitlines()
    obj = json.loads(lines[1])
    obj["req_id"] = req_id
    lines[1] = json.dumps(obj)
    out = tmp_path / "r.jsonl"
    out.write_text("\n".join(lines) + "\n")
    return out


def test_a_request_id_on_two_lines_is_bad_input(tmp_path):
    reqs = _requests_with_line_2_as(tmp_path, "0")  # line 1 is req 0 already
    r = run_inproc("import", "vt", LOG, "--requests", reqs, "-o", tmp_path / "t.h5")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        f"spectrace: error: {reqs}:2: req_id '0' given twice (first at line 1)"
    )
    assert not (tmp_path / "t.h5").exists()


def test_requests_with_distinct_ids_import(tmp_path):
    """Twin: the bundled file (ids 0..4 once each) imports, with 5 requests."""
    reqs = tmp_path / "r.jsonl"
    shutil.copy(REQS, reqs)
    r = run_inproc("import", "vt", LOG, "--requests", reqs, "-o", tmp_path / "t.h5")
    assert r.returncode == 0, r.stderr
    info = json.loads(run_inproc("info", tmp_path / "t.h5", "--format", "json").stdout)
    assert info["requests"] == 5


def _api_trace(path: Path, requests: int) -> Path:
    """A trace written through the API, without a capture or import record."""
    with TraceWriter(path, {"k": 4}, flush_interval=0) as w:
        for i in range(requests):
            w.request(f"r{i}", [1, 2, 3], [4, 5], "length")
    return path


def test_a_trace_that_recorded_nothing_fails_check(tmp_path):
    t = _api_trace(tmp_path / "empty.h5", requests=0)
    r = run_inproc("check", t, "--format", "json")
    assert r.returncode == 1, r.stderr
    kinds = [f["kind"] for f in json.loads(r.stdout)["findings"]]
    assert kinds == ["capture_incomplete"]


def test_a_trace_with_requests_and_no_block_passes_check(tmp_path):
    """Twin: two requests decoded without drafts (a vanilla run) record work: exit 0."""
    t = _api_trace(tmp_path / "vanilla.h5", requests=2)
    r = run_inproc("check", t, "--format", "json")
    assert r.returncode == 0, r.stdout
    assert json.loads(r.stdout)["findings"] == []


def test_an_unknown_request_of_a_trace_without_requests_says_none(tmp_path):
    t = _api_trace(tmp_path / "empty.h5", requests=0)
    r = run_inproc("check", t, "--request", "x")
    assert r.returncode == 2
    assert "no request 'x' (known: none: the traces hold no request)" in r.stderr


def test_an_unknown_request_lists_the_known_ones(tmp_path):
    """Twin: with requests r0 and r1, both are listed."""
    t = _api_trace(tmp_path / "two.h5", requests=2)
    r = run_inproc("check", t, "--request", "x")
    assert r.returncode == 2
    assert "no request 'x' (known: r0, r1)" in r.stderr
