"""The crash-safe buffered writer of one trace file (schema v1).

The writer buffers rows in Python lists, appends them in chunks to resizable HDF5 datasets,
and flushes at least every ``flush_interval`` seconds from a background thread, so a
``kill -9`` of the writing process loses only the rows recorded after the last flush. It
writes ``NAME.h5.partial`` and renames it to ``NAME.h5`` on a clean :meth:`TraceWriter.close`.
Rows already added can still be patched (:meth:`TraceWriter.patch_blocks`) before the close,
so no importer reopens a closed file. The file layout is :mod:`spectrace.tracer.schema`.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import threading
import time
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path

import h5py
import numpy as np

from .. import schema
from ..errors import InputError
from .amend import amend_meta as amend_meta  # re-exported: callers of the writer
from .block_arrays import append_rows, block_arrays, concat_blocks, derived
from .live import announce
from .paths import final_path, partial_path
from .vlen import REQUEST_FIELDS, finished_runs, row_runs, write_request_rows

_STR = h5py.string_dtype("utf-8")
_VLEN_I32 = h5py.vlen_dtype(np.int32)


def spectrace_version() -> str:
    """The installed spectrace version ("unknown" in a source checkout on sys.path)."""
    try:
        return version("spectrace")
    except Exception:  # not installed (a source checkout on sys.path), or bad metadata
        return "unknown"


class TraceWriter:
    """Append-only writer of one trace file (schema v1).

    Args:
        path: final file name (``NAME.h5``); the file is written as ``NAME.h5.partial``.
        meta: the /meta JSON document (see :data:`schema.META_KEYS`); must be JSON-serialisable.
        flush_interval: seconds from the last sync of the file, whoever made it, to the flush
            thread's next (default 1.0): a row reaches the disk within it. ``0`` disables the
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

    def __init__(
        self,
        path: str | os.PathLike,
        meta: dict | None = None,
        *,
        flush_interval: float = 1.0,
        flush_rows: int = 65536,
        compression: str | None = "gzip",
    ) -> None:
        self.path = final_path(path)
        self.partial_path = partial_path(self.path)
        self._meta = dict(meta or {})
        self._lock = threading.RLock()
        self._flush_rows = flush_rows
        self._compression = compression
        self._kmax = max(int(self._meta.get("k") or 0), 1)
        try:
            # No HDF5 file lock: readers open without one (a live --follow, the closing
            # cross-check in this very process), and HDF5 refuses mixed lock flags.
            self._file = h5py.File(self.partial_path, "w", locking=False)
        except OSError as exc:
            raise InputError(f"{self.partial_path}: cannot create trace file ({exc})") from None
        try:
            self._init_file()
        except BaseException:  # a file it could not lay out holds nothing: leave none behind
            self._file.close()
            self.partial_path.unlink(missing_ok=True)
            raise
        #: table -> column -> dataset (h5py's group lookup costs about 0.1 ms per call)
        self._tables = {t: {c.name: self._file[t][c.name] for c in cols}
                        for t, cols in schema.TABLES.items()}  # fmt: skip
        self._blocks: dict[str, list] = {c.name: [] for c in schema.BLOCK_COLUMNS}
        self._block_parts: list[dict[str, np.ndarray]] = []  # add_blocks' rows, unwritten
        self._parts_rows = 0
        self._phases: dict[str, list] = {c.name: [] for c in schema.PHASE_COLUMNS}
        self._phase_names: dict[str, int] = {}
        self._req_index: dict[str, int] = {}
        self._requests: list[list] = []  # [req_id, prompt, output, finish_reason]
        self._dirty_requests: set[int] = set()  # rows to write whole; then rows whose
        self._dirty_outputs: set[int] = set()  # output ids or finish reason changed
        self._meta_dirty = False
        self._closed = False
        self.rows_written = 0
        self._stop = threading.Event()
        self._synced = time.monotonic()  # the last sync of the file (see _flush_loop)
        self._thread: threading.Thread | None = None
        if flush_interval and flush_interval > 0:
            self._thread = threading.Thread(
                target=self._flush_loop, args=(flush_interval,), name="spectrace-flush", daemon=True
            )
            self._thread.start()

    # -- file layout ---------------------------------------------------------------------------

    def _init_file(self) -> None:
        f = self._file
        f.attrs["format"] = schema.FORMAT
        f.attrs["format_version"] = schema.FORMAT_VERSION
        f.attrs["status"] = schema.STATUS_RECORDING
        f.attrs["writer"] = f"spectrace {spectrace_version()}"
        f.attrs["created_utc"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
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
        kw: dict[str, object] = {}
        shape: tuple[int, ...]
        maxshape: tuple[int | None, ...]
        chunks: tuple[int, ...]
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
        group.create_dataset(
            c.name, shape=shape, maxshape=maxshape, chunks=chunks, dtype=dtype, **kw
        )

    def _write_meta(self) -> None:
        if "meta" in self._file:
            del self._file["meta"]
        self._file.create_dataset(
            "meta", data=json.dumps(self._meta, sort_keys=True, default=str), dtype=_STR
        )

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

    def request(
        self,
        req_id: str,
        prompt_ids: Sequence[int] | None = None,
        output_ids: Sequence[int] | None = None,
        finish_reason: str | None = None,
    ) -> int:
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
                idx = self._req_index[req_id] = len(self._requests)
                self._requests.append([req_id, [], [], ""])
                self._dirty_requests.add(idx)
            row = self._requests[idx]
            if prompt_ids is not None:
                row[1] = list(map(int, prompt_ids))
                self._dirty_requests.add(idx)  # new rows and prompts: the whole row
            if output_ids is not None:
                row[2] = list(map(int, output_ids))
            if finish_reason is not None:
                row[3] = str(finish_reason)
            if output_ids is not None or finish_reason is not None:
                self._dirty_outputs.add(idx)
            return idx

    def add_block(
        self,
        req_id: str,
        step: int,
        position: int,
        anchor: int,
        proposed: Sequence[int],
        *,
        verified: Sequence[int] | None = None,
        accepted: int = schema.PAD,
        emitted: Sequence[int] | None = None,
        t_ns: int | None = None,
        batch_row: int = schema.PAD,
        batch_size: int = schema.PAD,
        proposal_source: int = schema.PAD,
        draft_margin: Sequence[float] | None = None,
        target_margin: float = float("nan"),
    ) -> None:
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
            draft_margin, target_margin: top-1 minus top-2 logits per proposed slot and
                where the target sampled the anchor (``None``/NaN: unknown).
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
            b["draft_margin"].append([] if draft_margin is None else list(draft_margin))
            b["target_margin"].append(target_margin)
            if len(b["request"]) >= self._flush_rows:
                self._flush_locked()

    def add_blocks(self, columns: dict[str, np.ndarray]) -> None:
        """Append many blocks at once (vectorised; importers, the vLLM plugin's writer
        thread). With the flush thread running they are kept (copied) until its next flush,
        which appends and syncs them with everything else (one sync per interval: each
        re-compresses the last chunk of every column); past ``flush_rows`` buffered rows, at
        once.

        Args:
            columns: block column name -> array of n rows; ``request`` holds row indices
                of requests already registered with :meth:`request`. Matrices are
                ``[n, w]`` int32 with ``-1`` padding. Missing columns get their fill value.
        Raises:
            ValueError: columns of different lengths or an unknown column name.
        """
        with self._lock:
            defer = (
                self._thread is not None
                and not self._closed
                and not self._blocks["request"]  # row-wise rows first: one write order
                and self._parts_rows + len(next(iter(columns.values()))) < self._flush_rows
            )
            n, arrays = block_arrays(columns, copy=defer)
            if defer:
                self._block_parts.append(arrays)
                self._parts_rows += n
                return
            self._flush_locked(sync=False)  # the rows added before first; one sync below
            self._append_blocks(arrays)
            announce(self._file, self.rows_written)
            self._sync()

    def _append_blocks(self, arrays: dict[str, np.ndarray]) -> None:
        g = self._tables["blocks"]
        arrays.update(derived(arrays))
        for c in schema.BLOCK_COLUMNS:
            append_rows(g[c.name], arrays[c.name], c)
        self.rows_written += len(arrays["request"])

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
        while not self._stop.wait(max(0.01, interval - (time.monotonic() - self._synced))):
            if time.monotonic() - self._synced < interval - 0.01:
                continue  # synced while waiting: the next is due an interval after that
            try:
                self.flush()
            except Exception:  # the file was closed under us; close() flushes anyway
                return

    def flush(self) -> None:
        """Write buffered rows to the file and flush HDF5's buffers to disk."""
        with self._lock:
            if not self._closed:
                self._flush_locked()

    def _flush_locked(self, sync: bool = True) -> None:
        wrote = False
        if self._block_parts:  # kept by add_blocks; always older than the row-wise rows
            parts, self._block_parts, self._parts_rows = self._block_parts, [], 0
            self._append_blocks(concat_blocks(parts))
            wrote = True
        if self._blocks["request"]:
            self._flush_table("blocks", schema.BLOCK_COLUMNS, self._blocks)
            wrote = True
        if wrote:
            announce(self._file, self.rows_written)  # the live-reader protocol (.live)
        if self._phases["step"]:
            self._flush_table("phases", schema.PHASE_COLUMNS, self._phases)
            self._file["phases"].attrs["names"] = list(self._phase_names)
            wrote = True
        if self._dirty_requests or self._dirty_outputs:
            self._flush_requests()
            wrote = True
        if self._meta_dirty:
            self._write_meta()
            self._meta_dirty = False
            wrote = True
        if wrote and sync:
            self._sync()

    def _sync(self) -> None:
        """Flush HDF5's buffers to disk (the time is when the flush thread's next is due)."""
        self._file.flush()
        self._synced = time.monotonic()

    def _flush_table(
        self, table: str, cols: tuple[schema.Column, ...], buf: dict[str, list]
    ) -> None:
        g = self._tables[table]
        n = len(buf[cols[0].name])
        arrays = {}
        # Every k-wide column gets the same width, so slot j is column j in all of them.
        wk = max((len(v) for c in cols if c.width == "k" for v in buf[c.name]), default=0)
        for c in cols:
            if c.derived:
                continue
            values = buf[c.name]
            if c.width is None:
                arrays[c.name] = np.asarray(values, dtype=c.np_dtype)
            else:
                w = wk if c.width == "k" else max((len(v) for v in values), default=0)
                arr = np.full((n, max(w, 1)), c.fill, dtype=c.np_dtype)
                for i, v in enumerate(values):
                    arr[i, : len(v)] = v
                arrays[c.name] = arr
            buf[c.name] = []
        if table == "blocks":
            arrays.update(derived(arrays))
        for c in cols:
            append_rows(g[c.name], arrays[c.name], c)
        if table == "blocks":
            self.rows_written += n

    def _flush_requests(self) -> None:
        # One write per run of dirty rows and column (one per request made the store an
        # import's bottleneck); a finished request rewrites its output and finish reason only.
        g = self._tables["requests"]
        n, old = len(self._requests), g["req_id"].shape[0]
        for c in schema.REQUEST_COLUMNS if n != old else ():
            g[c.name].resize((n,))
        whole = self._dirty_requests
        for lo, hi in row_runs(sorted(whole)):
            write_request_rows(g, self._requests, lo, hi, old, REQUEST_FIELDS)
        for lo, hi in finished_runs(self._requests, self._dirty_outputs - whole):
            write_request_rows(g, self._requests, lo, hi, old, REQUEST_FIELDS[2:])
        self._dirty_requests, self._dirty_outputs = set(), set()

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
                self._sync()
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
        return self.path if complete else self.partial_path

    def discard(self) -> Path:
        """Close without completing and delete the ``.partial`` file: a failed import or
        capture leaves nothing behind. Idempotent; the file goes even when the close's flush
        fails again (what failed before, the reason for discarding).

        Returns:
            The removed path.
        """
        with contextlib.suppress(Exception):
            self.close(complete=False)
        self.partial_path.unlink(missing_ok=True)
        return self.partial_path

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(complete=exc_type is None)
