"""Host/device staging blocks of the V2 hooks: the propose tap's ring of segments
(:class:`Segment`, :func:`make_ring`) and the DSpark inner record's slots (:class:`Slot`,
:func:`staging_ring`). On CUDA each has a device block, a pinned host block and an event; on a
CPU device the device block is the host block and there is no event (copies are plain and
synchronous). torch is imported by the constructors only (this module loads without it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class Segment:
    """One segment of the propose tap's staging ring: rows of up to ``flush_steps`` steps.

    ``dev`` int32 ``[cap, cols]`` on the device (the host tensor itself on a CPU device),
    contiguous, its address ``dev_ptr`` (read once: the tap owns it and never re-points it);
    ``host`` its pinned host copy, ``event`` recorded after the copy. States: ``fill`` (steps
    are staged into it), ``flight`` (copy issued), ``free`` (joined; reusable).
    """

    __slots__ = (
        "dev",
        "dev_ptr",
        "host",
        "host_np",
        "event",
        "state",
        "used",
        "steps",
        "pending",
        "ready",
        "t0_ns",
        "cap",
        "cols",
    )

    def __init__(self, dev, host, event) -> None:
        self.dev, self.host, self.event = dev, host, event
        self.dev_ptr = dev.data_ptr()
        self.host_np = host.numpy()
        self.cap, self.cols = host.shape  # rows, columns
        self.state, self.used, self.steps, self.pending, self.ready, self.t0_ns = (
            "free",
            0,
            0,
            0,
            False,
            0,
        )


def make_ring(count: int, rows: int, cols: int, device, cuda: bool) -> list[Segment]:
    """``count`` free segments of int32 ``[rows, cols]`` on ``device``."""
    import torch

    ring = []
    for _ in range(count):
        host = torch.zeros((rows, cols), dtype=torch.int32, pin_memory=cuda)
        if cuda:
            ring.append(
                Segment(
                    torch.zeros((rows, cols), dtype=torch.int32, device=device),
                    host,
                    torch.cuda.Event(),
                )
            )
        else:
            ring.append(Segment(host, host, None))
    return ring


@dataclass
class Slot:
    """One staging slot of the DSpark inner record."""

    dev: Any  # torch.Tensor: device staging block (the host tensor itself on a CPU device)
    host: Any  # torch.Tensor: host tensor (pinned on CUDA)
    event: Any = None  # torch.cuda.Event on CUDA
    busy: bool = False


def staging_ring(count: int, rows: int, cols: int, device, cuda: bool) -> list[Slot]:
    """``count`` staging slots of int64 ``[rows, cols]`` on ``device``."""
    import torch

    def one() -> Slot:
        host = torch.zeros((rows, cols), dtype=torch.int64, pin_memory=cuda)
        if not cuda:
            return Slot(host, host)
        return Slot(
            torch.zeros((rows, cols), dtype=torch.int64, device=device), host, torch.cuda.Event()
        )

    return [one() for _ in range(count)]
