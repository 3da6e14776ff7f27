"""What every part of the vLLM plugin shares: the layout error, strict mode, vLLM's version and
its warmup request ids. Standard library only (loaded in every vLLM process)."""

from __future__ import annotations

import os
from collections.abc import Iterable

from spectrace.tracer.errors import SpectraceError

ENV_STRICT = "SPECTRACE_STRICT"

#: Request-id prefixes of vLLM's warmup / dummy batches (never recorded;
#: ``vllm/v1/worker/gpu/warmup.py``).
WARMUP_PREFIXES = ("_warmup_", "_v2_mixed_warmup", "_dummy")


class SpecTraceLayoutError(SpectraceError):
    """vLLM's code does not have the shape this hook was written against (one-line message
    naming the vLLM version, the class and what is missing). Raised at attach time."""


def strict() -> bool:
    """``SPECTRACE_STRICT`` (default on): a layout or recording error raises; off, it disables
    the hook with one ``spectrace: ERROR`` line."""
    return os.environ.get(ENV_STRICT, "1").strip().lower() not in ("0", "false", "no", "off")


def vllm_version() -> str:
    """``vllm.__version__``, or ``"unknown"`` when vLLM cannot be imported."""
    try:
        import vllm

        return str(vllm.__version__)
    except Exception:
        return "unknown"


def require_attrs(obj: object, names: Iterable[str], what: str, hint: str = "") -> None:
    """Fail at attach time when ``obj`` lacks an attribute spectrace reads.

    Raises:
        SpecTraceLayoutError: one line naming the vLLM version, ``what`` and the missing names.
    """
    missing = [a for a in names if not hasattr(obj, a)]
    if missing:
        raise SpecTraceLayoutError(
            f"vLLM {vllm_version()}: {what} lacks {', '.join(missing)}{hint}"
        )


def dp_rank_of(parallel_config) -> int:
    """The data-parallel rank a process serves: ``parallel_config.data_parallel_index``.

    vLLM 0.32 runs the DP ranks of a dense (non-MoE) model as independent engines and
    resets ``data_parallel_rank`` to 0 (and ``data_parallel_size`` to 1) in every engine-core
    process (``ParallelConfig.reconfigure_for_independent_dp_rank``, called from
    ``vllm/v1/engine/core.py``); ``data_parallel_index`` keeps the real rank. Older vLLM
    without ``data_parallel_index``: ``data_parallel_rank``. None (no config): 0.
    """
    index = getattr(parallel_config, "data_parallel_index", None)
    if index is None:
        index = getattr(parallel_config, "data_parallel_rank", 0)
    return int(index or 0)


def is_warmup(req_id: str) -> bool:
    """True for vLLM's warmup and dummy request ids (``_warmup_...``, ``_v2_mixed_warmup...``)."""
    return str(req_id).startswith(WARMUP_PREFIXES)
