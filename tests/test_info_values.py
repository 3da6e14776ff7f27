"""``info`` and ``check`` never show a rate outside [0, 1] without the finding that explains
it (issue 11 leftover), and ``check`` names its one trace "trace", not "ours" (issue 12)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from spectrace.tracer.store import TraceWriter

SPECTRACE = os.path.join(os.path.dirname(sys.executable), "spectrace")
PROMPT, OUTPUT = [1, 2, 3], list(range(10, 18))


def write(path, first_accepted: int):
    """k=2, one request; block 0 at position 2 (drafts 10, 11 right), block 1 at position 5
    (drafts 13, 14 right, accepted 2). Block 0 records ``first_accepted``."""
    with TraceWriter(path, {"k": 2, "engine": "x"}, flush_interval=0) as w:
        w.request("r", prompt_ids=PROMPT, output_ids=OUTPUT, finish_reason="length")
        w.add_block(
            "r", 0, 2, 3, [10, 11], verified=[10, 11], accepted=first_accepted, emitted=[10, 11, 12]
        )
        w.add_block("r", 1, 5, 12, [13, 14], verified=[13, 14], accepted=2, emitted=[13, 14, 15])
    return path


def run(*args):
    r = subprocess.run([SPECTRACE, *args], capture_output=True, text=True)
    assert "Traceback" not in r.stderr, r.stderr
    return r


@pytest.fixture
def bad(tmp_path):
    return write(tmp_path / "bad.h5", 3)  # accepted 3 > k = 2: 5/4 = 125% if counted


@pytest.fixture
def good(tmp_path):
    return write(tmp_path / "good.h5", 2)


def test_info_json_leaves_impossible_blocks_out_and_says_why(bad):
    r = run("info", str(bad), "--format", "json")
    assert r.returncode == 0
    doc = json.loads(r.stdout)
    # Only block 1 counts: 2 accepted of 2 verified.
    assert doc["recorded"]["blocks"] == 1
    assert (doc["recorded"]["accepted_tokens"], doc["recorded"]["verified_tokens"]) == (2, 2)
    assert doc["recorded"]["acceptance_rate"] == 1.0
    assert doc["left_out_blocks"] == 1
    f = doc["impossible_values"]
    assert (f["kind"], f["severity"], f["side"], f["request"], f["position"]) == (
        "impossible_values",
        "error",
        "trace",
        "r",
        2,
    )
    assert (f["evidence"]["row"], f["evidence"]["rule"], f["evidence"]["value"]) == (
        0,
        "accepted > k",
        3,
    )


def test_info_text_prints_the_finding_line(bad):
    text = " ".join(run("info", str(bad)).stdout.split())
    assert "125.0%" not in text
    assert (
        "impossible values: trace: 1 blocks hold values no engine can produce (first: "
        "block 0, request r at position 2: accepted > k, accepted=3, limit 2)" in text
    )
    assert "the figures above leave the same 1 block(s) out" in text


def test_clean_twin_counts_every_block(good):
    doc = json.loads(run("info", str(good), "--format", "json").stdout)
    assert doc["impossible_values"] is None and doc["left_out_blocks"] == 0
    # Both blocks: 2 + 2 accepted of 2 + 2 verified.
    assert (doc["recorded"]["blocks"], doc["recorded"]["accepted_tokens"]) == (2, 4)
    assert doc["recorded"]["acceptance_rate"] == 1.0
    assert "impossible values" not in run("info", str(good)).stdout
    r = run("check", str(good))
    assert r.returncode == 0 and "findings: none" in r.stdout


def test_check_names_one_trace_trace_not_ours(bad):
    r = run("check", str(bad), "--format", "json")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert {f["side"] for f in doc["findings"]} == {"trace"}
    assert doc["summary"]["recorded"]["acceptance_rate"] == 1.0
    assert doc["summary"]["impossible_values"]["kind"] == "impossible_values"
    text = run("check", str(bad)).stdout
    assert "error   impossible_values (request r, position 2)" in text
    assert "(ours" not in text and "ours:" not in text


def _with_draftless_block(path, draftless: bool):
    """k=2; block 0 (optional) drafts nothing at position 2 (k=0: n-gram found no match),
    then one block at position 3 (anchor 10) whose drafts 11, 12 are both accepted."""
    with TraceWriter(path, {"k": 2, "engine": "x"}, flush_interval=0) as w:
        w.request("r", prompt_ids=PROMPT, output_ids=OUTPUT, finish_reason="length")
        if draftless:
            w.add_block("r", 0, 2, 3, [], verified=[], accepted=0, emitted=[10])
        w.add_block("r", 1, 3, 10, [11, 12], verified=[11, 12], accepted=2, emitted=[11, 12, 13])
    return path


@pytest.mark.parametrize("draftless", [True, False], ids=["k0-block", "clean"])
def test_a_block_without_drafts_is_no_verified_block(tmp_path, draftless):
    # vLLM's num_drafts counts only steps with scheduled drafts: by hand, 1 verified block,
    # 2 of 2 drafts accepted, mean acceptance length 1 + 2/1 = 3.0 with or without the k=0 one
    r = run("info", str(_with_draftless_block(tmp_path / "t.h5", draftless)), "--format", "json")
    rec = json.loads(r.stdout)["recorded"]
    assert (rec["blocks"], rec["verified_tokens"], rec["accepted_tokens"]) == (1, 2, 2)
    assert (rec["mean_acceptance_length"], rec["per_position"]) == (3.0, [1.0, 1.0])


@pytest.mark.parametrize("draftless", [True, False], ids=["k0-block", "clean"])
def test_golden_counters_skip_a_block_without_drafts(draftless):
    # the counters vLLM would print for the placed blocks: by hand 1 draft step, 2 draft
    # tokens, 2 accepted, both slots accepted once (the k=0 block is no draft step)
    from spectrace.hooks.importers.counters import placed_totals
    from spectrace.hooks.importers.placement import PlacedBlock

    blocks = [PlacedBlock(1, 3, 10, [11, 12], 2, False)]
    if draftless:
        blocks.insert(0, PlacedBlock(0, 2, 3, [], 0, False))
    got = placed_totals(blocks, 2)
    assert (got["drafts"], got["draft_tokens"], got["accepted_tokens"]) == (1, 2, 2)
    assert got["accepted_per_pos"] == [1, 1]
