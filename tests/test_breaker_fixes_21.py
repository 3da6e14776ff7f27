"""The twenty-first round of defects (fresh-user round 22, real runs), each with its clean
twin; expected values derived by hand in the comments from the bundled traces
(traces/README.md: 5 requests of 64 output tokens, prompts of 10, 14, 12, 10 and 12 tokens;
request 1 loops from position 30 with period 3 in both traces).

1. Against a run of a smaller max_tokens (its outputs a prefix of ours), ours' loop was an
   error, "the other engine's output does not loop there": the shorter output holds the
   same loop, too short to show one. Now a warning that nothing says whether it loops.
2. Runs of different methods (draft_model vs ngram), or of different n-gram settings, were
   blamed on the drafter: ``unverified_drafts`` ("went on without drafting") and
   ``stale_state``. Drafts of other configurations need not agree: ``draft_mismatch`` now
   names the difference, and the cross-side drafting checks and stale_state stand down.
3. A capture stopped by ``--timeout`` in vLLM's shutdown, every request finished and the
   counters equal, said "requests and blocks after that point are missing".
4. ``replay`` ignored REF's method and k (an n-gram trace replayed as draft_model k=4).
5. A run of max_tokens 1 (only final proposals) against a full run said "the engines never
   drafted from the same anchor position". (Since final proposals compare where both sides
   drafted at a position, each pairs with the full run's first block, drafted from the same
   context; the "only final proposals" line stays for a full run without blocks there.)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
from bundled import edited_copy
from inproc import run_inproc
from test_breaker_fixes_19 import _one_token

from spectrace.tracer.store import open_trace

ROOT = Path(__file__).resolve().parents[1]
VLLM, REF = ROOT / "traces" / "vllm.h5", ROOT / "traces" / "reference.h5"


def _diff(*args) -> tuple[int, dict[str, dict]]:
    r = run_inproc("diff", *args, "--format", "json")
    assert r.stdout, r.stderr
    return r.returncode, {f["kind"]: f for f in json.loads(r.stdout)["findings"]}


# -- 1. a loop against a shorter run -----------------------------------------------------------


def _short(tmp_path: Path, diverge_at: int | None = None) -> Path:
    """The reference run cut to 32 output tokens (request 1 then ends at 14 + 32 - 1 = 45:
    16 tokens from its loop's start at 30, fewer than the 24 a loop needs), its blocks past
    the cut gone; ``diverge_at``: request 1's token there changed (its loop broken)."""
    with h5py.File(REF, "r", locking=False) as f:
        req, pos = f["blocks/request"][:], f["blocks/position"][:]
        end = np.array([len(p) + 32 for p in f["requests/prompt_ids"][:]])
    out = edited_copy(REF, tmp_path / "short.h5", keep=pos < end[req] - 1, drop_meta=("checks",))
    with h5py.File(out, "r+") as f:
        r = f["requests"]
        for i in range(5):
            o = r["output_ids"][i][:32]
            if i == 1 and diverge_at is not None:
                o[diverge_at - 14] = 2047
            r["output_ids"][i] = o
    return out


def test_a_loop_against_a_shorter_run_of_the_same_text_is_a_warning(tmp_path):
    code, found = _diff(REF, _short(tmp_path), "--ignore", "requests_incomplete")
    assert code == 0
    loop = found["degenerate_output"]
    assert (loop["severity"], loop["position"]) == ("warning", 30)
    assert "too soon after to show one" in loop["message"]


def test_a_loop_the_shorter_run_breaks_is_still_an_error(tmp_path):
    code, found = _diff(REF, _short(tmp_path, diverge_at=40), "--ignore", "requests_incomplete")
    assert code == 1
    assert found["degenerate_output"]["severity"] == "error"


# -- 2. runs of other configurations -----------------------------------------------------------


def _theirs(tmp_path: Path, name: str, meta: dict) -> Path:
    """vLLM's trace with /meta ``meta``, request 2's blocks at positions 19 and 20 gone
    (drafted from by ours: a skipped anchor), and slot 0 of the first 8 blocks that accepted
    nothing set to id 2047 (verified too: proposals that differ, counts unchanged)."""
    with h5py.File(VLLM, "r", locking=False) as f:
        req, pos = f["blocks/request"][:], f["blocks/position"][:]
    keep = ~((req == 2) & np.isin(pos, (19, 20)))
    out = edited_copy(VLLM, tmp_path / f"{name}.h5", keep=keep, meta=meta, drop_meta=("checks",))
    with h5py.File(out, "r+") as f:
        rows = np.flatnonzero(f["blocks/accepted"][:] == 0)[:8]
        for col in ("proposed", "verified"):
            m = f["blocks"][col][:]
            m[rows, 0] = 2047
            f["blocks"][col][:] = m
    return out


def test_runs_of_different_methods_name_the_methods(tmp_path):
    theirs = _theirs(tmp_path, "ngram", {"method": "ngram"})
    code, found = _diff(REF, theirs)
    assert code == 1
    assert found["draft_mismatch"]["message"].endswith(
        "the runs use different methods (ours draft_model, theirs ngram): their drafts need "
        "not agree"
    )
    assert "unverified_drafts" not in found and "stale_state" not in found


def test_runs_of_different_ngram_settings_name_them(tmp_path):
    ours = edited_copy(
        VLLM, tmp_path / "ours.h5", meta={"method": "ngram", "ngram": {"prompt_lookup_max": 3}}
    )
    theirs = _theirs(tmp_path, "l2", {"method": "ngram", "ngram": {"prompt_lookup_max": 2}})
    code, found = _diff(ours, theirs)
    assert code == 1
    assert (
        "the runs' n-gram settings differ (prompt_lookup_max 3 vs 2)"
        in (found["draft_mismatch"]["message"])
    )
    assert "unverified_drafts" not in found


def test_runs_of_one_configuration_still_miss_skipped_anchors(tmp_path):
    # The twin: both n-gram with the same (recorded) settings: on identical content the
    # same drafter drafts from the same anchors, so the skipped ones are lost drafts.
    same = {"method": "ngram", "ngram": {"prompt_lookup_max": 3}}
    ours = edited_copy(VLLM, tmp_path / "ours.h5", meta=same)
    code, found = _diff(ours, _theirs(tmp_path, "same", same))
    assert code == 1
    assert "unverified_drafts" in found
    assert "need not agree" not in found.get("draft_mismatch", {}).get("message", "")


# -- 3. a timeout in the shutdown --------------------------------------------------------------

TIMEOUT = {"capture": {"ended": "timeout", "exit_status": 143, "signal": 15, "timeout_s": 24.0}}


def test_a_timeout_after_the_work_says_so(tmp_path):
    t = edited_copy(VLLM, tmp_path / "to.h5", meta=TIMEOUT)  # checks ok, every request length
    code, found = _diff(REF, t)
    assert code == 1
    msg = found["capture_incomplete"]["message"]
    assert msg.endswith(
        "every request finished and the trace equals the engine's counters: the engine was "
        "stopped after its work (a hung shutdown?), not during it"
    )


def test_a_timeout_before_a_request_finished_says_work_is_missing(tmp_path):
    t = edited_copy(VLLM, tmp_path / "to.h5", meta=TIMEOUT)
    with h5py.File(t, "r+") as f:
        f["requests/finish_reason"][4] = "unfinished"
    code, found = _diff(REF, t)
    assert code == 1
    assert found["capture_incomplete"]["message"].endswith(
        "requests and blocks after that point are missing, agreement of the rest proves nothing"
    )


# -- 4. replay takes REF's method and k --------------------------------------------------------


def test_replay_takes_the_references_method_and_k(tmp_path):
    ref = edited_copy(VLLM, tmp_path / "ng.h5", meta={"method": "ngram", "k": 3})
    r = run_inproc("replay", ref, "-o", tmp_path / "out.h5", "--positions", "1")
    assert r.returncode == 0, r.stderr
    assert f"spectrace: replay: method ngram and k 3 from {ref}'s /meta" in r.stderr
    meta = open_trace(tmp_path / "out.h5").meta
    assert (meta["method"], meta["k"]) == ("ngram", 3)


def test_replay_options_win_over_the_references_meta(tmp_path):
    ref = edited_copy(VLLM, tmp_path / "ng.h5", meta={"method": "ngram", "k": 3})
    r = run_inproc(
        "replay", ref, "-o", tmp_path / "out.h5", "--positions", "1", "--method", "draft_model",
        "--k", "2",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "/meta" not in r.stderr
    meta = open_trace(tmp_path / "out.h5").meta
    assert (meta["method"], meta["k"]) == ("draft_model", 2)


# -- 5. only final proposals against a full run ------------------------------------------------


def test_a_run_of_final_proposals_against_a_full_run_says_so(tmp_path):
    one = _one_token(VLLM, tmp_path / "v1.h5", keep_first=True)
    r = run_inproc("diff", one, shutil.copyfile(VLLM, tmp_path / "full.h5"))
    assert r.returncode == 1  # the full run's work has no partner: requests_incomplete
    # Each final proposal (at len(prompt), drafted from prompt + the one output token) pairs
    # with the full run's first block there, drafted from the same context: 5 paired, the
    # same ids (the copy keeps vLLM's proposals), so something was compared.
    assert "coverage: 5 paired blocks" in r.stdout
    assert "proposals identical 5/5" in r.stdout
    assert "nothing to compare" not in r.stdout
    # Without the full run's blocks at those positions nothing pairs, and the diff says why.
    with h5py.File(VLLM, "r", locking=False) as f:
        req, pos = f["blocks/request"][:], f["blocks/position"][:]
        plen = np.array([len(p) for p in f["requests/prompt_ids"][:]])
    later = edited_copy(VLLM, tmp_path / "later.h5", keep=pos != plen[req], drop_meta=("checks",))
    r = run_inproc("diff", one, later)
    assert r.returncode == 1
    assert (
        "ours has only final proposals (drafted after each request's last token, never "
        "verified): nothing to compare" in r.stdout
    )
