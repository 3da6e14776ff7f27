"""The lazy reader of schema-v1 trace files.

A :class:`Trace` opens one or several files (a glob or a list: one per process/DP rank) as one
trace, reads block columns lazily on first access and caches them as numpy arrays
(:class:`~spectrace.tracer.store.columns.Blocks`). A ``.partial`` file opens with a
:class:`TraceWarning`; rows are recovered up to the shortest flushed column that reads back.
Every open or read failure is one :class:`TraceFormatError` line naming the file.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import h5py
import numpy as np

from .. import schema
from ..errors import InputError, SpectraceError, TraceFormatError
from .columns import Blocks, RaggedColumn, Requests
from .h5file import open_h5, short_reason
from .live import ATTEMPTS, announced, backoff, maybe_live, readable_rows, retrying
from .paths import TraceSpec, TraceWarning, final_path, resolve_paths
from .structure import (
    COUNT_COLUMNS,
    column_problems,
    decode_texts,
    format_version,
    is_complete,
    length_problems,
    phase_name_column,
    read_meta,
    request_ids,
    request_index_problems,
    runs_differ,
    scanned_request_index_problems,
    shared_request,
    stored_rows,
    value_problems,
)

_T = TypeVar("_T")


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

    def __init__(
        self, paths: list[Path], *, lazy_requests: bool = False, scan_requests: bool = True
    ) -> None:
        self.paths, self._lazy_requests, self._scan = paths, lazy_requests, scan_requests
        self._requests: Requests | None = None
        self._requests_lock = threading.Lock()
        self._unknown: dict[int, int] = {}
        self.warnings: list[str] = []
        self._files: list[h5py.File] = []
        self.metas: list[dict] = []
        #: Each file's trace format version (``schema.FORMAT_VERSION`` when it was written).
        self.formats: list[str] = []
        self._nblocks: list[int] = []
        self._complete: list[bool] = []  # per file: closed cleanly (all columns equal)
        self._req_offsets: list[int] = []  # per file: its first row in the joined /requests
        self._nreq_per_file: list[int] = []
        self._datasets: dict[tuple[int, str], h5py.Dataset | None] = {}
        self.status: schema.Status = schema.STATUS_COMPLETE
        for p in paths:
            self._open_one(p)
        # Rank 0's meta speaks for the run (a glob sorts run.dp1.h5 before run.h5).
        self.meta = min(self.metas, key=lambda m: m.get("dp_rank") or 0) if self.metas else {}
        self._one_run()
        self.blocks = Blocks(self)
        if not lazy_requests:
            self._requests = self._read_requests()
            self._add_placeholders()
        #: Memo of derived columns (see :func:`spectrace.tracer.metrics.memo`).
        self.cache: dict = {}

    @property
    def requests(self) -> Requests:
        """The /requests table (read on first access when opened with ``lazy_requests``)."""
        if self._requests is None:
            with self._requests_lock:
                if self._requests is None:
                    self._requests = self._read_requests()
                    self._add_placeholders()
        return self._requests

    def _add_placeholders(self) -> None:
        # A live or killed writer's blocks may index requests it had not flushed: placeholder
        # rows first (unless this reads the request column: that load adds them itself).
        if not all(self._complete) and not self.blocks.reading_here("request"):
            self.blocks.request  # noqa: B018 - loading the column adds the placeholders

    # -- opening -------------------------------------------------------------------------------

    def _open_one(self, path: Path) -> None:
        """Open and check one file; a ``.partial`` file (its writer may be flushing right
        now) is opened again after a failure (:mod:`.live`)."""
        if not str(path).endswith(schema.PARTIAL_SUFFIX):
            return self._open_checked(path)
        for attempt in range(ATTEMPTS):
            if not path.exists() and final_path(path).exists():  # closed meanwhile
                self.paths[self.paths.index(path)] = path = final_path(path)
            last = attempt == ATTEMPTS - 1 or not maybe_live(path)
            try:
                return self._open_checked(path, step_back=last)
            except TraceFormatError:
                if last:
                    raise
            except InputError:  # renamed to its final name between the check and the open
                if last or not final_path(path).exists():
                    raise
            time.sleep(backoff(attempt))

    def _open_checked(self, path: Path, step_back: bool = True) -> None:
        f = open_h5(path)
        try:
            self._check_and_add(path, f, step_back)
        except TraceFormatError:
            f.close()
            raise
        except (KeyError, OSError, RuntimeError, ValueError, TypeError) as exc:
            # HDF5 reports damaged object headers as KeyError/OSError deep inside h5py.
            f.close()
            what = "column blocks/request" if isinstance(exc, PartError) else "trace file"
            raise TraceFormatError(f"{path}: damaged {what} ({short_reason(exc)})") from None

    def _check_and_add(self, path: Path, f: h5py.File, step_back: bool = True) -> None:
        version, problems = format_version(str(path), f)
        if problems:
            raise problems[0].error()
        meta, problems = read_meta(str(path), f)
        problems += column_problems(str(path), f)
        status = _attr(f, "status")
        complete = is_complete(str(path), f)
        if complete and not problems:
            problems = length_problems(str(path), f)
        n = self._flushed_rows(f)
        if complete and not problems and self._scan:  # a bad index fails here, not later
            nreq = f["requests"]["req_id"].shape[0]
            req = f["blocks"]["request"]  # a damaged chunk: PartError (_open_checked says so)
            problems = _part(path, scanned_request_index_problems, str(path), req, n, nreq)
        if problems:
            raise problems[0].error()
        if not complete:
            n = readable_rows(path, f, n, step_back)
            self.status = schema.STATUS_RECORDING
            self._warn(
                f"{path}: trace was not closed cleanly (status {status!r}); "
                f"recovered {n} flushed blocks"
            )
        self._files.append(f)
        self._complete.append(complete)
        self.metas.append(meta)
        self.formats.append(version or "")
        self._nblocks.append(n)

    @staticmethod
    def _flushed_rows(f: h5py.File) -> int:
        # A writer killed mid-flush may leave columns of different lengths: the shortest one
        # bounds the rows that were completely written; a live writer's announced count
        # bounds the rows its last flush finished (.live).
        n = stored_rows(f["blocks"])
        told = announced(f)
        return n if told is None else min(n, told)

    # -- sharing a file with its live writer (.live) ---------------------------------------------

    def _live(self) -> bool:
        """Whether a writer may still be recording one of the files (open, not complete)."""
        return bool(self._files) and not all(self._complete)

    def _retrying(self, read: Callable[[], _T]) -> _T:
        """``read()``, read again after a re-open while it races a live writer."""
        return retrying(read, self._reopen_live, self._live)

    def _reopen_live(self) -> None:
        """Close and re-open every file that was not closed cleanly: only a fresh open sees
        the chunk index the writer has flushed since. The row counts stay those read at open
        (rows below them never change). A file that cannot be opened right now keeps its
        closed handle: the next read fails and is retried."""
        for i in [i for i, complete in enumerate(self._complete) if not complete]:
            path = self.paths[i]
            if not path.exists() and final_path(path).exists():  # the writer closed it
                path = final_path(path)
            self._files[i].close()
            try:
                self._files[i] = open_h5(path)
            except SpectraceError:
                pass
        self._datasets.clear()
        ragged = self._requests.output_ids if self._requests is not None else None
        if isinstance(ragged, RaggedColumn):
            ragged.rebind(self._output_parts())

    def _output_parts(self) -> list[tuple[h5py.Dataset, int]]:
        return [(f["requests"]["output_ids"], n) for f, n in zip(self._files, self._nreq_per_file)]

    def _one_run(self) -> None:
        """Raise :class:`InputError` when the files are not one run (blocks merged from two
        runs are data no engine produced: no verdict on them is honest)."""
        why = runs_differ(self.metas)  # one trace = one run split over processes
        if why is None and len(self.metas) > 1:  # ranks serve distinct requests
            ranked = all(m.get("dp_rank") is not None for m in self.metas)
            why = shared_request(self.paths, self._files, ranked)
        if why is not None:
            self.close()
            msg = f"{self.name}: files of different runs given as one trace ({why})"
            raise InputError(msg + "; pass the files of one run")

    def _warn(self, msg: str) -> None:
        self.warnings.append(msg)
        warnings.warn(msg, TraceWarning, stacklevel=3)

    # -- reading -------------------------------------------------------------------------------

    def _read_requests(self) -> Requests:
        try:
            return self._retrying(self._read_requests_unchecked)
        except (KeyError, OSError, RuntimeError) as exc:
            why = short_reason(exc)
            raise TraceFormatError(f"{self.name}: damaged /requests table ({why})") from None

    def _read_requests_unchecked(self) -> Requests:
        r, files, self._req_offsets = Requests(), [], []
        lazy_parts: list[tuple[h5py.Dataset, int]] = []
        for i, f in enumerate(self._files):
            g = f["requests"]
            n = min(g[c.name].shape[0] for c in schema.REQUEST_COLUMNS)
            self._req_offsets.append(len(r.req_id))
            r.req_id += request_ids(str(self.paths[i]), g["req_id"][:n])
            r.prompt_ids += [np.asarray(x, np.int32) for x in g["prompt_ids"][:n]]
            if self._lazy_requests:
                lazy_parts.append((g["output_ids"], n))
            else:
                r.output_ids += [np.asarray(x, np.int32) for x in g["output_ids"][:n]]
            r.finish_reason += decode_texts(
                str(self.paths[i]), "requests/finish_reason", g["finish_reason"][:n]
            )
            files.append(np.full(n, i, np.int32))
        if self._lazy_requests:
            r.output_ids = RaggedColumn(lazy_parts, retry=self._retrying)  # type: ignore[assignment]
        r.file = np.concatenate(files) if files else np.zeros(0, np.int32)
        self._nreq_per_file = [int((r.file == i).sum()) for i in range(len(self._files))]
        return r

    def _read_block_column(self, c: schema.Column) -> np.ndarray:
        try:
            return self._retrying(lambda: self._read_block_column_unchecked(c))
        except (KeyError, OSError, RuntimeError) as exc:
            raise self._damaged(f"column blocks/{c.name}", exc) from None

    def _damaged(self, what: str, exc: BaseException) -> TraceFormatError:
        """A failed read's one line: the file it failed in (else the trace), what, why."""
        where = exc.path if isinstance(exc, PartError) else self.name
        return TraceFormatError(f"{where}: damaged {what} ({short_reason(exc)})")

    def _read_block_column_unchecked(self, c: schema.Column) -> np.ndarray:
        self.requests  # noqa: B018 - request offsets are known once requests are read
        parts = []
        for i, (f, n) in enumerate(zip(self._files, self._nblocks)):
            ds = f["blocks"].get(c.name)
            if ds is None:
                arr = _filled(c, n, None if c.width is None else 1)
            else:
                whole = () if ds.shape[0] == n else slice(n)  # [()] skips hyperslab work
                arr = _part(self.paths[i], ds.__getitem__, whole)
            parts.append(self._checked(i, c.name, arr))
        if not parts:
            return _filled(c, 0, None if c.width is None else 1)
        if c.width is not None:
            w = max(p.shape[1] for p in parts)
            parts = [schema.pad_to(p, w, c.fill) for p in parts]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _checked(self, i: int, name: str, arr: np.ndarray, base: int = 0) -> np.ndarray:
        """File ``i``'s cells of block column ``name`` after the value checks that keep the
        analysis sound (never clamped); ``request`` re-based onto the joined /requests;
        ``base``: the file's block row of ``arr[0]`` (named by a problem). Impossible counts
        (:data:`COUNT_COLUMNS`) are kept: ``impossible_values`` and ``validate`` name them.

        Raises:
            TraceFormatError: a value below the column's minimum, a request index that
                is negative or (complete file) out of range.
        """
        path = str(self.paths[i])
        problems = [] if name in COUNT_COLUMNS else value_problems(path, name, arr, base)
        if problems:
            raise problems[0].error()
        return self._rebase_requests(i, arr, base) if name == "request" else arr

    def _rebase_requests(self, i: int, arr: np.ndarray, base: int = 0) -> np.ndarray:
        """File ``i``'s ``request`` cells as rows of the concatenated /requests table; rows
        flushed before their request row was point at placeholder requests (kept, not lost)."""
        problems = request_index_problems(
            str(self.paths[i]), arr, self._nreq_per_file[i], self._complete[i], base
        )
        if problems:
            raise problems[0].error()
        arr = arr.astype(np.int32) + self._req_offsets[i]
        missing = arr >= self._req_offsets[i] + self._nreq_per_file[i]
        if missing.any():
            self._add_unknown_requests(i, arr, missing)
        return arr

    def _verified_is_proposed(self) -> bool:
        """Whether every block's ``verified`` row equals its ``proposed`` row, by the store's
        own ``verified_same`` column (format 1.1), without reading either matrix. False when
        a file predates the column or stores the two matrices at different widths."""
        for f in self._files:
            g = f["blocks"]
            if "verified_same" not in g or g["verified"].shape[1] != g["proposed"].shape[1]:
                return False
        return bool(self.blocks.verified_same.all())

    def _add_unknown_requests(self, i: int, arr: np.ndarray, missing: np.ndarray) -> None:
        # Remap file i's dangling request indices to placeholder request rows (of file i) at
        # the end, the same placeholder when windowed reads see an index again, in one pass.
        dangling, inverse = np.unique(arr[missing], return_inverse=True)
        target = np.empty(len(dangling), arr.dtype)
        for j, idx in enumerate(dangling.tolist()):
            if idx not in self._unknown:
                self._unknown[idx] = len(self.requests.req_id)
                self.requests.req_id.append(f"?{idx}")
                self.requests.prompt_ids.append(np.zeros(0, np.int32))
                self.requests.output_ids.append(np.zeros(0, np.int32))
                self.requests.finish_reason.append("unfinished")
                self.requests.file = np.append(self.requests.file, np.int32(i))
            target[j] = self._unknown[idx]
        arr[missing] = target[inverse]

    def read_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` of block column ``name`` without loading the whole column.

        Same values, dtype and padding as ``blocks.<name>[start:stop]`` (served from that
        array when it is already loaded). For viewers of traces too big to hold in memory.

        Raises:
            KeyError: unknown column name; TraceFormatError: a damaged chunk.
        """
        c = {c.name: c for c in schema.BLOCK_COLUMNS}[name]
        try:
            return self._retrying(lambda: self._read_rows_unchecked(c, start, stop))
        except (OSError, RuntimeError) as exc:
            raise self._damaged(f"column blocks/{name}", exc) from None

    def _read_rows_unchecked(self, c: schema.Column, start: int, stop: int) -> np.ndarray:
        name = c.name
        cached = self.blocks.loaded(name)
        if cached is not None:
            return cached[start:stop]
        self.requests  # noqa: B018 - request offsets
        total = sum(self._nblocks)
        start, stop = max(0, min(start, total)), max(0, min(stop, total))
        dss = [self._dataset(i, name) for i in range(len(self._files))]
        width = None if c.width is None else max([d.shape[1] for d in dss if d is not None] or [1])
        parts, base = [], 0
        for i, n in enumerate(self._nblocks):
            lo, hi = max(start, base) - base, min(stop, base + n) - base
            base += n
            if lo >= hi:
                continue
            ds = dss[i]
            arr = (
                _filled(c, hi - lo, width)
                if ds is None
                else _part(self.paths[i], ds.__getitem__, slice(lo, hi))
            )
            if width is not None and arr.shape[1] < width:
                arr = schema.pad_to(arr, width, c.fill)
            parts.append(self._checked(i, name, arr, lo))
        if not parts:
            return _filled(c, 0, width)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _dataset(self, i: int, name: str) -> h5py.Dataset | None:
        # h5py's group lookup costs as much as a small read: keep the handles.
        if (i, name) not in self._datasets:
            self._datasets[(i, name)] = self._files[i]["blocks"].get(name)
        return self._datasets[(i, name)]

    @property
    def nblocks_per_file(self) -> list[int]:
        """Flushed block rows of each file (as read at open)."""
        return list(self._nblocks)

    def phases(self) -> dict[str, np.ndarray]:
        """The /phases table: ``step`` int32, ``name`` (str object array), ``ms`` float32,
        ``level`` int8, ``file`` int32, all [n].

        Raises:
            TraceFormatError: a damaged chunk (checksum or filter failure).
        """
        try:
            return self._retrying(self._phases_unchecked)
        except (KeyError, OSError, RuntimeError) as exc:
            raise TraceFormatError(
                f"{self.name}: damaged /phases table ({short_reason(exc)})"
            ) from None

    def _phases_unchecked(self) -> dict[str, np.ndarray]:
        out: dict[str, list] = {"step": [], "name": [], "ms": [], "level": [], "file": []}
        for i, f in enumerate(self._files):
            g = f["phases"]
            n = min(g[c.name].shape[0] for c in schema.PHASE_COLUMNS)
            out["step"].append(g["step"][:n])
            out["name"].append(phase_name_column(str(self.paths[i]), g, g["name"][:n]))
            out["ms"].append(g["ms"][:n])
            out["level"].append(g["level"][:n])
            out["file"].append(np.full(n, i, np.int32))
        return {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in out.items()}

    def close(self) -> None:
        """Close the underlying files (columns already read stay usable)."""
        for f in self._files:
            f.close()
        self._files = []

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` ran (columns not read yet can no longer be)."""
        return not self._files

    def __enter__(self) -> Trace:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def name(self) -> str:
        """A short label: the first file name (plus ``+N`` for more files)."""
        extra = f" +{len(self.paths) - 1}" if len(self.paths) > 1 else ""
        return f"{self.paths[0].name}{extra}" if self.paths else "?"


def open_trace(
    spec: TraceSpec, *, lazy_requests: bool = False, scan_requests: bool = True
) -> Trace:
    """Open a trace for reading (see :func:`resolve_paths` for the accepted specs).

    Args:
        lazy_requests: read /requests on first use and output ids row by row on demand
            (for viewers of very large traces; see :class:`RaggedColumn`).
        scan_requests: scan each complete file's ``blocks/request`` column for indexes
            past its /requests table on open (False: when the column loads, for a viewer
            whose first paint should not wait for a whole-column read).
    Returns:
        A :class:`Trace`; its columns are read lazily.
    Raises:
        InputError: missing file; TraceFormatError: not a spectrace trace or an unknown
        major version. Each message is one line naming the file.
    """
    return Trace(resolve_paths(spec), lazy_requests=lazy_requests, scan_requests=scan_requests)


class PartError(OSError):
    """A failed read of one file of a trace (a damaged or torn chunk), naming the file
    (``path``); an OSError, so a live file's read is still retried."""

    def __init__(self, path: Path, exc: BaseException) -> None:
        super().__init__(short_reason(exc))
        self.path = path


def _part(path: Path, read: Callable[..., _T], *args) -> _T:
    """``read(*args)`` of file ``path``; its failure as a :class:`PartError` naming it."""
    try:
        return read(*args)
    except (OSError, RuntimeError, ValueError) as exc:
        raise PartError(path, exc) from exc


def _filled(c: schema.Column, n: int, width: int | None) -> np.ndarray:
    """``n`` rows of column ``c``'s fill (``width`` columns, 1-D when None): a column an
    older file lacks reads as its fill."""
    return np.full((n,) if width is None else (n, width), c.fill, c.np_dtype)


def _attr(f: h5py.File, name: str) -> str | None:
    v = f.attrs.get(name)
    return _decode(v) if v is not None else None


def _decode(v) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)
