"""The seventh new user's defects, each with its clean twin (expected values derived by hand
from the bundled traces: ``traces/README.md``).

1. A speculative run that recorded no block at all (its /meta naming ``method`` draft_model,
   k 4: every draft lost, as when drafts are never installed or the hook drops them all)
   passed ``diff`` against a run that drafts (exit 0, "no divergence in content"): it was
   read as a vanilla baseline (``content_only``). Only a side whose /meta names no
   speculative method (or k 0) is a vanilla run; the other side's requests never draft:
   ``unverified_drafts``, exit 1.
2. A trace holding verified blocks twice (the bundled vLLM trace with its first 10 rows
   appended again: a record written twice) passed ``diff`` (exit 0, "no divergence") and
   ``check``, ``validate`` called it valid and ``info`` counted 149 verified blocks where
   vLLM counted 139: no engine verifies from one anchor position of a request twice.
   ``impossible_values`` (the repeats left out of the figures) and a ``validate`` problem.
3. A ``VT_SPEC_TRACE`` log cut short (its first 300 of 697 lines: no request has printed
   ``finished=1`` yet), imported with the run's complete requests file, passed ``check``
   (exit 0): the file's finish reasons hid that the log lost its tail (79 of 139 blocks).
   Each request the file says finished and the log never finished is counted
   (``ends before finished=1``): ``capture_incomplete``.
4. A vLLM-hook trace closed with /meta ``checks`` still ``pending`` (the hook's close
   raised before it flushed the last blocks and cross-checked them: ``Session.close``
   closes the file complete in a ``finally``), and one whose ``checks`` say ``mismatch``
   without naming the counters, passed ``check`` and ``diff`` (exit 0):
   ``capture_incomplete``.
5. A recorder error of the vLLM hook (``Session.fail``: ``SPECTRACE_STRICT=0`` stops the
   recording, strict mode raises into vLLM) left no mark in the trace: with vLLM's counters
   out of reach (``checks`` ``unavailable``) the trace that lost every later block passed
   ``check`` (exit 0). /meta ``aborted`` now names the error: ``capture_incomplete``.
6. ``validate`` called a file valid whose /requests holds one request id on two rows
   (the bundled vLLM trace with its first request row appended again): no writer writes
   that (``TraceWriter.request`` keeps one row per id); a problem naming the row.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from inproc import run_inproc

from spectrace.tracer.store import open_trace

ROOT = Path(__file__).resolve().parents[1]
REFERENCE, VLLM = ROOT / "traces" / "reference.h5", ROOT / "traces" / "vllm.h5"
LOG, REQUESTS = ROOT / "traces" / "reference.vt.log", ROOT / "traces" / "reference.requests.jsonl"
#: the bundled vLLM trace's request ids, in its /requests order
VLLM_IDS = ["0-baad9995", "1-bfcb47c7", "2-9f89bbd7", "3-b7ce7833", "4-af469d6f"]


def _edited(
    src: Path, dst: Path, meta: dict | None = None, drop_blocks: bool = False, again: int = 0
) -> Path:
    """A copy of ``src`` with /meta items replaced by ``meta`` and, with ``drop_blocks``,
    every /blocks column cut to 0 rows (the dtype and width kept); ``again``: its first
    ``again`` /blocks rows appended once more."""
    shutil.copyfile(src, dst)
    with h5py.File(dst, "r+") as f:
        if meta:
            m = json.loads(f["meta"][()])
            m.update(meta)
            del f["meta"]
            f["meta"] = json.dumps(m)
        if drop_blocks or again:
            g = f["blocks"]
            for name in list(g):
                a = g[name][:0] if drop_blocks else np.concatenate([g[name][:], g[name][:again]])
                del g[name]
                g.create_dataset(name, data=a, maxshape=(None, *a.shape[1:]), chunks=True)
    return dst


def _diff(a: Path, b: Path) -> tuple[int, dict]:
    r = run_inproc("diff", a, b, "--format", "json")
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, json.loads(r.stdout)


# -- 1. a speculative run without a block is no vanilla baseline ------------------------------


@pytest.mark.parametrize("spec_side", ["theirs", "ours"])
def test_a_speculative_run_that_lost_every_draft_diverges(tmp_path, spec_side):
    lost = _edited(VLLM, tmp_path / "lost.h5", drop_blocks=True)  # meta: draft_model, k=4
    a, b = (REFERENCE, lost) if spec_side == "theirs" else (lost, REFERENCE)
    code, doc = _diff(a, b)
    assert code == 1 and doc["diverged"] is True
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    # The trace itself says it lost them (its recorder counted 144 blocks; breaker 10), and
    # against the drafting side every request never drafts.
    assert [(f["kind"], f["side"]) for f in errors] == [
        ("capture_incomplete", spec_side),
        ("unverified_drafts", spec_side),
    ]
    assert errors[0]["evidence"]["recorded_blocks"] == 144
    # the reference drafts first from position 10 in request 0 (its first /blocks row)
    assert (errors[1]["request"], errors[1]["position"]) == ("0-baad9995", 10)
    assert errors[1]["evidence"]["requests_never_drafting"] == VLLM_IDS
    assert all(f["kind"] != "content_only" for f in doc["findings"])


@pytest.mark.parametrize("meta", [{"method": None, "k": 0}, {"method": "none"}, {"k": 0}])
def test_a_vanilla_run_without_blocks_is_still_a_content_only_pass(tmp_path, meta):
    """Twin: the same trace whose /meta names no method, or k 0 (what the vLLM hook writes
    without a speculative config): a vanilla baseline, identical outputs pass. (An unknown
    method with k 4 is a speculative run since breaker 11: an import of a run whose drafts
    were never installed records its lookahead as k.) Its /meta checks go too (a vanilla
    run's recorder counts no block; 144 would say blocks were lost)."""
    meta = {**meta, "checks": None}
    vanilla = _edited(VLLM, tmp_path / "vanilla.h5", meta=meta, drop_blocks=True)
    code, doc = _diff(REFERENCE, vanilla)
    assert code == 0 and doc["diverged"] is False
    assert [(f["kind"], f["side"]) for f in doc["findings"] if f["severity"] != "warning"] == [
        ("content_only", "theirs")
    ]


# -- 2. a block verified twice ----------------------------------------------------------------


def test_blocks_verified_twice_are_impossible_values(tmp_path):
    twice = _edited(VLLM, tmp_path / "twice.h5", again=10)  # rows 144..153 repeat 0..9
    code, doc = _diff(REFERENCE, twice)
    assert code == 1
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    # and 154 blocks where the recorder counted 144 at close (breaker 10)
    assert [(f["kind"], f["side"]) for f in errors] == [
        ("impossible_values", "theirs"),
        ("capture_incomplete", "theirs"),
    ]
    assert errors[1]["evidence"]["recorded_blocks"] == 144
    ev = errors[0]["evidence"]
    assert (ev["rules"], ev["row"], ev["value"]) == (
        {"verified twice at one position": 10},
        144,
        10,
    )
    # row 0 of the bundled trace: request 0-baad9995 drafting from position 10
    assert (errors[0]["request"], errors[0]["position"]) == ("0-baad9995", 10)
    # the repeats are left out: theirs' figures are the bundled 185/556 again
    acc = doc["acceptance"]["theirs"]["all_content"]["recorded"]
    assert (acc["blocks"], acc["accepted_tokens"], acc["verified_tokens"]) == (139, 185, 556)
    assert run_inproc("check", twice).returncode == 1
    r = run_inproc("validate", twice)
    assert r.returncode == 1
    assert r.stdout.splitlines() == [
        f"{twice}: a second verified block at one request position (a record written "
        f"twice?) at row 144 (10 rows) (field=blocks/position, value=10)"
    ]


def test_one_position_in_two_requests_is_no_repeat(tmp_path):
    """Twin: the bundled trace has blocks of requests 0 and 3 both at position 10 (and of
    2 and 4 at 12), and each request's final proposal is unverified: valid, exit 0."""
    with h5py.File(VLLM, "r", locking=False) as f:  # as spectrace opens it
        req, pos = f["blocks/request"][:], f["blocks/position"][:]
    assert set(req[pos == 10].tolist()) >= {0, 3}
    assert run_inproc("validate", VLLM).returncode == 0
    assert run_inproc("check", VLLM).returncode == 0
    code, doc = _diff(REFERENCE, VLLM)
    assert code == 0 and doc["diverged"] is False


# -- 3. a log cut short beside a complete requests file ----------------------------------------


def _import_head(tmp_path: Path, lines: int | None, requests: Path = REQUESTS) -> Path:
    """``import vt`` of the bundled log's first ``lines`` lines (None: all 697)."""
    log = tmp_path / "run.vt.log"
    log.write_text("".join(LOG.read_text().splitlines(keepends=True)[:lines]))
    out = tmp_path / "run.h5"
    r = run_inproc("import", "vt", log, "-o", out, "--requests", requests)
    assert r.returncode == 0, r.stderr
    return out


def _check(path: Path) -> tuple[int, list[dict]]:
    r = run_inproc("check", path, "--format", "json")
    errors = [f for f in json.loads(r.stdout)["findings"] if f["severity"] == "error"]
    return r.returncode, errors


def test_a_log_cut_short_beside_its_requests_file_is_missing_work(tmp_path):
    # the bundled log's first finished=1 is on line 539 (request 3): none before line 300
    assert "finished=1" not in "".join(LOG.read_text().splitlines(keepends=True)[:300])
    code, errors = _check(_import_head(tmp_path, 300))
    assert code == 1 and [f["kind"] for f in errors] == ["capture_incomplete"]
    ev = errors[0]["evidence"]
    assert ev["violations"] == {"ends before finished=1": 5}
    assert ev["first_violation"] == (
        f"{tmp_path / 'run.vt.log'}:300: ends before finished=1: the log ends before 5 "
        f"request(s) that the requests file says finished printed finished=1 (first: req=0): "
        f"their last blocks are missing"
    )


def test_a_whole_log_beside_its_requests_file_passes(tmp_path):
    """Twin: the whole log (every request prints finished=1) and the same file: clean, and
    the import counts no violation."""
    out = _import_head(tmp_path, None)
    assert _check(out) == (0, [])
    with open_trace(out) as t:
        assert t.meta["import"]["violations"] == {}


def test_a_cut_log_beside_a_file_without_finish_reasons_is_unfinished(tmp_path):
    """Twin: without finish reasons in the file the requests are marked ``unfinished``, as
    before (requests_incomplete in a diff), and nothing is counted twice."""
    bare = tmp_path / "bare.jsonl"
    rows = [json.loads(x) for x in REQUESTS.read_text().splitlines() if x.strip()]
    bare.write_text("".join(json.dumps({**r, "finish_reason": ""}) + "\n" for r in rows))
    out = _import_head(tmp_path, 300, bare)
    with open_trace(out) as t:
        assert t.meta["import"]["violations"] == {}
        assert list(t.requests.finish_reason) == ["unfinished"] * 5


# -- 4. /meta checks pending in a closed file, or a mismatch that names nothing -----------------


def _checked(tmp_path: Path, checks: dict) -> tuple[int, list[dict]]:
    return _check(_edited(VLLM, tmp_path / "checked.h5", meta={"checks": checks}))


@pytest.mark.parametrize(
    "checks, pending, names",
    [
        ({"status": "pending", "note": "replaced when the trace closes"}, True, []),
        ({"status": "mismatch", "mismatch": []}, False, ["counters not named"]),
        ({"status": "mismatch"}, False, ["counters not named"]),
    ],
)
def test_checks_pending_or_unnamed_mismatch_is_missing_work(tmp_path, checks, pending, names):
    code, errors = _checked(tmp_path, checks)
    assert code == 1 and [f["kind"] for f in errors] == ["capture_incomplete"]
    ev = errors[0]["evidence"]
    assert (ev["checks_pending"], ev["counters_mismatch"]) == (pending, names)
    assert run_inproc("diff", REFERENCE, tmp_path / "checked.h5").returncode == 1


@pytest.mark.parametrize(
    "checks",
    [
        {"status": "ok", "mismatch": []},
        {"status": "unavailable", "mismatch": []},  # not cross-checked: nothing says missing
    ],
)
def test_checks_ok_or_unavailable_pass(tmp_path, checks):
    """Twins: the statuses a finished close writes, with nothing else wrong: exit 0."""
    assert _checked(tmp_path, checks) == (0, [])


# -- 5. a recorder error of the vLLM hook is in the trace ---------------------------------------


def _session(tmp_path: Path, monkeypatch, error: bool) -> Path:
    """A hook session of request r-1 (prompt [5, 6], output [7, 8, 9]) with one verified
    block at position 1 (drafts [7, 8, 1, 2], 2 accepted); with ``error``, a recorder error
    in non-strict mode before the request's second proposal (which is then not recorded).
    No vLLM counters reach the close: checks ``unavailable``."""
    from spectrace.hooks.vllm.session import Session

    monkeypatch.setenv("SPECTRACE_STRICT", "0")
    path = tmp_path / "hook.h5"
    s = Session(path, {"k": 4, "dp_rank": 0, "source": "vllm-hook"})
    s.see_request("r-1", [5, 6], None)
    s.joiner.propose("r-1", 0, 1, 6, [7, 8, 1, 2])
    s.joiner.verdict("r-1", [7, 8, 1, 2], [7, 8, 9])
    if error:
        s.fail(RuntimeError("boom"), "V1 propose")
    if s.active:
        s.joiner.propose("r-1", 1, 4, 9, [3, 3, 3, 3])
    s.finish_request("r-1", [7, 8, 9], "length")
    s.close()
    return path


def test_a_recorder_error_is_missing_work(tmp_path, monkeypatch):
    path = _session(tmp_path, monkeypatch, error=True)
    with open_trace(path) as t:
        assert t.meta["checks"]["status"] == "unavailable"
        assert t.meta["aborted"].startswith("a recorder error: V1 propose: RuntimeError: boom")
    code, errors = _check(path)
    assert code == 1 and [f["kind"] for f in errors] == ["capture_incomplete"]
    assert errors[0]["evidence"]["aborted"].startswith("a recorder error: V1 propose")


def test_a_session_without_errors_passes(tmp_path, monkeypatch):
    """Twin: the same session without the error: no ``aborted``, exit 0."""
    path = _session(tmp_path, monkeypatch, error=False)
    with open_trace(path) as t:
        assert "aborted" not in t.meta and t.meta["checks"]["status"] == "unavailable"
    assert _check(path) == (0, [])


# -- 6. one request id on two rows --------------------------------------------------------------


def test_validate_reports_a_request_id_on_two_rows(tmp_path):
    twice = tmp_path / "ids.h5"
    shutil.copyfile(VLLM, twice)
    with h5py.File(twice, "r+") as f:
        for name in list(f["requests"]):
            a, dt = f["requests"][name][:], f["requests"][name].dtype
            del f["requests"][name]
            f["requests"].create_dataset(name, data=np.concatenate([a, a[:1]]), dtype=dt)
    r = run_inproc("validate", twice)
    assert r.returncode == 1
    assert r.stdout.splitlines() == [
        f"{twice}: a request id on a second row (one row per request) at row 5 "
        f"(field=requests/req_id, value='0-baad9995')"
    ]


def test_validate_takes_distinct_request_ids(tmp_path):
    """Twin: the bundled traces (ids 0..4, and 0-baad9995..4-af469d6f) are valid."""
    r = run_inproc("validate", VLLM, REFERENCE)
    assert r.returncode == 0
    assert r.stdout.splitlines() == [f"{VLLM}: valid", f"{REFERENCE}: valid"]


def test_a_pass_that_ignores_missing_work_says_so(tmp_path):
    """--ignore may let missing work pass (by design), but the passing verdict names what it
    left out: the cut log's one capture_incomplete (check), and with the diff's
    unverified_drafts two error findings (diff against the whole reference run)."""
    cut = _import_head(tmp_path, 300)
    r = run_inproc("check", cut, "--ignore", "capture_incomplete")
    assert r.returncode == 0
    assert "gate: passed, with 1 error finding ignored (capture_incomplete)" in r.stdout
    r = run_inproc("check", cut, "--ignore", "capture_incomplete", "--format", "json")
    assert json.loads(r.stdout)["gate"]["ignored"] == ["capture_incomplete"]
    ignore = ("--ignore", "capture_incomplete", "--ignore", "unverified_drafts")
    r = run_inproc("diff", cut, REFERENCE, *ignore)
    assert r.returncode == 0
    assert (
        "no divergence on comparable blocks, with 2 error findings ignored "
        "(capture_incomplete, unverified_drafts)"
    ) in r.stdout


def test_a_pass_with_nothing_ignored_says_nothing_more(tmp_path):
    """Twin: the whole log with the same --ignore: nothing was left out, the plain verdict."""
    whole = _import_head(tmp_path, None)
    r = run_inproc("check", whole, "--ignore", "capture_incomplete")
    assert r.returncode == 0 and "gate: passed\n" in r.stdout
    r = run_inproc("diff", whole, REFERENCE, "--ignore", "capture_incomplete")
    assert r.returncode == 0
    assert "no divergence on comparable blocks\n" in r.stdout


def test_strict_import_refuses_a_log_cut_before_finished(tmp_path):
    """--strict refuses every broken invariant: the cut log beside its requests file is exit
    2 naming the log's last line, and leaves no trace behind (a strict import is all or
    nothing)."""
    log = tmp_path / "cut.vt.log"
    log.write_text("".join(LOG.read_text().splitlines(keepends=True)[:300]))
    out = tmp_path / "cut.h5"
    r = run_inproc("import", "vt", log, "-o", out, "--requests", REQUESTS, "--strict")
    assert r.returncode == 2 and not out.exists()
    assert f"{log}:300: ends before finished=1: the log ends before 5 request(s)" in r.stderr


def test_strict_import_of_the_whole_log_with_its_requests_passes(tmp_path):
    """Twin: the whole log (every request prints finished=1), strict, imports all 139."""
    out = tmp_path / "whole.h5"
    r = run_inproc("import", "vt", LOG, "-o", out, "--requests", REQUESTS, "--strict")
    assert r.returncode == 0, r.stderr
    with open_trace(out) as t:
        assert len(t.blocks) == 139
