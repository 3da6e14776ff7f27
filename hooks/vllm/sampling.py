"""A request's ``SamplingParams`` as the plugin uses them: the scheduler's stop rule (to trim
worker-side outputs) and the /meta ``sampling`` object."""

from __future__ import annotations

from collections.abc import Sequence


def trim_output(
    tokens: Sequence[int], sampling_params, num_prompt_tokens: int, max_model_len: int | None
) -> tuple[list[int], str | None]:
    """Cut a worker-side output at the first stop condition, as the scheduler does.

    Mirrors ``vllm/v1/core/sched/utils.py:check_stop`` (vLLM 0.32): EOS (unless
    ``ignore_eos``), ``stop_token_ids``, ``max_tokens`` and ``max_model_len``. The worker may
    have produced a few tokens more than the user gets (accepted drafts past ``max_tokens``).
    Stop *strings* are applied by the front end's detokenizer and are not seen here.

    Returns:
        (the ids the user receives, ``"stop"`` | ``"length"`` | None when no condition hit).
    """
    tokens = list(map(int, tokens))
    eos = getattr(sampling_params, "eos_token_id", None)
    stops = set(getattr(sampling_params, "stop_token_ids", None) or ())
    if eos is not None:
        stops.add(eos)
    max_tokens = getattr(sampling_params, "max_tokens", None)
    # the first n (1-based) that stops, and the first that reaches a length limit; at the
    # same n the stop token wins (check_stop tests it first). list.index, not a loop.
    stop = min((tokens.index(t) + 1 for t in stops if t in tokens), default=None)
    limits = [max_tokens] if max_tokens is not None else []
    if max_model_len:
        limits.append(max_model_len - num_prompt_tokens)
    length = max(min(limits), 1) if limits else None
    if stop is not None and (length is None or stop <= length):
        return tokens[:stop], "stop"
    if length is not None and length <= len(tokens):
        return tokens[:length], "length"
    return tokens, None


def removed_reason(sampling_params, final: bool) -> str:
    """The finish reason of a request without a token-level stop (:func:`trim_output` found
    none), removed (``final``) or still held by the runner when the trace closes.

    A stop *string* ends a request that way: vLLM's front end detects it
    (``vllm/v1/engine/output_processor.py`` ``OutputProcessor.process_outputs``, through
    ``IncrementalDetokenizer.update``) and aborts the request in the engine core; the
    runner learns of it at its next step, which a generate's last requests never get, so
    at close it still holds them. A request with stop strings set therefore ends ``stop``
    either way; its stored output holds the engine core's tokens, up to one step past the
    stop string (the front end drops those after it). A client's abort of such a request
    reads as that stop, and a capture interrupted or killed while it ran says so itself
    (``capture_incomplete``). Any other request: ``abort`` (removed) or ``unfinished``."""
    stop = getattr(sampling_params, "stop", None)
    if (isinstance(stop, str) and stop) or (isinstance(stop, list) and any(stop)):
        return "stop"
    return "abort" if final else "unfinished"


_SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "max_tokens",
    "ignore_eos",
    "n",
)


def sampling_meta(sampling_params) -> dict:
    """The /meta ``sampling`` object of a request's ``SamplingParams`` (as applied)."""
    out = {}
    for key in _SAMPLING_KEYS:
        v = getattr(sampling_params, key, None)
        if isinstance(v, (bool, int, float, str)) or v is None:
            out[key] = v
    return out
