"""Fixtures shared by the test folders (each folder's conftest.py adds its own)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

#: num_speculative_tokens of the tiny DSpark drafter (its block_size).
TINY_DSPARK_K = 4


@pytest.fixture
def tiny_dspark():
    """``tiny_dspark(**config)`` -> a tiny DSpark draft model (vocab 64, hidden 32, 2 layers,
    block_size 4) with seeded normal weights, in eval mode; ``config`` overrides fields."""
    torch = pytest.importorskip("torch")
    from spectrace.engine import dspark

    def make(**kw) -> dspark.DSparkDraftModel:
        cfg = dict(
            vocab_size=64,
            draft_vocab_size=64,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            target_hidden_size=24,
            aux_hidden_state_layer_ids=[1, 2],
            mask_token_id=63,
            block_size=TINY_DSPARK_K,
            markov_rank=8,
        )
        cfg.update(kw)
        torch.manual_seed(0)
        m = dspark.DSparkDraftModel(dspark.DSparkConfig(**cfg))
        for p in m.parameters():
            torch.nn.init.normal_(p, 0.0, 0.5)
        return m.eval()

    return make


def _capture_reference(
    tmp: Path, name: str, args: list[str], k: int = 4, max_tokens: int = 64
) -> subprocess.CompletedProcess:
    """``spectrace capture`` of the reference engine (draft model, greedy) into
    ``tmp/NAME.h5`` with its requests file and raw log beside it; ``args`` go to the engine
    (e.g. ``["--fault", "layout_shift"]``)."""
    h5, req, log = tmp / f"{name}.h5", tmp / f"{name}.requests.jsonl", tmp / f"{name}.log"
    spectrace = str(Path(sys.executable).parent / "spectrace")
    engine = [sys.executable, "-m", "spectrace.engine", "--method", "draft_model"]
    engine += ["--k", str(k), "--max-tokens", str(max_tokens), "--requests-out", str(req)]
    cmd = [spectrace, "capture", "-o", str(h5), "--requests", str(req), "--log", str(log)]
    return subprocess.run([*cmd, "--", *engine, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="session")
def capture_reference():
    """``capture_reference(tmp, name, args, k=4, max_tokens=64)`` -> the finished process
    of a reference-engine capture into ``tmp/NAME.h5`` (see :func:`_capture_reference`)."""
    return _capture_reference
