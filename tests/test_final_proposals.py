"""A request's final proposal (the block drafted after its last output token, never
verified: num_verified -1) is compared when both sides drafted one at the same request pair
and position: both drafted from the same context, prompt + output up to and including the
last token. One only one side drafted stays off matched content (vLLM drafts after the last
token, our reference engine does not), and none counts as verified in the acceptance figures.

The bundled vLLM trace (traces/vllm.h5) holds 144 blocks: 139 verified and 5 final proposals,
one per request. Request 0-baad9995 (prompt 10 + output 64 tokens) has its final proposal at
position 73, its last token; the other four lie past their output's end (positions 80, 79, 74
and 76 against last tokens 77, 75, 73 and 75: drafted from the bonus token of a step that
max_tokens trimmed, so the tokens before their anchors are in neither output) and stay
unpaired. The expected figures are derived below from the trace's columns alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from bundled import edited_copy
from inproc import run_inproc

ROOT = Path(__file__).resolve().parents[1]
VLLM = ROOT / "traces" / "vllm.h5"
REF = ROOT / "traces" / "reference.h5"


def _columns(path: Path) -> dict:
    """Per block: request, position, num_verified; per request: full sequence length."""
    with h5py.File(path, "r", locking=False) as f:  # as spectrace opens it (one process)
        b, r = f["blocks"], f["requests"]
        n = len(r["req_id"])
        return {
            "request": b["request"][:],
            "position": b["position"][:],
            "num_verified": b["num_verified"][:],
            "length": np.array(
                [len(r["prompt_ids"][i]) + len(r["output_ids"][i]) for i in range(n)]
            ),
        }


def _at_last_token(c: dict) -> np.ndarray:
    """bool [blocks]: final proposals anchored at their request's last token."""
    return (c["num_verified"] < 0) & (c["position"] == c["length"][c["request"]] - 1)


def _diff(ours: Path, theirs: Path) -> tuple[int, dict]:
    r = run_inproc("diff", ours, theirs, "--format", "json")
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def _finals_shifted(dst: Path) -> Path:
    """traces/vllm.h5 with 1 added to every id of each final proposal (mod the 2048 ids)."""
    edited_copy(VLLM, dst)
    with h5py.File(dst, "r+") as f:
        nv, prop = f["blocks/num_verified"][:], f["blocks/proposed"][:]
        rows = nv < 0
        prop[rows] = np.where(prop[rows] >= 0, (prop[rows] + 1) % 2048, prop[rows])
        f["blocks/proposed"][:] = prop
    return dst


def test_figures_derived_from_the_trace():
    c = _columns(VLLM)
    assert len(c["request"]) == 144 and int((c["num_verified"] < 0).sum()) == 5
    assert int(_at_last_token(c).sum()) == 1  # request 0 at 73; the other four past the end
    # a copy pairs with itself at every (request, position) up to the last token
    on = c["position"] <= c["length"][c["request"]] - 1
    assert len({(int(r), int(p)) for r, p in zip(c["request"][on], c["position"][on])}) == 140


def test_final_proposals_that_differ_are_a_divergence(tmp_path):
    c = _columns(VLLM)
    theirs = _finals_shifted(tmp_path / "finals.h5")
    code, d = _diff(VLLM, theirs)
    assert code == 1
    # 139 verified blocks and request 0's final proposal at its last token pair; that one
    # differs (every id shifted); the four past the output's end stay unpaired
    assert d["agreement"]["paired_blocks"] == 140
    assert d["agreement"]["exact_matches"] == 140 - int(_at_last_token(c).sum()) == 139
    assert d["reasons"] == ["1 of 140 paired blocks differ"]
    cov = d["coverage"]
    assert (cov["ours_on_matched_content"], cov["theirs_on_matched_content"]) == (140, 140)
    (ex,) = [e for e in d["examples"]]
    assert (ex["position"], ex["first_differing_slot"]) == (73, 0)
    for side in ("ours", "theirs"):  # the final proposal is never counted as verified
        rec = d["acceptance"][side]["matched_content"]["recorded"]
        assert (rec["blocks"], rec["verified_tokens"], rec["accepted_tokens"]) == (139, 556, 185)


def test_clean_twin_pairs_the_final_proposal_and_agrees(tmp_path):
    theirs = edited_copy(VLLM, tmp_path / "same.h5")
    code, d = _diff(VLLM, theirs)
    assert code == 0, d["reasons"]
    assert (d["agreement"]["paired_blocks"], d["agreement"]["exact_matches"]) == (140, 140)
    assert [f["kind"] for f in d["findings"]] == ["degenerate_output"]  # the model's loop
    rec = d["acceptance"]["theirs"]["matched_content"]["recorded"]
    assert (rec["blocks"], rec["verified_tokens"], rec["accepted_tokens"]) == (139, 556, 185)


def test_final_proposals_on_one_side_stay_unpaired(tmp_path):
    c = _columns(VLLM)
    keep = c["num_verified"] >= 0
    theirs = edited_copy(VLLM, tmp_path / "nofinal.h5", keep=keep, drop_meta=("checks",))
    for ours, other in ((VLLM, theirs), (theirs, VLLM)):
        code, d = _diff(ours, other)
        assert code == 0, d["reasons"]
        assert d["agreement"]["paired_blocks"] == 139
        cov = d["coverage"]
        assert sorted([cov["ours_on_matched_content"], cov["theirs_on_matched_content"]]) == [
            139,
            139,
        ]
        assert sorted([cov["ours_blocks"], cov["theirs_blocks"]]) == [139, 144]
    # the reference engine drafts no final proposal: vLLM's five stay off matched content
    code, d = _diff(REF, VLLM)
    assert code == 0 and d["agreement"]["paired_blocks"] == 139
    assert d["coverage"]["theirs_on_matched_content"] == 139
    r = run_inproc("diff", REF, VLLM)
    assert "not on matched content: 5 of theirs" in r.stdout
    assert "a request's final proposal that only one side drafted" in r.stdout


def _shorter(dst: Path, shift: bool = False) -> Path:
    """traces/vllm.h5 with request 0's output cut to 60 tokens (full sequence 70): its block
    at position 69 (verified in the original) becomes its final proposal, unverified, and
    its block at 73 goes; with ``shift``, that final proposal's ids + 1."""
    c = _columns(VLLM)
    keep = ~((c["request"] == 0) & (c["position"] == 73))
    edited_copy(VLLM, dst, keep=keep, drop_meta=("checks",))
    with h5py.File(dst, "r+") as f:
        b = f["blocks"]
        (j,) = np.flatnonzero((b["request"][:] == 0) & (b["position"][:] == 69))
        for name in ("num_verified", "accepted", "num_emitted", "verified", "emitted"):
            a = b[name][:]
            a[j] = 0 if name == "num_emitted" else -1
            b[name][:] = a
        if shift:
            a = b["proposed"][:]
            a[j] = (a[j] + 1) % 2048
            b["proposed"][:] = a
        f["requests/output_ids"][0] = f["requests/output_ids"][0][:60]
        f["requests/finish_reason"][0] = "stop"
    return dst


@pytest.mark.parametrize("shift", [False, True])
def test_shorter_output_final_pairs_with_the_longer_sides_block(tmp_path, shift):
    # Decision: one output a prefix of the other, the shorter side's final proposal at its
    # last token (69) was drafted from prompt + output[:60], as the longer side's block at
    # 69 was: the same context, so they pair (the longer side's is verified, ours not).
    short = _shorter(tmp_path / "short.h5", shift)
    c = _columns(short)
    assert int(_at_last_token(c).sum()) == 1
    for ours, theirs, side in ((VLLM, short, "theirs"), (short, VLLM, "ours")):
        code, d = _diff(ours, theirs)
        assert code == int(shift), d["reasons"]
        # 139 = request 0's blocks before 69 and at 69, and every other request's verified
        # blocks (the original's final at 73 and the four past the end stay unpaired)
        assert d["agreement"]["paired_blocks"] == 139
        assert d["agreement"]["exact_matches"] == 139 - int(shift)
        other = "ours" if side == "theirs" else "theirs"
        short_acc = d["acceptance"][side]["matched_content"]["recorded"]
        long_acc = d["acceptance"][other]["matched_content"]["recorded"]
        assert (short_acc["blocks"], long_acc["blocks"]) == (138, 139)
        if not shift:
            assert [f["kind"] for f in d["findings"]] == ["degenerate_output"]


def test_duckdb_pair_query_pairs_final_proposals_as_the_diff(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    pytest.importorskip("pyarrow")
    from spectrace.tracer.export import block_columns, request_columns, write_parquet
    from spectrace.tracer.export_sql import PAIR_FIGURES
    from spectrace.tracer.store import open_trace

    short, finals = _shorter(tmp_path / "short.h5"), _finals_shifted(tmp_path / "finals.h5")
    nofinal = edited_copy(VLLM, tmp_path / "nofinal.h5", keep=_columns(VLLM)["num_verified"] >= 0)
    runs = {"vllm": VLLM, "short": short, "finals": finals, "nofinal": nofinal}
    out = tmp_path / "x"
    for name, path in runs.items():
        t = open_trace(path)
        write_parquet(block_columns(t, name), "blocks", out)
        write_parquet(request_columns(t, name), "requests", out)
    for ours, theirs in (("vllm", "short"), ("short", "vllm"), ("vllm", "finals"),
                         ("nofinal", "vllm")):  # fmt: skip
        _, d = _diff(runs[ours], runs[theirs])
        cur = duckdb.connect().execute(
            PAIR_FIGURES.format(out=out), {"ours": ours, "theirs": theirs}
        )
        row = dict(zip([x[0] for x in cur.description], cur.fetchone()))
        agr, cov = d["agreement"], d["coverage"]
        assert (row["paired_blocks"], row["exact_matches"]) == (
            agr["paired_blocks"],
            agr["exact_matches"],
        )
        assert row["ours_on_matched_content"] == cov["ours_on_matched_content"]
        assert row["theirs_on_matched_content"] == cov["theirs_on_matched_content"]
