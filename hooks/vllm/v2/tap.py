"""The V2 hot path: :class:`ProposeTap`, a wrapper on one speculator instance's ``propose``
that stages each step's rows, and joins them into blocks off the hot path (see
:mod:`spectrace.hooks.vllm.v2`)."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import numpy as np

from ..common import is_warmup, require_attrs
from ..session import Session
from .drainer import Drainer
from .graph_stage import GraphStage
from .join import Proposals
from .layout import BATCH_ATTRS, KNOWN_LAYOUT, RecordArgs, propose_layout
from .outputs import EmittedIds
from .ring import Segment, make_ring
from .stage import META_COLS, stage_torch, stage_triton, triton_ok
from .stream import StepRec
from .tap_join import TapJoin
from .tap_requests import TapRequests

_time_ns = time.time_ns  # bound once: the hot path reads the clock once per step
#: One step's staging inputs: (ns, nr, idx, qsl, positions, last, nxt) (see :mod:`.stage`).
_Inputs = tuple[Any, Any, Any, Any, Any, Any, Any]


class ProposeTap(TapRequests, TapJoin):
    """Wraps ``speculator.propose`` on one instance and feeds ``session``.

    Per recorded step the hot path issues one staging launch (:mod:`.stage`:
    Triton on CUDA, torch ops on a CPU or as the fallback) that writes the step's rows
    (``int32 [n, 4 + K]``) into the current segment of a device ring. A segment is copied to
    pinned host memory with one non-blocking copy and one event after ``flush_steps`` steps
    (or when full, or 0.5 s after its first step); segments whose event has completed
    (``event.query()``; never a wait on the hot path) are joined, many steps at once with
    :func:`.join.join_chunk`, and the blocks go to :meth:`Session.add_block_columns`. On
    CUDA the joins run on a background thread (:class:`~.drainer.Drainer`, kicked once per
    segment; ``background_join=False``, or step observers, join on the runner's thread at the
    next ``propose`` instead); request registrations are then queued in order with the steps,
    so the session is only written from that thread. On a CPU device the rows are written in
    place and joined every ``cpu_flush_steps`` steps (default: at once).

    Args:
        speculator: the runner's speculator (any object with a V2-shaped ``propose``).
        session: the :class:`~spectrace.hooks.vllm.session.Session` that writes the blocks.
        slots: segments in the ring (CUDA).
        max_model_len: for trimming outputs at finish (``trim_output``).
        flush_steps: steps per segment before its copy is issued (CUDA).
        cpu_flush_steps: steps joined together on a CPU device (default 1: every step at
            once; more exercises the chunked join and the deferred finishes on a CPU).
        background_join: on CUDA, join on a background thread (default True; ignored when
            ``step_observers`` are set at the first CUDA step).

    Attributes:
        outputs: request id -> emitted token ids so far (prefill token + every block), a
            list built on access from the numpy chunks the joins append
            (:class:`~.outputs.EmittedIds`).
        sync_waits: times the ring had to wait for a copy (should stay 0).
        drainer: the background joiner (:class:`~.drainer.Drainer`), or None (CPU, or not
            started yet, or ``background_join=False``).
        step_observers: callables ``(rows, req_ids, step)`` run for each step, in order,
            before its rows are joined (``rows``: numpy int32 ``[n, 4 + K]``).

    Raises:
        SpecTraceLayoutError: at construction, when ``propose`` lacks a required parameter.
    """

    SEGMENT_AGE_NS = 500_000_000  # copy a segment out after this long, however few steps

    def __init__(
        self,
        speculator,
        session: Session,
        slots: int = 4,
        max_model_len: int | None = None,
        flush_steps: int = 64,
        cpu_flush_steps: int = 1,
        background_join: bool = True,
    ) -> None:
        self.layout = propose_layout(speculator.propose, type(speculator).__name__)
        self._args = RecordArgs(self.layout).read  # (args, kwargs) -> RECORD_ARGS' values
        self.session = session
        self.max_model_len = max_model_len
        self._out = EmittedIds()  # tap-local id -> emitted ids, in order
        self.requests: dict[str, tuple[int, object]] = {}  # req id -> (prompt len, params)
        self.sync_waits = 0
        self.step_observers: list = []
        self.flush_steps = max(int(flush_steps), 1)
        self.cpu_flush_steps = max(int(cpu_flush_steps), 1)
        self._nslots = max(int(slots), 2)
        self._ring: list[Segment] = []
        self._ring_key: tuple | None = None
        self._next = 0
        self._cur: Segment | None = None
        # steps (plain tuples in StepRec's order) and ReqEvents, in order
        self._stream: deque = deque()
        self._batch_checked = False
        self._ids: dict[str, int] = {}  # request id -> tap-local int id
        self._names: list[str] = []
        self._wrows = None  # int64 [len(_names)]: /requests row per int id (-1: unknown)
        self._prev_req_ids: list | None = None  # None: no batch seen yet
        # ids (int64 [n]), keep (bool [n] or None: all kept), all warmup, the ids' own copy
        self._prev_batch: tuple[np.ndarray | None, np.ndarray | None, bool, list] = (
            None,
            None,
            False,
            [],
        )
        self._carry_req = np.zeros(0, dtype=np.int64)  # requests with an open proposal
        self._carry: Proposals | None = None  # those proposals
        self.background_join = bool(background_join)
        self.drainer: Drainer | None = None
        self._join_error: BaseException | None = None
        self._lock = threading.RLock()  # join state: the drainer's thread vs close/finish paths
        self.graph: GraphStage | None = None  # set by the drafter's first stage_in_graph
        # torch-op staging left for after the call: (rows, n, the 7 inputs before drafts)
        self._post: tuple[Any, int, tuple[Any, Any, Any, Any, Any, Any, Any]] | None = None
        self._flush_after: Segment | None = None  # a segment to copy out after the call
        self._orig = speculator.propose
        speculator.propose = self.propose  # instance attribute: beats subclass overrides
        session.on_close(self.finalize_requests)

    # -- the wrapper ---------------------------------------------------------------------

    def propose(self, *args, **kwargs):
        """Call the original ``propose`` and record this step (never alters its result).

        Once the drafter stages in its graph (:mod:`.graph_stage`; this path is the hot one,
        written out here: one Python call less per step), the step's descriptor is written
        first (rows, or none) and the original call runs the kernel; before that, the step is
        staged after the call (:meth:`_propose_launch`)."""
        g = self.graph
        if g is None or not g.armed:
            return self._propose_launch(args, kwargs)
        captures = g.captures  # see _captured: no capture check per step
        if self._join_error is not None or g.lost_seen:
            self._report_lost(g)
        staged = False
        if self.session.active:
            try:
                staged = self.record(args, kwargs, None)
            except Exception as exc:
                self.session.fail(exc, "V2 propose")
        if not staged:
            g.write_skip()
        try:
            out = self._orig(*args, **kwargs)
        finally:
            if g.captures != captures:
                self._captured(g, staged)
            g.call_desc = False  # GraphStage.end_call, inlined (the call is over)
        if self._post is not None or self._flush_after is not None:
            self._after_call(g, out)
        return out

    def _propose_launch(self, args: tuple, kwargs: dict):
        """``propose`` before the drafter stages in its graph: the call, then the step."""
        out = self._orig(*args, **kwargs)
        if self._join_error is not None:  # raised on the drainer's thread: report it here
            exc, self._join_error = self._join_error, None
            self.session.fail(exc, "V2 join")
        if self.session.active:
            try:
                self.record(args, kwargs, out)
            except Exception as exc:
                self.session.fail(exc, "V2 propose")
        return out

    def _after_call(self, g: GraphStage, out) -> None:
        """After an in-graph call: torch-op staging for a layout the kernel does not take,
        and (once per segment) the segment's copy and a read of the lost count."""
        if self._post is not None:
            import torch

            seg_dev, n, inputs = self._post
            self._post = None
            drafts = out if isinstance(out, torch.Tensor) else getattr(out, "draft_tokens", out)
            stage_torch(seg_dev, n, *inputs, drafts)
        if self._flush_after is not None:
            seg, self._flush_after = self._flush_after, None
            if seg.state == "fill":
                self._flush(seg)
            g.lost_seen = g.lost

    def _captured(self, g: GraphStage, staged: bool) -> None:
        """The call captured the staging kernel (:meth:`.graph_stage.GraphStage.launch`).
        Still capturing now, with the call's descriptor untaken: the whole call ran under a
        capture (the runner capturing ``propose``), so no kernel runs for it; its descriptor
        and its step are taken back (what the check at every call did before, now read only
        after a capture). A capture that ended inside the call leaves them: a replay in the
        call may have taken the descriptor (a wrong guess fails the session: lost count)."""
        if not (g.call_desc and g.capturing()):
            return
        g.retract()
        self._post = self._flush_after = None  # nothing to stage or copy from a capture
        if not staged:
            return
        with self._lock:  # the call's own step: the stream's last item (its segment fills)
            last = self._stream[-1] if self._stream else None
            if type(last) is not tuple or last[4] != self.session.step - 1:
                exc = RuntimeError("in-graph staging: a captured call's step is not the last")
                self.session.fail(exc, "V2 propose")
                return
            seg, row0 = self._stream.pop()[:2]
            seg.used, seg.steps = row0, seg.steps - 1
            self.session.step -= 1

    def _report_lost(self, g: GraphStage) -> None:
        """An error from the join thread, or (while recording) kernel runs that found no
        descriptor: the session fails (never a silent shift)."""
        session = self.session
        if self._join_error is None and not session.active:
            return
        exc = self._join_error or RuntimeError(
            f"in-graph staging lost count: {g.lost} kernel runs without their descriptor"
        )
        self._join_error = None
        session.fail(exc, "V2 join")

    def stage_in_graph(self, drafts) -> None:
        """The drafter's staging launch (:meth:`.graph_stage.GraphStage.launch`): call it
        after ``drafts`` (the buffer ``propose`` returns rows of) is written, inside the
        drafter's CUDA-graph capture and on its eager path. A no-op off CUDA; until a first
        capture, an eager call only compiles the kernel (an eager-only drafter keeps the
        tap's own launch, which is cheaper than this one from Python).

        Raises:
            ValueError: see :meth:`~.graph_stage.GraphStage.launch`.
        """
        import torch

        g = self.graph
        if g is None:
            # Made on an eager call only: its buffers must not come from a graph's pool (a
            # drafter captured with no eager call first keeps the tap's own launch).
            if not drafts.is_cuda or not triton_ok(drafts):
                return
            if torch.cuda.is_current_stream_capturing():
                return
            g = self.graph = GraphStage(drafts.device)
        g.launch(drafts)

    def record(self, args: tuple, kwargs: dict, out) -> bool:
        """Stage (num_sampled, num_rejected, anchor, anchor position, drafts) of this call;
        ``out`` None: before the call, as a descriptor for the drafter's graph (:attr:`graph`).
        Returns True when the step was staged."""
        batch, ns, nr, last, nxt, k_arg, dummy, profile = self._args(args, kwargs)
        if dummy or profile:
            return False
        if not self._batch_checked:
            require_attrs(
                batch,
                BATCH_ATTRS,
                f"{type(batch).__name__} (propose's input_batch)",
                f"; known layout: {KNOWN_LAYOUT}",
            )
            self._batch_checked = True
        n = int(batch.num_reqs)
        if n <= 0:
            return False
        req_ids = batch.req_ids
        if type(req_ids) is not list or len(req_ids) != n:
            req_ids = list(req_ids[:n])
        # Compared by value every step, never kept: the runner may reuse or mutate its list
        # (vLLM 0.32 builds a new one per step, but nothing promises that); the tap keeps its
        # own copy, made only when the ids change.
        if req_ids != self._prev_req_ids:
            self._new_batch(req_ids)
        bstate = self._prev_batch
        if bstate[2]:  # all warmup
            return False
        inputs = (ns, nr, batch.idx_mapping, batch.query_start_loc, batch.positions, last, nxt)
        g = self.graph if out is None else None
        if g is None:
            return self._stage_launch(out, n, inputs, bstate, k_arg)
        # In-graph (here, not a method of its own: one Python call less per step): the step's
        # descriptor, its rows land when the call's replay or eager launch runs the kernel.
        # What touches CUDA (a poll, a new segment) never runs under a capture; the rest of
        # a step is taken back if the call turns out to be captured (_captured).
        if self.drainer is None and self._stream:
            if g.capturing():
                return False
            self._poll()  # no background joiner: join what is ready here
        t_ns = _time_ns()
        seg = self._cur
        cols = META_COLS + (g.k or 0)
        if seg is None or seg.used + n > seg.cap or seg.cols != cols:
            if g.capturing():
                return False
            seg = self._segment(n, cols, max(n, int(last.shape[0])), g.device, True, t_ns)
        row0 = seg.used
        if not g.write(seg.dev_ptr, cols, row0, n, inputs):  # dev: contiguous [cap, cols]
            g.write_skip()
            self._post = (seg.dev[row0 : row0 + n], n, inputs)
        if self._staged(seg, row0, n, bstate, k_arg, t_ns):
            self._flush_after = seg  # after the call: its kernel writes the rows
        return True

    def _stage_launch(self, out, n: int, inputs: _Inputs, bstate: tuple, k_arg) -> bool:
        """:meth:`record`'s launched part, after the call: one staging launch (Triton on
        CUDA, else torch ops) from ``out``'s drafts, then the step's bookkeeping."""
        import torch

        drafts = out if isinstance(out, torch.Tensor) else getattr(out, "draft_tokens", out)
        cuda = drafts.is_cuda
        if cuda:
            if torch.cuda.is_current_stream_capturing():
                return False
            if self.drainer is None and self._stream:
                self._poll()  # no background joiner: join what is ready here
        t_ns = _time_ns()
        seg = self._cur
        cols = META_COLS + drafts.shape[1]
        if seg is None or seg.used + n > seg.cap or seg.cols != cols:
            rows_hint = max(n, int(inputs[5].shape[0]))
            seg = self._segment(n, cols, rows_hint, drafts.device, cuda, t_ns)
        row0 = seg.used
        if not (cuda and triton_ok(drafts) and stage_triton(seg.dev, row0, n, *inputs, drafts)):
            stage_torch(seg.dev[row0 : row0 + n], n, *inputs, drafts)
        due = self._staged(seg, row0, n, bstate, k_arg, t_ns)
        if not cuda:
            if seg.steps >= self.cpu_flush_steps:
                self.drain(wait=True)
        elif due:
            self._flush(seg)
        return True

    def _staged(self, seg: Segment, row0: int, n: int, bstate: tuple, k_arg, t_ns: int) -> bool:
        """The bookkeeping of a step staged at ``seg[row0 : row0 + n]``: the segment's
        counts, the session's step number, the step's :class:`~.stream.StepRec` in the
        stream (its ``k_eff`` is worked out when it is joined). Returns True when the segment
        is due for its copy (``flush_steps`` steps, or :attr:`SEGMENT_AGE_NS` old)."""
        seg.used = row0 + n
        steps = seg.steps = seg.steps + 1  # pending: set from steps at the flush
        session = self.session
        step = session.step
        session.step = step + 1
        self._stream.append((seg, row0, n, bstate, step, k_arg, t_ns))
        return steps >= self.flush_steps or t_ns - seg.t0_ns >= self.SEGMENT_AGE_NS

    def _new_batch(self, req_ids: list) -> None:
        """Request ids changed since the last step: map them to int ids, mark warmup rows."""
        own = self._prev_req_ids = list(req_ids)
        keep = [not is_warmup(r) for r in req_ids]
        ids = np.fromiter((self._id(r) for r in req_ids), dtype=np.int64, count=len(req_ids))
        self._prev_batch = (ids, None if all(keep) else np.array(keep), not any(keep), own)

    def _id(self, req_id: str) -> int:
        i = self._ids.get(req_id)
        if i is None:
            i = self._ids[req_id] = len(self._names)
            self._names.append(req_id)
        return i

    # -- the ring ------------------------------------------------------------------------

    def _segment(self, n: int, cols: int, rows_hint: int, device, cuda: bool, t_ns: int) -> Segment:
        """The segment that takes this step's ``n`` rows (flushing a full one)."""
        seg = self._cur
        if seg is not None:
            if seg.used + n <= seg.cap and seg.cols == cols:
                return seg
            self._flush(seg)
        key = (cols, device, cuda)
        if self._ring_key != key or self._ring[0].cap < n:
            self.drain(wait=True)
            steps = self.flush_steps if cuda else self.cpu_flush_steps
            self._ring = make_ring(
                self._nslots if cuda else 1, steps * max(rows_hint, n), cols, device, cuda
            )
            self._ring_key, self._next = key, 0
            if cuda and self.background_join and self.drainer is None and not self.step_observers:
                self.drainer = Drainer(self._drain_ready, self._join_failed)
        seg = self._ring[self._next]
        self._next = (self._next + 1) % len(self._ring)
        if seg.state != "free":
            self.drain(wait=False)
            if seg.state != "free":  # the host fell a whole ring behind
                self.sync_waits += 1
                self.drain(wait=True)
        seg.state, seg.used, seg.steps, seg.pending, seg.ready = "fill", 0, 0, 0, False
        seg.t0_ns = t_ns
        self._cur = seg
        return seg

    def _flush(self, seg: Segment) -> None:
        """Issue the segment's copy to the host (non-blocking, then an event)."""
        if seg.event is not None and seg.used:
            seg.host[: seg.used].copy_(seg.dev[: seg.used], non_blocking=True)
            seg.event.record()
        seg.state, seg.pending = "flight", seg.steps  # all staged, none joined yet
        if self._cur is seg:
            self._cur = None
        if self.drainer is not None:
            self.drainer.kick()

    def _poll(self) -> None:
        """Join what is ready, if the oldest staged step's copy has completed."""
        head = self._stream[0]
        if type(head) is not tuple:  # a ReqEvent
            self.drain(wait=False)
            return
        seg = head[0]  # a raw step: StepRec's fields
        if seg.ready or (seg.state == "flight" and seg.event.query()):
            self.drain(wait=False)

    def drain(self, wait: bool) -> None:
        """Join every staged step whose copy has completed (``wait``: all of them, issuing
        and waiting for copies as needed: finish and shutdown paths only). Holds the tap's
        lock (the background joiner runs this too)."""
        with self._lock:
            self._drain(wait)

    def _drain(self, wait: bool, max_rows: int | None = None) -> None:
        """:meth:`drain` without the lock; ``max_rows``: stop once that many staged rows are
        taken (the background joiner's pieces)."""
        items = []
        rows = 0
        while self._stream:
            if max_rows is not None and rows >= max_rows:
                break
            item = self._stream[0]
            step = type(item) is tuple  # a raw step (StepRec's fields), else a ReqEvent
            if step and not item[0].ready:
                seg = item[0]
                if seg.state == "fill":
                    if not wait:
                        break
                    self._flush(seg)
                if seg.event is not None and not seg.event.query():
                    if not wait:
                        break
                    seg.event.synchronize()
                seg.ready = True
            self._stream.popleft()
            if step:
                item = StepRec._make(item)
                rows += item.n
            items.append(item)
        if items:
            self._join(items)

    #: Rows the background joiner joins at a time: between pieces it sleeps a little, so
    #: the runner's thread takes the GIL back within one piece's time. Each join has a fixed
    #: cost (~0.5 ms of numpy calls on the H200 host), so pieces are large: a whole 64-step
    #: segment up to batch 128 (1024 rows a piece cost more in the benchmark than they saved).
    PIECE_ROWS = 8192

    def _drain_ready(self) -> float | None:
        """The background joiner's work: join at most :attr:`PIECE_ROWS` ready rows. Returns
        the pause before the next piece (:attr:`Drainer.PIECE_PAUSE_S`: more is ready;
        :attr:`Drainer.POLL_S`: a copy is still in flight), or None (nothing in flight)."""
        with self._lock:
            self._drain(wait=False, max_rows=self.PIECE_ROWS)
            head = self._stream[0] if self._stream else None
            if type(head) is not tuple or head[0].state != "flight":  # no raw step in flight
                return None
            return Drainer.PIECE_PAUSE_S if head[0].ready else Drainer.POLL_S

    def _join_failed(self, exc: BaseException) -> None:
        # session.fail may raise (strict mode): the runner's thread calls it at the next step.
        self._join_error = exc

    def finalize_requests(self) -> None:
        """Session close hook: stop the background joiner, drain, then record the requests
        still running."""
        if self.drainer is not None:
            self.drainer.stop()
        with self._lock:
            self._drain(wait=True)
            for rid in list(self.requests):
                self.finish(rid, final=False)
            for rid in [self._names[i] for i in self._carry_req.tolist()]:
                self._hand_over(rid)  # requests never registered: session.close drops them
