"""A golden written from a real vLLM run keeps each request's final proposal (vLLM's drafter
proposes once more after the step that sampled the last token, and the oracle capture wraps
``propose``): the import must not count it against vLLM's counters, which never do.

The golden is made from the bundled real vLLM trace (traces/vllm.h5, captured by the plugin
from vLLM's V1 runner): per request its prompt, output and every recorded block's anchor and
drafts in order, with the counters vLLM's scheduler reported (``meta.checks.vllm``: 139
drafts, 556 draft tokens, 185 accepted, per slot [90, 40, 30, 25]). The trace holds 144
blocks: 139 verified and 5 unverified, one per request, anchored at its last token.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from inproc import run_inproc

from spectrace.hooks.importers.golden import import_golden
from spectrace.tracer.store import open_trace

ROOT = Path(__file__).resolve().parents[1]
VLLM = ROOT / "traces" / "vllm.h5"


def _golden_of(trace_path: Path, out: Path, keep_final: bool = True) -> dict:
    """The oracle-capture golden of a trace: records in request order, blocks by position."""
    t = open_trace(trace_path)
    b, r = t.blocks, t.requests
    records = []
    for i, rid in enumerate(r.req_id):
        rows = np.flatnonzero(b.request == i)
        rows = rows[np.argsort(b.position[rows], kind="stable")]
        blocks = [
            {"call": int(b.step[j]), "req_row": 0, "anchor": int(b.anchor[j]),
             "drafts": [int(x) for x in b.proposed[j] if x >= 0]}
            for j in rows
            if keep_final or b.accepted[j] >= 0
        ]  # fmt: skip
        records.append({"request_id": rid, "prompt_token_ids": [int(x) for x in r.prompt_ids[i]],
                        "output_token_ids": [int(x) for x in r.output_ids[i]], "blocks": blocks})  # fmt: skip
    v = t.meta["checks"]["vllm"]
    metrics = {
        "vllm:spec_decode_num_drafts": v["num_drafts"],
        "vllm:spec_decode_num_draft_tokens": v["num_draft_tokens"],
        "vllm:spec_decode_num_accepted_tokens": v["num_accepted_tokens"],
        "vllm:spec_decode_num_accepted_tokens_per_pos": v["num_accepted_tokens_per_pos"],
    }
    doc = {"num_speculative_tokens": t.meta["k"], "metrics": metrics, "records": records}
    out.write_text(json.dumps(doc))
    return doc


def _visible(trace_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Per verified block, the acceptance the output shows (the recorded one, cut at the
    output's end: max_tokens trims what vLLM accepted past it), and the final proposals'
    mask (unverified: accepted -1), derived from the trace alone."""
    t = open_trace(trace_path)
    b, r = t.blocks, t.requests
    last = np.array([len(p) + len(o) - 1 for p, o in zip(r.prompt_ids, r.output_ids)])
    verified = b.accepted >= 0
    shown = np.minimum(b.accepted, last[b.request] - b.position)[verified]
    return shown, ~verified


def test_the_bundled_vllm_run_has_one_final_proposal_per_request():
    # independent of the importer: each request's last block is unverified, anchored at its
    # last token (1 request) or past it (4, drafted from a bonus max_tokens trimmed)
    t = open_trace(VLLM)
    b, r = t.blocks, t.requests
    last = np.array([len(p) + len(o) - 1 for p, o in zip(r.prompt_ids, r.output_ids)])
    final = b.accepted < 0
    assert (len(b), int(final.sum()), len(set(b.request[final].tolist()))) == (144, 5, 5)
    at = b.position[final] - last[b.request[final]]
    assert (int((at == 0).sum()), int((at > 0).sum())) == (1, 4)
    shown, _ = _visible(VLLM)
    assert (len(shown), int(b.accepted[~final].sum()), int(shown.sum())) == (139, 185, 180)


@pytest.mark.parametrize("keep_final", [True, False], ids=["final-kept", "final-dropped"])
def test_a_golden_of_a_real_vllm_run_matches_its_counters(tmp_path, keep_final):
    src, out = tmp_path / "g.json", tmp_path / "g.h5"
    _golden_of(VLLM, src, keep_final)
    stats = import_golden(src, out, strict=True)  # nothing in it is a problem
    shown, _ = _visible(VLLM)
    placed = stats.check["placed"]
    assert (placed["drafts"], placed["draft_tokens"]) == (139, 556)
    assert placed["accepted_tokens"] == int(shown.sum())  # 180: 5 accepted drafts past max_tokens
    assert placed["accepted_per_pos"] == [int((shown > i).sum()) for i in range(4)]
    assert stats.check["unexplained"] == [] and stats.check["shortfall"]["drafts"] == 0
    kept = (144, 140, 1, 4) if keep_final else (139, 139, 0, 0)
    assert (stats.blocks, stats.placed, stats.final, stats.unplaced["final_past_end"]) == kept
    r = run_inproc("check", out, "--format", "json")
    assert r.returncode == 0, r.stdout
    assert [f["kind"] for f in json.loads(r.stdout)["findings"] if f["severity"] == "error"] == []


def test_a_real_golden_short_of_a_verified_block_is_missing_work(tmp_path):
    """The bug-shaped twin: drop one verified block (request 0's second) from the golden;
    vLLM counted it: drafts 138 vs 139 -> mismatch -> capture_incomplete, exit 1."""
    src, out = tmp_path / "g.json", tmp_path / "g.h5"
    doc = _golden_of(VLLM, src)
    del doc["records"][0]["blocks"][1]
    src.write_text(json.dumps(doc))
    stats = import_golden(src, out)
    assert stats.check["shortfall"]["drafts"] >= 1
    r = run_inproc("check", out, "--format", "json")
    assert r.returncode == 1
    kinds = [f["kind"] for f in json.loads(r.stdout)["findings"] if f["severity"] == "error"]
    assert "capture_incomplete" in kinds


def _check(tmp_path: Path, edit) -> tuple[int, list[str]]:
    """Import the real-run golden without its counters, edited by ``edit(records)``, and
    ``check`` it: (exit status, error kinds)."""
    src, out = tmp_path / "g.json", tmp_path / "g.h5"
    doc = _golden_of(VLLM, src)
    del doc["metrics"]
    edit(doc["records"])
    src.write_text(json.dumps(doc))
    import_golden(src, out)
    r = run_inproc("check", out, "--format", "json")
    return r.returncode, [
        f["kind"] for f in json.loads(r.stdout)["findings"] if f["severity"] == "error"
    ]


def _cut_tail(records):
    del records[0]["blocks"][-6:]  # request 0's last 5 verified blocks and its final proposal


def _drop_request(records):
    records[2]["blocks"] = []  # request 2 emitted 64 tokens without a block


@pytest.mark.parametrize("edit", [_cut_tail, _drop_request], ids=["tail-cut", "request-lost"])
def test_a_golden_without_counters_that_lost_blocks_is_missing_work(tmp_path, edit):
    """Without counters nothing cross-checks the blocks: the oracle capture records a model
    speculator's every proposal, so a request's output past its last block's reach, or
    emitted without any block, is work the golden lost (capture_incomplete, exit 1)."""
    assert _check(tmp_path, edit) == (1, ["capture_incomplete"])


def test_a_golden_without_counters_that_kept_every_block_passes(tmp_path):
    """Twin: the same golden, whole."""
    assert _check(tmp_path, lambda records: None) == (0, [])
