"""Shared fixtures of the hook tests: the fake V2 ``propose`` (the one copy of vLLM 0.32's
``BaseSpeculator.propose`` signature, checked against vLLM's source in
``test_vllm_capture.py``), V2 input batches and sampling parameters."""

from __future__ import annotations

from types import SimpleNamespace

import pytest


def _make_propose(body):
    """A ``propose`` with vLLM 0.32's ``BaseSpeculator.propose`` parameters (``self`` left
    out: it is set as an instance attribute, as the V2 hook expects). It calls
    ``body(input_batch, num_sampled, num_rejected, last_sampled, next_prefill_tokens,
    num_speculative_tokens)`` and returns what ``body`` returns (the drafts)."""

    def propose(
        input_batch,
        attn_metadata,
        slot_mappings,
        last_hidden_states,
        aux_hidden_states,
        num_sampled,
        num_rejected,
        last_sampled,
        next_prefill_tokens,
        temperature,
        seeds,
        dp_sync_state=None,
        dummy_run=False,
        skip_attn_for_dummy_run=False,
        mm_inputs=None,
        is_profile=False,
        num_speculative_tokens=None,
    ):
        return body(
            input_batch,
            num_sampled,
            num_rejected,
            last_sampled,
            next_prefill_tokens,
            num_speculative_tokens,
        )

    return propose


@pytest.fixture(scope="session")
def make_propose():
    """``make_propose(body)`` -> a fake V2 ``propose`` (see :func:`_make_propose`)."""
    return _make_propose


def _v2_batch(
    req_ids, idx_mapping, positions, query_start_loc, device="cpu", idx_dtype=None, **extra
):
    """A V2 ``InputBatch`` stand-in with the attributes the hook reads: ``req_ids``,
    ``num_reqs``, ``idx_mapping`` (int32 unless ``idx_dtype``), ``positions`` (int64) and
    ``query_start_loc`` (int32), as tensors on ``device``; ``extra`` attributes as given."""
    import torch

    dev = torch.device(device)
    return SimpleNamespace(
        req_ids=list(req_ids),
        num_reqs=len(req_ids),
        idx_mapping=torch.tensor(idx_mapping, dtype=idx_dtype or torch.int32, device=dev),
        positions=torch.tensor(positions, dtype=torch.int64, device=dev),
        query_start_loc=torch.tensor(query_start_loc, dtype=torch.int32, device=dev),
        **extra,
    )


@pytest.fixture(scope="session")
def v2_batch():
    """``v2_batch(req_ids, idx_mapping, positions, query_start_loc, device="cpu")``."""
    return _v2_batch


def _sampling(max_tokens=None, **kw):
    """``SamplingParams`` as the hook reads them: no EOS, no stop ids, ``max_tokens``."""
    return SimpleNamespace(eos_token_id=None, stop_token_ids=None, max_tokens=max_tokens, **kw)


@pytest.fixture(scope="session")
def sampling():
    """``sampling(max_tokens, **more)`` -> greedy ``SamplingParams`` without stop tokens."""
    return _sampling
