"""The worker side of the plugin: attach a recorder to a vLLM model runner after its
``__init__`` (V1: :class:`~.v1.V1Recorder`; V2: :func:`~.v2.attach.attach_v2`)."""

from __future__ import annotations

import functools
from types import ModuleType

from spectrace.tracer.cli.output import say

from .common import SpecTraceLayoutError, dp_rank_of, strict, vllm_version
from .meta import base_meta
from .patching import wrap_init
from .paths import output_path, trace_path
from .session import Session
from .v1 import V1Recorder
from .v2.attach import attach_v2


def patch_runner(module: ModuleType, kind: str) -> None:
    """Wrap ``module.GPUModelRunner.__init__`` (``kind``: ``"v1"`` or ``"v2"``) so that
    :func:`attach` runs after it. A V1 module without the class gets a warning."""
    cls = getattr(module, "GPUModelRunner", None)
    if cls is None:
        if kind == "v1":
            say(
                f"WARNING {module.__name__} has no GPUModelRunner (vLLM {vllm_version()}): "
                "the V1 runner is not traced"
            )
        return
    wrap_init(cls, functools.partial(_attach_guarded, kind=kind))


def _attach_guarded(runner, kind: str) -> None:
    if getattr(runner, "_spectrace_attached", False):
        return  # a subclass's __init__ chain passed through the wrapper twice
    runner._spectrace_attached = True
    try:
        attach(runner, kind)
    except SpecTraceLayoutError as exc:
        say(f"ERROR {exc}")
        if strict():
            raise
    except Exception as exc:
        say(f"ERROR attaching to the vLLM {kind} runner failed: {type(exc).__name__}: {exc}")
        if strict():
            raise


def attach(runner, kind: str | None = None) -> Session | None:
    """Attach spectrace to a vLLM model runner (after its ``__init__``).

    A no-op (returns None) without ``SPECTRACE_OUT``, without a speculative config, without a
    drafter (not the last PP rank) and on TP rank != 0 (its drafts and verdicts are TP rank
    0's; vLLM returns rank 0's model output). ``kind`` is ``"v1"``, ``"v2"`` or None
    (detect: a ``speculator`` attribute means V2, a ``drafter`` V1).

    Raises:
        SpecTraceLayoutError: the runner lacks what the hook reads (one line, with the vLLM
            version and the missing name).
    """
    out = output_path()
    if not out or getattr(runner, "speculative_config", None) is None:
        return None
    if kind is None:
        kind = "v2" if hasattr(runner, "speculator") else "v1"
    if _tp_rank() != 0:
        return None
    dp_rank = dp_rank_of(getattr(runner, "parallel_config", None))
    path = trace_path(out, dp_rank)
    if kind == "v2":
        if getattr(runner, "speculator", None) is None:
            return None  # not the last PP rank
        return attach_v2(runner, path, base_meta(runner, "v2", dp_rank))
    if not hasattr(runner, "drafter"):
        return None  # V1 creates the drafter on the last PP rank only
    if getattr(runner, "use_async_scheduling", False):
        say(
            "WARNING the V1 runner with async scheduling keeps drafts on the device; "
            "spectrace does not record this configuration (use --no-async-scheduling)"
        )
        return None
    return V1Recorder(runner, path, base_meta(runner, "v1", dp_rank)).session


def _tp_rank() -> int:
    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:  # distributed state not initialised: a single process
        return 0
