"""Fixes for a tester's findings on selections of lost requests, bookkeeping totals and runs of
different max_tokens. Inputs are edited copies of the bundled reference trace
(traces/README.md: 139 blocks, k 4, 5 requests "0".."4" of 64 output tokens, prompts of 10,
14, 12, 10 and 12 tokens; its recorded accepted counts sum to 185, and its last blocks' counts
run past the output's end, trimmed there: legitimately above the recomputed ones).

1. ``diff --request 2`` where theirs lost request 2 kept no finding ("findings: none"): the
   selection now keeps ``requests_incomplete`` about the selected id.
2. ``acceptance_bookkeeping`` quoted whole-trace totals (186 vs 180 for a 1-token edit): the
   message and evidence now give the disagreeing blocks' totals.
3. A run of a smaller max_tokens was only "did not complete": the message now asks whether the
   runs' max_tokens differ (still exit 1: the shorter side's work is missing).
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
from bundled import edited_copy
from inproc import run_inproc

REF = Path(__file__).resolve().parent.parent / "traces" / "reference.h5"


def _json(*argv) -> tuple[int, dict]:
    r = run_inproc(*argv, "--format", "json")
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout)


def _by_kind(doc: dict) -> dict[str, dict]:
    return {f["kind"]: f for f in doc["findings"]}


# -- 1. --request on a lost request keeps why it is lost ---------------------------------------


def _without_request(dst: Path, row: int) -> Path:
    """The reference with request row ``row`` and its blocks removed (the rows after it
    move up one: the blocks' request indexes follow)."""
    with h5py.File(REF, "r", locking=False) as f:
        req = f["blocks/request"][:]
    out = edited_copy(REF, dst, keep=req != row)
    with h5py.File(out, "r+") as f:
        g = f["requests"]
        for name in list(g):
            dtype, data = g[name].dtype, g[name][:]
            del g[name]
            g.create_dataset(name, data=np.delete(data, row), dtype=dtype, maxshape=(None,))
        r = f["blocks/request"][:]
        f["blocks/request"][:] = r - (r > row)
    return out


ABSENT_2 = "theirs: 1 request of the other side is absent (ours' id 2): their work is missing, "
ABSENT_2 += "not compared"


def test_request_selecting_a_lost_request_keeps_requests_incomplete(tmp_path):
    theirs = _without_request(tmp_path / "no2.h5", 2)
    with h5py.File(theirs, "r", locking=False) as f:  # the edit: ids 0, 1, 3, 4 left
        assert [x.decode() for x in f["requests/req_id"][:]] == ["0", "1", "3", "4"]
    code, doc = _json("diff", REF, theirs, "--request", "2")
    assert code == 1
    (f,) = doc["findings"]  # request 2's only finding; request 1's loop is not selected
    assert (f["kind"], f["severity"]) == ("requests_incomplete", "error")
    assert (f["side"], f["request"]) == ("theirs", "2")
    assert f["message"] == ABSENT_2
    assert f["evidence"]["missing"] == ["2"] and f["evidence"]["requests"] == 1
    assert doc["reasons"] == [
        "nothing selected: request 2 is in no matched request pair",
        "1 error finding(s), at most 0 allowed",
    ]
    # the threshold tolerating it still fails: it is missing work
    code, doc = _json("diff", REF, theirs, "--request", "2", "--max-errors", "1")
    assert code == 1 and doc["reasons"][1] == (
        "missing work (requests_incomplete): --max-errors tolerates none; --ignore KIND does"
    )
    # the text report names it instead of "findings: none"
    out = run_inproc("diff", REF, theirs, "--request", "2").stdout.splitlines()
    assert out[4:7] == [
        "findings (1):",
        "  error   requests_incomplete (theirs; request 2)",
        f"          {ABSENT_2}",
    ]


def test_clean_twin_request_of_a_pair_both_sides_hold(tmp_path):
    theirs = _without_request(tmp_path / "no2.h5", 2)
    # request 1 is paired: request 2's absence is outside the selection
    code, doc = _json("diff", REF, theirs, "--request", "1")
    assert code == 0 and doc["reasons"] == []
    assert [f["kind"] for f in doc["findings"]] == ["degenerate_output"]  # the bundled loop
    assert doc["findings"][0]["severity"] == "warning"
    # the trace against itself: request 2 paired, nothing missing
    code, doc = _json("diff", REF, REF, "--request", "2")
    assert code == 0 and doc["findings"] == []


# -- 2. bookkeeping totals cover the disagreeing blocks ----------------------------------------


def _recomputed(f: h5py.File, row: int) -> int:
    """The longest prefix of block ``row``'s drafts that its request's sequence (prompt +
    output) holds after the anchor."""
    r, pos, k = (int(f["blocks"][c][row]) for c in ("request", "position", "k"))
    seq = np.concatenate([f["requests/prompt_ids"][r], f["requests/output_ids"][r]])
    drafts, truth = f["blocks/proposed"][row][:k], seq[pos + 1 : pos + 1 + k]
    n = 0
    while n < min(len(drafts), len(truth)) and drafts[n] == truth[n]:
        n += 1
    return n


def _miscounted(dst: Path, rows: tuple[int, ...]) -> tuple[Path, list[tuple[int, int]]]:
    """The reference with ``rows``' accepted counts raised by 1 (num_emitted unchanged);
    returns the copy and each row's (recorded, recomputed) after the edit."""
    out = edited_copy(REF, dst)
    pairs = []
    with h5py.File(out, "r+") as f:
        acc = f["blocks/accepted"][:]
        for row in rows:
            rc = _recomputed(f, row)
            assert acc[row] == rc and f["blocks/num_verified"][row] == 4  # a real rejection
            acc[row] += 1
            pairs.append((int(acc[row]), rc))
        f["blocks/accepted"][:] = acc
    return out, pairs


# Rows 30 (request 0 at 21: accepted 1, drafts 1485 307 .., output 1485 83) and 32 (request 2
# at 24: accepted 1, drafts 530 307 .., output 530 12): mid-request rejections.


def test_bookkeeping_totals_are_those_of_the_disagreeing_block(tmp_path):
    trace, pairs = _miscounted(tmp_path / "m1.h5", (30,))
    assert pairs == [(2, 1)]
    code, doc = _json("check", trace)
    assert code == 1
    f = _by_kind(doc)["acceptance_bookkeeping"]
    assert f["message"] == (
        "trace: the recorded accepted count disagrees with the emitted stream in 1 of 139 "
        "blocks (recorded 2, recomputed 1 accepted tokens in that block)"
    )
    ev = f["evidence"]
    assert (ev["recorded_disagreeing"], ev["recomputed_disagreeing"]) == (2, 1)
    assert ev["blocks"] == 1 and ev["first"] == {"recorded": 2, "recomputed": 1}
    assert ev["emitted_count_mismatch"] == 1  # num_emitted 2 is no longer accepted + 1
    with h5py.File(trace, "r", locking=False) as t:  # whole-trace totals, as labelled
        assert ev["recorded_total"] == int(t["blocks/accepted"][:].sum()) == 186


def test_bookkeeping_totals_of_two_disagreeing_blocks(tmp_path):
    trace, pairs = _miscounted(tmp_path / "m2.h5", (30, 32))
    assert pairs == [(2, 1), (2, 1)]
    code, doc = _json("diff", REF, trace)
    assert code == 1
    f = _by_kind(doc)["acceptance_bookkeeping"]
    assert (f["side"], f["request"], f["position"]) == ("theirs", "0", 21)
    assert f["message"] == (
        "theirs: the recorded accepted count disagrees with the emitted stream in 2 of 139 "
        "blocks (recorded 4, recomputed 2 accepted tokens in those blocks)"
    )
    ev = f["evidence"]
    assert (ev["recorded_disagreeing"], ev["recomputed_disagreeing"]) == (4, 2)


def test_clean_twin_end_trimming_alone_is_no_bookkeeping(tmp_path):
    # the reference's own recorded/recomputed gap (its last blocks, trimmed) is no finding
    code, doc = _json("check", edited_copy(REF, tmp_path / "same.h5"))
    assert code == 0 and "acceptance_bookkeeping" not in _by_kind(doc)


# -- 3. runs of different max_tokens ----------------------------------------------------------


def _shortened(dst: Path, lengths: list[int], meta: dict | None = None) -> Path:
    """The reference with request i's output cut to ``lengths[i]`` tokens (finish still
    ``length``) and its blocks anchored at or past its new last token gone."""
    with h5py.File(REF, "r", locking=False) as f:
        req, pos = f["blocks/request"][:], f["blocks/position"][:]
        end = np.array([len(p) + n for p, n in zip(f["requests/prompt_ids"][:], lengths)])
    out = edited_copy(REF, dst, keep=pos < end[req] - 1, meta=meta)
    with h5py.File(out, "r+") as f:
        r = f["requests"]
        for i, n in enumerate(lengths):
            r["output_ids"][i] = r["output_ids"][i][:n]
    return out


def _incomplete(ours: Path, theirs: Path) -> tuple[int, dict]:
    code, doc = _json("diff", ours, theirs)
    return code, _by_kind(doc)["requests_incomplete"]


def test_a_run_of_a_smaller_max_tokens_says_so(tmp_path):
    code, f = _incomplete(_shortened(tmp_path / "s.h5", [40] * 5), REF)
    assert code == 1  # still missing work
    # request 0: prompt 10 + 40 output tokens: its work ends at position 50
    assert (f["severity"], f["side"], f["request"], f["position"]) == ("error", "ours", "0", 50)
    assert f["message"] == (
        "ours: 5 requests finished length after 40 output tokens where theirs ran 64 (first: "
        "request 0): the runs' max_tokens differ? the work past 40 tokens is missing, not "
        "compared"
    )
    assert f["evidence"]["cut_short"] == ["0", "1", "2", "3", "4"]
    # the other way round, and with both /meta recording max_tokens
    code, f = _incomplete(REF, _shortened(tmp_path / "t.h5", [40] * 5))
    assert (code, f["side"]) == (1, "theirs")
    assert f["message"].startswith(
        "theirs: 5 requests finished length after 40 output tokens where ours ran 64 "
    )
    ours = _shortened(tmp_path / "m.h5", [40] * 5, meta={"sampling": {"max_tokens": 40}})
    theirs = edited_copy(REF, tmp_path / "r.h5", meta={"sampling": {"max_tokens": 64}})
    code, f = _incomplete(ours, theirs)
    assert code == 1
    assert f["message"].endswith(
        "(first: request 0): the runs' max_tokens differ (40 vs 64): the work past 40 tokens "
        "is missing, not compared"
    )


def test_clean_twin_requests_cut_at_different_lengths_did_not_complete(tmp_path):
    # request 0 cut at 30, the others at 40: no common limit
    code, f = _incomplete(_shortened(tmp_path / "s.h5", [30, 40, 40, 40, 40]), REF)
    assert code == 1
    assert f["message"] == (
        "ours: 5 requests did not complete (first: request 0, finish length after 30 output "
        "tokens; theirs: length after 64 tokens): their work is missing, not compared"
    )
    # the same max_tokens recorded on both sides: no max_tokens difference to suspect
    same = {"sampling": {"max_tokens": 64}}
    code, f = _incomplete(
        _shortened(tmp_path / "m.h5", [40] * 5, meta=same),
        edited_copy(REF, tmp_path / "r.h5", meta=same),
    )
    assert code == 1 and f["message"].startswith("ours: 5 requests did not complete (first: ")
    # runs of one length: nothing missing
    code, doc = _json("diff", REF, edited_copy(REF, tmp_path / "same.h5"))
    assert code == 0 and "requests_incomplete" not in _by_kind(doc)
