"""The one pass over a trace's id matrices that the single-trace detectors share.

The detectors need per-block reductions of ``proposed`` and ``verified`` ([n, w] each), not
the matrices: which blocks hold an id below the pad (impossible_values), which repeat one id
across slots (constant_drafts), the largest id (vocab_mapping), where the target verified
other ids than proposed (verified_differs), the recomputed acceptance, and in a diff the rows
of the paired blocks. :func:`sweep` computes all of them in one streaming pass
(:func:`~spectrace.tracer.rows.row_chunks`), so a diff's memory is set by its narrow columns
and the paired rows, not by the trace's matrices.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..compare import slot_equal, slots_present
from ..index import checked_counts, checked_ids, memo, sequence_index
from ..metrics import recompute_rows
from ..rows import Gather, gather, row_chunks, verified_is_proposed
from ..store import Trace


class Consumer(Protocol):
    """Takes the chunks of a sweep's ``proposed`` matrix (see :func:`sweep_pair`)."""

    def take(self, c: slice, chunk: np.ndarray) -> None:
        """Take block rows ``c`` (``chunk``: int32 [rows, w], ``proposed[c]``)."""


@dataclass
class VerifiedStats:
    """verified_differs' figures: slots where the verified id is not the proposed one.

    Attributes:
        bad: bool [n] blocks with such a slot; per_slot: int64 [w] such slots per slot.
        values, equals_anchor, placeholders: such slots, those whose verified id is the
            block's anchor, and those holding -1.
        first_slot: the first such slot of the first bad block (-1: none).
    """

    bad: np.ndarray
    per_slot: np.ndarray
    values: int = 0
    equals_anchor: int = 0
    placeholders: int = 0
    first_slot: int = -1


@dataclass
class Sweep:
    """Per-block reductions of one trace's id matrices (see the module docstring).

    Attributes:
        width: slots of the ``proposed`` matrix as loaded.
        max_id: the largest proposed id (-1 when none; the pad never raises it).
        below_pad: bool [n] a proposed id below -1.
        constant: bool [n] k >= 2 and every live slot holds slot 0's id.
        recomputed: int16 [n] (:func:`~spectrace.tracer.metrics.recompute_accepted`).
        verified: the verified_differs figures, None when verified equals proposed.
        paired: int32 [P, width] rows ``rows`` of ``proposed`` (-1 padded), or None.
        rows: int [P] the block rows of ``paired`` (None with it).
        emitted_off: bool [n] an emitted id (of the ``num_emitted`` recorded) that is not
            the output's token at its position (ids past the output's end, trimmed at a
            stop, are not compared); all False when no request holds output ids.
        rejected_emitted: blocks whose correction (the id emitted after the accepted drafts,
            where the target checked more) is the rejected draft itself, which neither
            greedy verification nor exact rejection sampling emits (vLLM's
            ``sample_recovered_tokens`` masks the draft id); 0 when no request holds output
            ids (``emitted`` is not read then).
    """

    width: int
    max_id: int
    below_pad: np.ndarray
    constant: np.ndarray
    recomputed: np.ndarray
    verified: VerifiedStats | None
    paired: np.ndarray | None = None
    rows: np.ndarray | None = None
    emitted_off: np.ndarray | None = None
    rejected_emitted: int = 0


def sweep(t: Trace, paired_rows: np.ndarray | None = None) -> Sweep:
    """The :class:`Sweep` of trace ``t`` (memoised in ``t.cache``; the first call decides
    which rows are gathered: a later call with other rows gathers them in a pass of its own).
    A diff's comparison streams the chunks of both sides instead (:func:`sweep_pair`).

    Args:
        paired_rows: int [P] block rows whose proposals to keep (a diff's ``ia`` / ``ib``).
    Raises:
        TraceFormatError: a damaged chunk of either matrix.
    """
    sw = memo(t, "sweep", lambda: _sweep(t, paired_rows))
    if paired_rows is not None and not (
        sw.rows is paired_rows or (sw.rows is not None and np.array_equal(sw.rows, paired_rows))
    ):
        sw.paired, sw.rows = gather(t, "proposed", paired_rows), paired_rows
    return sw


def sweep_pair(ta: Trace, tb: Trace, consumers: tuple[Consumer, Consumer]) -> None:
    """Both traces' :func:`sweep` (memoised as its), on this thread, chunk by chunk
    alternately (ours' first), each chunk of ``proposed`` handed to that side's consumer (a
    diff's :class:`~spectrace.tracer.compare_stream.PairedStreams`): so that the consumer
    sees both sides advance together. A side swept before is streamed for its consumer only.

    Raises:
        TraceFormatError: a damaged chunk of either matrix.
    """
    steps = [_steps(t, c) for t, c in zip((ta, tb), consumers)]
    while steps:
        for st in list(steps):
            try:
                next(st)
            except StopIteration:
                steps.remove(st)


def _steps(t: Trace, consumer: Consumer) -> Iterator[None]:
    """:func:`sweep_pair`'s side: its sweep (or, memoised, its stream), a chunk per step."""
    if "sweep" in t.cache:
        for c, cols in row_chunks(t, ("proposed",), ahead=True):
            consumer.take(c, cols["proposed"])
            yield
        return
    sw = yield from _chunked(t, None, consumer)
    memo(t, "sweep", lambda: sw)


def _sweep(t: Trace, paired_rows: np.ndarray | None) -> Sweep:
    """The :class:`Sweep` of ``t`` in one pass (see :func:`sweep`)."""
    it = _chunked(t, paired_rows, None)
    while True:
        try:
            next(it)
        except StopIteration as done:
            return done.value


def _chunked(
    t: Trace, paired_rows: np.ndarray | None, consumer: Consumer | None
) -> Generator[None, None, Sweep]:
    """The pass of :func:`_sweep`, yielding after each chunk; returns the :class:`Sweep`."""
    b = t.blocks
    n = len(b)
    k, nv, anchor = b.k, b.num_verified, b.anchor
    same = verified_is_proposed(t)
    counts = checked_counts(t)
    recomputed = np.zeros(n, np.int16)
    below, const = np.zeros(n, bool), k >= 2
    vs: VerifiedStats | None = None
    g: Gather | None = None
    width, max_id = 0, -1
    # ``step`` is read for its value check only (a negative step is a damaged trace, exit 2):
    # no detector needs the column, and streaming it costs no memory. ``emitted`` is read
    # only where there is an output to hold it against.
    names = ("proposed", "verified", "step") + (("emitted",) if _has_outputs(t) else ())
    off = np.zeros(n, bool)
    reemitted = 0
    for c, cols in row_chunks(t, names, ahead=True):
        p, v = cols["proposed"], cols["verified"]
        ids = checked_ids(p, v, nv[c])
        if "emitted" in cols:
            _emitted_off(t, c, cols["emitted"], ids, off[c])
            reemitted += _rejected_emitted(b.accepted[c], counts[c], cols["emitted"], ids)
        if g is None:
            width = p.shape[1]
            g = Gather(
                np.zeros(0, np.int64) if paired_rows is None else paired_rows, width, np.int32, -1
            )
            if not same:
                vs = VerifiedStats(
                    bad=np.zeros(n, bool), per_slot=np.zeros(min(width, v.shape[1]), np.int64)
                )
        max_id = max(max_id, int(p.max(initial=-1)))
        _below_pad(p, below[c])
        _constant(p, k[c], const[c])
        recompute_rows(t, c, ids, counts[c], recomputed[c])
        if vs is not None:
            _verified(vs, c, p, v, k[c], nv[c], anchor[c])
        g.take(c, p)
        if consumer is not None:
            consumer.take(c, p)
        yield
    if g is None:  # no rows
        width = t.read_rows("proposed", 0, 0).shape[1]
    recomputed[(nv < 0) & (b.accepted < 0)] = -1  # never verified: nothing accepted
    memo(t, "recompute_accepted", lambda: recomputed)
    return Sweep(
        width=width,
        max_id=max_id,
        below_pad=below,
        constant=const,
        recomputed=recomputed,
        verified=vs if vs is not None and vs.bad.any() else None,
        paired=None if paired_rows is None or g is None else g.out,
        rows=None if paired_rows is None or g is None else paired_rows,
        emitted_off=off,
        rejected_emitted=reemitted,
    )


def _has_outputs(t: Trace) -> bool:
    """Whether any request holds output ids (its sequence is in the sequence index)."""
    return bool((sequence_index(t)[2] > 0).any())


def _emitted_off(t: Trace, c: slice, e: np.ndarray, ids: np.ndarray, out: np.ndarray) -> None:
    """``out[:] =`` rows ``c`` emit an id (int32 ``e`` [rows, w], ``num_emitted`` of them)
    that is not the output's token at ``position + 1 + j``. The accepted ones (all but the
    last) are held against the checked drafts ``ids`` (int32 [rows, wi]), which the
    recomputed acceptance holds against the output (a difference there is bookkeeping's),
    so that only the last id, the bonus or correction, needs a gather from the output.
    Ids past the output's end (trimmed at a stop), or of requests without output ids, are
    not compared."""
    b = t.blocks
    flat, start, length = sequence_index(t)
    ne = b.num_emitted[c].astype(np.int64)
    out[:] = False
    for j in range(min(e.shape[1] - 1, ids.shape[1], int(ne.max(initial=0)) - 1)):
        out |= (ne - 1 > j) & (e[:, j] != ids[:, j])
    req, last = b.request[c], b.position[c].astype(np.int64) + ne  # the last id's position
    live = (ne >= 1) & (last < length[req]) & (last >= 0) & (length[req] > 0)
    at = np.where(live, start[req] + last, 0)
    tail = e[np.arange(len(ne)), np.clip(ne - 1, 0, e.shape[1] - 1)]
    out |= live & (flat[np.minimum(at, max(len(flat) - 1, 0))] != tail)


def _rejected_emitted(acc: np.ndarray, n: np.ndarray, e: np.ndarray, ids: np.ndarray) -> int:
    """How many rows emit their first rejected draft as its correction: ``accepted`` (int
    ``acc`` [rows]) below the checked count ``n``, and ``e[r, acc] == ids[r, acc]`` (int32
    emitted [rows, we] and checked drafts [rows, wi])."""
    rej = np.flatnonzero((acc >= 0) & (acc < n) & (acc < min(e.shape[1], ids.shape[1])))
    a = acc[rej].astype(np.intp)
    return int((e[rej, a] == ids[rej, a]).sum())


def _below_pad(p: np.ndarray, out: np.ndarray) -> None:
    """``out[:] =`` the row holds an id below -1 (slot by slot: 1-D passes, where
    ``.any(axis=1)`` over w slots crawls)."""
    out[:] = False
    for j in range(p.shape[1]):
        out |= p[:, j] < -1


def _constant(p: np.ndarray, k: np.ndarray, out: np.ndarray) -> None:
    """``out &=`` every slot j < k holds slot 0's id (padded slots count as equal)."""
    for j in range(1, p.shape[1]):
        out &= (p[:, j] == p[:, 0]) | (k <= j)


def _verified(vs: VerifiedStats, c: slice, p, v, k, nv, anchor) -> None:
    """Add rows ``c`` to the verified_differs figures (the kernel's slot equality of each
    block's proposal with its own verified ids)."""
    w = len(vs.per_slot)
    k64, nv64 = k.astype(np.int64), nv.astype(np.int64)
    ver = v[:, :w]
    diff = slots_present(k64, nv64, w) & ~slot_equal(p[:, :w], ver, k64, nv64)
    bad = diff.any(axis=1)
    if not bad.any():
        return
    vs.bad[c] = bad
    vs.per_slot += diff.sum(axis=0)
    vals = ver[diff]
    vs.values += len(vals)
    vs.equals_anchor += int((vals == np.broadcast_to(anchor[:, None], diff.shape)[diff]).sum())
    vs.placeholders += int((vals < 0).sum())
    if vs.first_slot < 0:
        vs.first_slot = int(np.flatnonzero(diff[np.flatnonzero(bad)[0]])[0])
