"""Column views of an open trace: the /requests table, ragged (vlen) request columns read on
demand, and the lazily loaded /blocks columns.

A :class:`Blocks` view reads a column from its :class:`BlockSource` (the open
:class:`~spectrace.tracer.store.Trace`) on first access and caches it; one read per column even
when a prefetch thread (:mod:`spectrace.tracer.store.prefetch`) and the caller want it at once.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import h5py
import numpy as np

from .. import schema


class BlockSource(Protocol):
    """What :class:`Blocks` reads from: the open trace's files."""

    _nblocks: list[int]

    def _read_block_column(self, c: schema.Column) -> np.ndarray:
        """Every row of block column ``c``, all files concatenated (see ``Trace``)."""

    def _verified_is_proposed(self) -> bool:
        """Whether the ``verified`` matrix equals ``proposed`` by the store's own column."""


@dataclass
class Requests:
    """The /requests table of a trace (all files concatenated).

    Attributes:
        req_id: list of n request ids (str).
        prompt_ids, output_ids: lists of n int32 arrays (empty when unknown).
        finish_reason: list of n str.
        file: int array [n], index of the file each request came from.
    """

    req_id: list[str] = field(default_factory=list)
    prompt_ids: list[np.ndarray] = field(default_factory=list)
    output_ids: list[np.ndarray] = field(default_factory=list)
    finish_reason: list[str] = field(default_factory=list)
    file: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))

    def __len__(self) -> int:
        return len(self.req_id)

    def full_sequence(self, i: int) -> np.ndarray:
        """Prompt + output ids of request ``i`` (int32 [len])."""
        return np.concatenate([self.prompt_ids[i], self.output_ids[i]]).astype(np.int32)


def _read_once(read: Callable[[], Any]) -> Any:
    return read()


class RaggedColumn(Sequence):
    """A ragged int32 request column read on demand (``Trace(..., lazy_requests=True)``).

    Indexing returns one int32 array (read from the file and kept in a bounded cache); rows
    appended with :meth:`append` (placeholder requests) live in memory. Reads need the trace
    to be open. Thread-safe (h5py serialises file access).

    Args:
        parts: per file, its ``output_ids`` dataset and the rows to read from it.
        cache_rows: rows kept in the cache.
        retry: runs a read (a callable) and re-runs it after a failure that raced a live
            writer (:func:`spectrace.tracer.store.live.retrying`); None: read once.
    """

    def __init__(
        self,
        parts: list[tuple[h5py.Dataset, int]],
        cache_rows: int = 256,
        retry: Callable[[Callable[[], Any]], Any] | None = None,
    ) -> None:
        self._parts = parts
        self._retry = retry or _read_once
        self._starts = np.cumsum([0] + [n for _, n in parts])
        self._extra: list[np.ndarray] = []
        self._cache: dict[int, np.ndarray] = {}
        self._cache_rows = cache_rows
        self._lock = threading.RLock()  # a retried read re-binds under it

    def __len__(self) -> int:
        return int(self._starts[-1]) + len(self._extra)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        i = int(i) + n if int(i) < 0 else int(i)
        if not 0 <= i < n:
            raise IndexError(i)
        if i >= self._starts[-1]:
            return self._extra[i - int(self._starts[-1])]
        with self._lock:
            hit = self._cache.get(i)
            if hit is None:
                f = int(np.searchsorted(self._starts, i, side="right")) - 1
                j = i - int(self._starts[f])
                hit = np.asarray(self._retry(lambda: self._parts[f][0][j]), np.int32)
                if len(self._cache) >= self._cache_rows:
                    self._cache.pop(next(iter(self._cache)))
                self._cache[i] = hit
            return hit

    def read(self, start: int, stop: int) -> list[np.ndarray]:
        """Rows ``[start, stop)`` in bulk (uncached): for scans over many requests."""
        out: list[np.ndarray] = []
        base = int(self._starts[-1])
        for f in range(len(self._parts)):
            s0, s1 = int(self._starts[f]), int(self._starts[f + 1])
            lo, hi = max(start, s0), min(stop, s1)
            if lo < hi:
                rows = self._retry(functools.partial(self._rows, f, lo - s0, hi - s0))
                out += [np.asarray(x, np.int32) for x in rows]
        if stop > base:
            out += self._extra[max(start - base, 0) : stop - base]
        return out

    def _rows(self, f: int, lo: int, hi: int) -> Any:
        return self._parts[f][0][lo:hi]  # looked up at call time: a retry reads a new handle

    def rebind(self, parts: list[tuple[h5py.Dataset, int]]) -> None:
        """Read from these datasets from now on (the same rows, from a re-opened file)."""
        with self._lock:
            self._parts = [(ds, n) for (ds, _), (_, n) in zip(parts, self._parts)]

    def append(self, arr: np.ndarray) -> None:
        """Add an in-memory row at the end."""
        self._extra.append(np.asarray(arr, np.int32))


class Blocks:
    """Lazy view of the /blocks table: ``blocks.<column>`` loads and caches a numpy array.

    Column names and dtypes are those of :data:`schema.BLOCK_COLUMNS`; matrices are padded
    with ``-1`` to the widest file. ``request`` is re-based to index the concatenated
    :class:`Requests`. Unknown optional columns are ignored.
    """

    def __init__(self, trace: BlockSource) -> None:
        self._trace = trace
        self._cache: dict[str, np.ndarray] = {}
        self._cols = {c.name: c for c in schema.BLOCK_COLUMNS}
        self._lock = threading.Lock()
        self._loading: dict[str, threading.Event] = {}  # column -> set when its read ends
        self._owner: dict[str, int] = {}  # column -> the thread reading it

    def __len__(self) -> int:
        return sum(self._trace._nblocks)

    def __getattr__(self, name: str) -> np.ndarray:
        cols = self.__dict__.get("_cols", {})
        if name not in cols:
            raise AttributeError(name)
        cache = self.__dict__["_cache"]
        hit = cache.get(name)
        return hit if hit is not None else self._load(name)

    def _load(self, name: str) -> np.ndarray:
        # One read per column even when a prefetch thread and the caller want it at once.
        with self._lock:
            if name in self._cache:
                return self._cache[name]
            pending = self._loading.get(name)
            mine = pending is None
            ev = self._loading[name] = threading.Event() if pending is None else pending
            if mine:
                self._owner[name] = threading.get_ident()
        if not mine:
            ev.wait()
            if name in self._cache:
                return self._cache[name]
            return self._load(name)  # that read failed: read (and raise) here
        try:
            if name == "verified" and self._trace._verified_is_proposed():
                value = self.proposed  # the store says so row by row: skip the read
            else:
                value = self._trace._read_block_column(self._cols[name])
            self._cache[name] = value
            return value
        finally:
            with self._lock:
                del self._loading[name]
                del self._owner[name]
            ev.set()

    def reading_here(self, name: str) -> bool:
        """True while this very thread reads column ``name`` (a nested access would wait
        for itself)."""
        with self._lock:
            return self._owner.get(name) == threading.get_ident()

    def loaded(self, name: str) -> np.ndarray | None:
        """Column ``name`` if it has been read already, else None (never reads)."""
        return self._cache.get(name)

    def columns(self) -> dict[str, np.ndarray]:
        """Every column, loaded (name -> array)."""
        return {name: getattr(self, name) for name in self._cols}
