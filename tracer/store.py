"""HDF5 trace store: a crash-safe buffered writer and a lazy reader for schema v1.

The writer buffers rows in Python lists, appends them in chunks to resizable HDF5 datasets,
and flushes at least every ``flush_interval`` seconds from a background thread, so a
``kill -9`` of the writing process loses only the rows recorded after the last flush. It
writes ``NAME.h5.partial`` and renames it to ``NAME.h5`` on a clean :meth:`TraceWriter.close`.

The reader opens one or several files (a glob or a list: one per process/DP rank) as one
trace, reads columns lazily on first access and caches them as numpy arrays. A ``.partial``
file opens with a :class:`TraceWarning`; rows are recovered up to the shortest flushed column.
The file layout is defined in :mod:`spectrace.tracer.schema`.
"""

from __future__ import annotations

import atexit
import datetime as _dt
import glob as _glob
import json
import os
import re
import threading
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from . import schema
from .errors import InputError, TraceFormatError

_STR = h5py.string_dtype("utf-8")
_VLEN_I32 = h5py.vlen_dtype(np.int32)


class TraceWarning(UserWarning):
    """A recoverable problem with a trace file (e.g. a ``.partial`` file of a dead writer)."""


def spectrace_version() -> str:
    """The installed spectrace version ("unknown" in a source checkout on sys.path)."""
    try:
        from importlib.metadata import version

        return version("spectrace")
    except Exception:  # not installed (e.g. a source checkout on sys.path)
        return "unknown"


def final_path(path: str | os.PathLike) -> Path:
    """Return the clean-close name of a trace path (strips a trailing ``.partial``)."""
    p = Path(path)
    return p.with_name(p.name[: -len(schema.PARTIAL_SUFFIX)]) if p.name.endswith(
        schema.PARTIAL_SUFFIX) else p


# --------------------------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------------------------


class TraceWriter:
    """Append-only writer of one trace file (schema v1).

    Args:
        path: final file name (``NAME.h5``); the file is written as ``NAME.h5.partial``.
        meta: the /meta JSON document (see :data:`schema.META_KEYS`); must be JSON-serialisable.
        flush_interval: seconds between background flushes (default 1.0). ``0`` disables the
            thread; rows are then flushed every ``flush_rows`` rows and on close.
        flush_rows: flush as soon as this many block rows are buffered.
        compression: HDF5 filter for the tables: ``"gzip"`` (deflate level 1 after byte
            shuffle: every HDF5 reader has it, and it reads faster than ``"lzf"`` on id
            matrices), ``"lzf"`` (h5py only) or ``None``.

    Thread-safe: a lock guards the buffers and the file. Use as a context manager: an
    exception inside the ``with`` block flushes what was recorded and leaves the
    ``.partial`` file (status ``recording``) for inspection instead of losing it.

    Raises:
        InputError: the output directory does not exist or the file cannot be created.
    """

    def __init__(self, path: str | os.PathLike, meta: dict | None = None, *,
                 flush_interval: float = 1.0, flush_rows: int = 65536,
                 compression: str | None = "gzip") -> None:
        self.path = final_path(path)
        self.partial_path = self.path.with_name(self.path.name + schema.PARTIAL_SUFFIX)
        self._meta = dict(meta or {})
        self._lock = threading.RLock()
        self._flush_rows = flush_rows
        self._compression = compression
        self._kmax = max(int(self._meta.get("k") or 0), 1)
        try:
            self._file = h5py.File(self.partial_path, "w")
        except OSError as exc:
            raise InputError(f"{self.partial_path}: cannot create trace file ({exc})") from None
        self._init_file()
        self._blocks: dict[str, list] = {c.name: [] for c in schema.BLOCK_COLUMNS}
        self._phases: dict[str, list] = {c.name: [] for c in schema.PHASE_COLUMNS}
        self._phase_names: dict[str, int] = {}
        self._req_index: dict[str, int] = {}
        self._requests: list[list] = []  # [req_id, prompt, output, finish_reason]
        self._dirty_requests: set[int] = set()
        self._meta_dirty = False
        self._closed = False
        self.rows_written = 0
        self._stop = threading.Event()
        self._thread = None
        if flush_interval and flush_interval > 0:
            self._thread = threading.Thread(target=self._flush_loop, args=(flush_interval,),
                                            name="spectrace-flush", daemon=True)
            self._thread.start()

    # -- file layout ---------------------------------------------------------------------------

    def _init_file(self) -> None:
        f = self._file
        f.attrs["format"] = schema.FORMAT
        f.attrs["format_version"] = schema.FORMAT_VERSION
        f.attrs["status"] = schema.STATUS_RECORDING
        f.attrs["writer"] = f"spectrace {spectrace_version()}"
        f.attrs["created_utc"] = _dt.datetime.now(_dt.timezone.utc).isoformat(
            timespec="seconds")
        self._write_meta()
        for table, cols in schema.TABLES.items():
            g = f.create_group(table)
            for c in cols:
                self._create_column(g, c)
        f.flush()

    def _create_column(self, group: h5py.Group, c: schema.Column) -> None:
        if c.vlen:
            dtype = _VLEN_I32
        elif c.dtype == "str":
            dtype = _STR
        else:
            dtype = c.np_dtype
        kw = {}
        if c.width is None:
            shape, maxshape, chunks = (0,), (None,), (16384,)
        else:
            w = self._kmax + (1 if c.width == "k+1" else 0)
            shape, maxshape, chunks = (0, w), (None, None), (4096, w)
        if not c.vlen and c.dtype != "str":
            kw["fillvalue"] = c.fill
            if self._compression:
                kw.update(compression=self._compression, shuffle=True)
                if self._compression == "gzip":
                    kw["compression_opts"] = 1  # level 1: most of the size, a third the time
            kw["fletcher32"] = True  # a damaged chunk fails to read instead of lying
        else:
            chunks = (256,)
        group.create_dataset(c.name, shape=shape, maxshape=maxshape, chunks=chunks,
                             dtype=dtype, **kw)

    def _write_meta(self) -> None:
        if "meta" in self._file:
            del self._file["meta"]
        self._file.create_dataset("meta", data=json.dumps(self._meta, sort_keys=True,
                                                          default=str), dtype=_STR)

    # -- recording -----------------------------------------------------------------------------

    def update_meta(self, **items) -> None:
        """Merge ``items`` into /meta (rewritten on the next flush)."""
        with self._lock:
            self._meta.update(items)
            self._meta_dirty = True

    @property
    def meta(self) -> dict:
        """A copy of the /meta document as it will be written."""
        with self._lock:
            return dict(self._meta)

    def request(self, req_id: str, prompt_ids: Sequence[int] | None = None,
                output_ids: Sequence[int] | None = None,
                finish_reason: str | None = None) -> int:
        """Register request ``req_id`` (or update its ids) and return its row index.

        Args:
            req_id: engine request id.
            prompt_ids, output_ids: token ids (int); ``None`` keeps what is stored.
            finish_reason: ``length``, ``stop``, ...; ``None`` keeps what is stored.
        Returns:
            The request's row index in /requests (stable for the writer's lifetime).
        """
        with self._lock:
            req_id = str(req_id)
            idx = self._req_index.get(req_id)
            if idx is None:
                idx = len(self._requests)
                self._req_index[req_id] = idx
                self._requests.append([req_id, [], [], ""])
            row = self._requests[idx]
            if prompt_ids is not None:
                row[1] = [int(t) for t in prompt_ids]
            if output_ids is not None:
                row[2] = [int(t) for t in output_ids]
            if finish_reason is not None:
                row[3] = str(finish_reason)
            self._dirty_requests.add(idx)
            return idx

    def add_block(self, req_id: str, step: int, position: int, anchor: int,
                  proposed: Sequence[int], *, verified: Sequence[int] | None = None,
                  accepted: int = schema.PAD, emitted: Sequence[int] | None = None,
                  t_ns: int | None = None, batch_row: int = schema.PAD,
                  batch_size: int = schema.PAD, proposal_source: int = schema.PAD) -> None:
        """Record one draft block.

        Args:
            req_id: engine request id (registered on first sight).
            step: engine step that proposed the block.
            position: absolute index of the anchor in prompt + output (tokens).
            anchor: anchor token id.
            proposed: the k ids the drafter proposed (int).
            verified: ids the target consumed, or ``None`` when not recorded.
            accepted: accepted drafts as the engine counted them (``-1``: unknown).
            emitted: tokens the target emitted (accepted drafts + bonus), or ``None``.
            t_ns: wall-clock ns; defaults to now.
            batch_row, batch_size: the request's row in the proposing step's batch and the
                number of rows (-1: unknown); they expose batch-dependent drafts.
            proposal_source: 1 when ``proposed`` is the drafter's output, 0 when it only
                copies ``verified`` (-1 unknown); see ``schema.PROPOSAL_*``.
        """
        with self._lock:
            b = self._blocks
            # Register only new requests: re-marking rows would rewrite their ragged ids on
            # every flush (heap churn that a kill mid-flush can leave unreadable).
            idx = self._req_index.get(str(req_id))
            b["request"].append(self.request(req_id) if idx is None else idx)
            b["step"].append(step)
            b["position"].append(position)
            b["anchor"].append(anchor)
            b["k"].append(len(proposed))
            b["proposed"].append(list(proposed))
            b["num_verified"].append(schema.PAD if verified is None else len(verified))
            b["verified"].append([] if verified is None else list(verified))
            b["accepted"].append(accepted)
            b["num_emitted"].append(schema.PAD if emitted is None else len(emitted))
            b["emitted"].append([] if emitted is None else list(emitted))
            b["t_ns"].append(time.time_ns() if t_ns is None else t_ns)
            b["batch_row"].append(batch_row)
            b["batch_size"].append(batch_size)
            b["proposal_source"].append(proposal_source)
            if len(b["request"]) >= self._flush_rows:
                self._flush_locked()

    def add_blocks(self, columns: dict[str, np.ndarray]) -> None:
        """Append many blocks at once (vectorised; used by importers and benchmarks).

        Args:
            columns: block column name -> array of n rows; ``request`` holds row indices
                of requests already registered with :meth:`request`. Matrices are
                ``[n, w]`` int32 with ``-1`` padding. Missing columns get their fill value.
        Raises:
            ValueError: columns of different lengths or an unknown column name.
        """
        with self._lock:
            self._flush_locked()
            n = len(next(iter(columns.values())))
            known = {c.name: c for c in schema.BLOCK_COLUMNS}
            for name, arr in columns.items():
                if name not in known:
                    raise ValueError(f"blocks: unknown column {name!r}")
                if len(arr) != n:
                    raise ValueError(f"blocks.{name}: {len(arr)} rows, expected {n}")
            g = self._file["blocks"]
            arrays = {}
            for c in schema.BLOCK_COLUMNS:
                arr = columns.get(c.name)
                if arr is None:
                    shape = (n,) if c.width is None else (n, 1)
                    arr = np.full(shape, c.fill, dtype=c.np_dtype)
                arrays[c.name] = np.asarray(arr, dtype=c.np_dtype)
            arrays.update(self._derived(g, arrays))
            for c in schema.BLOCK_COLUMNS:
                self._append(g[c.name], arrays[c.name], c)
            self.rows_written += n
            self._file.flush()

    def add_phase(self, step: int, name: str, ms: float, level: int = 1) -> None:
        """Record one per-step timing (``name`` such as ``backbone``; ``ms`` milliseconds)."""
        with self._lock:
            code = self._phase_names.setdefault(name, len(self._phase_names))
            p = self._phases
            p["step"].append(step)
            p["name"].append(code)
            p["ms"].append(ms)
            p["level"].append(level)

    # -- flushing ------------------------------------------------------------------------------

    def _flush_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.flush()
            except Exception:  # the file was closed under us; close() flushes anyway
                return

    def flush(self) -> None:
        """Write buffered rows to the file and flush HDF5's buffers to disk."""
        with self._lock:
            if not self._closed:
                self._flush_locked()

    def _flush_locked(self) -> None:
        wrote = False
        if self._blocks["request"]:
            self._flush_table("blocks", schema.BLOCK_COLUMNS, self._blocks)
            wrote = True
        if self._phases["step"]:
            self._flush_table("phases", schema.PHASE_COLUMNS, self._phases)
            self._file["phases"].attrs["names"] = list(self._phase_names)
            wrote = True
        if self._dirty_requests:
            self._flush_requests()
            wrote = True
        if self._meta_dirty:
            self._write_meta()
            self._meta_dirty = False
            wrote = True
        if wrote:
            self._file.flush()

    def _flush_table(self, table: str, cols: tuple[schema.Column, ...],
                     buf: dict[str, list]) -> None:
        g = self._file[table]
        n = len(buf[cols[0].name])
        arrays = {}
        for c in cols:
            if c.derived:
                continue
            values = buf[c.name]
            if c.width is None:
                arrays[c.name] = np.asarray(values, dtype=c.np_dtype)
            else:
                w = max((len(v) for v in values), default=0)
                arr = np.full((n, max(w, 1)), c.fill, dtype=c.np_dtype)
                for i, v in enumerate(values):
                    arr[i, :len(v)] = v
                arrays[c.name] = arr
            buf[c.name] = []
        if table == "blocks":
            arrays.update(self._derived(g, arrays))
        for c in cols:
            self._append(g[c.name], arrays[c.name], c)
        if table == "blocks":
            self.rows_written += n

    @staticmethod
    def _derived(g: h5py.Group, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The writer-computed block columns of rows about to be appended to group ``g``.

        ``verified_same`` compares the rows as they will read back: both matrices padded
        with -1 to the wider of the two stored widths.
        """
        p, v = arrays["proposed"], arrays["verified"]
        w = max(p.shape[1], v.shape[1], g["proposed"].shape[1], g["verified"].shape[1])
        same = schema.pad_to(p, w) == schema.pad_to(v, w)
        return {"verified_same": same.all(axis=1).astype(np.int8)}

    def _append(self, ds: h5py.Dataset, arr: np.ndarray, c: schema.Column) -> None:
        n0 = ds.shape[0]
        if c.width is None:
            ds.resize((n0 + len(arr),))
            ds[n0:] = arr
            return
        w = ds.shape[1]
        if arr.shape[1] > w:  # a wider block than seen so far: widen, new cells read as -1
            ds.resize((n0, arr.shape[1]))
            w = arr.shape[1]
        ds.resize((n0 + len(arr), w))
        ds[n0:, :arr.shape[1]] = arr

    def _flush_requests(self) -> None:
        g = self._file["requests"]
        n = len(self._requests)
        for c in schema.REQUEST_COLUMNS:
            g[c.name].resize((n,))
        for idx in sorted(self._dirty_requests):
            req_id, prompt, output, reason = self._requests[idx]
            g["req_id"][idx] = req_id
            g["prompt_ids"][idx] = np.asarray(prompt, dtype=np.int32)
            g["output_ids"][idx] = np.asarray(output, dtype=np.int32)
            g["finish_reason"][idx] = reason
        self._dirty_requests.clear()

    def patch_blocks(self, column: str, rows: Sequence[int], values: Sequence[int]) -> int:
        """Overwrite cells of a 1-D block column in rows already added (late patches, e.g.
        first-block anchors resolved from a requests file after their rows were flushed).

        Buffered rows are flushed first, so every row added so far can be patched; the
        file is never reopened after :meth:`close`.

        Args:
            column: a 1-D, non-derived block column (``schema.BLOCK_COLUMNS``), e.g. ``anchor``.
            rows: int block row indices (0-based, in add order); values: the new cells.
        Returns:
            The number of rows written (rows not yet added are skipped).
        Raises:
            InputError: unknown, 2-D or writer-computed column, or the writer is closed.
        """
        cols = {c.name: c for c in schema.BLOCK_COLUMNS if c.width is None}
        if column not in cols:
            raise InputError(f"blocks.{column}: not a 1-D block column")
        if cols[column].derived:
            raise InputError(f"blocks.{column}: computed by the writer, not updatable")
        r = np.asarray(rows, dtype=np.int64)
        v = np.asarray(values, dtype=cols[column].np_dtype)
        # h5py fancy indexing needs unique increasing rows: the last patch of a row wins.
        r, last = np.unique(r[::-1], return_index=True)
        v = v[::-1][last]
        with self._lock:
            if self._closed:
                raise InputError(f"{self.path}: writer closed; blocks.{column} not patched")
            self._flush_locked()
            ds = self._file["blocks"][column]
            keep = (r >= 0) & (r < ds.shape[0])
            if keep.any():
                ds[r[keep]] = v[keep]
                self._file.flush()
            return int(keep.sum())

    # -- closing -------------------------------------------------------------------------------

    def close(self, complete: bool = True) -> Path:
        """Flush, mark the file and (if ``complete``) rename ``.partial`` to the final name.

        Idempotent. With ``complete=False`` the rows are flushed but the file stays
        ``NAME.h5.partial`` with status ``recording`` (what a crashed engine leaves).

        Returns:
            The path of the file on disk.
        """
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        with self._lock:
            if self._closed:
                return self.path if complete else self.partial_path
            self._flush_locked()
            if complete:
                self._file.attrs["status"] = schema.STATUS_COMPLETE
            self._file.close()
            self._closed = True
        if complete:
            os.replace(self.partial_path, self.path)
            return self.path
        return self.partial_path

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(complete=exc_type is None)


# --------------------------------------------------------------------------------------------
# Reader
# --------------------------------------------------------------------------------------------


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


class RaggedColumn(Sequence):
    """A ragged int32 request column read on demand (``Trace(..., lazy_requests=True)``).

    Indexing returns one int32 array (read from the file and kept in a bounded cache); rows
    appended with :meth:`append` (placeholder requests) live in memory. Reads need the trace
    to be open. Thread-safe (h5py serialises file access).
    """

    def __init__(self, parts: list[tuple[h5py.Dataset, int]], cache_rows: int = 256) -> None:
        self._parts = parts
        self._starts = np.cumsum([0] + [n for _, n in parts])
        self._extra: list[np.ndarray] = []
        self._cache: dict[int, np.ndarray] = {}
        self._cache_rows = cache_rows
        self._lock = threading.Lock()

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
                ds, _ = self._parts[f]
                hit = np.asarray(ds[i - int(self._starts[f])], np.int32)
                if len(self._cache) >= self._cache_rows:
                    self._cache.pop(next(iter(self._cache)))
                self._cache[i] = hit
            return hit

    def read(self, start: int, stop: int) -> list[np.ndarray]:
        """Rows ``[start, stop)`` in bulk (uncached): for scans over many requests."""
        out: list[np.ndarray] = []
        base = int(self._starts[-1])
        for f, (ds, _) in enumerate(self._parts):
            s0, s1 = int(self._starts[f]), int(self._starts[f + 1])
            lo, hi = max(start, s0), min(stop, s1)
            if lo < hi:
                out += [np.asarray(x, np.int32) for x in ds[lo - s0:hi - s0]]
        if stop > base:
            out += self._extra[max(start - base, 0):stop - base]
        return out

    def append(self, arr: np.ndarray) -> None:
        """Add an in-memory row at the end."""
        self._extra.append(np.asarray(arr, np.int32))


class Blocks:
    """Lazy view of the /blocks table: ``blocks.<column>`` loads and caches a numpy array.

    Column names and dtypes are those of :data:`schema.BLOCK_COLUMNS`; matrices are padded
    with ``-1`` to the widest file. ``request`` is re-based to index the concatenated
    :class:`Requests`. Unknown optional columns are ignored.
    """

    def __init__(self, trace: Trace) -> None:
        self._trace = trace
        self._cache: dict[str, np.ndarray] = {}
        self._cols = {c.name: c for c in schema.BLOCK_COLUMNS}
        self._lock = threading.Lock()
        self._loading: dict[str, threading.Event] = {}  # column -> set when its read ends

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
            ev = self._loading.get(name)
            mine = ev is None
            if mine:
                ev = self._loading[name] = threading.Event()
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
            ev.set()

    def columns(self) -> dict[str, np.ndarray]:
        """Every column, loaded (name -> array)."""
        return {name: getattr(self, name) for name in self._cols}


#: Running prefetch threads and their stop flags; joined at interpreter exit (see below).
_prefetching: set[tuple[threading.Thread, threading.Event]] = set()
_prefetch_lock = threading.Lock()
_prefetch_atexit = False


def _stop_prefetching() -> None:
    # A daemon thread frozen inside an h5py read at shutdown holds h5py's lock while the
    # exit handlers close files: the process would hang (e.g. after an error on the main
    # thread). Stop after the column in hand and join, before h5py's own exit handler.
    with _prefetch_lock:
        running = list(_prefetching)
    for th, stop in running:
        stop.set()
    for th, _ in running:
        th.join()


def _unreadable(path: Path, exc: OSError) -> str:
    """Why h5py cannot open ``path``, in the user's words where we can tell."""
    m = re.search(r"truncated file: eof = (\d+).*stored_eof = (\d+)", str(exc))
    if m:
        return (f"truncated HDF5 file ({m.group(1)} of {m.group(2)} bytes; a copy cut "
                f"short?)")
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        head = b""
    if b"VT_SPEC_TRACE" in head or b"[SPECTRACE]" in head or b"[spec-" in head:
        return ("a VT_SPEC_TRACE log, not a trace file: convert it with "
                "`spectrace import vt LOG -o TRACE.h5`")
    return f"not a readable HDF5 file ({_short(exc)})"


def prefetch(tables: Sequence[Blocks], names: Iterable[str]) -> threading.Thread:
    """Start reading columns ``names`` of each :class:`Blocks` in ``tables``, in that order,
    on one background thread (h5py releases the GIL while it reads and decompresses, so the
    caller computes meanwhile; HDF5 itself reads one dataset at a time).

    Accessing a column waits for its read; a read that fails there is retried, and raises,
    on the accessing thread. ``request`` is never prefetched: reading it may add placeholder
    request rows, which the caller's thread does. At interpreter exit the thread stops after
    the column it is reading.

    Returns:
        The (daemon) thread.
    """
    names = [n for n in names if n != "request"]
    stop = threading.Event()

    def run() -> None:
        try:
            for blocks in tables:
                for n in names:
                    if stop.is_set():
                        return
                    try:
                        getattr(blocks, n)
                    except Exception:  # noqa: BLE001 - re-raised where the column is used
                        pass
        finally:
            with _prefetch_lock:
                _prefetching.discard((th, stop))

    global _prefetch_atexit
    th = threading.Thread(target=run, name="spectrace-prefetch", daemon=True)
    with _prefetch_lock:
        if not _prefetch_atexit:
            atexit.register(_stop_prefetching)  # registered after h5py's: runs before it
            _prefetch_atexit = True
        _prefetching.add((th, stop))
    th.start()
    return th


class Trace:
    """A trace opened for reading: one or several files treated as one run.

    Attributes:
        paths: the files, in the order given (globs sorted).
        meta: /meta of the first file; ``metas`` holds every file's.
        requests: :class:`Requests`, read eagerly (small).
        blocks: :class:`Blocks`, read lazily per column.
        status: ``complete`` if every file closed cleanly, else ``recording``.
        warnings: one-line warnings raised while opening (also issued as TraceWarning).
    """

    def __init__(self, paths: list[Path], *, lazy_requests: bool = False) -> None:
        self.paths = paths
        self._lazy_requests = lazy_requests
        self._requests: Requests | None = None
        self._requests_lock = threading.Lock()
        self._unknown: dict[int, int] = {}
        self.warnings: list[str] = []
        self._files: list[h5py.File] = []
        self.metas: list[dict] = []
        #: Each file's trace format version (``schema.FORMAT_VERSION`` when it was written).
        self.formats: list[str] = []
        self._nblocks: list[int] = []
        self.status = schema.STATUS_COMPLETE
        for p in paths:
            self._open_one(p)
        self.meta = self.metas[0] if self.metas else {}
        engines = {(m.get("engine"), m.get("method"), m.get("k")) for m in self.metas}
        ranks = [m["dp_rank"] for m in self.metas if m.get("dp_rank") is not None]
        if len(engines) > 1:  # one trace = one run split over processes, not two engines
            self._warn(f"{self.name}: files of different runs read as one trace "
                       f"(engine, method, k: {sorted(engines, key=str)})")
        elif len(ranks) != len(set(ranks)):  # one run writes one file per data-parallel rank
            self._warn(f"{self.name}: files of different runs read as one trace (data-parallel "
                       f"ranks {sorted(ranks)}: a rank appears twice)")
        if not lazy_requests:
            self._requests = self._read_requests()
        self.blocks = Blocks(self)
        #: Memo of derived columns (see :func:`spectrace.tracer.metrics.memo`).
        self.cache: dict = {}

    @property
    def requests(self) -> Requests:
        """The /requests table (read on first access when opened with ``lazy_requests``)."""
        if self._requests is None:
            with self._requests_lock:
                if self._requests is None:
                    self._requests = self._read_requests()
        return self._requests

    # -- opening -------------------------------------------------------------------------------

    def _open_one(self, path: Path) -> None:
        if path.is_dir():
            raise InputError(f"{path}: is a directory, not a trace file")
        try:
            f = h5py.File(path, "r", locking=False)
        except FileNotFoundError:
            raise InputError(f"{path}: no such file") from None
        except OSError as exc:
            raise TraceFormatError(f"{path}: {_unreadable(path, exc)}") from None
        try:
            self._check_and_add(path, f)
        except (KeyError, OSError, RuntimeError, ValueError, TypeError) as exc:
            # HDF5 reports damaged object headers as KeyError/OSError deep inside h5py.
            f.close()
            raise TraceFormatError(f"{path}: damaged trace file ({_short(exc)})") from None

    def _check_and_add(self, path: Path, f: h5py.File) -> None:
        fmt = _attr(f, "format")
        if fmt != schema.FORMAT:
            f.close()
            raise TraceFormatError(f"{path}: not a spectrace trace (format attribute is "
                                   f"{fmt!r}, expected {schema.FORMAT!r})")
        version = str(_attr(f, "format_version") or "")
        if not version:
            f.close()
            raise TraceFormatError(f"{path}: damaged trace file (no format_version attribute)")
        if version.split(".")[0] != str(schema.MAJOR_VERSION):
            f.close()
            raise TraceFormatError(
                f"{path}: trace format version {version or '?'} is not supported; this "
                f"spectrace reads {schema.MAJOR_VERSION}.x (upgrade spectrace)")
        try:
            meta = json.loads(_decode(f["meta"][()]))
        except (KeyError, ValueError) as exc:
            f.close()
            raise TraceFormatError(f"{path}: /meta is missing or not JSON ({exc})") from None
        status = _attr(f, "status")
        for table, cols in schema.TABLES.items():  # touch every column: damage shows here
            for c in cols:
                if c.name in f[table] or not c.optional:
                    f[table][c.name].shape
        n = self._flushed_rows(f)
        if status != schema.STATUS_COMPLETE or path.name.endswith(schema.PARTIAL_SUFFIX):
            n = self._readable_rows(f, n)
            self.status = schema.STATUS_RECORDING
            self._warn(f"{path}: trace was not closed cleanly (status {status!r}); "
                       f"recovered {n} flushed blocks")
        self._files.append(f)
        self.metas.append(meta)
        self.formats.append(version)
        self._nblocks.append(n)

    @staticmethod
    def _flushed_rows(f: h5py.File) -> int:
        # A writer killed mid-flush may leave columns of different lengths: the shortest one
        # bounds the rows that were completely written.
        g = f["blocks"]
        return min((g[c.name].shape[0] for c in schema.BLOCK_COLUMNS if c.name in g),
                   default=0)

    @staticmethod
    def _readable_rows(f: h5py.File, n: int) -> int:
        """Rows of a dead writer's file that read back: a kill during a flush can tear the
        last compressed chunks, so step back a chunk at a time until every column reads."""
        g = f["blocks"]
        cols = [g[c.name] for c in schema.BLOCK_COLUMNS if c.name in g]
        while n > 0:
            try:
                for ds in cols:
                    ds[max(0, n - ds.chunks[0]):n]
                return n
            except (OSError, RuntimeError, ValueError):
                step = min(ds.chunks[0] for ds in cols)
                n = (n - 1) // step * step
        return 0

    def _warn(self, msg: str) -> None:
        self.warnings.append(msg)
        warnings.warn(msg, TraceWarning, stacklevel=3)

    # -- reading -------------------------------------------------------------------------------

    def _read_requests(self) -> Requests:
        try:
            return self._read_requests_unchecked()
        except (KeyError, OSError, RuntimeError) as exc:
            raise TraceFormatError(f"{self.name}: damaged /requests table ({_short(exc)})") \
                from None

    def _read_requests_unchecked(self) -> Requests:
        r = Requests()
        files = []
        lazy_parts: list[tuple[h5py.Dataset, int]] = []
        self._req_offsets = []
        for i, f in enumerate(self._files):
            g = f["requests"]
            n = min(g[c.name].shape[0] for c in schema.REQUEST_COLUMNS)
            self._req_offsets.append(len(r.req_id))
            r.req_id += [_decode(x) for x in g["req_id"][:n]]
            r.prompt_ids += [np.asarray(x, np.int32) for x in g["prompt_ids"][:n]]
            if self._lazy_requests:
                lazy_parts.append((g["output_ids"], n))
            else:
                r.output_ids += [np.asarray(x, np.int32) for x in g["output_ids"][:n]]
            r.finish_reason += [_decode(x) for x in g["finish_reason"][:n]]
            files.append(np.full(n, i, np.int32))
        if self._lazy_requests:
            r.output_ids = RaggedColumn(lazy_parts)  # type: ignore[assignment]
        r.file = np.concatenate(files) if files else np.zeros(0, np.int32)
        self._nreq_per_file = [int((r.file == i).sum()) for i in range(len(self._files))]
        return r

    def _read_block_column(self, c: schema.Column) -> np.ndarray:
        try:
            return self._read_block_column_unchecked(c)
        except (KeyError, OSError, RuntimeError) as exc:
            raise TraceFormatError(f"{self.name}: damaged column blocks/{c.name} "
                                   f"({_short(exc)})") from None

    def _read_block_column_unchecked(self, c: schema.Column) -> np.ndarray:
        self.requests  # noqa: B018 - request offsets are known once requests are read
        parts = []
        for i, (f, n) in enumerate(zip(self._files, self._nblocks)):
            ds = f["blocks"].get(c.name)
            if ds is None:
                shape = (n,) if c.width is None else (n, 1)
                arr = np.full(shape, c.fill, c.np_dtype)
            else:
                arr = ds[()] if ds.shape[0] == n else ds[:n]  # [()] skips hyperslab work
            if c.name == "request":
                arr = arr + self._req_offsets[i]
                missing = arr >= self._req_offsets[i] + self._nreq_per_file[i]
                if missing.any():  # rows flushed before their request row: keep them
                    self._add_unknown_requests(arr, missing)
            parts.append(arr)
        if not parts:
            return np.zeros((0,) if c.width is None else (0, 1), c.np_dtype)
        if c.width is not None:
            w = max(p.shape[1] for p in parts)
            parts = [schema.pad_to(p, w, c.fill) for p in parts]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _verified_is_proposed(self) -> bool:
        """Whether every block's ``verified`` row equals its ``proposed`` row, by the store's
        own ``verified_same`` column (format 1.1), without reading either matrix. False when
        a file predates the column or stores the two matrices at different widths."""
        for f in self._files:
            g = f["blocks"]
            if "verified_same" not in g or g["verified"].shape[1] != g["proposed"].shape[1]:
                return False
        return bool(self.blocks.verified_same.all())

    def _add_unknown_requests(self, arr: np.ndarray, missing: np.ndarray) -> None:
        # Remap dangling request indices to placeholder request rows at the end (the same
        # placeholder when windowed reads see an index again), in one pass over the column.
        dangling, inverse = np.unique(arr[missing], return_inverse=True)
        target = np.empty(len(dangling), arr.dtype)
        for j, idx in enumerate(dangling.tolist()):
            if idx not in self._unknown:
                self._unknown[idx] = len(self.requests.req_id)
                self.requests.req_id.append(f"?{idx}")
                self.requests.prompt_ids.append(np.zeros(0, np.int32))
                self.requests.output_ids.append(np.zeros(0, np.int32))
                self.requests.finish_reason.append("unfinished")
                self.requests.file = np.append(self.requests.file, -1)
            target[j] = self._unknown[idx]
        arr[missing] = target[inverse]

    def read_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` of block column ``name`` without loading the whole column.

        Same values, dtype and padding as ``blocks.<name>[start:stop]`` (served from that
        array when it is already loaded). For viewers of traces too big to hold in memory.

        Raises:
            KeyError: unknown column name.
        """
        c = {c.name: c for c in schema.BLOCK_COLUMNS}[name]
        cached = self.blocks._cache.get(name)
        if cached is not None:
            return cached[start:stop]
        self.requests  # noqa: B018 - request offsets
        total = sum(self._nblocks)
        start, stop = max(0, min(start, total)), max(0, min(stop, total))
        width = None
        if c.width is not None:
            width = max([ds.shape[1] for ds in (self._dataset(i, name)
                                                for i in range(len(self._files)))
                         if ds is not None] or [1])
        parts, base = [], 0
        for i, (f, n) in enumerate(zip(self._files, self._nblocks)):
            lo, hi = max(start, base) - base, min(stop, base + n) - base
            base += n
            if lo >= hi:
                continue
            ds = self._dataset(i, name)
            if ds is None:
                shape = (hi - lo,) if width is None else (hi - lo, width)
                arr = np.full(shape, c.fill, c.np_dtype)
            else:
                arr = ds[lo:hi]
            if width is not None and arr.shape[1] < width:
                arr = schema.pad_to(arr, width, c.fill)
            if name == "request":
                arr = arr + self._req_offsets[i]
                missing = arr >= self._req_offsets[i] + self._nreq_per_file[i]
                if missing.any():
                    self._add_unknown_requests(arr, missing)
            parts.append(arr)
        if not parts:
            return np.zeros((0,) if width is None else (0, width), c.np_dtype)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _dataset(self, i: int, name: str):
        # h5py's group lookup costs as much as a small read: keep the handles.
        cache = self.__dict__.setdefault("_datasets", {})
        if (i, name) not in cache:
            cache[(i, name)] = self._files[i]["blocks"].get(name)
        return cache[(i, name)]

    @property
    def nblocks_per_file(self) -> list[int]:
        """Flushed block rows of each file (as read at open)."""
        return list(self._nblocks)

    def phases(self) -> dict[str, np.ndarray]:
        """The /phases table: ``step`` int32, ``name`` (str object array), ``ms`` float32,
        ``level`` int8, ``file`` int32, all [n]."""
        out: dict[str, list] = {"step": [], "name": [], "ms": [], "level": [], "file": []}
        for i, f in enumerate(self._files):
            g = f["phases"]
            n = min(g[c.name].shape[0] for c in schema.PHASE_COLUMNS)
            names = [_decode(x) for x in g.attrs.get("names", [])]
            codes = g["name"][:n]
            out["step"].append(g["step"][:n])
            out["name"].append(np.array([names[c] if 0 <= c < len(names) else "?"
                                         for c in codes], dtype=object))
            out["ms"].append(g["ms"][:n])
            out["level"].append(g["level"][:n])
            out["file"].append(np.full(n, i, np.int32))
        return {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in out.items()}

    def close(self) -> None:
        """Close the underlying files (columns already read stay usable)."""
        for f in self._files:
            f.close()
        self._files = []

    def __enter__(self) -> Trace:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def name(self) -> str:
        """A short label: the first file name (plus ``+N`` for more files)."""
        extra = f" +{len(self.paths) - 1}" if len(self.paths) > 1 else ""
        return f"{self.paths[0].name}{extra}" if self.paths else "?"


def resolve_paths(spec: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """Expand a trace spec to file paths.

    A spec is a path, a glob (``run-*.h5``) or a list of either. ``NAME.h5`` that does not
    exist but has a ``NAME.h5.partial`` resolves to the partial file.

    Raises:
        InputError: a path or glob that matches nothing.
    """
    specs = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    out: list[Path] = []
    for s in specs:
        s = str(s)
        if any(ch in s for ch in "*?["):
            matches = sorted(_glob.glob(s))
            if not matches:
                raise InputError(f"{s}: no file matches this pattern")
            out += [Path(m) for m in matches]
            continue
        p = Path(s)
        if not p.exists():
            partial = p.with_name(p.name + schema.PARTIAL_SUFFIX)
            if partial.exists():
                p = partial
            else:
                raise InputError(f"{s}: no such file")
        out.append(p)
    if not out:
        raise InputError("no trace file given")
    unique = list(dict.fromkeys(p.resolve() for p in out))
    if len(unique) < len(out):  # the same file twice would count every block twice
        warnings.warn(f"{len(out) - len(unique)} trace file(s) given more than once; "
                      f"each is read once", TraceWarning, stacklevel=2)
        out = [p for p in dict.fromkeys(out) if p.resolve() in unique]
        out = list({p.resolve(): p for p in out}.values())
    return out


def open_trace(spec: str | os.PathLike | Iterable[str | os.PathLike], *,
               lazy_requests: bool = False) -> Trace:
    """Open a trace for reading (see :func:`resolve_paths` for the accepted specs).

    Args:
        lazy_requests: read /requests on first use and output ids row by row on demand
            (for viewers of very large traces; see :class:`RaggedColumn`).
    Returns:
        A :class:`Trace`; its columns are read lazily.
    Raises:
        InputError: missing file; TraceFormatError: not a spectrace trace or an unknown
        major version. Each message is one line naming the file.
    """
    return Trace(resolve_paths(spec), lazy_requests=lazy_requests)


def _attr(f: h5py.File, name: str):
    v = f.attrs.get(name)
    return _decode(v) if v is not None else None


def _decode(v) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def _short(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:120]
