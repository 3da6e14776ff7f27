"""DSpark on vLLM's V2 runner: layout detection and a second recording from inside
``_sample_sequential``, checked against the ``propose`` wrapper.

The generic V2 hook (:class:`spectrace.hooks.vllm.v2.tap.ProposeTap`) records every DSpark block
from ``speculator.propose``'s arguments and return value; that is the only hook that also runs
when the draft step is replayed from a CUDA graph (``vllm_hooks.md`` §1.7). This module adds,
for ``DSparkSpeculator`` instances:

* **Layout detection at attach time** (:func:`dspark_layout`): the attributes
  ``_sample_sequential`` reads and writes (``draft_tokens``, ``input_buffers.input_ids``,
  ``_anchor_idx``, ``sample_pos``, ``num_speculative_steps``, ``num_query_per_req``) and the
  layout flag (``sample_from_anchor``, or ``dspark_bonus_anchor`` of the draft config). The
  query slots per request must be k (anchor layout) or 1 + k (fill-in layout). Anything else
  raises :class:`~spectrace.hooks.vllm.common.SpecTraceLayoutError` with one line naming the vLLM
  version and what is missing. The layout goes into the trace's /meta.
* **Inner recording under ``enforce_eager``** (:class:`DSparkTap`): an instance-level wrapper
  on ``_sample_sequential`` (which runs in Python on every eager step, never on graph replay)
  stages, after the Markov loop, the anchor the loop started from
  (``input_buffers.input_ids[_anchor_idx[:n]]``), ``sample_pos[:n*k]`` and
  ``draft_tokens[:n, :k]``. On CUDA the block goes through a small ring of pinned host slots
  with a non-blocking copy and an event, like the propose wrapper: nothing synchronises.
* **In-graph staging** (``graph_stage``, on CUDA, opt-in: ``SPECTRACE_GRAPH_STAGE=1``): the
  same wrapper makes the propose tap's staging launch after the Markov loop
  (:meth:`.tap.ProposeTap.stage_in_graph`); while vLLM captures the draft step that launch is
  captured too, so a replayed step stages its rows with no launch from Python
  (:mod:`.graph_stage`).
* **Agreement check**: when the propose wrapper joins a step, the inner record of the same step
  must have the same anchors and drafts per row, and ``sample_pos[i, j] == anchor_pos[i] + 1 +
  j`` (the DFlash/DSpark prepare kernel's positions). The result is stored in
  ``meta["dspark_inner_check"]``; a mismatch is an error (raised in strict mode, else it
  stops the session with one ``spectrace: ERROR`` line).
"""

from __future__ import annotations

import inspect
import os

import numpy as np

from spectrace.tracer.cli.output import say
from spectrace.tracer.errors import SpectraceError

from ..common import SpecTraceLayoutError, vllm_version
from ..session import Session
from .ring import Slot, staging_ring

#: Speculator attributes ``_sample_sequential`` uses that the inner recording reads.
DSPARK_ATTRS = (
    "_sample_sequential",
    "draft_tokens",
    "input_buffers",
    "_anchor_idx",
    "sample_pos",
    "num_speculative_steps",
    "num_query_per_req",
)
#: The layout this was written against, named in :class:`SpecTraceLayoutError` messages.
KNOWN_DSPARK_LAYOUT = (
    "vLLM 0.32 DSparkSpeculator: _sample_sequential(num_reqs, head_hidden), "
    "draft_tokens [max_reqs, k], input_buffers.input_ids[_anchor_idx], "
    "sample_pos [max_reqs*k], num_query_per_req = k (sample_from_anchor) "
    "or 1 + k"
)


class SpecTraceConsistencyError(SpectraceError):
    """Two recordings of the same DSpark step disagree."""


def is_dspark(speculator) -> bool:
    """True for vLLM's DSpark speculators (by class name in the MRO; any revision)."""
    return any("DSpark" in c.__name__ for c in type(speculator).__mro__)


def _sample_from_anchor(speculator):
    v = getattr(speculator, "sample_from_anchor", None)
    if v is not None:
        return bool(v)
    hf = getattr(getattr(speculator, "draft_model_config", None), "hf_config", None)
    bonus = getattr(hf, "dspark_bonus_anchor", None)
    if bonus is not None:  # UP@6534e06: the flag is `not dspark_bonus_anchor`
        return not bool(bonus)
    return None


def dspark_layout(speculator) -> dict:
    """Feature-detect a DSpark speculator's layout.

    Returns:
        ``{"sample_from_anchor", "num_query_per_req", "k", "num_reqs_arg", "d2t",
        "draft_vocab_size"}`` (``num_reqs_arg``: the position of ``num_reqs`` in
        ``_sample_sequential``; the last two from ``model.draft_id_to_target_id``).
    Raises:
        SpecTraceLayoutError: an attribute or the layout flag is missing, or the query slots
            per request fit neither layout (one line: vLLM version, class, what is missing).
    """
    cls = type(speculator).__name__
    missing = [a for a in DSPARK_ATTRS if not hasattr(speculator, a)]
    if hasattr(speculator, "input_buffers") and not hasattr(speculator.input_buffers, "input_ids"):
        missing.append("input_buffers.input_ids")
    sfa = _sample_from_anchor(speculator)
    if sfa is None:
        missing.append("sample_from_anchor (or draft hf_config.dspark_bonus_anchor)")
    num_reqs_arg = None
    if hasattr(speculator, "_sample_sequential"):
        try:
            names = list(inspect.signature(speculator._sample_sequential).parameters)
        except (TypeError, ValueError):
            names = []
        if "num_reqs" in names:
            num_reqs_arg = names.index("num_reqs")
        else:
            missing.append("_sample_sequential(num_reqs, ...)")
    if missing:
        raise SpecTraceLayoutError(
            f"vLLM {vllm_version()}: {cls} lacks {', '.join(missing)}; "
            f"known layout: {KNOWN_DSPARK_LAYOUT}"
        )
    k = int(speculator.num_speculative_steps)
    nq = int(speculator.num_query_per_req)
    if nq != (k if sfa else k + 1):
        raise SpecTraceLayoutError(
            f"vLLM {vllm_version()}: {cls} has num_query_per_req={nq} with "
            f"num_speculative_steps={k} and sample_from_anchor={sfa}: neither the N-slot nor "
            f"the 1+N layout; known layout: {KNOWN_DSPARK_LAYOUT}"
        )
    model = getattr(speculator, "model", None)
    d2t_t = getattr(model, "draft_id_to_target_id", None)
    return {
        "sample_from_anchor": sfa,
        "num_query_per_req": nq,
        "k": k,
        "num_reqs_arg": num_reqs_arg,
        "d2t": d2t_t is not None,
        "draft_vocab_size": int(d2t_t.shape[0]) if d2t_t is not None else None,
    }


class DSparkTap:
    """Layout meta, inner ``_sample_sequential`` recording and the agreement check.

    Args:
        speculator: the ``DSparkSpeculator`` instance.
        tap: the :class:`~spectrace.hooks.vllm.v2.tap.ProposeTap` already wrapping its
            ``propose`` (the check runs as its step observer, before each step's join).
        session: the tap's session.
        inner: wrap ``_sample_sequential`` (only meaningful under ``enforce_eager``: with
            CUDA graphs the method does not run on replay, and capture is skipped).
        slots: ring size for the inner records on CUDA.
        graph_stage: on CUDA, ``_sample_sequential`` also makes the propose tap's staging
            launch (:meth:`.tap.ProposeTap.stage_in_graph`): captured with the drafter's CUDA
            graph, so a replayed step adds no launch from Python (:mod:`.graph_stage`). None
            (default): on when ``SPECTRACE_GRAPH_STAGE=1``. Off by default: it halves the
            tap's host time per step (H200, 8B shape: 32-48 us against 61-87 us) but its
            kernel takes ~4.9 us of device time per step against 1.4 us for the launched
            one (~1.9 us of it the descriptor's read from pinned memory), so the 8B shape
            costs more with it from batch 8 up (+0.80/+0.57/+0.28% against
            +0.46/+0.32/+0.17% at batch 8/32/64) and sits near 1% at batch 1 (+0.71% in
            the 500x5 run, +0.95% in another) (``benchmarks/bench_dspark_gpu.py``).

    Attributes:
        layout: :func:`dspark_layout`'s result.
        checked: steps whose inner record was compared with the propose record.
        mismatched: those that disagreed; ``first_mismatch`` describes the first.
        unchecked: joined steps without an inner record (graph replay, or ``inner`` off).
        sync_waits: inner records that had to be waited for (should stay 0).
    """

    def __init__(
        self,
        speculator,
        tap,
        session: Session,
        inner: bool = True,
        slots: int = 8,
        graph_stage: bool | None = None,
    ) -> None:
        self.layout = dspark_layout(speculator)
        self.spec = speculator
        self.tap = tap
        self.session = session
        self.k = self.layout["k"]
        self.checked = self.mismatched = self.unchecked = self.sync_waits = 0
        self.first_mismatch: dict | None = None
        self._pending: dict[int, tuple[Slot, int]] = {}
        self._ring: list[Slot] = []
        self._nslots = slots
        self._next = 0
        self._set_meta()
        tap.step_observers.append(self._observe)
        self.inner = bool(inner)
        if graph_stage is None:
            graph_stage = os.environ.get("SPECTRACE_GRAPH_STAGE") == "1"
        self.graph_stage = bool(graph_stage)
        if self.inner or self.graph_stage:
            self._orig_sample = speculator._sample_sequential
            speculator._sample_sequential = self._sample_sequential
        session.on_close(self._on_close)

    # -- meta ------------------------------------------------------------------------------

    def _set_meta(self) -> None:
        lay = self.layout
        layout = dict(self.session.meta.get("layout") or {})
        layout.update(
            {
                "sample_from_anchor": lay["sample_from_anchor"],
                "query_slots_per_request": lay["num_query_per_req"],
                "speculator": type(self.spec).__name__,
            }
        )
        extra = {"layout": layout, "d2t": lay["d2t"]}  # schema META_KEYS names
        if lay["draft_vocab_size"]:
            extra["draft_vocab_size"] = lay["draft_vocab_size"]
        self.session.update_meta(**extra)

    def _observe(self, rows, req_ids: list[str], step: int) -> None:
        """The tap's per-step observer: the agreement check, before the step is joined."""
        if self.session.active:
            try:
                self.check(rows, req_ids, step)
            except Exception as exc:
                self.session.fail(exc, "DSpark agreement check")

    # -- inner recording -------------------------------------------------------------------

    def _sample_sequential(self, *args, **kwargs):
        out = self._orig_sample(*args, **kwargs)
        if self.graph_stage:  # every run, also while the session is closed (see graph_stage)
            try:
                self.tap.stage_in_graph(self.spec.draft_tokens)
            except Exception as exc:
                self.graph_stage = False
                self.session.fail(exc, "DSpark in-graph staging")
        if self.inner and self.session.active:
            try:
                n = kwargs.get("num_reqs")
                if n is None:
                    n = args[self.layout["num_reqs_arg"]]
                self.record_inner(int(n))
            except Exception as exc:
                self.session.fail(exc, "DSpark _sample_sequential")
        return out

    def record_inner(self, n: int) -> None:
        """Stage (anchor, sample_pos[k], drafts[k]) of the first ``n`` rows for the step the
        propose wrapper is about to record (``session.step``)."""
        import torch

        if n <= 0:
            return
        spec, k = self.spec, self.k
        drafts = spec.draft_tokens
        cuda = drafts.device.type == "cuda"
        if cuda and torch.cuda.is_current_stream_capturing():
            return
        with torch.inference_mode():
            slot = self._acquire(int(drafts.shape[0]), 1 + 2 * k, drafts.device, cuda)
            stage = (slot.dev if cuda else slot.host)[:n]
            stage[:, 0] = spec.input_buffers.input_ids[spec._anchor_idx[:n]]
            stage[:, 1 : 1 + k] = spec.sample_pos[: n * k].view(n, k)
            stage[:, 1 + k :] = drafts[:n, :k]
            if cuda:
                slot.host[:n].copy_(stage, non_blocking=True)
                slot.event.record()
        step = self.session.step
        old = self._pending.pop(step, None)  # a dummy/warmup call of the same step: replaced
        if old is not None:
            old[0].busy = False
        self._pending[step] = (slot, n)

    def _acquire(self, rows: int, cols: int, device, cuda: bool) -> Slot:
        if not self._ring or self._ring[0].host.shape[0] < rows:
            # Two CPU slots: a step's inner rows wait for its propose to be joined.
            self._ring = staging_ring(self._nslots if cuda else 2, rows, cols, device, cuda)
            self._next = 0
        slot = self._ring[self._next]
        if slot.busy:  # never joined (its step was skipped): reclaim it
            for step, (s, _) in list(self._pending.items()):
                if s is slot:
                    del self._pending[step]
            if slot.event is not None and not slot.event.query():
                self.sync_waits += 1
                slot.event.synchronize()
        slot.busy = True
        self._next = (self._next + 1) % len(self._ring)
        return slot

    # -- the check -------------------------------------------------------------------------

    def check(self, rows, req_ids: list[str], step: int) -> None:
        """Compare the propose record of ``step`` (rows: int32 [n, 4 + K]: num_sampled,
        num_rejected, anchor, anchor position, drafts) with the inner record of that step."""
        for old in [s for s in self._pending if s < step]:  # skipped steps: drop
            self._pending.pop(old)[0].busy = False
        rec = self._pending.pop(step, None)
        if rec is None:
            self.unchecked += 1
            return
        slot, n = rec
        if slot.event is not None and not slot.event.query():
            self.sync_waits += 1
            slot.event.synchronize()
        inner = slot.host[:n].numpy().copy()
        slot.busy = False
        k = self.k
        rows = np.asarray(rows)
        bad = []
        if n != len(rows):
            bad.append(f"{n} rows in _sample_sequential vs {len(rows)} in propose")
        else:
            a_ok = inner[:, 0] == rows[:, 2]
            d_ok = (inner[:, 1 + k :] == rows[:, 4 : 4 + k]).all(axis=1)
            want_pos = rows[:, 3:4] + 1 + np.arange(k)[None, :]
            p_ok = (inner[:, 1 : 1 + k] == want_pos).all(axis=1)
            for what, ok in (("anchor", a_ok), ("drafts", d_ok), ("sample_pos", p_ok)):
                if not ok.all():
                    i = int(np.flatnonzero(~ok)[0])
                    bad.append(
                        f"{what}: mismatch at row {i} (request {req_ids[i]}): "
                        f"_sample_sequential anchor={int(inner[i, 0])} "
                        f"sample_pos={inner[i, 1 : 1 + k].tolist()} "
                        f"drafts={inner[i, 1 + k :].tolist()} vs propose "
                        f"anchor={int(rows[i, 2])} anchor_pos={int(rows[i, 3])} "
                        f"drafts={rows[i, 4 : 4 + k].tolist()}"
                    )
        self.checked += 1
        if bad:
            self.mismatched += 1
            if self.first_mismatch is None:
                self.first_mismatch = {"step": int(step), "problems": bad}
            raise SpecTraceConsistencyError(
                f"DSpark step {step}: _sample_sequential and propose disagree: {bad[0]}"
            )

    def summary(self) -> dict:
        """The ``meta["dspark_inner_check"]`` document."""
        if not self.inner:
            status = "off"
        elif self.mismatched:
            status = "mismatch"
        elif self.checked:
            status = "ok"
        else:
            status = "not_run"
        out = {
            "status": status,
            "steps_checked": self.checked,
            "steps_mismatched": self.mismatched,
            "steps_unchecked": self.unchecked,
            "sync_waits": self.sync_waits,
        }
        if self.first_mismatch:
            out["first_mismatch"] = self.first_mismatch
        return out

    def _on_close(self) -> None:
        self.tap.drain(wait=True)
        summary = self.summary()
        self.session.update_meta(dspark_inner_check=summary)
        if summary["status"] == "mismatch":
            say(
                f"WARNING DSpark: _sample_sequential and propose disagreed on "
                f"{self.mismatched} of {self.checked} steps"
            )


def maybe_attach_dspark(runner, tap, session: Session) -> DSparkTap | None:
    """Attach :class:`DSparkTap` when ``runner.speculator`` is a DSpark speculator.

    The inner recording is on under ``enforce_eager`` (``runner.model_config``), where
    ``_sample_sequential`` runs in Python every step.

    Raises:
        SpecTraceLayoutError: a DSpark speculator of an unknown layout.
    """
    spec = getattr(runner, "speculator", None)
    if spec is None or not is_dspark(spec):
        return None
    eager = bool(getattr(getattr(runner, "model_config", None), "enforce_eager", False))
    return DSparkTap(spec, tap, session, inner=eager)
