"""The engine-core side of the plugin: vLLM's spec-decode counters from the scheduler, and
their hand-off at shutdown (see :mod:`.counters`).

* ``Scheduler.__init__`` gets a :class:`~.counters.VllmCounters` (when speculative decoding is
  configured); in one process it goes straight to the session writing the same trace.
* ``Scheduler.make_spec_decoding_stats`` (``vllm/v1/core/sched/scheduler.py``) feeds it with
  the arguments vLLM itself counts (minus invalid spec tokens), whether or not stats logging
  is on.
* ``Scheduler._free_request`` snapshots vLLM's per-request spec-decode metrics
  (``request.spec_decode_metrics.to_dict()``, with ``--per-request-spec-decode-metrics``)
  into the counters, for the per-request cross-check (:mod:`.request_check`).
* ``EngineCore.shutdown`` (``vllm/v1/engine/core.py``) writes the counters for the worker
  before the original shutdown stops it.
"""

from __future__ import annotations

import functools
import inspect
from types import ModuleType

from spectrace.tracer.cli.output import say

from ..watchdog import announce_engine_core, engine_core_stopping
from .common import dp_rank_of, vllm_version
from .counters import VllmCounters, fmt_counts, hand_off
from .patching import wrap_init
from .paths import output_path, trace_of_handoff, trace_path
from .registry import waiting_for_counters

_NEEDED = ("num_draft_tokens", "num_accepted_tokens")
_KEYWORDS = frozenset(_NEEDED + ("num_invalid_spec_tokens", "request_id"))


def patch_scheduler(module: ModuleType) -> None:
    """Patch ``module.Scheduler`` (idempotent; a warning when its counting method changed)."""
    cls = getattr(module, "Scheduler", None)
    if cls is None or cls.__dict__.get("_spectrace_patched"):
        return
    make = cls.__dict__.get("make_spec_decoding_stats")
    params = list(inspect.signature(make).parameters) if make else []
    if make is None or any(p not in params for p in _NEEDED):
        say(
            f"WARNING vLLM {vllm_version()}: Scheduler.make_spec_decoding_stats "
            "not found or changed; traces will not be cross-checked against vLLM's counters"
        )
        return
    cls.make_spec_decoding_stats = _counting(make)
    free = cls.__dict__.get("_free_request")
    if free is not None:
        cls._free_request = _snapshotting(free)
    wrap_init(cls, _attach_counters)


def _attach_counters(sched) -> None:
    """After ``Scheduler.__init__``: give it counters; in one process (the runner was made
    just before the scheduler) the session writing the same trace reads them at close."""
    announce_engine_core()  # the capture's watchdog watches this process from now on
    cfg = getattr(sched, "vllm_config", None)
    if cfg is None or getattr(cfg, "speculative_config", None) is None:
        return
    c = VllmCounters(
        k=int(cfg.speculative_config.num_speculative_tokens or 0),
        dp_rank=dp_rank_of(cfg.parallel_config),
    )
    c.per_request_level = str(getattr(sched, "spec_decode_metrics_level", "none") or "none")
    sched._spectrace_counters = c
    out = output_path()
    session = waiting_for_counters(trace_path(out, c.dp_rank)) if out else None
    if session is not None:
        session.counters = c
        c.local = True


def _counting(make):
    """``make_spec_decoding_stats`` that also counts into the scheduler's counters."""
    sig = inspect.signature(make)

    @functools.wraps(make)
    def make_spec_decoding_stats(self, *args, **kwargs):
        result = make(self, *args, **kwargs)
        c = getattr(self, "_spectrace_counters", None)
        if c is not None:
            try:
                # vLLM passes these by keyword (Scheduler.update_from_output): read them
                # directly; Signature.bind costs more than the rest of the step's counting.
                b = (
                    kwargs
                    if _KEYWORDS.issubset(kwargs)
                    else sig.bind(self, *args, **kwargs).arguments
                )
                n_draft = b["num_draft_tokens"]
                if n_draft:  # vLLM returns early on zero drafts
                    invalid = b.get("num_invalid_spec_tokens")
                    if invalid:
                        n_draft -= invalid.get(b.get("request_id"), 0)
                    c.observe(int(n_draft), int(b["num_accepted_tokens"]))
            except Exception as exc:
                say(f"WARNING counting vLLM's spec-decode stats failed: {exc}")
                c.broken = True
                self._spectrace_counters = None
        return result

    return make_spec_decoding_stats


def _snapshotting(free):
    """``_free_request`` that first keeps the request's ``spec_decode_metrics.to_dict()``."""

    @functools.wraps(free)
    def _free_request(self, request, *args, **kwargs):
        c = getattr(self, "_spectrace_counters", None)
        m = getattr(request, "spec_decode_metrics", None)
        if c is not None and m is not None:
            try:
                c.per_request[str(request.request_id)] = m.to_dict()
            except Exception as exc:
                say(f"WARNING reading vLLM's per-request spec-decode metrics failed: {exc}")
        return free(self, request, *args, **kwargs)

    return _free_request


def patch_engine_core(module: ModuleType) -> None:
    """Patch ``module.EngineCore.shutdown`` to hand the counters off first (idempotent)."""
    cls = getattr(module, "EngineCore", None)
    if cls is None or cls.__dict__.get("_spectrace_shutdown_patched"):
        return
    orig = cls.shutdown

    @functools.wraps(orig)
    def shutdown(self, *args, **kwargs):
        engine_core_stopping()  # a clean stop: not a death for the watchdog
        c = getattr(getattr(self, "scheduler", None), "_spectrace_counters", None)
        handoff = None
        if c is not None and not c.local and not c.handed_off:
            handoff = hand_off(c)
        try:
            return orig(self, *args, **kwargs)
        finally:
            if handoff is not None and handoff.exists():
                _unclaimed(handoff, c)

    cls.shutdown = shutdown
    cls._spectrace_shutdown_patched = True


def _unclaimed(handoff, c: VllmCounters) -> None:
    """The executor's shutdown is over and no worker took the counters: remove them, and say
    so when there was something to cross-check."""
    handoff.unlink(missing_ok=True)
    counted = c.as_dict()
    if counted and counted["num_drafts"]:
        say(
            f"WARNING {trace_of_handoff(handoff)}: no worker closed the trace to cross-check "
            f"it; vLLM counted {fmt_counts(counted)}"
        )
