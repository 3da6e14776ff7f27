"""Rows of the block view: request pairs, the rows of one pair and the contents of a window
of rows, every comparison made by the kernel :mod:`spectrace.tracer.compare`.

One **row** is one anchor position of one request pair (a matched pair of requests, or one
request of one trace): the union of both sides' anchor positions; a position only one side
drafted from has the other side empty. A side's block at a position is its first one there
(as :func:`spectrace.tracer.align.align` pairs blocks). A row is *comparable* when the kernel
says so (:func:`~spectrace.tracer.compare.comparable`: before the content divergence and
before the last common token; at that token, the final position, when both sides drafted
there), and a paired comparable row *diverges* when the kernel's
:func:`~spectrace.tracer.compare.compare_blocks` calls the block pair divergent: exactly the
blocks ``spectrace diff`` counts as differing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spectrace.tracer.compare import (
    NO_DIVERGENCE,
    NO_FINAL,
    SHIFTS,
    comparable,
    comparable_limit,
    compare_blocks,
    final_position,
    shift_equal,
)
from spectrace.tracer.schema import pad_to
from spectrace.tracer.store import Trace

from .sides import SideIndex, gather

#: Slot states (int8), one per draft slot and side.
S_NONE, S_EQUAL, S_DIFF, S_SHIFT, S_PAST, S_SOLO = 0, 1, 2, 3, 4, 5
STATE_NAMES = {
    S_NONE: "none",
    S_EQUAL: "equal",
    S_DIFF: "different",
    S_SHIFT: "shifted",
    S_PAST: "past divergence",
    S_SOLO: "unpaired",
}

#: Block columns a row shows (read per window).
ROW_FIELDS = ("anchor", "k", "proposed", "num_verified", "verified", "accepted")


@dataclass
class Pair:
    """One entry of the requests pane: a matched request pair, or a request of one side.

    Attributes:
        index: position in :attr:`ViewModel.pairs` (matched pairs first, numbered as
            :func:`spectrace.tracer.align.match_requests` returns them).
        req_a, req_b: request rows in ours / theirs (-1: none on that side).
        id_a, id_b: request ids ('' when none).
        matched_by: ``prompt`` | ``req_id`` | ``order``; ``ours only`` / ``theirs only`` for
            unmatched requests; ``single`` for a one-trace view.
        prompt_len: prompt length (tokens).
        divergence: first differing index of the full sequences, :data:`NO_DIVERGENCE`, or
            None until computed (see :meth:`ViewModel.divergence`).
        content_known: both sides know their output ids.
        limit: first anchor position that is not comparable
            (:func:`~spectrace.tracer.compare.comparable_limit`), set with ``divergence``;
        final: the final position (:func:`~spectrace.tracer.compare.final_position`),
            comparable where both sides drafted there.
    """

    index: int
    req_a: int
    req_b: int
    id_a: str
    id_b: str
    matched_by: str
    prompt_len: int = 0
    divergence: int | None = None
    content_known: bool = True
    limit: int = NO_DIVERGENCE
    final: int = NO_FINAL

    @property
    def matched(self) -> bool:
        """Both sides have this request."""
        return self.req_a >= 0 and self.req_b >= 0

    @property
    def label(self) -> str:
        """Short request label: ``id`` or ``id_a/id_b``."""
        if self.matched and self.id_a != self.id_b:
            return f"{self.id_a}/{self.id_b}"
        return self.id_a or self.id_b

    def set_content(self, divergence: int, common_len: int, known: bool) -> None:
        """Record the content comparison of a matched pair (``divergence`` as
        :func:`~spectrace.tracer.compare.first_difference`, ``common_len`` the shorter full
        sequence's length in tokens, ``known`` both outputs recorded)."""
        self.divergence, self.content_known = divergence, known
        args = np.array([divergence], np.int64), np.array([common_len], np.int64), np.array([known])
        self.limit = int(comparable_limit(*args)[0])
        self.final = int(final_position(*args)[0])


@dataclass
class Rows:
    """The rows of one pair (optionally only the divergent ones).

    Attributes:
        pair: the :class:`Pair`; divergence: its content divergence (or NO_DIVERGENCE);
            limit: its first non-comparable anchor position (:attr:`Pair.limit`).
        pos: int64 [R] anchor positions (ascending); ia, ib: int64 [R] block index per side
            (-1: that side has no block at the position).
        base: int64 [R] row numbers in the unfiltered rows (identity when not filtered).
        filtered: only divergent rows; key: identity for caches.
    """

    pair: Pair
    divergence: int
    limit: int
    pos: np.ndarray
    ia: np.ndarray
    ib: np.ndarray
    base: np.ndarray
    filtered: bool
    key: tuple

    def __len__(self) -> int:
        return len(self.pos)

    def row_of_position(self, position: int) -> int:
        """The row at ``position``, or the first row after it (clamped to the last row)."""
        if not len(self.pos):
            return 0
        return min(int(np.searchsorted(self.pos, position)), len(self.pos) - 1)

    def goto(self, position: int) -> tuple[int | None, str | None]:
        """Where ``:position`` goes: ``(row, note)``. The row at ``position`` (no note), the
        first row after it (a note naming the anchor shown), or None with a note when the
        position lies outside these rows' anchors (the cursor stays)."""
        if not len(self.pos):
            return None, "this request has no rows"
        lo, hi = int(self.pos[0]), int(self.pos[-1])
        if position < 0 or position > hi:
            return None, (
                f"position {position} is outside this request's rows (anchor positions "
                f"{lo}..{hi}): the cursor stays"
            )
        row = int(np.searchsorted(self.pos, position))
        shown = int(self.pos[row])
        if shown == position:
            return row, None
        return row, f"no block at position {position}: showing the next anchor, {shown}"

    def subset(self, keep: np.ndarray, key: tuple) -> Rows:
        """The rows at indices ``keep`` (int64, ascending), numbered by their base rows."""
        return Rows(
            self.pair,
            self.divergence,
            self.limit,
            self.pos[keep],
            self.ia[keep],
            self.ib[keep],
            self.base[keep],
            True,
            key,
        )


def first_blocks(
    index: SideIndex | None, trace: Trace | None, req: int
) -> tuple[np.ndarray, np.ndarray]:
    """A request's anchor positions (int64, ascending, unique) and the first block index
    (int64) at each; empty for a missing side or request (``req`` -1)."""
    if index is None or trace is None or req < 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    blocks = index.blocks_of(req)
    pos = gather(trace, blocks, ("position",))["position"].astype(np.int64)
    u, first = np.unique(pos, return_index=True)
    return u, blocks[first]


def union_rows(
    pair: Pair,
    divergence: int,
    side_a: tuple[np.ndarray, np.ndarray],
    side_b: tuple[np.ndarray, np.ndarray],
    key: tuple,
) -> Rows:
    """The unfiltered :class:`Rows` of ``pair`` from both sides' :func:`first_blocks`."""
    (ua, ba), (ub, bb) = side_a, side_b
    pos = np.union1d(ua, ub)
    ia = np.full(len(pos), -1, np.int64)
    ib = np.full(len(pos), -1, np.int64)
    ia[np.searchsorted(pos, ua)] = ba
    ib[np.searchsorted(pos, ub)] = bb
    return Rows(
        pair, divergence, pair.limit, pos, ia, ib, np.arange(len(pos), dtype=np.int64), False, key
    )


@dataclass
class Window:
    """Contents of rows ``[start, stop)`` of a :class:`Rows`, all arrays vectorised.

    Per side (dicts ``a`` ours, ``b`` theirs or None): ``has`` bool [n]; block columns
    ``anchor``, ``k``, ``accepted``, ``num_verified`` [n]; ``proposed``, ``verified``
    [n, w]; ``in_k`` bool [n, w]; ``state`` int8 [n, w] (``S_*``); ``acc`` bool
    [n, w] slot inside the accepted prefix; ``unverified`` bool [n, w]; ``vdiff`` bool [n, w]
    verified id differs from the proposed one. Per row: ``pos``, ``paired``, ``comparable``,
    ``anchor_eq``, ``bad`` (diverges), ``first_diff`` (first differing slot or -1).
    ``divergence``: the pair's content divergence (a row that is not comparable but before
    it holds the request's final, never-verified proposal).
    """

    start: int
    stop: int
    w: int
    pos: np.ndarray
    paired: np.ndarray
    comparable: np.ndarray
    anchor_eq: np.ndarray
    bad: np.ndarray
    first_diff: np.ndarray
    a: dict
    b: dict | None
    divergence: int = NO_DIVERGENCE


def _side_arrays(g: dict, has: np.ndarray, w: int) -> dict:
    d = {name: g[name] for name in ("anchor", "accepted", "num_verified")}
    d["k"] = np.where(has, g["k"].astype(np.int64), 0)
    d["proposed"] = pad_to(g["proposed"], w)
    d["verified"] = pad_to(g["verified"], w)
    d["has"] = has
    slots = np.arange(w)
    nv = g["num_verified"].astype(np.int64)[:, None]
    acc = g["accepted"].astype(np.int64)[:, None]
    d["acc"] = has[:, None] & (slots < acc)
    d["in_k"] = slots < d["k"][:, None]
    unknown = (nv < 0) & (acc < 0)
    d["unverified"] = d["in_k"] & (((nv >= 0) & (slots >= nv)) | unknown)
    d["vdiff"] = d["in_k"] & (nv >= 0) & (slots < nv) & (d["verified"] != d["proposed"])
    return d


def shifted_slots(
    pa: np.ndarray, pb: np.ndarray, ka: np.ndarray, kb: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Slots equal to the other side's slot one shift off, for each shift in
    :data:`~spectrace.tracer.compare.SHIFTS` (the kernel's :func:`shift_equal`).

    Args:
        pa, pb: int32 [n, w] proposals (-1 padded, same width); ka, kb: int [n] lengths.
    Returns:
        bool [n, w] per side (ours, theirs).
    """
    n, w = pa.shape
    sa, sb = np.zeros((n, w), bool), np.zeros((n, w), bool)
    for s in SHIFTS:
        d = abs(s)
        m = shift_equal(pa, pb, ka, kb, s)  # s > 0: ours' slot j; s < 0: theirs' slot j
        if not m.shape[1]:
            continue
        lead, lag = (sa, sb) if s > 0 else (sb, sa)
        lead[:, : w - d] |= m
        lag[:, d:] |= m
    return sa, sb


def _states(
    side: dict, eq: np.ndarray, shift: np.ndarray, paired: np.ndarray, comp: np.ndarray
) -> np.ndarray:
    st = np.where(eq, S_EQUAL, np.where(shift, S_SHIFT, S_DIFF))
    st = np.where(paired[:, None], st, S_SOLO)
    st = np.where(comp[:, None], st, S_PAST)
    return np.where(side["in_k"] & side["has"][:, None], st, S_NONE).astype(np.int8)


def compute_window(ta: Trace, tb: Trace | None, rows: Rows, start: int, stop: int) -> Window:
    """Compute :class:`Window` for rows ``[start, stop)`` (vectorised; see the class).

    Reads :data:`ROW_FIELDS` of the rows' blocks; the comparison of the paired rows is the
    kernel's, so ``bad`` is True exactly on the paired blocks ``spectrace diff`` counts.
    """
    ia, ib = rows.ia[start:stop], rows.ib[start:stop]
    pos = rows.pos[start:stop]
    n = len(pos)
    ga = gather(ta, ia, ROW_FIELDS)
    gb = gather(tb, ib, ROW_FIELDS) if tb is not None else None
    w = max(ga["proposed"].shape[1], gb["proposed"].shape[1] if gb else 0, 1)
    A = _side_arrays(ga, ia >= 0, w)
    comp = comparable(pos, np.zeros(n, np.int64), np.array([rows.limit], np.int64))
    comp |= (pos == rows.pair.final) & (ia >= 0) & (ib >= 0)  # a final both drafted
    if gb is None:
        A["state"] = np.where(A["in_k"], S_SOLO, S_NONE).astype(np.int8)
        z = np.zeros(n, bool)
        return Window(
            start,
            stop,
            w,
            pos,
            z,
            comp,
            np.ones(n, bool),
            z,
            np.full(n, -1, np.int64),
            A,
            None,
            rows.divergence,
        )
    B = _side_arrays(gb, ib >= 0, w)
    paired = A["has"] & B["has"]
    c = compare_blocks(A["proposed"], B["proposed"], A["k"], B["k"], A["anchor"], B["anchor"])
    bad = paired & comp & c.divergent
    shift_a, shift_b = shifted_slots(A["proposed"], B["proposed"], A["k"], B["k"])
    A["state"] = _states(A, c.eq, shift_a & paired[:, None], paired, comp)
    B["state"] = _states(B, c.eq, shift_b & paired[:, None], paired, comp)
    return Window(
        start,
        stop,
        w,
        pos,
        paired,
        comp,
        c.anchor_eq,
        bad,
        np.where(bad, c.first_slot, -1),
        A,
        B,
        rows.divergence,
    )
