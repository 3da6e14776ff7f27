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
    tokens = [int(t) for t in tokens]
    eos = getattr(sampling_params, "eos_token_id", None)
    stops = set(getattr(sampling_params, "stop_token_ids", None) or ())
    max_tokens = getattr(sampling_params, "max_tokens", None)
    for n, t in enumerate(tokens, 1):
        if (eos is not None and t == eos) or t in stops:
            return tokens[:n], "stop"
        if (max_model_len and num_prompt_tokens + n >= max_model_len) or (
            max_tokens is not None and n >= max_tokens
        ):
            return tokens[:n], "length"
    return tokens, None


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
