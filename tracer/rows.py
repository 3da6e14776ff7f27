"""The wide block columns (``proposed``, ``verified``, ``emitted``, ``draft_margin``: [n, w])
read in row chunks, never whole.

A 5M-block trace at k = 8 holds 160 MB per id matrix and side; the diff and the detectors
need per-block reductions of them and the rows of the paired blocks only, so they stream the
matrices through :func:`row_chunks` (one pass, :data:`ROWS` rows at a time) instead of
loading them (``blocks.<name>`` still loads a column whole for the viewers and the export).
Values, dtypes and padding are those of the loaded column (:meth:`Trace.read_rows`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .parallel import bounds, row_order
from .store import Trace

#: Rows per chunk of a streaming pass: 8 MB per int32 [n, 8] matrix, aligned to the store's
#: 4096-row chunks (each HDF5 chunk is decompressed once).
ROWS = 1 << 18


def row_chunks(
    t: Trace, names: Sequence[str], rows: int | None = None, ahead: bool = False
) -> Iterator[tuple[slice, dict[str, np.ndarray]]]:
    """The rows of block columns ``names``, ``rows`` (default :data:`ROWS`) at a time, in
    row order.

    Args:
        ahead: read each chunk on a worker thread while the caller works on the one before
            (one chunk more in memory; the read and the caller's numpy work overlap).
    Yields:
        ``(c, cols)``: the slice ``c`` of block rows and ``{name: column[c]}`` (a loaded
        column is sliced, not read again).
    Raises:
        KeyError: an unknown column; TraceFormatError: a damaged chunk.
    """
    it = _row_chunks(t, names, rows)
    return _read_ahead(it) if ahead else it


def _read_ahead(it: Iterator) -> Iterator:
    """The items of ``it``, each produced on a worker thread while the caller holds the
    one before."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        nxt = pool.submit(next, it, None)
        while (item := nxt.result()) is not None:
            nxt = pool.submit(next, it, None)
            yield item


def _row_chunks(
    t: Trace, names: Sequence[str], rows: int | None
) -> Iterator[tuple[slice, dict[str, np.ndarray]]]:
    n, rows = len(t.blocks), rows or ROWS
    alias = "verified" in names and "proposed" in names and verified_is_proposed(t)
    for lo in range(0, n, rows):
        c = slice(lo, min(lo + rows, n))
        cols = {name: _rows(t, name, c) for name in names if not (alias and name == "verified")}
        if alias:
            cols["verified"] = cols["proposed"]
        yield c, cols


def verified_is_proposed(t: Trace) -> bool:
    """Whether the store says every ``verified`` row is its ``proposed`` row (format 1.1's
    ``verified_same``), so a pass reads one matrix for both."""
    loaded_v, loaded_p = t.blocks.loaded("verified"), t.blocks.loaded("proposed")
    if loaded_v is not None and loaded_v is loaded_p:
        return True
    return bool(t._verified_is_proposed())


def _rows(t: Trace, name: str, c: slice) -> np.ndarray:
    whole = t.blocks.loaded(name)
    return whole[c] if whole is not None else t.read_rows(name, c.start, c.stop)


#: Up to this many rows, :func:`gather` reads each row's store chunk instead of a pass.
FEW = 64


def width(t: Trace, name: str) -> int:
    """Slots of matrix column ``name`` as loaded (the widest file's), without reading it."""
    whole = t.blocks.loaded(name)
    return int((whole if whole is not None else t.read_rows(name, 0, 0)).shape[1])


def row(t: Trace, name: str, i: int) -> np.ndarray:
    """Row ``i`` of block column ``name`` (one chunk of the store read, not the column)."""
    return _rows(t, name, slice(int(i), int(i) + 1))[0]


class Gather:
    """Collects rows ``idx`` (any order, repeats allowed) of one block column during a
    :func:`row_chunks` pass: call :meth:`take` with each chunk, then read :attr:`out`.

    Args:
        w: slots of a matrix column, or None for a 1-D column.
    Attributes:
        out: [len(idx), w] (or [len(idx)]) array of the column's dtype (``fill`` until
            taken).
    """

    def __init__(self, idx: np.ndarray, w: int | None, dtype, fill) -> None:
        self._order, self._sorted = row_order(idx)
        self.out = np.full((len(idx),) if w is None else (len(idx), w), fill, dtype)

    def take(self, c: slice, chunk: np.ndarray) -> None:
        """Copy the wanted rows that lie in ``c`` (``chunk`` = column[c])."""
        lo, hi = np.searchsorted(self._sorted, bounds(c, self._sorted))
        if lo >= hi:
            return
        at, src = self._order[lo:hi], self._sorted[lo:hi] - c.start
        if self.out.ndim == 1:
            self.out[at] = chunk[src]
            return
        w = min(chunk.shape[1], self.out.shape[1])
        self.out[at, :w] = chunk[src, :w]


def gather(t: Trace, name: str, idx: np.ndarray, fill=-1) -> np.ndarray:
    """Rows ``idx`` of block column ``name``: [len(idx), w] (w as loaded) for a matrix,
    [len(idx)] for a 1-D column, in one pass (or by indexing the column when it is loaded
    already)."""
    whole = t.blocks.loaded(name)
    if whole is not None:
        return whole[idx]
    probe = t.read_rows(name, 0, 0)
    if len(idx) <= FEW:  # a few rows: a chunk read each, not a pass over the range
        return np.stack([row(t, name, i) for i in idx]) if len(idx) else probe
    g = Gather(idx, probe.shape[1] if probe.ndim == 2 else None, probe.dtype, fill)
    if len(idx):
        lo, hi = int(np.min(idx)), int(np.max(idx)) + 1
        for c in range(lo, hi, ROWS):  # ROWS read here: tests shrink it
            s = slice(c, min(c + ROWS, hi))
            g.take(s, t.read_rows(name, s.start, s.stop))
    return g.out
