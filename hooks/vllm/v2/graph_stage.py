"""Staging from inside the drafter's CUDA graph: no launch from Python on a replayed step.

The propose tap (:mod:`.tap`) normally launches its staging kernel from Python after each
``propose`` (:mod:`.stage`, ~16 us of host time on the H200). With a :class:`GraphStage`, the
drafter launches :func:`~.stage_triton._ring_stage_kernel` itself, once, while its draft step is
captured in a CUDA graph (:meth:`GraphStage.launch` called from inside the capture, after the
drafts are written; DSpark: from ``_sample_sequential``, see :mod:`.dspark`), so every replay
stages the step's rows with no extra launch. A graph holds fixed addresses, but ``propose``'s
inputs (``num_sampled``, ``input_batch.positions``, ...) and the destination (the tap's ring
segment, the row offset) change per step, so the kernel reads them from a *descriptor*: int64
``[DESC_W]`` in a ring of pinned host memory that the kernel reads through unified addressing.
Per step the host only writes one descriptor (numpy stores, no CUDA call) before calling the
original ``propose``.

Which descriptor a kernel run takes: a device-side counter (int64 ``[2]``, device memory: runs,
lost runs) that every run increments; run ``c`` reads ``desc[c % SLOTS]`` and stages its rows
only when the descriptor's sequence number is ``c``. The host writes descriptor ``h`` for the
``h``-th run it expects: one per ``propose`` call while armed (``n = 0`` for calls it does not
record: dummy runs, warmup batches, an inactive session), and one of its own for a launch from
:meth:`GraphStage.launch` outside a capture and outside a ``propose`` call (eager warmup).
Eager steps (no replay: ``enforce_eager``, batch sizes without a graph) launch the same kernel
from :meth:`GraphStage.launch`, taking the call's descriptor. A call run whole under a capture
(the runner capturing ``propose``) runs no kernel: the tap sees the capture the launch counted
(:attr:`GraphStage.captures`) after the call and takes its descriptor back
(:meth:`GraphStage.retract`; no capture query per step). A run whose descriptor does not
match (a replay the host did not see, or a call that ran no kernel) writes nothing and counts
in ``ctl[1]`` (pinned, written by the kernel; the tap fails the session when it is non-zero:
never a silent shift).
``ctl[0]`` is the count of runs done, which bounds how far the host may write ahead
(:attr:`SLOTS` descriptors; past that it waits, counted in ``waits``: never in practice).

Rows land in the tap's device ring as before; segments are copied out every ``flush_steps``
steps and joined on the drainer thread, unchanged. torch and Triton are imported on first use.
"""

from __future__ import annotations

import struct
import time

from .row_layout import DESC_FIELDS
from .stage import InputLayouts

_PACK = struct.Struct(f"<{len(DESC_FIELDS)}q")  # one descriptor, as the kernel reads it
_SIZE = _PACK.size


class GraphStage:
    """The descriptor ring, the device counter and the in-graph staging launch of one tap.

    Args:
        device: the CUDA device of the drafter.

    Attributes:
        k: drafts per row the captured launches stage (``drafts.shape[1]``), None before the
            first :meth:`launch`.
        armed: True once a launch was captured (from then on every ``propose`` call writes
            one descriptor).
        seq: descriptors written so far (the next one's sequence number).
        waits: times the host waited for the device to take descriptors (should stay 0).
        captures: launches made inside a CUDA-graph capture.
        lost_seen: :attr:`lost` as last read by the tap (it reads it once per ring segment).
        call_desc: inside a ``propose`` call whose descriptor no eager launch took yet.
    """

    SLOTS = 4096  # descriptors in the ring: how far the host may run ahead of the device
    BLOCK = 64  # rows per loop iteration of the kernel (one warp)

    def __init__(self, device) -> None:
        import torch

        self.device = device
        # Bound once: torch.cuda.is_current_stream_capturing only calls this C function.
        self.capturing = getattr(
            torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing
        )
        self.desc = torch.full((self.SLOTS, len(DESC_FIELDS)), -1, dtype=torch.int64)
        self.desc = self.desc.pin_memory()
        self.desc_np = self.desc.numpy()
        self.ctl = torch.zeros(2, dtype=torch.int64).pin_memory()  # runs done, lost
        self.ctl_np = self.ctl.numpy()
        self.counter = torch.zeros(2, dtype=torch.int64, device=device)  # runs, lost
        self.k: int | None = None
        self.armed = False
        self.seq = 0
        self.waits = 0
        self.captures = 0
        self.lost_seen = 0  # :attr:`lost` as the tap last read it (once per segment)
        self.call_desc = False  # inside a propose call whose descriptor no run took yet
        self._room = 0  # descriptors writable before the device's count is read again
        self._buf = memoryview(self.desc_np).cast("B")
        self._layouts = InputLayouts()  # the descriptor's fields that follow the layout
        # Same dtypes as the real buffers (same compiled kernel); seq -1: nothing is staged.
        self._scratch = (
            torch.full((len(DESC_FIELDS),), -1, dtype=torch.int64).pin_memory(),
            torch.zeros(2, dtype=torch.int64).pin_memory(),
            torch.zeros(2, dtype=torch.int64, device=device),
        )

    # -- host side -------------------------------------------------------------------------

    def _next(self) -> int:
        """The next descriptor's sequence number (see :meth:`_wait_room`)."""
        h = self.seq
        if self._room <= 0:
            self._wait_room(h)
        self._room -= 1
        self.seq = h + 1
        return h

    def _wait_room(self, h: int) -> None:
        """Refill :attr:`_room` from the device's count of runs done (read once per
        :attr:`SLOTS` writes), waiting while descriptor ``h`` would overwrite one the
        device has not taken yet."""
        done = int(self.ctl_np[0])
        if h - done >= self.SLOTS:
            self.waits += 1
            while h - done >= self.SLOTS:
                time.sleep(0.0001)
                done = int(self.ctl_np[0])
        self._room = self.SLOTS - (h - done)

    def write(self, out_ptr: int, out_stride: int, row0: int, n: int, inputs: tuple) -> bool:
        """Write the descriptor of the next run: stage ``n`` rows at row ``row0`` of the
        int32 block at ``out_ptr`` (``out_stride`` elements a row, unit column stride) from
        ``inputs``, ``(ns, nr, idx, qsl, positions, last, nxt)`` of ``propose`` (the shapes
        of :func:`.stage.stage_triton`; int32 or int64 each). Returns False, writing nothing,
        when an input's layout or dtype is not what the kernel takes (the caller then writes
        :meth:`write_skip` and stages with torch ops after the call).

        Per call: the inputs' layout, checked afresh (:class:`.stage.InputLayouts`: one C
        call where torch has it), their seven ``data_ptr()`` (read every call: nothing is
        cached by tensor identity) and one ``struct`` pack into the pinned ring."""
        lays = self._layouts  # InputLayouts.of, inlined: this is the hot path
        guard = lays.guard
        lay = lays.lay if guard is not None and guard.check(*inputs) else lays.read(inputs)
        if lay is None:
            return False
        h = self.seq  # _next(), inlined: this is the hot path
        if self._room <= 0:
            self._wait_room(h)
        self._room -= 1
        self.seq = h + 1
        ns, nr, idx, qsl, pos, last, nxt = inputs  # .stage.input_ptrs, inlined: no call
        _PACK.pack_into(
            self._buf,
            (h % self.SLOTS) * _SIZE,
            h,
            n,
            out_ptr,
            out_stride,
            row0,
            ns.data_ptr(),
            nr.data_ptr(),
            idx.data_ptr(),
            qsl.data_ptr(),
            pos.data_ptr(),
            last.data_ptr(),
            nxt.data_ptr(),
            *lay,
        )
        self.call_desc = True
        return True

    def write_skip(self) -> None:
        """Write a descriptor of no rows (for a run the host does not record)."""
        h = self._next()
        row = self.desc_np[h % self.SLOTS]
        row[0], row[1] = h, 0
        self.call_desc = True

    def retract(self) -> None:
        """Take back the current call's descriptor (no kernel runs for the call: it was
        captured, not run); the next descriptor reuses its sequence number and slot."""
        self.seq -= 1
        self._room += 1
        self.desc_np[self.seq % self.SLOTS, 0] = -1  # matches no run
        self.call_desc = False

    def end_call(self) -> None:
        """The ``propose`` call is over (its descriptor was taken by a replay, or by an eager
        :meth:`launch`)."""
        self.call_desc = False

    @property
    def lost(self) -> int:
        """Kernel runs whose descriptor did not match (0 unless the host lost count)."""
        return int(self.ctl_np[1])

    # -- the launch --------------------------------------------------------------------------

    def launch(self, drafts) -> None:
        """The staging launch, from the drafter, after ``drafts`` (int ``[rows, k]``, unit
        column stride, the buffer ``propose`` returns the first ``n`` rows of) are written.

        Inside a CUDA-graph capture the launch is captured (every replay stages a step) and
        the stage is armed; outside one, once armed, it runs now, taking the current
        ``propose`` call's descriptor (or writing one of no rows: a warmup launch outside
        ``propose``); before the first capture it runs once on scratch buffers (compiling the
        kernel before a capture needs it) and stages nothing.

        Raises:
            ValueError: ``drafts`` has a column stride other than 1, or another ``k`` than an
                earlier launch.
        """
        import torch

        from .stage_triton import _ring_stage_kernel

        k = int(drafts.shape[1])
        if drafts.stride(1) != 1 or (self.k is not None and k != self.k):
            raise ValueError(
                f"in-graph staging: drafts {tuple(drafts.shape)} stride {drafts.stride()} "
                f"(k {self.k} before); needs unit column stride and one k"
            )
        capturing = torch.cuda.is_current_stream_capturing()
        desc, ctl, counter = self.desc, self.ctl, self.counter
        if capturing:
            self.captures += 1
            self.armed = True
        elif not self.armed:  # before the first capture: compile on scratch buffers, once
            if self.k == k:
                return
            desc, ctl, counter = self._scratch
        else:
            if not self.call_desc:
                self.write_skip()
            self.call_desc = False
        _ring_stage_kernel[(1,)](
            desc,
            ctl,
            counter,
            drafts,
            drafts.stride(0),
            drafts.shape[0],
            A=self.SLOTS,
            K=k,
            KP=1 << max(k - 1, 0).bit_length(),
            BLOCK=self.BLOCK,
            num_warps=1,  # one tiny program: a warp is enough, and it starts sooner
        )
        self.k = k
