"""The V2 model runner path of the vLLM plugin: a wrapper on ``speculator.propose``.

.. warning:: Not exercised on a real V2 runner yet. vLLM's V2 runner needs Triton, which the
   CPU wheel does not have; this code is tested against a fake speculator whose ``propose``
   has the real 0.32 signature (``vllm/v1/worker/gpu/spec_decode/speculator.py``,
   ``BaseSpeculator.propose``) and real CPU tensors, and shares its join logic
   (:class:`spectrace.hooks.vllm.BlockJoiner`) with the V1 path that is tested on real vLLM.

Why ``propose`` (``vllm_hooks.md`` §1.2, §2, §6): the V2 runner calls
``speculator.propose(input_batch, ..., num_sampled, num_rejected, last_sampled,
next_prefill_tokens, ...)`` once per step, after the rejection sampler and the bookkeeping
that writes ``last_sampled``. Its ``num_sampled``/``num_rejected`` are the verdict on the
drafts verified in this step, which are request r's previous proposal; its return value is
r's new proposal. One wrapper therefore sees the whole chain. ``propose`` is never captured in
a CUDA graph, and wrapping the instance survives subclass overrides.

Per call, for the ``n = input_batch.num_reqs`` rows (row i is ``input_batch.req_ids[i]``, slot
``idx_mapping[i]``), the hot path writes ``int32 [n, 4 + K]`` rows: ``num_sampled``,
``num_rejected``, the anchor (``last_sampled[slot]`` when ``num_sampled > 0``, else
``next_prefill_tokens[0, slot]``), the anchor position
(``positions[query_start_loc[i + 1] - 1 - num_rejected[i]] + 1``) and the K drafts. On CUDA
that is one Triton launch (:mod:`spectrace.hooks.v2_stage`) into a segment of a device ring;
every ``flush_steps`` steps the segment goes to pinned host memory with one non-blocking copy
and one event. Nothing synchronises: segments are joined once their event has completed
(``event.query()``), many steps at once (:mod:`spectrace.hooks.v2_join`); finishes and
preemptions are queued in order with the steps. Waits happen only at close (and in
:meth:`ProposeTap.drain` with ``wait=True``). On a CPU device the rows are written in place
with torch ops and joined at once.

Join (per row, by request id): ``num_sampled == 0`` is a prefill chunk, so r's open proposal
(if any) was not verified; otherwise ``verified = num_sampled + num_rejected - 1`` drafts were
checked, ``accepted = num_sampled - 1``, ``emitted = proposal[:accepted] + [anchor]``. Then the
row's new drafts (the first ``num_speculative_tokens`` columns, trailing ``-1`` removed) open
r's next block.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spectrace.hooks.v2_join import Proposals, concat_proposals, join_chunk
from spectrace.hooks.v2_stage import META_COLS, stage_torch, stage_triton, triton_ok
from spectrace.hooks.vllm import (
    OpenBlock,
    Session,
    SpecTraceLayoutError,
    _say,
    _vllm_version,
    is_warmup,
    require_attrs,
    trim_output,
)

#: ``propose`` parameters the hook reads (by name; positions are resolved once).
PROPOSE_REQUIRED = ("input_batch", "num_sampled", "num_rejected", "last_sampled",
                    "next_prefill_tokens")
#: Read when present.
PROPOSE_OPTIONAL = ("num_speculative_tokens", "dummy_run", "is_profile")
#: What :meth:`ProposeTap.record` reads, in the order it unpacks them.
_RECORD_ARGS = ("input_batch", "num_sampled", "num_rejected", "last_sampled",
                "next_prefill_tokens", "num_speculative_tokens", "dummy_run", "is_profile")
#: ``input_batch`` attributes the hook reads.
BATCH_ATTRS = ("req_ids", "num_reqs", "idx_mapping", "positions", "query_start_loc")
#: The layout this was written against, named in :class:`SpecTraceLayoutError` messages.
KNOWN_LAYOUT = ("vLLM 0.32 BaseSpeculator.propose(input_batch, attn_metadata, slot_mappings, "
                "last_hidden_states, aux_hidden_states, num_sampled, num_rejected, "
                "last_sampled, next_prefill_tokens, temperature, seeds, dp_sync_state=None, "
                "dummy_run=False, skip_attn_for_dummy_run=False, mm_inputs=None, "
                "is_profile=False, num_speculative_tokens=None)")


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
            f"vLLM {_vllm_version()}: {owner}.propose lacks {', '.join(missing)}; "
            f"known layout: {KNOWN_LAYOUT}")
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    layout = {}
    for name in PROPOSE_REQUIRED + PROPOSE_OPTIONAL:
        if name in names:
            i = names.index(name)
            p = params[i]
            layout[name] = (i if p.kind in positional else None,
                            None if p.default is inspect.Parameter.empty else p.default)
    return layout


def _torch():
    """The torch module (imported on first use: this module imports without it)."""
    import torch

    return torch


@dataclass
class _Slot:
    dev: object          # device staging block (the host tensor itself on a CPU device)
    host: object         # host tensor (pinned on CUDA)
    event: object = None  # torch.cuda.Event on CUDA
    busy: bool = False


def staging_ring(count: int, rows: int, cols: int, device, cuda: bool) -> list[_Slot]:
    """``count`` staging slots of int64 ``[rows, cols]``: on CUDA a device block, a pinned
    host block and an event each; on a CPU the device block is the host block and there is
    no event (copies are plain and synchronous)."""
    import torch

    def one() -> _Slot:
        host = torch.zeros((rows, cols), dtype=torch.int64, pin_memory=cuda)
        if not cuda:
            return _Slot(host, host)
        return _Slot(torch.zeros((rows, cols), dtype=torch.int64, device=device), host,
                     torch.cuda.Event())

    return [one() for _ in range(count)]


class _Segment:
    """One segment of the staging ring: rows of up to ``flush_steps`` steps.

    ``dev`` int32 ``[cap, cols]`` on the device (the host tensor itself on a CPU device),
    ``host`` its pinned host copy, ``event`` recorded after the copy. States: ``fill`` (steps
    are staged into it), ``flight`` (copy issued), ``free`` (joined; reusable).
    """

    __slots__ = ("dev", "host", "host_np", "event", "state", "used", "steps", "pending",
                 "ready", "t0_ns", "cap", "cols")

    def __init__(self, dev, host, event) -> None:
        self.dev, self.host, self.event = dev, host, event
        self.host_np = host.numpy()
        self.cap, self.cols = host.shape  # rows, columns
        self.state, self.used, self.steps, self.pending, self.ready, self.t0_ns = (
            "free", 0, 0, 0, False, 0)


class _StepRec:
    """One staged step: ``n`` rows at ``row0`` of ``seg`` (a slots class, not a dataclass:
    one is made per step on the hot path)."""

    __slots__ = ("seg", "row0", "n", "ids", "keep", "req_ids", "step", "k_eff", "t_ns")

    def __init__(self, seg: _Segment, row0: int, n: int, ids, keep, req_ids: list, step: int,
                 k_eff: int, t_ns: int) -> None:
        self.seg, self.row0, self.n = seg, row0, n
        self.ids = ids          # int64 [n] tap-local request ids
        self.keep = keep        # bool [n] non-warmup rows, or None for all
        self.req_ids = req_ids  # the tap's own copy (never the runner's list)
        self.step, self.k_eff, self.t_ns = step, k_eff, t_ns


class ProposeTap:
    """Wraps ``speculator.propose`` on one instance and feeds ``session``.

    Per recorded step the hot path issues one staging launch (:mod:`spectrace.hooks.v2_stage`:
    Triton on CUDA, torch ops on a CPU or as the fallback) that writes the step's rows
    (``int32 [n, 4 + K]``) into the current segment of a device ring. A segment is copied to
    pinned host memory with one non-blocking copy and one event after ``flush_steps`` steps
    (or when full, or 0.5 s after its first step); the host joins segments whose event has
    completed (``event.query()``; never a wait on the hot path), many steps at once with
    :func:`spectrace.hooks.v2_join.join_chunk`, and hands the blocks to
    :meth:`Session.add_block_columns`. On a CPU device the rows are written in place and
    joined every ``cpu_flush_steps`` steps (default: at once).

    Args:
        speculator: the runner's speculator (any object with a V2-shaped ``propose``).
        session: the :class:`~spectrace.hooks.vllm.Session` that writes the blocks.
        slots: segments in the ring (CUDA).
        max_model_len: for trimming outputs at finish (``trim_output``).
        flush_steps: steps per segment before its copy is issued (CUDA).
        cpu_flush_steps: steps joined together on a CPU device (default 1: every step at
            once; more exercises the chunked join and the deferred finishes on a CPU).

    Attributes:
        outputs: request id -> emitted token ids so far (prefill token + every block), a
            list built on access from the numpy chunks the joins append (``_out``).
        sync_waits: times the ring had to wait for a copy (should stay 0).
        step_observers: callables ``(rows, req_ids, step)`` run for each step, in order,
            before its rows are joined (``rows``: numpy int32 ``[n, 4 + K]``).

    Raises:
        SpecTraceLayoutError: at construction, when ``propose`` lacks a required parameter.
    """

    SEGMENT_AGE_NS = 500_000_000  # copy a segment out after this long, however few steps

    def __init__(self, speculator, session: Session, slots: int = 4,
                 max_model_len: int | None = None, flush_steps: int = 64,
                 cpu_flush_steps: int = 1) -> None:
        self.layout = propose_layout(speculator.propose, type(speculator).__name__)
        # (name, position or None, default) in the order record() unpacks them.
        self._argspec = tuple((name, *self.layout.get(name, (None, None)))
                              for name in _RECORD_ARGS)
        self.session = session
        self.max_model_len = max_model_len
        self._out: dict[int, list[np.ndarray]] = {}  # int id -> emitted id chunks, in order
        self.requests: dict[str, tuple[int, object]] = {}  # req id -> (prompt len, params)
        self.sync_waits = 0
        self.step_observers: list = []
        self.flush_steps = max(int(flush_steps), 1)
        self.cpu_flush_steps = max(int(cpu_flush_steps), 1)
        self._nslots = max(int(slots), 2)
        self._ring: list[_Segment] = []
        self._ring_key = None
        self._next = 0
        self._cur: _Segment | None = None
        self._stream: deque = deque()  # _StepRec | ("drop", req id) | ("finish", req id, final)
        self._batch_checked = False
        self._ids: dict[str, int] = {}  # request id -> tap-local int id
        self._names: list[str] = []
        self._wrows = None  # int64 [len(_names)]: /requests row per int id (-1: unknown)
        self._prev_req_ids: list | None = None
        self._prev_batch = (None, None, False)  # ids, keep, all warmup
        self._carry_req = np.zeros(0, dtype=np.int64)  # requests with an open proposal
        self._carry: Proposals | None = None           # those proposals
        self._orig = speculator.propose
        speculator.propose = self.propose  # instance attribute: beats subclass overrides
        session.on_close(self.finalize_requests)

    # -- the wrapper ---------------------------------------------------------------------

    def propose(self, *args, **kwargs):
        """Call the original ``propose`` and record this step (never alters its result)."""
        out = self._orig(*args, **kwargs)
        if self.session.active:
            try:
                self.record(args, kwargs, out)
            except Exception as exc:
                self.session.fail(exc, "V2 propose")
        return out

    def _args(self, args: tuple, kwargs: dict) -> list:
        """The values of ``_RECORD_ARGS`` in this call (keyword, else position, else the
        default), positions resolved once at construction."""
        nargs = len(args)
        return [kwargs[name] if name in kwargs else
                args[pos] if pos is not None and pos < nargs else default
                for name, pos, default in self._argspec]

    def record(self, args: tuple, kwargs: dict, out) -> None:
        """Stage (num_sampled, num_rejected, anchor, anchor position, drafts) of this call."""
        batch, ns, nr, last, nxt, k_arg, dummy, profile = self._args(args, kwargs)
        if dummy or profile:
            return
        if not self._batch_checked:
            require_attrs(batch, BATCH_ATTRS, f"{type(batch).__name__} (propose's input_batch)",
                          f"; known layout: {KNOWN_LAYOUT}")
            self._batch_checked = True
        n = int(batch.num_reqs)
        if n <= 0:
            return
        req_ids = batch.req_ids
        if type(req_ids) is not list or len(req_ids) != n:
            req_ids = list(req_ids[:n])
        # Compared by value every step, never kept: the runner may reuse or mutate its list
        # (vLLM 0.32 builds a new one per step, but nothing promises that); the tap keeps its
        # own copy, made only when the ids change.
        if req_ids != self._prev_req_ids:
            self._new_batch(req_ids)
        ids, keep, all_warmup = self._prev_batch
        if all_warmup:
            return
        torch = _torch()
        drafts = out if isinstance(out, torch.Tensor) else getattr(out, "draft_tokens", out)
        cuda = drafts.is_cuda
        if cuda and torch.cuda.is_current_stream_capturing():
            return
        if cuda and self._stream:
            self._poll()
        k_all = drafts.shape[1]
        k_eff = min(int(k_arg), k_all) if k_arg else k_all
        t_ns = time.time_ns()
        seg = self._cur
        if seg is None or seg.used + n > seg.cap or seg.cols != META_COLS + k_all:
            seg = self._segment(n, META_COLS + k_all, max(n, int(last.shape[0])),
                                drafts.device, cuda, t_ns)
        row0 = seg.used
        inputs = (ns, nr, batch.idx_mapping, batch.query_start_loc, batch.positions, last, nxt,
                  drafts)
        if not (cuda and triton_ok(drafts) and stage_triton(seg.dev, row0, n, *inputs)):
            stage_torch(seg.dev[row0:row0 + n], n, *inputs)
        seg.used += n
        seg.steps += 1
        seg.pending += 1
        session = self.session
        self._stream.append(_StepRec(seg, row0, n, ids, keep, self._prev_req_ids,
                                     session.step, k_eff, t_ns))
        session.step += 1
        if not cuda:
            if seg.steps >= self.cpu_flush_steps:
                self.drain(wait=True)
        elif seg.steps >= self.flush_steps or t_ns - seg.t0_ns >= self.SEGMENT_AGE_NS:
            self._flush(seg)

    def _new_batch(self, req_ids: list) -> None:
        """Request ids changed since the last step: map them to int ids, mark warmup rows."""
        self._prev_req_ids = list(req_ids)
        keep = [not is_warmup(r) for r in req_ids]
        ids = np.fromiter((self._id(r) for r in req_ids), dtype=np.int64, count=len(req_ids))
        self._prev_batch = (ids, None if all(keep) else np.array(keep), not any(keep))

    def _id(self, req_id: str) -> int:
        i = self._ids.get(req_id)
        if i is None:
            i = self._ids[req_id] = len(self._names)
            self._names.append(req_id)
        return i

    # -- the ring ------------------------------------------------------------------------

    def _segment(self, n: int, cols: int, rows_hint: int, device, cuda: bool,
                 t_ns: int) -> _Segment:
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
            self._ring = self._make_ring(self._nslots if cuda else 1,
                                         steps * max(rows_hint, n), cols, device, cuda)
            self._ring_key, self._next = key, 0
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

    @staticmethod
    def _make_ring(count: int, rows: int, cols: int, device, cuda: bool) -> list[_Segment]:
        import torch

        ring = []
        for _ in range(count):
            host = torch.zeros((rows, cols), dtype=torch.int32, pin_memory=cuda)
            if cuda:
                ring.append(_Segment(torch.zeros((rows, cols), dtype=torch.int32,
                                                 device=device), host, torch.cuda.Event()))
            else:
                ring.append(_Segment(host, host, None))
        return ring

    def _flush(self, seg: _Segment) -> None:
        """Issue the segment's copy to the host (non-blocking, then an event)."""
        if seg.event is not None and seg.used:
            seg.host[:seg.used].copy_(seg.dev[:seg.used], non_blocking=True)
            seg.event.record()
        seg.state = "flight"
        if self._cur is seg:
            self._cur = None

    def _poll(self) -> None:
        """Join what is ready, if the oldest staged step's copy has completed."""
        head = self._stream[0]
        if not isinstance(head, _StepRec):
            self.drain(wait=False)
            return
        seg = head.seg
        if seg.ready or (seg.state == "flight" and seg.event.query()):
            self.drain(wait=False)

    def drain(self, wait: bool) -> None:
        """Join every staged step whose copy has completed (``wait``: all of them, issuing
        and waiting for copies as needed: finish and shutdown paths only)."""
        items = []
        while self._stream:
            item = self._stream[0]
            if isinstance(item, _StepRec) and not item.seg.ready:
                seg = item.seg
                if seg.state == "fill":
                    if not wait:
                        break
                    self._flush(seg)
                if seg.event is not None and not seg.event.query():
                    if not wait:
                        break
                    seg.event.synchronize()
                seg.ready = True
            items.append(self._stream.popleft())
        if items:
            self._join(items)

    # -- joining -------------------------------------------------------------------------

    def _join(self, items: list) -> None:
        """Join a run of stream items (steps and deferred finishes/drops) in order."""
        pieces, finishes = [], []
        for item in items:
            if isinstance(item, _StepRec):
                if self.step_observers:
                    rows = item.seg.host_np[item.row0:item.row0 + item.n]
                    for fn in self.step_observers:
                        fn(rows, item.req_ids, item.step)
                pieces.append(item)
            else:
                if item[1] in self._ids:
                    pieces.append(self._ids[item[1]])  # a synthetic drop row
                if item[0] == "finish":
                    finishes.append(item)
        chunk = self._assemble(pieces)
        for item in items:  # rows are copied out: segments whose steps are all joined are free
            if isinstance(item, _StepRec):
                seg = item.seg
                seg.pending -= 1
                if seg.pending == 0 and seg.state == "flight":
                    seg.state = "free"
        if chunk is not None:
            self._join_chunk(*chunk)
        for _, rid, final in finishes:
            self.finish(rid, final)

    def _assemble(self, pieces: list):
        """Rows and per-row columns of a run of pieces (steps, or ints: synthetic drop rows
        of finished/preempted requests): ``(rows int32 [R, 4 + K], req, step, batch_row,
        batch_size, t_ns)``, warmup rows removed, drafts past each step's k set to -1; None
        without rows."""
        cols = self._ring_key[0] if self._ring_key else META_COLS
        blocks, ids, meta, keeps = [], [], [], []
        run = None  # [segment, first row, end row]: consecutive steps share one slice
        for p in pieces:
            if isinstance(p, _StepRec):
                if run is not None and run[0] is p.seg and run[2] == p.row0:
                    run[2] += p.n
                else:
                    if run is not None:
                        blocks.append(run[0].host_np[run[1]:run[2]])
                    run = [p.seg, p.row0, p.row0 + p.n]
                ids.append(p.ids)
                meta.append((p.n, p.step, p.n, p.t_ns, p.k_eff))
                keeps.append(p.keep)
            else:
                if run is not None:
                    blocks.append(run[0].host_np[run[1]:run[2]])
                    run = None
                row = np.full((1, cols), -1, dtype=np.int32)
                row[0, :META_COLS] = 0  # num_sampled 0, no drafts
                blocks.append(row)
                ids.append(np.array([p], dtype=np.int64))
                meta.append((1, -1, -1, 0, 0))
                keeps.append(None)
        if run is not None:
            blocks.append(run[0].host_np[run[1]:run[2]])
        if not ids:
            return None
        rows = np.concatenate(blocks)  # a copy: the segment may be reused
        req = np.concatenate(ids)
        counts, step, bsize, t_ns, keff = (np.array(c, dtype=np.int64) for c in zip(*meta))
        starts = np.cumsum(counts) - counts
        brow = np.arange(len(req)) - np.repeat(starts, counts)
        brow[np.repeat(bsize < 0, counts)] = -1
        step, bsize, t_ns, keff = (np.repeat(a, counts) for a in (step, bsize, t_ns, keff))
        if any(k is not None for k in keeps):
            keep = np.concatenate([np.ones(c, dtype=bool) if k is None else k
                                   for k, c in zip(keeps, counts.tolist())])
            rows, req, step, brow, bsize, t_ns, keff = (
                a[keep] for a in (rows, req, step, brow, bsize, t_ns, keff))
        k_all = rows.shape[1] - META_COLS
        if (keff < k_all).any():  # drafts past the step's k are not proposals
            cut = np.arange(k_all)[None, :] >= keff[:, None]
            rows[:, META_COLS:][cut] = -1
        return rows, req, step, brow, bsize, t_ns

    def _join_chunk(self, rows, req, step, brow, bsize, t_ns) -> None:
        """Join assembled rows against the carry; blocks to the session, outputs, new carry."""
        if not len(req):
            return
        k_all = rows.shape[1] - META_COLS
        carry_req, carry = self._carry_req, self._carry
        if carry is None or carry.drafts.shape[1] != k_all:
            carry = self._carry_arrays(k_all)
        res = join_chunk(req, rows, step, brow, bsize, t_ns, carry_req, carry)
        if len(res.blocks["request"]):
            cols = dict(res.blocks)
            cols["request"] = self._writer_rows(cols["request"])
            cols["proposal_source"] = np.ones(len(cols["request"]), dtype=np.int8)
            self.session.add_block_columns(cols)
        self._add_outputs(req[res.out_rows], res.out_tokens, res.out_len)
        kept = ~np.isin(carry_req, res.seen)  # requests absent from the chunk keep theirs
        self._carry_req = np.concatenate([carry_req[kept], req[res.open_rows]])
        self._carry = concat_proposals(carry.take(np.flatnonzero(kept)), res.open)

    def _carry_arrays(self, k_all: int) -> Proposals:
        """The carry at width ``k_all`` (empty, or re-padded after a change of K)."""
        if self._carry is None:
            return Proposals.empty(k_all)
        c = self._carry
        d = np.full((len(c.drafts), k_all), -1, dtype=np.int64)
        w = min(k_all, c.drafts.shape[1])
        d[:, :w] = c.drafts[:, :w]
        return Proposals(c.step, c.position, c.anchor, d, np.minimum(c.k, k_all), c.t_ns,
                         c.batch_row, c.batch_size)

    def _hand_over(self, req_id: str) -> None:
        """Move ``req_id``'s carried proposal (if any) to ``session.joiner.open``, where the
        session's finish/drop paths write it."""
        i = self._ids.get(req_id)
        if i is None or self._carry is None or not len(self._carry_req):
            return
        hit = np.flatnonzero(self._carry_req == i)
        if not len(hit):
            return
        j = int(hit[0])
        c = self._carry
        self.session.joiner.open[req_id] = OpenBlock(
            int(c.step[j]), int(c.position[j]), int(c.anchor[j]),
            c.drafts[j, :int(c.k[j])].tolist(), int(c.t_ns[j]), int(c.batch_row[j]),
            int(c.batch_size[j]))
        keep = np.ones(len(self._carry_req), dtype=bool)
        keep[j] = False
        self._carry_req = self._carry_req[keep]
        self._carry = c.take(np.flatnonzero(keep))

    def _writer_rows(self, ids):
        """/requests rows of tap-local int ids (registering unknown requests)."""
        if self._wrows is None or len(self._wrows) < len(self._names):
            grown = np.full(len(self._names), -1, dtype=np.int64)
            if self._wrows is not None:
                grown[:len(self._wrows)] = self._wrows
            self._wrows = grown
        rows = self._wrows[ids]
        for i in np.unique(ids[rows < 0]).tolist():
            self._wrows[i] = self.session.request_row(self._names[i])
        return self._wrows[ids] if (rows < 0).any() else rows

    def _add_outputs(self, req, tokens, lens) -> None:
        """Append each verdict row's emitted ids to its request's chunks, in row order.

        Args:
            req: int64 ``[V]`` tap-local ids of the verdict rows (chunk order).
            tokens: int64 ``[V, K + 1]`` emitted ids per row, ``lens[i]`` of them valid.
            lens: int64 ``[V]``.

        One numpy array per request and join (a view of one flat array), so the Python work
        per join is one append per distinct request, not per token.
        """
        if not len(req):
            return
        order = np.argsort(req, kind="stable")  # per request, rows stay in chunk order
        req, tokens, lens = req[order], tokens[order], lens[order]
        flat = tokens[np.arange(tokens.shape[1])[None, :] < lens[:, None]]
        starts = np.flatnonzero(np.r_[True, req[1:] != req[:-1]])
        offs = np.r_[0, np.cumsum(lens)]
        bounds = offs[np.r_[starts, len(req)]].tolist()
        out = self._out
        for j, r in enumerate(req[starts].tolist()):
            chunks = out.get(r)
            if chunks is None:
                chunks = out[r] = []
            chunks.append(flat[bounds[j]:bounds[j + 1]])

    def output_ids(self, req_id: str) -> list[int]:
        """``req_id``'s emitted ids so far (joined steps only), as a list."""
        chunks = self._out.get(self._ids.get(req_id, -1))
        return np.concatenate(chunks).tolist() if chunks else []

    @property
    def outputs(self) -> dict[str, list[int]]:
        """Request id -> emitted ids so far (built on each access; for inspection)."""
        return {self._names[i]: np.concatenate(c).tolist() for i, c in self._out.items() if c}

    # -- requests ------------------------------------------------------------------------

    def add_request(self, req_id: str, prompt_ids, sampling_params) -> None:
        """Register a new request (prompt ids, sampling parameters)."""
        if is_warmup(req_id):
            return
        self.requests[req_id] = (len(prompt_ids or []), sampling_params)
        self.session.see_request(req_id, prompt_ids, sampling_params)

    def finish(self, req_id: str, final: bool = True) -> None:
        """Record a finished (``final``) or still running request's trimmed output now (its
        staged steps must have been joined: :meth:`drain`); its open proposal is written
        unverified."""
        self._hand_over(req_id)
        if is_warmup(req_id) or req_id not in self.requests:
            return
        prompt_len, params = self.requests.pop(req_id) if final else self.requests[req_id]
        ids, reason = trim_output(self.output_ids(req_id), params, prompt_len,
                                  self.max_model_len)
        if final:  # its steps are all joined (finishes are queued after them): free its ids
            self._out.pop(self._ids.get(req_id, -1), None)
        self.session.finish_request(req_id, ids,
                                    reason or ("abort" if final else "unfinished"))

    def finish_later(self, req_id: str) -> None:
        """``req_id`` finished: record it once the steps staged so far are joined (at once
        on a CPU device with nothing pending; never waits)."""
        if self._stream or self._device_ring():
            self._stream.append(("finish", req_id, True))
        else:
            self.finish(req_id, final=True)

    def drop_later(self, req_id: str) -> None:
        """``req_id`` was preempted: its open proposal is written unverified, in order after
        the steps staged so far (never waits)."""
        if self._stream or self._device_ring():
            self._stream.append(("drop", req_id, None))
        else:
            self._hand_over(req_id)
            self.session.joiner.drop(req_id)

    def _device_ring(self) -> bool:
        # On CUDA, finishes go through the stream too: a synthetic row, not a row-wise write.
        return bool(self._ring_key and self._ring_key[2])

    def finalize_requests(self) -> None:
        """Session close hook: drain, then record the requests still running."""
        self.drain(wait=True)
        for rid in list(self.requests):
            self.finish(rid, final=False)
        for rid in [self._names[i] for i in self._carry_req.tolist()]:
            self._hand_over(rid)  # requests never registered: session.close drops them


def attach_v2(runner, path: Path, meta: dict) -> Session:
    """Attach to a V2 ``GPUModelRunner`` (``vllm/v1/worker/gpu/model_runner.py``).

    Wraps ``runner.speculator.propose`` (:class:`ProposeTap`), and on the runner instance
    ``add_requests`` (prompt ids, sampling parameters), ``finish_requests`` (finished requests
    get their output; preempted ones lose their open proposal) and ``shutdown`` (close).

    Raises:
        SpecTraceLayoutError: the speculator's ``propose`` or the runner lacks what is read.
    """
    require_attrs(runner, ("speculator", "add_requests", "finish_requests", "shutdown"),
                  f"V2 {type(runner).__name__}")
    session = Session(path, meta)
    tap = ProposeTap(runner.speculator, session,
                     max_model_len=getattr(runner, "max_model_len", None))
    from spectrace.hooks.vllm_dspark import maybe_attach_dspark

    maybe_attach_dspark(runner, tap, session)  # DSpark: layout meta, eager inner check
    orig_add, orig_finish, orig_shutdown = (runner.add_requests, runner.finish_requests,
                                            runner.shutdown)

    @functools.wraps(orig_add)
    def add_requests(scheduler_output, *args, **kwargs):
        if session.active:
            try:
                for new in getattr(scheduler_output, "scheduled_new_reqs", ()) or ():
                    tap.add_request(new.req_id, getattr(new, "prompt_token_ids", None),
                                    getattr(new, "sampling_params", None))
            except Exception as exc:
                session.fail(exc, "V2 add_requests")
        return orig_add(scheduler_output, *args, **kwargs)

    @functools.wraps(orig_finish)
    def finish_requests(scheduler_output, *args, **kwargs):
        if session.active:
            try:
                # Deferred, in order with the staged steps: no wait for the device here.
                for rid in getattr(scheduler_output, "finished_req_ids", ()) or ():
                    tap.finish_later(rid)
                for rid in getattr(scheduler_output, "preempted_req_ids", ()) or ():
                    tap.drop_later(rid)
            except Exception as exc:
                session.fail(exc, "V2 finish_requests")
        return orig_finish(scheduler_output, *args, **kwargs)

    @functools.wraps(orig_shutdown)
    def shutdown(*args, **kwargs):
        try:
            session.close()
        except Exception as exc:
            _say(f"ERROR closing {session.path}: {type(exc).__name__}: {exc}")
        return orig_shutdown(*args, **kwargs)

    runner.add_requests = add_requests
    runner.finish_requests = finish_requests
    runner.shutdown = shutdown
    return session
