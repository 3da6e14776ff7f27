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
``idx_mapping[i]``), the hot path fills one ``int64 [n, 4 + K]`` staging block on the device:
``num_sampled``, ``num_rejected``, the anchor (``last_sampled[slot]`` when ``num_sampled > 0``,
else ``next_prefill_tokens[0, slot]``), the anchor position
(``positions[query_start_loc[i + 1] - 1 - num_rejected[i]] + 1``) and the K drafts. On CUDA it
copies the block with ``non_blocking=True`` into a pinned host slot of a small ring and records
an event; nothing synchronises. Slots are drained (converted and joined by request id) at the
next call once their event has completed, when requests finish, and at shutdown. On a CPU
device the block is written straight into the host slot and joined at once.

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

from spectrace.hooks.vllm import (
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
#: ``input_batch`` attributes the hook reads.
BATCH_ATTRS = ("req_ids", "num_reqs", "idx_mapping", "positions", "query_start_loc")
#: The layout this was written against, named in :class:`SpecTraceLayoutError` messages.
KNOWN_LAYOUT = ("vLLM 0.32 BaseSpeculator.propose(input_batch, attn_metadata, slot_mappings, "
                "last_hidden_states, aux_hidden_states, num_sampled, num_rejected, "
                "last_sampled, next_prefill_tokens, temperature, seeds, dp_sync_state=None, "
                "dummy_run=False, skip_attn_for_dummy_run=False, mm_inputs=None, "
                "is_profile=False, num_speculative_tokens=None)")

_META_COLS = 4  # num_sampled, num_rejected, anchor, anchor position


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


class ProposeTap:
    """Wraps ``speculator.propose`` on one instance and feeds ``session``'s joiner.

    Args:
        speculator: the runner's speculator (any object with a V2-shaped ``propose``).
        session: the :class:`~spectrace.hooks.vllm.Session` that writes the blocks.
        slots: ring size (pinned host slots on CUDA).
        max_model_len: for trimming outputs at finish (``trim_output``).

    Attributes:
        outputs: request id -> emitted token ids so far (prefill token + every block).
        sync_waits: times a ring slot had to be waited for (should stay 0).

    Raises:
        SpecTraceLayoutError: at construction, when ``propose`` lacks a required parameter.
    """

    def __init__(self, speculator, session: Session, slots: int = 6,
                 max_model_len: int | None = None) -> None:
        self.layout = propose_layout(speculator.propose, type(speculator).__name__)
        self.session = session
        self.max_model_len = max_model_len
        self.outputs: dict[str, list[int]] = {}
        self.requests: dict[str, tuple[int, object]] = {}  # req id -> (prompt len, params)
        self.sync_waits = 0
        self._nslots = slots
        self._slots: list[_Slot] = []
        self._next = 0
        self._queue: deque = deque()
        self._batch_checked = False
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

    def _arg(self, name: str, args: tuple, kwargs: dict):
        if name in kwargs:
            return kwargs[name]
        pos, default = self.layout.get(name, (None, None))
        if pos is not None and pos < len(args):
            return args[pos]
        return default

    def record(self, args: tuple, kwargs: dict, out) -> None:
        """Stage (num_sampled, num_rejected, anchor, anchor position, drafts) of this call."""
        import torch

        if self._arg("dummy_run", args, kwargs) or self._arg("is_profile", args, kwargs):
            return
        batch = self._arg("input_batch", args, kwargs)
        if not self._batch_checked:
            require_attrs(batch, BATCH_ATTRS, f"{type(batch).__name__} (propose's input_batch)",
                          f"; known layout: {KNOWN_LAYOUT}")
            self._batch_checked = True
        n = int(batch.num_reqs)
        if n <= 0:
            return
        req_ids = list(batch.req_ids[:n])
        if all(is_warmup(r) for r in req_ids):
            return
        drafts = getattr(out, "draft_tokens", out)  # a tensor, or a Speculation-like object
        cuda = drafts.device.type == "cuda"
        if cuda and torch.cuda.is_current_stream_capturing():
            return
        self.drain(wait=False)
        k_all = int(drafts.shape[1])
        k_arg = self._arg("num_speculative_tokens", args, kwargs)
        k_eff = min(int(k_arg), k_all) if k_arg else k_all
        ns = self._arg("num_sampled", args, kwargs)[:n]
        nr = self._arg("num_rejected", args, kwargs)[:n]
        last = self._arg("last_sampled", args, kwargs)
        nxt = self._arg("next_prefill_tokens", args, kwargs)
        last = last[:, 0] if last.dim() == 2 else last
        nxt = nxt[0] if nxt.dim() == 2 else nxt
        cols = _META_COLS + k_all
        with torch.inference_mode():
            slot = self._acquire(max(n, int(last.shape[0])), cols, drafts.device, cuda)
            stage = slot.dev[:n, :cols]
            idx = batch.idx_mapping[:n].long()
            stage[:, 0] = ns
            stage[:, 1] = nr
            stage[:, 2] = torch.where(ns > 0, last[idx].long(), nxt[idx].long())
            q_last = batch.query_start_loc[1:n + 1].long() - 1 - nr.long()
            stage[:, 3] = batch.positions[q_last.clamp_min(0)].long() + 1
            stage[:, _META_COLS:cols] = drafts[:n, :k_all]
            if slot.event is not None:
                slot.host[:n, :cols].copy_(stage, non_blocking=True)
                slot.event.record()
        self._queue.append((slot, req_ids, n, cols, k_eff, self.session.step, time.time_ns()))
        self.session.step += 1
        if slot.event is None:
            self.drain(wait=True)

    # -- the ring ------------------------------------------------------------------------

    def _acquire(self, rows: int, cols: int, device, cuda: bool) -> _Slot:
        if self._slots and (self._slots[0].host.shape[0] < rows
                            or self._slots[0].host.shape[1] < cols):
            self.drain(wait=True)
            self._slots = []
        if not self._slots:
            self._slots = staging_ring(self._nslots if cuda else 1, rows, cols, device, cuda)
            self._next = 0
        slot = self._slots[self._next]
        if slot.busy:  # still queued: drain up to it (should not happen with 6 slots)
            self.sync_waits += 1
            while slot.busy and self._queue:
                self._drain_one(wait=True)
        slot.busy = True
        self._next = (self._next + 1) % len(self._slots)
        return slot

    def drain(self, wait: bool) -> None:
        """Join every staged step whose copy has completed (``wait``: all of them)."""
        while self._queue:
            if not self._drain_one(wait):
                return

    def _drain_one(self, wait: bool) -> bool:
        slot, req_ids, n, cols, k_eff, step, t_ns = self._queue[0]
        if slot.event is not None and not slot.event.query():
            if not wait:
                return False
            slot.event.synchronize()
        rows = slot.host[:n, :cols].numpy().copy()
        self._queue.popleft()
        slot.busy = False
        self._join(rows, req_ids, k_eff, step, t_ns)
        return True

    # -- joining -------------------------------------------------------------------------

    def _join(self, rows, req_ids: list[str], k_eff: int, step: int, t_ns: int) -> None:
        joiner = self.session.joiner
        for i, rid in enumerate(req_ids):
            if is_warmup(rid):
                continue
            ns, nr, anchor, pos = (int(x) for x in rows[i, :_META_COLS])
            if ns <= 0:  # a prefill chunk: nothing verified, its drafts are not used
                joiner.drop(rid)
                continue
            emitted = joiner.verdict_counts(rid, ns + nr - 1, ns - 1, anchor)
            self.outputs.setdefault(rid, []).extend(emitted or [anchor])
            drafts = [int(t) for t in rows[i, _META_COLS:_META_COLS + k_eff]]
            while drafts and drafts[-1] < 0:
                drafts.pop()
            if drafts:
                joiner.propose(rid, step, pos, anchor, drafts, t_ns=t_ns, batch_row=i,
                               batch_size=len(req_ids))

    # -- requests ------------------------------------------------------------------------

    def add_request(self, req_id: str, prompt_ids, sampling_params) -> None:
        """Register a new request (prompt ids, sampling parameters)."""
        if is_warmup(req_id):
            return
        self.requests[req_id] = (len(prompt_ids or []), sampling_params)
        self.session.see_request(req_id, prompt_ids, sampling_params)

    def finish(self, req_id: str, final: bool = True) -> None:
        """Record a finished (``final``) or still running request's trimmed output."""
        if is_warmup(req_id) or req_id not in self.requests:
            return
        prompt_len, params = self.requests.pop(req_id) if final else self.requests[req_id]
        ids, reason = trim_output(self.outputs.get(req_id, []), params, prompt_len,
                                  self.max_model_len)
        self.session.finish_request(req_id, ids,
                                    reason or ("abort" if final else "unfinished"))

    def finalize_requests(self) -> None:
        """Session close hook: drain, then record the requests still running."""
        self.drain(wait=True)
        for rid in list(self.requests):
            self.finish(rid, final=False)


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
                tap.drain(wait=True)
                for rid in getattr(scheduler_output, "finished_req_ids", ()) or ():
                    tap.finish(rid, final=True)
                for rid in getattr(scheduler_output, "preempted_req_ids", ()) or ():
                    session.joiner.drop(rid)
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
