"""The V2 ``propose`` call as the hook reads it: the parameters, their positions (resolved once
per speculator) and the ``input_batch`` attributes, checked at attach time against vLLM
0.32's ``BaseSpeculator.propose`` (``vllm/v1/worker/gpu/spec_decode/speculator.py``)."""

from __future__ import annotations

import inspect
from operator import itemgetter

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


class RecordArgs:
    """Reads the values of :data:`RECORD_ARGS` out of one ``propose`` call (keyword, else
    position, else the default), in that order: one ``itemgetter`` over ``args + keyword
    values + defaults`` per call shape (the count of positional arguments and the keyword
    names in order), made on the shape's first call. Called once per step (the hot path: one
    dict lookup and one C call; the keyword names are never looped over in Python).

    Args:
        layout: :func:`propose_layout`'s result (a name it lacks is always its default,
            None).
    """

    def __init__(self, layout: dict[str, tuple[int | None, object]]) -> None:
        spec = [layout.get(name, (None, None)) for name in RECORD_ARGS]
        self._pos = [pos for pos, _ in spec]
        self._defaults = tuple(default for _, default in spec)
        self._getters: dict[tuple, itemgetter] = {}  # (positional count, *keywords) -> getter

    def read(self, args: tuple, kwargs: dict) -> tuple:
        """The values, a tuple in :data:`RECORD_ARGS`' order (also the instance's call; the
        hot path binds this method: a bound method call is cheaper than ``__call__``)."""
        if kwargs:
            shape = (len(args), *kwargs)
            get = self._getters.get(shape) or self._getter(shape)
            return get(args + tuple(kwargs.values()) + self._defaults)
        get = self._getters.get((len(args),)) or self._getter((len(args),))
        return get(args + self._defaults)

    def _getter(self, shape: tuple) -> itemgetter:
        """The getter of one call shape: each name's index in ``args + keyword values +
        defaults`` (its keyword, else its position, else its default)."""
        n, names = shape[0], shape[1:]
        end = n + len(names)
        at = []
        for j, (name, pos) in enumerate(zip(RECORD_ARGS, self._pos)):
            if name in names:
                at.append(n + names.index(name))
            else:
                at.append(pos if pos is not None and pos < n else end + j)
        get = self._getters[shape] = itemgetter(*at)
        return get

    __call__ = read
