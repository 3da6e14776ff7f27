"""The viewer's model: rows of the block view over one or two traces, read lazily.

UI-independent (no textual): the TUI (``spectrace.tui``) renders what this module computes,
and tests can drive it directly. Sized for traces of ten million blocks in a few hundred MB:

* traces are opened with ``lazy_requests`` and block columns are read in windows
  (:meth:`Trace.read_rows`); the only whole columns held are the ``request`` columns
  (4 bytes a block), scanned in chunks by :class:`SideIndex`;
* one **row** is one anchor position of one request pair (a matched pair of requests, or one
  request of one trace): the union of both sides' anchor positions, built vectorised per pair
  (:class:`Rows`); a position only one side drafted from has the other side empty;
* row contents (:class:`Window`) are computed vectorised for 256 rows at a time and kept in a
  bounded LRU, so paging costs a few small HDF5 reads;
* the whole-trace analysis (alignment, diff, findings, per-request figures) is
  :func:`analyse`, which can run in a child process (``python -m
  spectrace.tracer.view_model``) so that its peak memory never lands in the viewer.

Definitions match :mod:`align` and :mod:`diff`: requests pair by :func:`align.match_requests`,
a row is comparable when its anchor position is before the content divergence, a side's
block at a position is its first one there, and a paired row *diverges* when the anchors
differ or the proposals are not exactly equal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .align import NO_DIVERGENCE, first_difference, match_requests
from . import schema
from .findings import Finding
from .store import Trace, open_trace

#: Slot states (int8), one per draft slot and side.
S_NONE, S_EQUAL, S_DIFF, S_SHIFT, S_PAST, S_SOLO = 0, 1, 2, 3, 4, 5
STATE_NAMES = {S_NONE: "none", S_EQUAL: "equal", S_DIFF: "different", S_SHIFT: "shifted",
               S_PAST: "past divergence", S_SOLO: "unpaired"}

#: Rows per computed window (the unit of the window cache).
WINDOW = 256
#: Request-column rows read per chunk while indexing.
INDEX_CHUNK = 1 << 20
#: Blocks above which :func:`analyse` runs in a child process by default.
SUBPROCESS_BLOCKS = 200_000
#: A gap between needed block rows above which two reads are cheaper than one span.
READ_GAP = 1 << 16

#: Block columns of one block (the detail view).
BLOCK_FIELDS = ("step", "position", "anchor", "k", "proposed", "num_verified", "verified",
                "accepted", "num_emitted", "emitted")
#: Block columns a row shows (read per window).
ROW_FIELDS = ("anchor", "k", "proposed", "num_verified", "verified", "accepted")


class LRU(OrderedDict):
    """A tiny bounded mapping (least recently used entries are dropped)."""

    def __init__(self, maxsize: int) -> None:
        super().__init__()
        self.maxsize = maxsize

    def get(self, key, default=None):  # noqa: D102 - dict API
        if key in self:
            self.move_to_end(key)
            return self[key]
        return default

    def put(self, key, value) -> None:
        """Insert ``key`` and drop the oldest entries beyond ``maxsize``."""
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.maxsize:
            self.popitem(last=False)


# --------------------------------------------------------------------------------------------
# Reading one side
# --------------------------------------------------------------------------------------------


class SideIndex:
    """The ``request`` column of one trace, read in chunks (background-friendly).

    Attributes:
        n: block rows of the trace; loaded: rows read so far.
    """

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.n = len(trace.blocks)
        self.request = np.empty(self.n, np.int32)
        self.loaded = 0
        # First and last block row of each request: a request's blocks then cost a scan of
        # its own span (one engine batch wave), not of the whole column.
        self.first = np.zeros(0, np.int64)
        self.last = np.zeros(0, np.int64)

    @property
    def complete(self) -> bool:
        """True once every row is read."""
        return self.loaded >= self.n

    def load(self, cancelled: Callable[[], bool] = lambda: False,
             progress: Callable[[float], None] | None = None) -> bool:
        """Read the rest of the column; returns False when cancelled."""
        while self.loaded < self.n:
            if cancelled():
                return False
            lo, hi = self.loaded, min(self.loaded + INDEX_CHUNK, self.n)
            chunk = self.trace.read_rows("request", lo, hi)
            self.request[lo:hi] = chunk
            top = int(chunk.max(initial=-1)) + 1
            if top > len(self.first):
                grow = top - len(self.first)
                self.first = np.concatenate([self.first, np.full(grow, self.n, np.int64)])
                self.last = np.concatenate([self.last, np.full(grow, -1, np.int64)])
            rows = np.arange(lo, hi, dtype=np.int64)
            np.minimum.at(self.first, chunk, rows)
            np.maximum.at(self.last, chunk, rows)
            self.loaded = hi
            if progress:
                progress(self.loaded / self.n)
        return True

    def blocks_of(self, req: int) -> np.ndarray:
        """Block indices (int64, ascending) of request row ``req`` among the loaded rows."""
        if req < 0 or req >= len(self.first) or self.last[req] < 0:
            return np.zeros(0, np.int64)
        lo, hi = int(self.first[req]), min(int(self.last[req]) + 1, self.loaded)
        return np.flatnonzero(self.request[lo:hi] == req).astype(np.int64) + lo


def gather(trace: Trace, idx: np.ndarray, names: Sequence[str]) -> dict[str, np.ndarray]:
    """Block columns at block indices ``idx`` (int64, any order, ``-1`` = absent).

    Reads contiguous spans through :meth:`Trace.read_rows` (a span is split where the gap
    between needed rows exceeds :data:`READ_GAP`). Absent rows read ``-1``.

    Returns:
        name -> array of ``len(idx)`` rows (matrices [len(idx), w]).
    """
    idx = np.asarray(idx, np.int64)
    ok = idx >= 0
    vi = idx[ok]
    order = np.argsort(vi, kind="stable")
    sv = vi[order]
    out: dict[str, np.ndarray] = {}
    if len(sv):
        cut = np.flatnonzero(np.diff(sv) > READ_GAP) + 1
        groups = np.split(sv, cut)
    else:
        groups = []
    for name in names:
        parts = []
        for g in groups:
            lo, hi = int(g[0]), int(g[-1]) + 1
            parts.append(trace.read_rows(name, lo, hi)[g - lo])
        if parts:
            vals = np.concatenate(parts) if len(parts) > 1 else parts[0]
        else:
            vals = trace.read_rows(name, 0, 0)
        arr = np.full((len(idx),) + vals.shape[1:], -1, vals.dtype)
        sel = np.flatnonzero(ok)[order]
        arr[sel] = vals
        out[name] = arr
    return out


# --------------------------------------------------------------------------------------------
# Request pairs and rows
# --------------------------------------------------------------------------------------------


@dataclass
class Pair:
    """One entry of the requests pane: a matched request pair, or a request of one side.

    Attributes:
        index: position in :attr:`ViewModel.pairs`.
        req_a, req_b: request rows in ours / theirs (-1: none on that side).
        id_a, id_b: request ids ('' when none).
        matched_by: ``prompt`` | ``req_id`` | ``order``; ``ours only`` / ``theirs only`` for
            unmatched requests; ``single`` for a one-trace view.
        prompt_len: prompt length (tokens).
        divergence: first differing index of the full sequences, :data:`NO_DIVERGENCE`, or
            None until computed (see :meth:`ViewModel.divergence`).
        content_known: both sides know their output ids.
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


@dataclass
class Rows:
    """The rows of one pair (optionally only the divergent ones).

    Attributes:
        pair: the :class:`Pair`; divergence: its content divergence (or NO_DIVERGENCE).
        pos: int64 [R] anchor positions (ascending); ia, ib: int64 [R] block index per side
            (-1: that side has no block at the position).
        base: int64 [R] row numbers in the unfiltered rows (identity when not filtered).
        filtered: only divergent rows; key: identity for caches.
    """

    pair: Pair
    divergence: int
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
        return int(min(np.searchsorted(self.pos, position), len(self.pos) - 1))


@dataclass
class Window:
    """Contents of rows ``[start, stop)`` of a :class:`Rows`, all arrays vectorised.

    Per side (dicts ``a`` ours, ``b`` theirs or None): ``has`` bool [n]; block columns
    ``anchor``, ``k``, ``accepted``, ``num_verified`` [n]; ``proposed``, ``verified``
    [n, w]; ``in_k`` bool [n, w]; ``state`` int8 [n, w] (``S_*``); ``acc`` bool
    [n, w] slot inside the accepted prefix; ``unverified`` bool [n, w]; ``vdiff`` bool [n, w]
    verified id differs from the proposed one. Per row: ``pos``, ``paired``, ``comparable``,
    ``anchor_eq``, ``bad`` (diverges), ``first_diff`` (first differing slot or -1).
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


def _side_arrays(g: dict, has: np.ndarray, w: int) -> dict:
    d = {name: g[name] for name in ("anchor", "accepted", "num_verified")}
    d["k"] = np.where(has, g["k"].astype(np.int64), 0)
    d["proposed"] = schema.pad_to(g["proposed"], w)
    d["verified"] = schema.pad_to(g["verified"], w)
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


def compute_window(ta: Trace, tb: Trace | None, rows: Rows, start: int, stop: int) -> Window:
    """Compute :class:`Window` for rows ``[start, stop)`` (vectorised; see the class)."""
    ia, ib = rows.ia[start:stop], rows.ib[start:stop]
    pos = rows.pos[start:stop]
    ga = gather(ta, ia, ROW_FIELDS)
    gb = gather(tb, ib, ROW_FIELDS) if tb is not None else None
    w = max(ga["proposed"].shape[1], gb["proposed"].shape[1] if gb else 0, 1)
    has_a = ia >= 0
    A = _side_arrays(ga, has_a, w)
    n = len(pos)
    comparable = pos < rows.divergence
    if gb is None:
        A["state"] = np.where(A["in_k"], S_SOLO, S_NONE).astype(np.int8)
        z = np.zeros(n, bool)
        return Window(start, stop, w, pos, z, comparable, np.ones(n, bool), z,
                      np.full(n, -1, np.int64), A, None)
    has_b = ib >= 0
    B = _side_arrays(gb, has_b, w)
    paired = has_a & has_b
    pa, pb, ka, kb = A["proposed"], B["proposed"], A["k"], B["k"]
    slots = np.arange(w)
    both = (slots < np.minimum(ka, kb)[:, None]) & paired[:, None]
    eq = both & (pa == pb)
    shift_a = np.zeros((n, w), bool)
    shift_b = np.zeros((n, w), bool)
    for d in (1, 2):
        if d >= w:
            break
        # ours[j] == theirs[j+d] / theirs[j-d] (and the mirror for theirs)
        m = (pa[:, :-d] == pb[:, d:]) & (slots[:-d] < ka[:, None]) & (slots[d:] < kb[:, None])
        shift_a[:, :-d] |= m
        shift_b[:, d:] |= m
        m = (pa[:, d:] == pb[:, :-d]) & (slots[d:] < ka[:, None]) & (slots[:-d] < kb[:, None])
        shift_a[:, d:] |= m
        shift_b[:, :-d] |= m
    anc_a, anc_b = A["anchor"], B["anchor"]
    anchor_eq = ~((anc_a >= 0) & (anc_b >= 0)) | (anc_a == anc_b)
    exact = (ka == kb) & (eq.sum(axis=1) == ka)
    bad = paired & comparable & (~exact | ~anchor_eq)
    span = slots < np.maximum(ka, kb)[:, None]
    neq = span & ~eq
    first = np.where(neq.any(axis=1), neq.argmax(axis=1), -1)
    first_diff = np.where(bad, first, -1)

    def states(side: dict, shift: np.ndarray) -> np.ndarray:
        st = np.where(eq, S_EQUAL, np.where(shift, S_SHIFT, S_DIFF))
        st = np.where(paired[:, None], st, S_SOLO)
        st = np.where(comparable[:, None], st, S_PAST)
        return np.where(side["in_k"] & side["has"][:, None], st, S_NONE).astype(np.int8)

    A["state"] = states(A, shift_a & paired[:, None])
    B["state"] = states(B, shift_b & paired[:, None])
    return Window(start, stop, w, pos, paired, comparable, anchor_eq, bad, first_diff, A, B)


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


class ViewModel:
    """Everything the viewer shows, computed on demand from one trace or a pair.

    Loading is split in stages so a UI can paint first and index in the background:
    :meth:`load_requests` (request tables, matching), :meth:`load_index` (request columns),
    :meth:`load_divergence` (content divergence of every pair). Each stage may be called
    from a worker thread; the accessors work as soon as their stage is done.

    Args:
        a: ours (or the only trace); b: theirs, or None for a one-trace view.
        generation: a number that changes whenever the traces are re-opened (follow mode);
            it is part of every cache key.
    """

    def __init__(self, a: Trace, b: Trace | None = None, generation: int = 0) -> None:
        self.a, self.b = a, b
        self.generation = generation
        self.pairs: list[Pair] = []
        self.requests_ready = False
        self.index_ready = False
        self.divergence_ready = False
        self.index_a = SideIndex(a)
        self.index_b = SideIndex(b) if b is not None else None
        self._rows: LRU = LRU(32)
        self._windows: LRU = LRU(96)
        self._bad: LRU = LRU(64)
        self._lock = threading.RLock()

    @property
    def paired(self) -> bool:
        """Two traces are compared."""
        return self.b is not None

    def trace(self, side: str) -> Trace:
        """``ours`` -> a, ``theirs`` -> b."""
        return self.a if side == "ours" else self.b  # type: ignore[return-value]

    # -- stages --------------------------------------------------------------------------------

    def load_requests(self) -> None:
        """Read the request tables and pair requests (matched first, then unmatched)."""
        a, b = self.a, self.b
        ra = a.requests
        pairs: list[Pair] = []
        if b is None:
            for i in range(len(ra)):
                pairs.append(Pair(len(pairs), i, -1, ra.req_id[i], "", "single",
                                  len(ra.prompt_ids[i])))
        else:
            rb = b.requests
            req_a, req_b, by = match_requests(a, b)
            for i, j, m in zip(req_a.tolist(), req_b.tolist(), by):
                pairs.append(Pair(len(pairs), i, j, ra.req_id[i], rb.req_id[j], m,
                                  len(ra.prompt_ids[i])))
            for i in np.setdiff1d(np.arange(len(ra)), req_a).tolist():
                pairs.append(Pair(len(pairs), i, -1, ra.req_id[i], "", "ours only",
                                  len(ra.prompt_ids[i])))
            for j in np.setdiff1d(np.arange(len(rb)), req_b).tolist():
                pairs.append(Pair(len(pairs), -1, j, "", rb.req_id[j], "theirs only",
                                  len(rb.prompt_ids[j])))
        self.pairs = pairs
        self.requests_ready = True

    def load_index(self, cancelled: Callable[[], bool] = lambda: False,
                   progress: Callable[[float], None] | None = None) -> bool:
        """Read the request columns (the per-pair block index); False when cancelled."""
        sides = [s for s in (self.index_a, self.index_b) if s is not None]
        total = sum(s.n for s in sides) or 1
        done = 0
        for s in sides:
            base = done

            def prog(x: float, base=base, s=s) -> None:
                if progress:
                    progress((base + x * s.n) / total)

            if not s.load(cancelled, prog):
                return False
            done += s.n
        self.index_ready = True
        return True

    def load_divergence(self, cancelled: Callable[[], bool] = lambda: False,
                        chunk: int = 256) -> bool:
        """Compute every pair's content divergence, reading output ids in bulk chunks."""
        matched = [p for p in self.pairs if p.matched and p.divergence is None]
        if self.b is None:
            for p in self.pairs:
                p.divergence = NO_DIVERGENCE
            self.divergence_ready = True
            return True
        ra, rb = self.a.requests, self.b.requests

        def bulk(col, rows: list[int]):
            lo, hi = min(rows), max(rows) + 1
            if hasattr(col, "read") and hi - lo <= 4 * len(rows):
                got = col.read(lo, hi)
                return [got[r - lo] for r in rows]
            return [col[r] for r in rows]

        for c in range(0, len(matched), chunk):
            if cancelled():
                return False
            part = matched[c:c + chunk]
            oa = bulk(ra.output_ids, [p.req_a for p in part])
            ob = bulk(rb.output_ids, [p.req_b for p in part])
            for p, x, y in zip(part, oa, ob):
                if p.divergence is None:
                    self._divergence_of(p, x, y)
        for p in self.pairs:
            if not p.matched:
                p.divergence = NO_DIVERGENCE
        self.divergence_ready = True
        return True

    def _divergence_of(self, p: Pair, oa: np.ndarray, ob: np.ndarray) -> None:
        known = len(oa) > 0 and len(ob) > 0
        p.content_known = known
        if not known:
            p.divergence = NO_DIVERGENCE
            return
        sa = np.concatenate([self.a.requests.prompt_ids[p.req_a], oa])
        sb = np.concatenate([self.b.requests.prompt_ids[p.req_b], ob])  # type: ignore
        p.divergence = first_difference(sa, sb)

    def divergence(self, p: Pair) -> int:
        """The pair's content divergence (computed now if the stage has not reached it)."""
        if p.divergence is None:
            if p.matched:
                self._divergence_of(p, self.a.requests.output_ids[p.req_a],
                                    self.b.requests.output_ids[p.req_b])  # type: ignore
            else:
                p.divergence = NO_DIVERGENCE
        return int(p.divergence)

    # -- rows ----------------------------------------------------------------------------------

    def rows(self, pair: int, divergent_only: bool = False) -> Rows:
        """The rows of pair ``pair`` (cached); requires :meth:`load_index`."""
        key = (self.generation, pair, divergent_only)
        with self._lock:
            hit = self._rows.get(key)
            if hit is not None:
                return hit
            base = self._base_rows(pair)
            if divergent_only:
                keep = np.flatnonzero(self.bad_mask(base))
                r = Rows(base.pair, base.divergence, base.pos[keep], base.ia[keep],
                         base.ib[keep], keep.astype(np.int64), True, key)
            else:
                r = base
            self._rows.put(key, r)
            return r

    def _base_rows(self, pair: int) -> Rows:
        key = (self.generation, pair, False)
        hit = self._rows.get(key)
        if hit is not None:
            return hit
        p = self.pairs[pair]
        div = self.divergence(p)

        def side(index: SideIndex | None, trace: Trace | None, req: int):
            if index is None or trace is None or req < 0:
                return np.zeros(0, np.int64), np.zeros(0, np.int64)
            blocks = index.blocks_of(req)
            pos = gather(trace, blocks, ("position",))["position"].astype(np.int64)
            u, first = np.unique(pos, return_index=True)
            return u, blocks[first]

        ua, ba = side(self.index_a, self.a, p.req_a)
        ub, bb = side(self.index_b, self.b, p.req_b)
        pos = np.union1d(ua, ub)
        ia = np.full(len(pos), -1, np.int64)
        ib = np.full(len(pos), -1, np.int64)
        ia[np.searchsorted(pos, ua)] = ba
        ib[np.searchsorted(pos, ub)] = bb
        r = Rows(p, div, pos, ia, ib, np.arange(len(pos), dtype=np.int64), False, key)
        self._rows.put(key, r)
        return r

    def window(self, rows: Rows, row: int) -> Window:
        """The cached :class:`Window` holding row ``row``."""
        w0 = (row // WINDOW) * WINDOW
        key = (rows.key, w0)
        with self._lock:
            hit = self._windows.get(key)
            if hit is None:
                hit = compute_window(self.a, self.b, rows, w0, min(w0 + WINDOW, len(rows)))
                self._windows.put(key, hit)
            return hit

    def bad_mask(self, rows: Rows) -> np.ndarray:
        """bool [len(rows)]: the row diverges (paired, comparable, anchor or drafts differ)."""
        key = rows.key
        with self._lock:
            hit = self._bad.get(key)
            if hit is not None:
                return hit
            if self.b is None:
                out = np.zeros(len(rows), bool)
            else:
                step = 8192
                parts = [compute_window(self.a, self.b, rows, s, min(s + step, len(rows))).bad
                         for s in range(0, len(rows), step)]
                out = np.concatenate(parts) if parts else np.zeros(0, bool)
            self._bad.put(key, out)
            return out

    def next_divergent(self, pair: int, row: int, forward: bool = True,
                       skip: Callable[[int], bool] = lambda p: False,
                       max_pairs: int | None = None) -> tuple[int, int] | None:
        """The next (or previous) divergent row after ``row`` of ``pair``, continuing into
        the following (preceding) pairs. Returns ``(pair, row)`` in unfiltered rows, or None.

        ``skip(p)`` says a pair is known to have no divergent row (e.g. from
        :class:`Analysis`), so it is not read; ``max_pairs`` bounds the scan (None: all).
        """
        n = len(self.pairs)
        scanned = 0
        p, r = pair, row
        while 0 <= p < n:
            if self.pairs[p].matched and not skip(p):
                bad = np.flatnonzero(self.bad_mask(self.rows(p)))
                if forward:
                    hit = bad[bad > r]
                    if len(hit):
                        return p, int(hit[0])
                else:
                    hit = bad[bad < r]
                    if len(hit):
                        return p, int(hit[-1])
            scanned += 1
            if max_pairs is not None and scanned >= max_pairs:
                return None
            p += 1 if forward else -1
            r = -1 if forward else 1 << 62
        return None

    def search(self, pair: int, row: int, ids: np.ndarray, forward: bool = True,
               ) -> tuple[int, int] | None:
        """The next row (after ``row``, this pair then the following ones, wrapping) where
        any of ``ids`` is the anchor or a proposed, verified or emitted id on either side.

        Returns ``(pair, row)`` in unfiltered rows, or None.
        """
        ids = np.asarray(ids, np.int64)
        n = len(self.pairs)
        order = [(pair + i) % n for i in range(n + 1)] if forward else \
            [(pair - i) % n for i in range(n + 1)]
        for step, p in enumerate(order):
            rows = self.rows(p)
            hits = self._search_rows(rows, ids)
            if step == 0:
                sel = hits[hits > row] if forward else hits[hits < row]
            elif step == n:
                sel = hits[hits <= row] if forward else hits[hits >= row]
            else:
                sel = hits
            if len(sel):
                return p, int(sel[0] if forward else sel[-1])
        return None

    def _search_rows(self, rows: Rows, ids: np.ndarray) -> np.ndarray:
        found = []
        for s in range(0, len(rows), 8192):
            e = min(s + 8192, len(rows))
            hit = np.zeros(e - s, bool)
            for trace, idx in ((self.a, rows.ia[s:e]), (self.b, rows.ib[s:e])):
                if trace is None:
                    continue
                g = gather(trace, idx, ("anchor", "proposed", "verified", "emitted"))
                ok = idx >= 0
                for name in ("anchor", "proposed", "verified", "emitted"):
                    m = np.isin(g[name], ids)
                    hit |= ok & (m.any(axis=1) if m.ndim == 2 else m)
            found.append(np.flatnonzero(hit) + s)
        return np.concatenate(found) if found else np.zeros(0, np.int64)

    # -- one block -----------------------------------------------------------------------------

    def block(self, side: str, index: int) -> dict:
        """Every column of block ``index`` of ``side`` as plain Python values (lists trimmed
        of their -1 padding), plus ``request`` (row) and ``file``."""
        t = self.trace(side)
        g = gather(t, np.array([index]), BLOCK_FIELDS + ("request",))
        out = {}
        for name, arr in g.items():
            v = arr[0]
            out[name] = [int(x) for x in v if x >= 0] if np.ndim(v) else int(v)
        starts = np.cumsum([0] + t.nblocks_per_file)
        out["file"] = int(np.searchsorted(starts, index, side="right") - 1)
        return out

    def context(self, side: str, req: int, position: int, before: int = 32) -> np.ndarray:
        """The ``before`` ids ending at the anchor (``position`` inclusive) of request row
        ``req`` (from its prompt + output ids; empty when unknown)."""
        t = self.trace(side)
        if req < 0:
            return np.zeros(0, np.int32)
        seq = t.requests.full_sequence(req)
        return seq[max(0, position + 1 - before):position + 1]

    def phases_of(self, side: str, step: int, file: int) -> list[tuple[str, float, int]]:
        """Recorded phase timings of engine step ``step`` in file ``file``:
        ``[(name, ms, level)]`` (empty when none)."""
        t = self.trace(side)
        cache = getattr(self, "_phases", {})
        if side not in cache:
            cache[side] = t.phases()
            self._phases = cache
        ph = cache[side]
        if not len(ph["step"]):
            return []
        sel = np.flatnonzero((ph["step"] == step) & (ph["file"] == file))
        return [(str(ph["name"][i]), float(ph["ms"][i]), int(ph["level"][i])) for i in sel]

    def series(self, pair: int) -> dict:
        """Acceptance along the sequence of one pair: per side, anchor positions and
        accepted/checked drafts of its blocks (for the charts)."""
        rows = self.rows(pair)
        out = {}
        for side, trace, idx in (("ours", self.a, rows.ia), ("theirs", self.b, rows.ib)):
            if trace is None:
                continue
            sel = idx[idx >= 0]
            g = gather(trace, sel, ("position", "accepted", "num_verified", "k"))
            checked = np.where(g["num_verified"] >= 0, g["num_verified"], g["k"])
            out[side] = {"position": g["position"].astype(np.int64),
                         "accepted": g["accepted"].astype(np.int64),
                         "checked": checked.astype(np.int64)}
        out["divergence"] = rows.divergence
        return out


# --------------------------------------------------------------------------------------------
# Whole-trace analysis (in a thread for small traces, in a child process for big ones)
# --------------------------------------------------------------------------------------------


@dataclass
class Analysis:
    """The whole-trace results the viewer shows beside the rows.

    Attributes:
        doc: the diff document (``spectrace.diff/1``) for a pair, or the ``trace_summary`` of
            one trace (key ``summary``); JSON-serialisable.
        findings: typed findings (most severe first).
        per_pair: list of dicts per matched pair (order of ``match_requests``): ``bad`` blocks,
            ``first_bad`` position or None, ``paired`` blocks.
        per_request: ``{"ours": {"blocks", "accepted", "checked"} lists per request row,
            "theirs": ...}``.
        along: per side ``{"edges": [...], "rate": [...], "blocks": [...]}``: acceptance by
            anchor-position bucket (where it collapses).
        seconds: wall time of the analysis.
    """

    doc: dict
    findings: list[Finding] = field(default_factory=list)
    per_pair: list[dict] = field(default_factory=list)
    per_request: dict = field(default_factory=dict)
    along: dict = field(default_factory=dict)
    seconds: float = 0.0

    def to_json(self) -> dict:
        """JSON form (what the child process prints)."""
        return {"doc": self.doc, "findings": [f.to_json() for f in self.findings],
                "per_pair": self.per_pair, "per_request": self.per_request,
                "along": self.along, "seconds": self.seconds}

    @classmethod
    def from_json(cls, d: dict) -> Analysis:
        """Inverse of :meth:`to_json`."""
        return cls(doc=d["doc"], findings=[Finding(**f) for f in d["findings"]],
                   per_pair=d["per_pair"], per_request=d["per_request"], along=d["along"],
                   seconds=d.get("seconds", 0.0))


def _per_request(t: Trace) -> dict:
    from .index import drafts_checked

    b = t.blocks
    n = len(t.requests)
    req = b.request.astype(np.int64)
    acc = b.accepted.astype(np.int64)
    _, checked = drafts_checked(t)
    known = acc >= 0
    return {"blocks": np.bincount(req, minlength=n).tolist(),
            "accepted": np.bincount(req[known], weights=acc[known], minlength=n)
            .astype(np.int64).tolist(),
            "checked": np.bincount(req[known], weights=np.maximum(checked[known], 0),
                                   minlength=n).astype(np.int64).tolist()}


def _along(t: Trace, buckets: int = 96) -> dict:
    from .index import drafts_checked

    b = t.blocks
    pos = b.position.astype(np.int64)
    acc = b.accepted.astype(np.int64)
    _, checked = drafts_checked(t)
    known = acc >= 0
    top = int(pos.max(initial=0)) + 1
    width = max(1, -(-top // buckets))
    bk = pos[known] // width
    nb = int(bk.max(initial=-1)) + 1
    a = np.bincount(bk, weights=acc[known], minlength=nb)
    c = np.bincount(bk, weights=np.maximum(checked[known], 0), minlength=nb)
    cnt = np.bincount(bk, minlength=nb)
    rate = [float(x / y) if y else None for x, y in zip(a, c)]
    return {"width": width, "rate": rate, "blocks": cnt.tolist()}


def analyse(a: Trace, b: Trace | None = None, decoder=None) -> Analysis:
    """Run the whole-trace analysis: the diff and its findings (or, for one trace,
    ``trace_summary`` and ``check_trace``), per-pair divergence counts, per-request
    acceptance and acceptance along the sequence. Vectorised; memory grows with the traces."""
    import time

    from .detect import check_trace
    from .metrics import trace_summary

    t0 = time.perf_counter()
    if b is None:
        doc = {"summary": trace_summary(a)}
        findings = check_trace(a, decoder, side="ours")
        return Analysis(doc, findings, [], {"ours": _per_request(a)}, {"ours": _along(a)},
                        time.perf_counter() - t0)
    from .align import align
    from .diff import diff_traces

    al = align(a, b)
    res = diff_traces(al, decoder=decoder)
    ia, bad = al.ia, res.bad
    pair = al.pair_of_block_a[ia]
    m = al.pairs
    nbad = np.bincount(pair[bad], minlength=m)
    npaired = np.bincount(pair, minlength=m)
    first_bad: list = [None] * m
    bp = pair[bad]
    if len(bp):
        u, first = np.unique(bp, return_index=True)
        positions = a.blocks.position[ia[bad]][first]
        for p, x in zip(u.tolist(), positions.tolist()):
            first_bad[p] = int(x)
    per_pair = [{"bad": int(nbad[p]), "paired": int(npaired[p]), "first_bad": first_bad[p]}
                for p in range(m)]
    doc = res.to_json()
    return Analysis(doc, list(res.findings), per_pair,
                    {"ours": _per_request(a), "theirs": _per_request(b)},
                    {"ours": _along(a), "theirs": _along(b)}, time.perf_counter() - t0)


def analyse_in_child(paths_a: Sequence[str], paths_b: Sequence[str] | None,
                     tokenizer: str | None = None) -> Analysis:
    """Run :func:`analyse` in a child Python process (its peak memory stays there).

    Raises:
        RuntimeError: the child failed (its last stderr line is in the message).
    """
    arg = json.dumps({"a": list(paths_a), "b": list(paths_b) if paths_b else None,
                      "tokenizer": tokenizer})
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, "-m", "spectrace.tracer.view_model", arg],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"analysis failed: {tail}")
    return Analysis.from_json(json.loads(r.stdout))


def _child_main(arg: str) -> None:
    import warnings

    from .tokens import decoder_for

    spec = json.loads(arg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = open_trace(spec["a"])
        b = open_trace(spec["b"]) if spec["b"] else None
    dec = None
    try:
        dec = decoder_for(spec.get("tokenizer"), a.meta, *(b.meta,) if b else ())
    except Exception:  # a bad tokenizer only costs the decoded examples
        dec = None
    json.dump(analyse(a, b, dec).to_json(), sys.stdout)


if __name__ == "__main__":
    from .pages import prefer_small_pages

    prefer_small_pages()
    _child_main(sys.argv[1])
