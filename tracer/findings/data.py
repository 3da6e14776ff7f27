"""The columns the detectors share: per trace (:class:`TraceData`), per side of a run
(:class:`SideInput`) and per paired block (:class:`PairData`, built on the comparison
kernel's :class:`~spectrace.tracer.compare.PairedComparison`)."""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ..align import Alignment
from ..compare import BlockComparison, PairedComparison, SlotCounts, anchors_equal, slots_present
from ..index import block_order, checked_counts, sequence_index
from ..metrics import recompute_accepted
from ..parallel import chunks
from ..rows import row
from ..schema import pad_to
from ..store import Trace
from ..tokens import Decoder
from .evidence import ProposalPair
from .model import Side, tok
from .sweep import Sweep, sweep


@dataclass
class TraceData:
    """Per-trace columns the detectors share (computed once, vectorised).

    Attributes:
        t: the trace; side: ``ours`` | ``theirs``.
        nchecked: int16 [n] how many drafts the target checked
            (:func:`~spectrace.tracer.index.checked_counts`).
        recomputed: int16 [n] accepted recomputed from the output (-1 unknown).
        sweep: the per-block reductions of the id matrices (:func:`~.sweep.sweep`; the
            matrices themselves are never loaded whole).
        order: int32 [n] block indices sorted by (request, position) (int64 past 2**31 - 1).
        last: bool [n] block is its request's last; prev: int [n] (the dtype of ``order``)
            previous block of the same request (-1 for the first). Both built on first use
            (after a diff's comparison, not beside its paired rows).
        flat, start, length: concatenated full sequences (see index.sequence_index).
    """

    t: Trace
    side: Side
    nchecked: np.ndarray
    recomputed: np.ndarray
    order: np.ndarray
    flat: np.ndarray
    start: np.ndarray
    length: np.ndarray
    sweep: Sweep

    #: Narrow block columns the detectors read (:func:`prepare` reads them up front).
    COLUMNS = (
        "request",
        "position",
        "anchor",
        "k",
        "num_verified",
        "accepted",
        "num_emitted",
        "batch_row",
        "batch_size",
    )
    #: Those of :data:`COLUMNS` that alignment and the sweeps read (a diff prefetches
    #: these; the others load on first use, after the comparison, not beside its rows).
    SWEPT = ("request", "position", "anchor", "k", "num_verified", "accepted", "num_emitted")
    #: The id matrices, streamed by :func:`~.sweep.sweep` (never loaded whole; ``emitted``
    #: only where requests hold output ids to check it against).
    WIDE = ("proposed", "verified", "emitted")

    @classmethod
    def build(
        cls,
        t: Trace,
        side: Side,
        paired_rows: np.ndarray | None = None,
    ) -> TraceData:
        """Build (once per trace and side; memoised in ``t.cache``).

        Args:
            paired_rows: int [P] the rows whose proposals a diff compares (kept by the
                sweep: ``td.sweep.paired``), or None.
        """
        key = f"TraceData.{side}"
        if key not in t.cache:
            t.cache[key] = cls._build(t, side, paired_rows)
        elif paired_rows is not None:
            t.cache[key].sweep = sweep(t, paired_rows)
        return t.cache[key]

    @classmethod
    def _build(cls, t: Trace, side: Side, paired_rows: np.ndarray | None) -> TraceData:
        order = block_order(t)
        flat, start, length = sequence_index(t)
        sw = sweep(t, paired_rows)  # before recompute_accepted: the sweep computes it
        return cls(
            t=t,
            side=side,
            nchecked=checked_counts(t),
            recomputed=recompute_accepted(t),
            order=order,
            flat=flat,
            start=start,
            length=length,
            sweep=sw,
        )

    @functools.cached_property
    def last(self) -> np.ndarray:
        """bool [n]: the block is its request's last (see the class docstring)."""
        return self._neighbours[0]

    @functools.cached_property
    def last_verified(self) -> np.ndarray:
        """int [requests + 1] (intp): each request's last block with a verify record in
        (request, position) order, ties in row order (-1 none): its last block but for a
        final proposal after it. In row chunks: per request the highest such position, then
        the latest row at it."""
        b = self.t.blocks
        m = len(self.t.requests) + 1
        # ufunc.at in matching dtypes (intp indices): its fast path, not a cast per element.
        top = np.full(m, np.iinfo(b.position.dtype).min, b.position.dtype)
        last = np.full(m, -1, np.intp)
        for final in (False, True):  # two passes: the highest positions, then the rows at them
            for c in chunks(len(b)):
                rows = np.flatnonzero((b.num_verified[c] >= 0) | (b.accepted[c] >= 0))
                req, pos = b.request[c][rows].astype(np.intp), b.position[c][rows]
                if not final:
                    np.maximum.at(top, req, pos)
                    continue
                at = pos == top[req]
                np.maximum.at(last, req[at], rows[at] + c.start)
        return last

    @functools.cached_property
    def prev(self) -> np.ndarray:
        """int [n] (the dtype of ``order``): the previous block of the same request, -1 for
        a request's first."""
        return self._neighbours[1]

    @functools.cached_property
    def chain_gaps(self) -> tuple[np.ndarray, np.ndarray]:
        """Gaps in each request's anchor chain: blocks whose position lies past the previous
        verified block's anchor + accepted + 1 (the engine emitted tokens from there without
        a block drafting from them), found in row chunks.

        Returns:
            ``(rows, expected)``: int64 [g] block rows after a gap (row order), int64 [g] the
            anchor position each gap skipped (where the next block should have drafted).
        """
        b = self.t.blocks
        gaps, exp = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
        for c in chunks(len(b)):
            pv = self.prev[c]
            has = pv >= 0
            pv = np.maximum(pv, 0)
            acc = b.accepted[pv]
            expected = b.position[pv].astype(np.int64) + acc + 1
            gap = np.flatnonzero(has & (acc >= 0) & (b.position[c] > expected))
            gaps.append(gap + c.start)
            exp.append(expected[gap])
        return np.concatenate(gaps), np.concatenate(exp)

    @functools.cached_property
    def prompt_lengths(self) -> np.ndarray:
        """int64 [requests]: each request's prompt length (tokens; 0 unknown)."""
        prompts = self.t.requests.prompt_ids
        return np.fromiter(map(len, prompts), np.int64, len(prompts))

    @functools.cached_property
    def tail_gaps(self) -> tuple[np.ndarray, np.ndarray]:
        """Requests whose output goes on past their last block: the last block's anchor
        position + accepted + 1 (the recomputed count where a verified block's is unknown;
        + 0 when never verified) lies before the sequence's last token, so the engine
        emitted tokens after it without a block drafting from them. Requests whose output
        is unknown are left out.

        Returns:
            ``(rows, reach)``: int64 [g] the last block rows (row order), int64 [g] the last
            position each reaches.
        """
        b = self.t.blocks
        rows = np.flatnonzero(self.last)
        req = b.request[rows].astype(np.int64)
        known = (req >= 0) & (req < len(self.length))
        rows, req = rows[known], req[known]
        acc, nv = b.accepted[rows].astype(np.int64), b.num_verified[rows]
        took = np.where(acc >= 0, acc, np.where(nv > 0, self.recomputed[rows], -1))
        reach = b.position[rows].astype(np.int64) + np.where(took >= 0, took + 1, 0)
        end = self.length[req] - 1
        gap = (end >= 0) & (reach < end)
        return rows[gap], reach[gap]

    @functools.cached_property
    def late_starts(self) -> tuple[np.ndarray, np.ndarray]:
        """Requests whose first block drafts past the first output token: its anchor position
        lies beyond ``len(prompt)`` (every engine anchors a request's first block on the
        token its prefill sampled, at ``len(prompt)``; vLLM ``GPUModelRunner`` proposes in
        that step), so the engine emitted tokens before it without a block drafting from
        them. Requests whose prompt is unknown are left out.

        Returns:
            ``(rows, start)``: int64 [g] the first block rows (row order), int64 [g] each
            request's prompt length (the position its first block should draft from).
        """
        rows, start = self._first_blocks
        late = (start > 0) & (self.t.blocks.position[rows] > start)
        return rows[late], start[late]

    @property
    def blind_starts(self) -> np.ndarray:
        """int64 [g]: the first block rows (row order) of requests whose prompt is unknown
        (a VT log imported without its requests file): where their output starts, nothing
        here says."""
        rows, start = self._first_blocks
        return rows[start == 0]

    @functools.cached_property
    def _first_blocks(self) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, start)``: each request's first block row (row order) and its prompt
        length (int64; 0 unknown), for blocks of a request the table holds."""
        rows = np.flatnonzero(self.prev < 0)
        req = self.t.blocks.request[rows].astype(np.int64)
        known = (req >= 0) & (req < len(self.prompt_lengths))
        return rows[known], self.prompt_lengths[req[known]]

    @property
    def head_gaps(self) -> tuple[np.ndarray, np.ndarray]:
        """:attr:`late_starts` as lost blocks: none when an anchor of the trace is not the
        token at its position (:attr:`anchor_check`; the positions are not to be trusted,
        anchor_shift names it). Returns ``(rows, start)`` as ``late_starts`` does."""
        rows, start = self.late_starts
        if self.anchor_check[1].any():
            return rows[:0], start[:0]
        return rows, start

    @functools.cached_property
    def anchor_check(self) -> tuple[np.ndarray, np.ndarray]:
        """``(known, bad)``: bool [n] each, the block's anchor and the sequence's token at
        its position are both known, and they differ (the record is shifted or corrupt)."""
        b = self.t.blocks
        n = len(b)
        known, bad = np.zeros(n, bool), np.zeros(n, bool)
        for c in chunks(n):
            req, anchor, pos = b.request[c], b.anchor[c], b.position[c].astype(np.int64)
            known[c] = (anchor >= 0) & (pos >= 0) & (pos < self.length[req])
            bad[c] = known[c] & ~anchors_equal(token_at(self, req, pos), anchor)
        return known, bad

    @functools.cached_property
    def _neighbours(self) -> tuple[np.ndarray, np.ndarray]:
        order, n, req = self.order, len(self.order), self.t.blocks.request
        last, prev = np.zeros(n, bool), np.full(n, -1, order.dtype)
        for c in chunks(n - 1):  # in chunks: the index temporaries stay small
            o0, o1 = order[c], order[c.start + 1 : c.stop + 1]
            same = req[o1] == req[o0]  # order[i + 1] continues order[i]'s request
            last[o0[~same]] = True
            prev[o1[same]] = o0[same]
        if n:
            last[order[-1]] = True
        return last, prev

    def req_id(self, block: int) -> str:
        """Request id of block row ``block``."""
        return self.t.requests.req_id[int(self.t.blocks.request[block])]

    def output_unknown(self, row: int) -> bool:
        """Whether request row ``row``'s output is unknown, not empty: no output ids and no
        finish reason (e.g. a VT import without its requests file). An unknown output is
        neither cut short nor missing work; nothing says what the engine emitted."""
        req = self.t.requests
        return len(req.output_ids[row]) == 0 and not req.finish_reason[row]

    def at(self, block: int) -> dict:
        """Location fields (``request``, ``position``) of a finding at ``block`` (position
        null when negative: impossible_values names such a block)."""
        pos = int(self.t.blocks.position[block])
        return {"request": self.req_id(block), "position": pos if pos >= 0 else None}


def prepare(
    traces: list[tuple[Trace, Side]], paired_rows: list[np.ndarray | None] | None = None
) -> list[TraceData]:
    """Build each trace's :class:`TraceData`: the narrow block columns are read here, one
    trace after the other (h5py holds the GIL), and each trace's derived columns (order,
    the sweep of its id matrices, recomputed acceptance) on a worker thread while the next
    trace reads.

    Args:
        paired_rows: per trace, the block rows a diff compares (``al.ia``, ``al.ib``), or None.
    """
    rows = paired_rows or [None] * len(traces)
    with ThreadPoolExecutor(max_workers=max(1, len(traces))) as pool:
        futures = []
        for (t, side), r in zip(traces, rows):
            for col in TraceData.COLUMNS:
                getattr(t.blocks, col)
            futures.append(pool.submit(TraceData.build, t, side, r))
        return [f.result() for f in futures]


@dataclass
class SideInput:
    """What a single-trace detector reads about one side.

    Attributes:
        td: the side's columns.
        ref: the other side's columns in a diff, None for ``spectrace check``.
        skipped: int64 block indices after anchors the other side drafted from and this
            side skipped (:func:`~.work.skipped_anchors`), None outside a diff.
        decoder: decodes example ids, or None.
        al: the diff's alignment, None for ``spectrace check``.
        side_a: ``td`` is the alignment's ours (``al.a``).
    """

    td: TraceData
    ref: TraceData | None = None
    skipped: np.ndarray | None = None
    decoder: Decoder | None = None
    al: Alignment | None = None
    side_a: bool = True

    def pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """Matched request rows ``(here, other)`` (int64 [m] each) of a diff (empty in a
        check)."""
        if self.al is None:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        a, b = self.al.req_a.astype(np.int64), self.al.req_b.astype(np.int64)
        return (a, b) if self.side_a else (b, a)


@dataclass
class PairData:
    """Paired-block arrays shared by the pair detectors (P paired blocks, w slots).

    Attributes:
        al: the alignment; oa, ob: ours' and theirs' columns.
        paired: the kernel's comparison of the paired blocks (ka, kb, blocks, counts).
        decoder: decodes example ids, or None.
        trusted: bool [P]: our proposal is the drafter's own output, or nothing says
            otherwise. False for blocks whose "proposal" only copies verified ids when
            verified ids are corrupted.
    """

    al: Alignment
    oa: TraceData
    ob: TraceData
    paired: PairedComparison
    decoder: Decoder | None = None
    trusted: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))

    def __post_init__(self) -> None:
        if len(self.trusted) != len(self.paired.ka):  # not given: every block trusted
            self.trusted = np.ones(len(self.paired.ka), bool)

    @property
    def cmp(self) -> BlockComparison:
        """The per-block comparison (eq, prefix, exact, anchor_eq, divergent, first_slot)."""
        return self.paired.blocks

    @property
    def counts(self) -> SlotCounts:
        """The per-slot counts (equal, present, shift_plus, shift_minus)."""
        return self.paired.counts

    @property
    def ka(self) -> np.ndarray:
        """int16 [P] our proposal lengths (tokens)."""
        return self.paired.ka

    @property
    def kb(self) -> np.ndarray:
        """int16 [P] their proposal lengths (tokens)."""
        return self.paired.kb

    @property
    def width(self) -> int:
        """w: the slots compared."""
        return self.cmp.eq.shape[1]

    @functools.cached_property
    def both(self) -> np.ndarray:
        """bool [P, w] (Fortran order): slot j present on both sides (built on first use)."""
        return slots_present(self.ka, self.kb, self.width)

    def both_at(self, j: int) -> np.ndarray:
        """bool [P]: slot j present on both sides (column j of :attr:`both`, without
        building the matrix where it is not built: the per-slot tests need one column)."""
        if "both" in self.__dict__:
            return self.both[:, j]
        return np.minimum(self.ka, self.kb) > j

    @functools.cached_property
    def pa(self) -> np.ndarray:
        """int32 [P, w] our paired proposals (-1 padded; the sweep's rows)."""
        return pad_to(paired_proposals(self.oa, self.al.ia), self.width)

    @functools.cached_property
    def pb(self) -> np.ndarray:
        """int32 [P, w] their paired proposals (-1 padded; the sweep's rows)."""
        return pad_to(paired_proposals(self.ob, self.al.ib), self.width)

    def example(self, x: int) -> ProposalPair:
        """Both proposals of paired block ``x`` (ids, decoded when a decoder is given)."""
        # Each side's own width: a k wider than the stored matrix shows the stored ids only.
        pa, pb = paired_row(self.oa, self.al.ia, x), paired_row(self.ob, self.al.ib, x)
        return ProposalPair(
            ours=tok(self.decoder, pa[: self.ka[x]]), theirs=tok(self.decoder, pb[: self.kb[x]])
        )

    def at(self, x: int) -> dict:
        """Location fields (request, position) of paired block ``x`` on our side."""
        return self.oa.at(int(self.al.ia[x]))


def paired_proposals(td: TraceData, rows: np.ndarray) -> np.ndarray:
    """int32 [P, w] the proposals of block rows ``rows`` (a diff's ``ia`` or ``ib``), as the
    side's sweep kept them (a pass of their own when it kept other rows)."""
    return sweep(td.t, rows).paired  # type: ignore[return-value]


def paired_row(td: TraceData, rows: np.ndarray, x: int) -> np.ndarray:
    """int32 [w] the proposal of block row ``rows[x]``: from the rows the side's sweep keeps
    when it keeps ``rows``, else one row read from the store (the same values; a diff's
    comparison streams both matrices and keeps no paired rows)."""
    sw = td.t.cache.get("sweep")
    if sw is not None and sw.paired is not None and sw.rows is rows:
        return sw.paired[x]
    return row(td.t, "proposed", int(rows[x])).astype(np.int32, copy=False)


def token_at(td: TraceData, req: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """int64 [n] the token of request ``req`` at position ``pos`` (-1 outside the sequence)."""
    length = td.length[req]
    ok = (pos >= 0) & (pos < length)
    out = np.full(len(req), -1, np.int64)
    out[ok] = td.flat[td.start[req[ok]] + pos[ok]]
    return out
