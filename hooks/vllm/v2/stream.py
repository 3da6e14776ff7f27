"""The propose tap's stream of staged steps, and its assembly into one chunk for the join.

The stream holds, in order, staged steps (:class:`StepRec`: rows in a ring segment) and
deferred request events (a finish or a preemption, joined as a synthetic row with
``num_sampled = 0``, which writes the request's open proposal unverified). :func:`assemble`
turns a run of them into the arrays :func:`~.join.join_chunk` takes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .ring import Segment
from .stage import META_COLS


class StepRec(NamedTuple):
    """One staged step: ``n`` rows at ``row0`` of ``seg``. On the hot path a step enters
    the stream as a plain tuple of these fields in this order (one tuple build: a named
    tuple's ``__new__`` is a Python call, ``tuple.__new__`` on a subclass costs ~4x a plain
    tuple); the tap's drain takes it off as a ``StepRec`` (``_make``), on the join thread.
    Stream items that are not plain tuples are :class:`ReqEvent`."""

    seg: Segment
    row0: int
    n: int
    batch: tuple  # the tap's batch state: (ids, keep, all warmup, req_ids), see below
    step: int
    k: Any  # propose's num_speculative_tokens (None or 0: all of the segment's K)
    t_ns: int

    @property
    def ids(self) -> Any:
        """int64 ``[n]`` tap-local request ids."""
        return self.batch[0]

    @property
    def keep(self) -> Any:
        """bool ``[n]`` non-warmup rows, or None for all."""
        return self.batch[1]

    @property
    def req_ids(self) -> list:
        """The request ids: the tap's own copy (never the runner's list)."""
        return self.batch[3]

    @property
    def k_eff(self) -> int:
        """Drafts per row that are proposals: ``k`` capped at the segment's K."""
        k_all = self.seg.cols - META_COLS
        return min(int(self.k), k_all) if self.k else k_all


class ReqEvent(tuple):
    """A deferred request event in the stream: ``("add", req id, prompt ids, params)``,
    ``("finish", req id, final)`` or ``("drop", req id, None)`` (a tuple subclass, so that
    ``type(item) is tuple`` tells the raw steps apart)."""

    __slots__ = ()


def _gather(pieces: list, cols: int) -> tuple[list, list, list, list]:
    """Row blocks, ids, per-piece ``(rows, step, batch_size, t_ns, k)`` and keep masks of a
    run of pieces; consecutive steps of one segment share one slice."""
    blocks, ids, meta, keeps = [], [], [], []
    run: list[Any] | None = None  # [segment, first row, end row]
    for p in pieces:
        if isinstance(p, StepRec):
            if run is not None and run[0] is p.seg and run[2] == p.row0:
                run[2] += p.n
            else:
                if run is not None:
                    blocks.append(run[0].host_np[run[1] : run[2]])
                run = [p.seg, p.row0, p.row0 + p.n]
            ids.append(p.ids)
            meta.append((p.n, p.step, p.n, p.t_ns, p.k_eff))
            keeps.append(p.keep)
        else:
            if run is not None:
                blocks.append(run[0].host_np[run[1] : run[2]])
                run = None
            row = np.full((1, cols), -1, dtype=np.int32)
            row[0, :META_COLS] = 0  # num_sampled 0, no drafts
            blocks.append(row)
            ids.append(np.array([p], dtype=np.int64))
            meta.append((1, -1, -1, 0, 0))
            keeps.append(None)
    if run is not None:
        blocks.append(run[0].host_np[run[1] : run[2]])
    return blocks, ids, meta, keeps


def assemble(pieces: list, cols: int):
    """Rows and per-row columns of a run of pieces.

    Args:
        pieces: :class:`StepRec` items, or ints (tap-local request ids: synthetic drop rows
            of finished or preempted requests).
        cols: the ring's columns (``4 + K``).
    Returns:
        ``(rows int32 [R, 4 + K], req, step, batch_row, batch_size, t_ns)`` (int64 ``[R]``
        each), warmup rows removed, drafts past each step's k set to -1; None without rows.
    """
    blocks, ids, meta, keeps = _gather(pieces, cols)
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
        keep = np.concatenate(
            [np.ones(c, dtype=bool) if k is None else k for k, c in zip(keeps, counts.tolist())]
        )
        rows, req, step, brow, bsize, t_ns, keff = (
            a[keep] for a in (rows, req, step, brow, bsize, t_ns, keff)
        )
    k_all = rows.shape[1] - META_COLS
    if (keff < k_all).any():  # drafts past the step's k are not proposals
        cut = np.arange(k_all)[None, :] >= keff[:, None]
        rows[:, META_COLS:][cut] = -1
    return rows, req, step, brow, bsize, t_ns
