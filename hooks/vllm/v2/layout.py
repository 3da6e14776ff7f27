"""The V2 ``propose`` call as the hook reads it: the parameters, their positions (resolved once
per speculator) and the ``input_batch`` attributes, checked at attach time against vLLM
0.32's ``BaseSpeculator.propose`` (``vllm/v1/worker/gpu/spec_decode/speculator.py``)."""

from __future__ import annotations

import inspect

from ..common import SpecTraceLayoutError, vllm_version

#: ``propose`` parameters the hook reads (by name; positions are resolved once).
PROPOSE_REQUIRED = (
    "input_batch",
    "num_sampled",
    "num_rejected",
    "last_sampled",
    "next_prefill_tokens",
)
#: Read when present.
PROPOSE_OPTIONAL = ("num_speculative_tokens", "dummy_run", "is_profile")
#: What :meth:`ProposeTap.record` reads, in the order it unpacks them.
RECORD_ARGS = (
    "input_batch",
    "num_sampled",
    "num_rejected",
    "last_sampled",
    "next_prefill_tokens",
    "num_speculative_tokens",
    "dummy_run",
    "is_profile",
)
#: ``input_batch`` attributes the hook reads.
BATCH_ATTRS = ("req_ids", "num_reqs", "idx_mapping", "positions", "query_start_loc")
#: The layout this was written against, named in :class:`SpecTraceLayoutError` messages.
KNOWN_LAYOUT = (
    "vLLM 0.32 BaseSpeculator.propose(input_batch, attn_metadata, slot_mappings, "
    "last_hidden_states, aux_hidden_states, num_sampled, num_rejected, "
    "last_sampled, next_prefill_tokens, temperature, seeds, dp_sync_state=None, "
    "dummy_run=False, skip_attn_for_dummy_run=False, mm_inputs=None, "
    "is_profile=False, num_speculative_tokens=None)"
)


def propose_layout(propose, owner: str = "speculator") -> dict[str, tuple[int | None, object]]:
    """Resolve where ``propose`` takes each parameter the hook reads.

    Args:
        propose: the (bound) ``propose`` method.
        owner: class name for messages.
    Returns:
        name -> (positional index or None for keyword-only, default value).
    Raises:
        SpecTraceLayoutError: a required parameter is missing (one line: vLLM version,
            class, the missing names, the known layout).
    """
    params = list(inspect.signature(propose).parameters.values())
    names = [p.name for p in params]
    missing = [n for n in PROPOSE_REQUIRED if n not in names]
    if missing:
        raise SpecTraceLayoutError(
            f"vLLM {vllm_version()}: {owner}.propose lacks {', '.join(missing)}; "
            f"known layout: {KNOWN_LAYOUT}"
        )
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    layout = {}
    for name in PROPOSE_REQUIRED + PROPOSE_OPTIONAL:
        if name in names:
            i = names.index(name)
            p = params[i]
            layout[name] = (
                i if p.kind in positional else None,
                None if p.default is inspect.Parameter.empty else p.default,
            )
    return layout
