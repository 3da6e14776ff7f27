"""Fixtures shared by the test folders (each folder's conftest.py adds its own)."""

from __future__ import annotations

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
