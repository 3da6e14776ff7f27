"""Reading one side of the viewer lazily: the request column index, windowed block reads and a
small LRU (the model's caches).

No block column is held whole: :class:`SideIndex` keeps each request's first and last block
row (scanning the ``request`` column in chunks), and every block column is read in spans through
:meth:`~spectrace.tracer.store.Trace.read_rows` by :func:`gather`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np

from spectrace.tracer.store import Trace

#: Request-column rows read per chunk while indexing.
INDEX_CHUNK = 1 << 18
#: A gap between needed block rows above which two reads are cheaper than one span.
READ_GAP = 1 << 16


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


class SideIndex:
    """Where each request's blocks lie in one trace, from the ``request`` column read in chunks
    (background-friendly) and not kept.

    Only each request's first and last block row is held (``first``/``last``, a few bytes a
    request); :meth:`blocks_of` reads the ``request`` rows of one request's span again (a
    request's blocks lie in one engine batch wave), :data:`INDEX_CHUNK` rows at a time, so the
    index costs the same whatever the trace's length.

    Attributes:
        n: block rows of the trace; loaded: rows scanned so far.
        first, last: int32 (int64 when ``n`` >= 2**31) [requests]: first / last block row of
            each request (``n`` / -1 for a request without blocks so far).
    """

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.n = len(trace.blocks)
        self.loaded = 0
        self._dtype = np.int32 if self.n < 2**31 - 1 else np.int64
        self.first = np.zeros(0, self._dtype)
        self.last = np.zeros(0, self._dtype)

    @property
    def complete(self) -> bool:
        """True once every row is read."""
        return self.loaded >= self.n

    def load(
        self,
        cancelled: Callable[[], bool] = lambda: False,
        progress: Callable[[float], object] | None = None,
    ) -> bool:
        """Scan the rest of the column; returns False when cancelled."""
        while self.loaded < self.n:
            if cancelled():
                return False
            lo, hi = self.loaded, min(self.loaded + INDEX_CHUNK, self.n)
            self._extend_spans(self.trace.read_rows("request", lo, hi), lo)
            self.loaded = hi
            if progress:
                progress(self.loaded / self.n)
        return True

    def _extend_spans(self, chunk: np.ndarray, lo: int) -> None:
        if not len(chunk):
            return
        top = int(chunk.max(initial=-1)) + 1
        if top > len(self.first):
            grow = top - len(self.first)
            self.first = np.concatenate([self.first, np.full(grow, self.n, self._dtype)])
            self.last = np.concatenate([self.last, np.full(grow, -1, self._dtype)])
        # Each request's first and last row in the chunk: one stable sort, no ufunc.at.
        order = np.argsort(chunk, kind="stable")
        reqs = chunk[order]
        head = np.flatnonzero(np.r_[True, reqs[1:] != reqs[:-1]])
        tail = np.r_[head[1:], len(reqs)] - 1
        u = reqs[head]
        self.first[u] = np.minimum(self.first[u], order[head] + lo)
        self.last[u] = np.maximum(self.last[u], order[tail] + lo)

    def blocks_of(self, req: int) -> np.ndarray:
        """Block indices (int64, ascending) of request row ``req`` among the scanned rows."""
        if req < 0 or req >= len(self.first) or self.last[req] < 0:
            return np.zeros(0, np.int64)
        lo, hi = int(self.first[req]), min(int(self.last[req]) + 1, self.loaded)
        parts = [
            np.flatnonzero(self.trace.read_rows("request", s, min(s + INDEX_CHUNK, hi)) == req) + s
            for s in range(lo, hi, INDEX_CHUNK)
        ]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)


def _read_groups(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Valid rows of ``idx``: (positions in ``idx`` in sorted order, their sorted rows, the
    sorted rows split where a gap exceeds :data:`READ_GAP`)."""
    ok = idx >= 0
    order = np.argsort(idx[ok], kind="stable")
    sv = idx[ok][order]
    groups = np.split(sv, np.flatnonzero(np.diff(sv) > READ_GAP) + 1) if len(sv) else []
    return np.flatnonzero(ok)[order], sv, groups


def gather(trace: Trace, idx: np.ndarray, names: Sequence[str]) -> dict[str, np.ndarray]:
    """Block columns at block indices ``idx`` (int64, any order, ``-1`` = absent).

    Reads contiguous spans through :meth:`Trace.read_rows` (a span is split where the gap
    between needed rows exceeds :data:`READ_GAP`). Absent rows read ``-1``.

    Returns:
        name -> array of ``len(idx)`` rows (matrices [len(idx), w], the column's dtype).
    """
    idx = np.asarray(idx, np.int64)
    sel, _, groups = _read_groups(idx)
    out: dict[str, np.ndarray] = {}
    for name in names:
        parts = [trace.read_rows(name, int(g[0]), int(g[-1]) + 1)[g - int(g[0])] for g in groups]
        if parts:
            vals = np.concatenate(parts) if len(parts) > 1 else parts[0]
        else:
            vals = trace.read_rows(name, 0, 0)
        arr = np.full((len(idx),) + vals.shape[1:], -1, vals.dtype)
        arr[sel] = vals
        out[name] = arr
    return out
