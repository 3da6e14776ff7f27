"""The comparison kernel fed by both sides' streamed proposal matrices (a diff's sweeps).

:class:`PairedStreams` is :func:`~spectrace.tracer.compare.compare_paired` of an alignment's
paired blocks with neither side's matrix held: each side's sweep hands its chunks over in row
order (:meth:`PairedStreams.take`), the two sweeps alternating chunk by chunk
(:func:`~spectrace.tracer.findings.sweep.sweep_pair`). A paired block is compared when the
second of its two rows arrives; the first is held until then. Two engines' runs of one
workload record a block and its partner at about the same point of their runs, so few rows
are held at once, where holding ours' paired rows for theirs' pass took [P, w] int32 (116 MB
of a 5M-block diff's peak). The result is the kernel's value for value: its counts are sums
and the rest is per block, whatever the order the blocks are compared in.
"""

from __future__ import annotations

import numpy as np

from .compare import Accumulator, PairedComparison, lengths
from .parallel import bounds, row_order


class _Held:
    """One side's rows waiting for their partner: sorted by the partner's row (the other
    side's chunks arrive in row order, so the rows a chunk completes are at the front).

    Attributes:
        key: int64 [m] the partner's row; pair: int [m] the paired block; rows: int32 [m, w]
            this side's proposals.
    """

    def __init__(self, w: int) -> None:
        self.key = np.zeros(0, np.int64)
        self.pair = np.zeros(0, np.int64)
        self.rows = np.zeros((0, w), np.int32)

    def add(self, key: np.ndarray, pair: np.ndarray, rows: np.ndarray) -> None:
        """Hold ``rows`` of paired blocks ``pair`` until their partner rows ``key`` arrive."""
        if not len(key):
            return
        first = np.argsort(key, kind="stable")  # two sorted runs: the stable sort merges them
        key, pair, rows = key[first], pair[first], rows[first]
        key = np.concatenate([self.key, key])
        order = np.argsort(key, kind="stable")
        self.key = key[order]
        self.pair = np.concatenate([self.pair, pair])[order]
        self.rows = np.concatenate([self.rows, rows])[order]

    def pop(self, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """``(pair, rows)`` of the held rows whose partner row is below ``stop``, removed."""
        n = int(np.searchsorted(self.key, stop))
        out = self.pair[:n], self.rows[:n]
        self.key, self.pair, self.rows = self.key[n:], self.pair[n:], self.rows[n:]
        return out


class PairedStreams:
    """:func:`~spectrace.tracer.compare.compare_paired` of paired blocks ``(ia, ib)`` with
    both proposal matrices streamed (see the module docstring).

    Args:
        ia, ib: int [P] ours' and theirs' block row of each paired block (``al.ia``,
            ``al.ib``; each side's rows distinct).
        ka, kb: int [P] the paired proposal lengths (tokens).
        anchors: ``(anchor_a, anchor_b)``: both sides' anchor columns (int [blocks] each, -1
            unknown), read at :meth:`result`.
        widths: ``(wa, wb)`` slots of each side's matrix.
    """

    def __init__(self, ia, ib, ka, kb, anchors: tuple, widths: tuple[int, int]) -> None:
        self._paired, self._anchors = (ia, ib), anchors
        self._order: list[np.ndarray] = []
        self._sorted: list[np.ndarray] = []
        for rows in (ia, ib):
            order, srt = row_order(rows)
            self._order.append(order)
            self._sorted.append(srt)
        self._seen = [0, 0]  # rows taken so far per side (chunks come in row order)
        self._held = [_Held(widths[0]), _Held(widths[1])]
        self._acc = Accumulator(len(ia), max(widths), lengths(ka), lengths(kb))

    def held(self) -> int:
        """Rows held now, waiting for their partner (both sides)."""
        return sum(len(h.key) for h in self._held)

    def side(self, s: int) -> _Side:
        """The consumer of side ``s``'s chunks (0: ours, 1: theirs) for its sweep."""
        return _Side(self, s)

    def take(self, s: int, c: slice, chunk: np.ndarray) -> None:
        """Side ``s``'s block rows ``c`` (``chunk``: its ``proposed[c]``, int32 [rows, w]):
        compare the paired blocks whose other row came before, hold the others' rows."""
        if c.start != self._seen[s]:
            raise ValueError(f"side {s}: rows from {c.start}, expected {self._seen[s]}")
        self._seen[s] = c.stop
        o = 1 - s
        lo, hi = np.searchsorted(self._sorted[s], bounds(c, self._sorted[s]))
        pair, at = self._order[s][lo:hi], self._sorted[s][lo:hi] - c.start
        partner = np.asarray(self._paired[o])[pair]
        ready = partner < self._seen[o]
        done, other = self._held[o].pop(c.stop)  # the other side's rows waiting for these
        if len(done):
            x, own = pair[ready], chunk[at[ready]]
            if not np.array_equal(x, done):  # both in this side's row order, unless rows repeat
                i, j = np.argsort(x, kind="stable"), np.argsort(done, kind="stable")
                x, own, other = x[i], own[i], other[j]
            pa, pb = (own, other) if s == 0 else (other, own)
            self._acc.counts += self._acc.fill(x, pa, pb)
        wait = ~ready
        self._held[s].add(partner[wait].astype(np.int64), pair[wait], chunk[at[wait]])

    def result(self) -> PairedComparison:
        """The comparison, once both sides' every row was taken."""
        if self.held():
            raise ValueError("paired rows left without their partner: a side was not swept")
        self._order, self._sorted, self._held = [], [], []  # let go before the result
        anchor_a, anchor_b = self._anchors
        ia, ib = self._paired
        return self._acc.result(anchor_a, anchor_b, ia, ib)


class _Side:
    """One side's :class:`~spectrace.tracer.findings.sweep.Consumer` of a
    :class:`PairedStreams`."""

    def __init__(self, streams: PairedStreams, s: int) -> None:
        self._streams, self._s = streams, s

    def take(self, c: slice, chunk: np.ndarray) -> None:
        """Block rows ``c`` of this side (``chunk``: ``proposed[c]``)."""
        self._streams.take(self._s, c, chunk)
