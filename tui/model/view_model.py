"""The viewer's model: everything the block view shows over one trace or a pair, read lazily.

Sized for traces of ten million blocks in about 200 MB: traces are opened with
``lazy_requests``; no block column is held whole (:class:`~.sides.SideIndex` keeps each
request's first and last block row, int32, and re-reads one request's span); the rows of
a pair are built vectorised (:func:`~.rows.union_rows`) and their contents computed 256 rows
at a time (:func:`~.rows.compute_window`), both kept in bounded LRUs, so paging costs a few
small HDF5 reads. Requests pair by :func:`spectrace.tracer.align.match_requests` and every
comparison is the kernel's (:mod:`spectrace.tracer.compare`), so the divergent rows are
exactly the blocks ``spectrace diff`` counts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from spectrace.tracer.align import match_requests
from spectrace.tracer.compare import NO_DIVERGENCE, first_difference
from spectrace.tracer.store import Trace

from .rows import Pair, Rows, Window, compute_window, first_blocks, union_rows
from .sides import LRU, SideIndex, gather

#: Rows per computed window (the unit of the window cache).
WINDOW = 256
#: Rows per pass when a whole pair's rows are compared or searched.
SCAN = 8192
#: Block columns of one block (the detail view).
BLOCK_FIELDS = (
    "step",
    "position",
    "anchor",
    "k",
    "proposed",
    "num_verified",
    "verified",
    "accepted",
    "num_emitted",
    "emitted",
)
#: Block columns a search looks in.
SEARCH_FIELDS = ("anchor", "proposed", "verified", "emitted")


def _pairs_of(a: Trace, b: Trace | None) -> list[Pair]:
    """The requests pane's entries: matched pairs first (in match order), then ours' and
    theirs' unmatched requests; every request of ``a`` for a one-trace view."""
    ra = a.requests
    if b is None:
        return [
            Pair(i, i, -1, ra.req_id[i], "", "single", len(ra.prompt_ids[i]))
            for i in range(len(ra))
        ]
    rb = b.requests
    req_a, req_b, by = match_requests(a, b)
    pairs: list[Pair] = []
    for i, j, m in zip(req_a.tolist(), req_b.tolist(), by):
        pairs.append(Pair(len(pairs), i, j, ra.req_id[i], rb.req_id[j], m, len(ra.prompt_ids[i])))
    for i in np.setdiff1d(np.arange(len(ra)), req_a).tolist():
        pairs.append(Pair(len(pairs), i, -1, ra.req_id[i], "", "ours only", len(ra.prompt_ids[i])))
    for j in np.setdiff1d(np.arange(len(rb)), req_b).tolist():
        pairs.append(
            Pair(len(pairs), -1, j, "", rb.req_id[j], "theirs only", len(rb.prompt_ids[j]))
        )
    return pairs


def _bulk(col, rows: list[int]) -> list[np.ndarray]:
    """Ragged rows ``rows`` of a request column: one read of their span when it is dense."""
    lo, hi = min(rows), max(rows) + 1
    if hasattr(col, "read") and hi - lo <= 4 * len(rows):
        got = col.read(lo, hi)
        return [got[r - lo] for r in rows]
    return [col[r] for r in rows]


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
        self._phases: dict[str, dict] = {}
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
        self.pairs = _pairs_of(self.a, self.b)
        self.requests_ready = True

    def load_index(
        self,
        cancelled: Callable[[], bool] = lambda: False,
        progress: Callable[[float], object] | None = None,
    ) -> bool:
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

    def load_divergence(
        self, cancelled: Callable[[], bool] = lambda: False, chunk: int = 256
    ) -> bool:
        """Compute every pair's content divergence, reading output ids in bulk chunks."""
        if self.b is not None:
            matched = [p for p in self.pairs if p.matched and p.divergence is None]
            ra, rb = self.a.requests, self.b.requests
            for c in range(0, len(matched), chunk):
                if cancelled():
                    return False
                part = matched[c : c + chunk]
                oa = _bulk(ra.output_ids, [p.req_a for p in part])
                ob = _bulk(rb.output_ids, [p.req_b for p in part])
                for p, x, y in zip(part, oa, ob):
                    if p.divergence is None:
                        self._divergence_of(p, x, y)
        for p in self.pairs:
            if not p.matched or self.b is None:
                p.divergence = NO_DIVERGENCE
        self.divergence_ready = True
        return True

    def _divergence_of(self, p: Pair, oa: np.ndarray, ob: np.ndarray) -> None:
        """Content divergence and comparability of matched pair ``p`` (as ``align``)."""
        known = len(oa) > 0 and len(ob) > 0
        sa = np.concatenate([self.a.requests.prompt_ids[p.req_a], oa])
        sb = np.concatenate([self.b.requests.prompt_ids[p.req_b], ob])  # type: ignore
        p.set_content(
            first_difference(sa, sb) if known else NO_DIVERGENCE, min(len(sa), len(sb)), known
        )

    def divergence(self, p: Pair) -> int:
        """The pair's content divergence (computed now if the stage has not reached it)."""
        if p.divergence is None:
            if p.matched:
                assert self.b is not None  # a matched pair has both traces
                self._divergence_of(
                    p, self.a.requests.output_ids[p.req_a], self.b.requests.output_ids[p.req_b]
                )
            else:
                p.divergence = NO_DIVERGENCE
        return int(p.divergence)  # type: ignore[arg-type]

    # -- rows ----------------------------------------------------------------------------------

    def rows(self, pair: int, divergent_only: bool = False) -> Rows:
        """The rows of pair ``pair`` (cached); requires :meth:`load_index`."""
        key = (self.generation, pair, divergent_only)
        with self._lock:
            hit = self._rows.get(key)
            if hit is not None:
                return hit
            base = self._base_rows(pair)
            r = base.subset(np.flatnonzero(self.bad_mask(base)), key) if divergent_only else base
            self._rows.put(key, r)
            return r

    def _base_rows(self, pair: int) -> Rows:
        key = (self.generation, pair, False)
        hit = self._rows.get(key)
        if hit is not None:
            return hit
        p = self.pairs[pair]
        div = self.divergence(p)
        r = union_rows(
            p,
            div,
            first_blocks(self.index_a, self.a, p.req_a),
            first_blocks(self.index_b, self.b, p.req_b),
            key,
        )
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
        """bool [len(rows)]: the row diverges (paired, comparable, and the kernel calls the
        block pair divergent: anchors or drafts differ)."""
        key = rows.key
        with self._lock:
            hit = self._bad.get(key)
            if hit is not None:
                return hit
            if self.b is None:
                out = np.zeros(len(rows), bool)
            else:
                parts = [
                    compute_window(self.a, self.b, rows, s, min(s + SCAN, len(rows))).bad
                    for s in range(0, len(rows), SCAN)
                ]
                out = np.concatenate(parts) if parts else np.zeros(0, bool)
            self._bad.put(key, out)
            return out

    def next_divergent(
        self,
        pair: int,
        row: int,
        forward: bool = True,
        skip: Callable[[int], bool] = lambda p: False,
        max_pairs: int | None = None,
    ) -> tuple[int, int] | None:
        """The next (or previous) divergent row after ``row`` of ``pair``, continuing into
        the following (preceding) pairs. Returns ``(pair, row)`` in unfiltered rows, or None.

        ``skip(p)`` says a pair is known to have no divergent row (e.g. from
        :class:`~.worker.Analysis`), so it is not read; ``max_pairs`` bounds the scan.
        """
        n = len(self.pairs)
        scanned = 0
        p, r = pair, row
        while 0 <= p < n:
            if self.pairs[p].matched and not skip(p):
                bad = np.flatnonzero(self.bad_mask(self.rows(p)))
                hit = bad[bad > r] if forward else bad[bad < r][::-1]
                if len(hit):
                    return p, int(hit[0])
            scanned += 1
            if max_pairs is not None and scanned >= max_pairs:
                return None
            p += 1 if forward else -1
            r = -1 if forward else 1 << 62
        return None

    def search(
        self,
        pair: int,
        row: int,
        ids: np.ndarray,
        forward: bool = True,
    ) -> tuple[int, int] | None:
        """The next row (after ``row``, this pair then the following ones, wrapping) where
        any of ``ids`` is the anchor or a proposed, verified or emitted id on either side.

        Returns ``(pair, row)`` in unfiltered rows, or None.
        """
        ids = np.asarray(ids, np.int64)
        n = len(self.pairs)
        if n == 0:
            return None
        sign = 1 if forward else -1
        for step in range(n + 1):
            p = (pair + sign * step) % n
            hits = self._search_rows(self.rows(p), ids)
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
        for s in range(0, len(rows), SCAN):
            e = min(s + SCAN, len(rows))
            hit = np.zeros(e - s, bool)
            for trace, idx in ((self.a, rows.ia[s:e]), (self.b, rows.ib[s:e])):
                if trace is None:
                    continue
                g = gather(trace, idx, SEARCH_FIELDS)
                for name in SEARCH_FIELDS:
                    m = np.isin(g[name], ids)
                    hit |= (idx >= 0) & (m.any(axis=1) if m.ndim == 2 else m)
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
        return seq[max(0, position + 1 - before) : position + 1]

    def phases_of(self, side: str, step: int, file: int) -> list[tuple[str, float, int]]:
        """Recorded phase timings of engine step ``step`` in file ``file``:
        ``[(name, ms, level)]`` (empty when none)."""
        if side not in self._phases:
            self._phases[side] = self.trace(side).phases()
        ph = self._phases[side]
        if not len(ph["step"]):
            return []
        sel = np.flatnonzero((ph["step"] == step) & (ph["file"] == file))
        return [(str(ph["name"][i]), float(ph["ms"][i]), int(ph["level"][i])) for i in sel]

    def series(self, pair: int) -> dict:
        """Acceptance along the sequence of one pair: per side, anchor positions and
        accepted/checked drafts of its blocks (int64 arrays, for the charts)."""
        rows = self.rows(pair)
        out: dict = {}
        for side, trace, idx in (("ours", self.a, rows.ia), ("theirs", self.b, rows.ib)):
            if trace is None:
                continue
            g = gather(trace, idx[idx >= 0], ("position", "accepted", "num_verified", "k"))
            checked = np.where(g["num_verified"] >= 0, g["num_verified"], g["k"])
            out[side] = {
                "position": g["position"].astype(np.int64),
                "accepted": g["accepted"].astype(np.int64),
                "checked": checked.astype(np.int64),
            }
        out["divergence"] = rows.divergence
        return out
