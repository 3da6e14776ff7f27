"""The thirteenth round's third part (the diff's selection, the API, per-request figures),
each defect with its clean twin. Expected values derived by hand from the bundled reference
trace (``traces/README.md``): its request 0 (prompt 10 + output 64 tokens) drafts from 10,
13, 15, 16, 19, 20, 21, 23, 24, 25, 30, 31, 32, 33 (accepted 1, so the next drafts from 35),
...; 139 blocks, 185 of 556 drafts accepted.

1. ``--positions 45:`` passed a pair whose request 0 stopped (aborted) at position 36: the
   finding was kept only when its first position lay inside the window. Content that differs
   from a position on lies in every window that reaches past it; work that stops lies in
   every window (round 21: missing work is never left out by one).
2. ``--positions 45:`` passed against a run without drafts whose output differs from 40.
3. ``spectrace.open(...).info()`` and ``diff --by-request`` counted blocks with impossible
   values (an acceptance rate of 5468%), which ``info`` leaves out.
4. The fixture's ``positions=12`` raised a bare TypeError; ``positions=[]`` printed a blank.
5. ``capture --strict`` refused a healthy run whose request never drafted (an n-gram request
   without a match, a request done at its first token) as "not in the log", although its
   ``[spec-update]`` lines name it.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from bundled import keep_block_rows
from inproc import run_inproc

import spectrace
from spectrace.tracer.gate import GateError, Selection
from spectrace.tracer.store import TraceWriter, open_trace

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "traces" / "reference.h5"


def _stopped_at_36(dst: Path) -> Path:
    """The reference trace with request 0 aborted after 26 output tokens (its sequence ends
    at 35, where its block at 33 with 1 accepted reaches) and its blocks from 35 on gone."""
    shutil.copyfile(REFERENCE, dst)
    with h5py.File(dst, "r+") as f:
        f["requests/output_ids"][0] = f["requests/output_ids"][0][:26]
        f["requests/finish_reason"][0] = "abort"
        g = f["blocks"]
        keep_block_rows(f, ~((g["request"][:] == 0) & (g["position"][:] >= 35)))
    return dst


def _kinds(*args) -> tuple[int, list[str]]:
    r = run_inproc(*args, "--format", "json")
    doc = json.loads(r.stdout)
    return r.returncode, [f["kind"] for f in doc["findings"] if f["severity"] == "error"]


def test_work_that_stops_before_a_window_is_missing_in_it(tmp_path):
    cut = _stopped_at_36(tmp_path / "cut.h5")
    assert _kinds("diff", REFERENCE, cut, "--positions", "45:") == (1, ["requests_incomplete"])
    assert _kinds("check", cut, "--positions", "45:") == (1, ["requests_incomplete"])


def test_work_that_stops_after_a_window_is_missing_in_it_too(tmp_path):
    # Missing work is never left out by a window (round 21): the run did not finish the
    # work the window is part of.
    cut = _stopped_at_36(tmp_path / "cut.h5")
    assert _kinds("diff", REFERENCE, cut, "--positions", "10:30") == (1, ["requests_incomplete"])


def test_clean_twin_the_whole_run_in_the_same_windows(tmp_path):
    copy = shutil.copyfile(REFERENCE, tmp_path / "copy.h5")
    for window in ("10:30", "45:"):
        assert _kinds("diff", REFERENCE, copy, "--positions", window) == (0, [])


def _vanilla(dst: Path, differ_from: int | None) -> Path:
    """The reference run's requests without blocks (k 0); request 0's output token at
    ``differ_from`` (a position) and after it, plus one, when given."""
    t = open_trace(REFERENCE)
    meta = {"engine": "x", "method": "none", "k": 0}
    with TraceWriter(dst, meta, flush_interval=0) as w:
        for i in range(len(t.requests)):
            prompt, out = t.requests.prompt_ids[i], t.requests.output_ids[i].copy()
            if i == 0 and differ_from is not None:
                out[differ_from - len(prompt) :] += 1
            w.request(t.requests.req_id[i], prompt, out, t.requests.finish_reason[i])
    t.close()
    return dst


def test_content_that_differs_before_a_window_is_in_it(tmp_path):
    van = _vanilla(tmp_path / "van.h5", differ_from=40)
    assert _kinds("diff", REFERENCE, van, "--positions", "45:") == (1, ["content_divergence"])


def test_clean_twin_a_vanilla_run_of_the_same_text(tmp_path):
    van = _vanilla(tmp_path / "same.h5", differ_from=None)
    assert _kinds("diff", REFERENCE, van, "--positions", "45:") == (0, [])


def _impossible(dst: Path) -> Path:
    shutil.copyfile(REFERENCE, dst)
    with h5py.File(dst, "r+") as f:
        acc = f["blocks/accepted"]
        acc[0], acc[1] = 30000, -5  # rows 0 and 1: requests 0 and 1's first (accepted 2, 0)
    return dst


def test_api_info_leaves_impossible_blocks_out(tmp_path):
    imp = _impossible(tmp_path / "imp.h5")
    info = spectrace.open(imp).info()
    # 139 blocks less the two: 137; 185 accepted less 2 and 0: 183 of 556 - 8 = 548
    rec = info["recorded"]
    assert (rec["blocks"], rec["accepted_tokens"], rec["verified_tokens"]) == (137, 183, 548)
    assert info["left_out_blocks"] == 2
    cli = json.loads(run_inproc("info", imp, "--format", "json").stdout)
    assert {k: v for k, v in cli.items() if k != "schema"} == info


def test_by_request_acceptance_leaves_impossible_blocks_out(tmp_path):
    imp = _impossible(tmp_path / "imp.h5")
    r = run_inproc("diff", REFERENCE, imp, "--by-request", "--format", "json")
    rows = json.loads(r.stdout)["by_request"]
    with h5py.File(REFERENCE, "r", locking=False) as f:
        req, acc = f["blocks/request"][:], f["blocks/accepted"][:].astype(np.int64)
        nv = f["blocks/num_verified"][:].astype(np.int64)
    for r in (0, 1):  # theirs without row r, that request's first block
        mine = np.flatnonzero(req == r)
        assert mine[0] == r
        assert rows[r]["acceptance_ours"] == pytest.approx(acc[mine].sum() / nv[mine].sum())
        rest = mine[1:]
        assert rows[r]["acceptance_theirs"] == pytest.approx(acc[rest].sum() / nv[rest].sum())
    assert rows[2]["acceptance_theirs"] == rows[2]["acceptance_ours"]  # twin: untouched


@pytest.mark.parametrize("positions", [12, True, "10:20"])
def test_fixture_positions_of_another_type_are_a_gate_error(positions):
    with pytest.raises(GateError) as e:
        Selection.of(positions=positions)
    assert str(e.value) == (
        f"positions: expected a range, (A, B), a slice or ints, not {positions!r}"
    )


def test_clean_twin_positions_given_as_ints_or_none():
    assert Selection.of(positions=[7, 3]).positions_text() == "3, 7"
    assert Selection.of(positions=[]).positions_text() == "(none)"
    assert Selection.of(positions=(40, None)).positions_text() == "40:"


# -- 5. --strict and requests that never drafted ---------------------------------------------


def test_strict_capture_takes_a_request_that_never_drafted(tmp_path):
    """An n-gram run (k 3, 5 tokens) whose request 3 never matches: its [spec-update] lines
    name it with drafts=0 and no [SPECTRACE] line does; --strict refused it as "not in the
    log"."""
    out, reqs, log = tmp_path / "ng.h5", tmp_path / "ng.req.jsonl", tmp_path / "ng.log"
    engine = [sys.executable, "-m", "spectrace.engine", "--method", "ngram", "--k", "3"]
    engine += ["--max-tokens", "5", "--requests-out", str(reqs)]
    args = ["--requests", reqs, "--log", log, "--meta", "method=ngram", "--strict"]
    r = run_inproc("capture", "-o", out, *args, "--", *engine)
    assert r.returncode == 0, r.stderr
    text = log.read_text()
    assert "[spec-update] req=3 " in text and "[SPECTRACE] req=3 " not in text
    with h5py.File(out, "r") as f:
        check = json.loads(f["meta"][()])["import"]["requests_check"]
    assert (check["unmatched"], check["log_requests"], check["file_requests"]) == (0, 5, 5)
    # twin: a request no line names is still not in the log
    extra = {"req_id": "99", "prompt_ids": [5, 6], "output_ids": [7, 8]}
    more = tmp_path / "more.jsonl"
    more.write_text(reqs.read_text() + json.dumps(extra) + "\n")
    r = run_inproc("import", "vt", log, "-o", tmp_path / "x.h5", "--requests", more, "--strict")
    assert r.returncode == 2
    assert "1 of its 6 requests are not in the log (first: req=99)" in r.stderr
