"""vLLM's spec-decode counters, tallied per (draft tokens, accepted) and folded through vLLM's
own ``SpecDecodingStats.observe_draft`` when read (``hooks/vllm/counters.py``)."""

from __future__ import annotations

import pytest

from spectrace.hooks.vllm.counters import VllmCounters

pytest.importorskip("vllm.v1.spec_decode.metrics")


def _observed(k: int, drafts: list[tuple[int, int]]) -> VllmCounters:
    c = VllmCounters(k=k, dp_rank=0)
    for n, a in drafts:
        c.observe(n, a)
    return c


def test_the_tally_reads_as_vllms_sums():
    # 3 drafts of 4 accepting 2, one of 4 accepting 0, 2 of 3 accepting 3 (in mixed order).
    drafts = [(4, 2), (3, 3), (4, 0), (4, 2), (3, 3), (4, 2)]
    got = _observed(4, drafts).as_dict()
    # By hand: 6 drafts; 4*4 + 2*3 = 22 draft tokens; 3*2 + 0 + 2*3 = 12 accepted; position
    # 0 and 1 accepted by the three (4, 2) and the two (3, 3) drafts, position 2 by the
    # (3, 3) ones only.
    assert got == {
        "num_drafts": 6,
        "num_draft_tokens": 22,
        "num_accepted_tokens": 12,
        "num_accepted_tokens_per_pos": [5, 5, 2, 0],
    }


def test_reading_twice_and_counting_on_adds_only_the_new_drafts():
    c = _observed(2, [(2, 1), (2, 2)])
    assert c.as_dict()["num_accepted_tokens_per_pos"] == [2, 1]
    c.observe(2, 0)
    assert c.as_dict() == {
        "num_drafts": 3,
        "num_draft_tokens": 6,
        "num_accepted_tokens": 3,
        "num_accepted_tokens_per_pos": [2, 1],
    }


def test_a_draft_vllm_rejects_leaves_no_counters(capsys):
    # vLLM's observe_draft asserts accepted <= k: such counters are not compared.
    c = _observed(2, [(2, 1), (2, 3)])
    assert c.as_dict() is None
    assert c.broken
    assert "counting vLLM's spec-decode stats failed" in capsys.readouterr().err


def test_no_draft_counts_zero():
    assert _observed(3, []).as_dict() == {
        "num_drafts": 0,
        "num_draft_tokens": 0,
        "num_accepted_tokens": 0,
        "num_accepted_tokens_per_pos": [0, 0, 0],
    }
