"""Columnar block writes off the recording thread (the V2 vectorised join's output, and the
V1 joiner's rows gathered by :class:`RowBuffer`).

Chunks of block columns are buffered and appended (concatenated, then one
:meth:`~spectrace.tracer.store.TraceWriter.add_blocks` call) on a background thread once
:attr:`ColumnWriter.FLUSH_ROWS` rows or :attr:`ColumnWriter.FLUSH_S` seconds are buffered
(h5py holds the GIL through much of an HDF5 call, compression included: measured, a Python
loop ran at about a fifth of its speed beside a compressing write. So background writes still
slow the recording thread: keep them few and large).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

import numpy as np

from spectrace.tracer.schema import BLOCK_COLUMNS, PAD, Column, pad_to
from spectrace.tracer.store import TraceWriter


def concat_columns(parts: list[dict]) -> dict:
    """Concatenate block column dicts row-wise; matrices are padded to the widest with the
    column's fill (-1, NaN for margins), and a column some parts lack is filled for them
    (the joiner's row blocks and a step's columns may carry different optional columns)."""
    if len(parts) == 1:
        return parts[0]
    known = {c.name: c for c in BLOCK_COLUMNS}
    out = {}
    for name in dict.fromkeys(n for p in parts for n in p):
        c = known[name]
        arrs = [np.asarray(p[name]) if name in p else _filled(c, _rows(p)) for p in parts]
        if c.width is not None:
            w = max(a.shape[1] for a in arrs)
            arrs = [pad_to(a, w, c.fill) for a in arrs]
        out[name] = np.concatenate(arrs)
    return out


def materialised(parts: list) -> list[dict]:
    """``parts`` as column dicts: each run of deferred parts (objects whose type has a static
    ``batch(parts) -> dict``, e.g. :class:`~.v1_join.ClosedStep`) made into one dict."""
    out: list[dict] = []
    run: list = []
    for p in [*parts, None]:
        if p is not None and not isinstance(p, dict):
            run.append(p)
            continue
        if run:
            out.append(type(run[0]).batch(run))
            run = []
        if p is not None:
            out.append(p)
    return out


def _rows(columns: dict) -> int:
    return len(next(iter(columns.values())))


def _filled(c: Column, n: int) -> np.ndarray:
    return np.full((n,) if c.width is None else (n, 1), c.fill, dtype=c.np_dtype)


class ColumnWriter:
    """Buffers block column chunks for one writer and appends them on a background thread.

    Args:
        writer: returns the :class:`TraceWriter` (called on the first flush: the session
            opens its file lazily).
    """

    #: Buffered rows or seconds that trigger a hand-over to the writer thread (one bulk HDF5
    #: append instead of one per drain). The writer appends and syncs what it was handed at
    #: its next 1 s flush, so a block reaches the file within about 1.5 s.
    FLUSH_ROWS = 16384
    FLUSH_S = 0.5

    def __init__(self, writer: Callable[[], TraceWriter]) -> None:
        self._writer = writer
        self._cols: list[dict] = []
        self._rows = 0
        self._t0 = 0.0
        self._writes: queue.Queue | None = None  # made on first use, with the thread
        self._error: BaseException | None = None

    @property
    def active(self) -> bool:
        """True once anything was buffered: row-wise writes must then wait for it (order)."""
        return bool(self._cols) or self._writes is not None

    def add(self, columns, n: int) -> None:
        """Buffer ``n`` rows of block columns (``TraceWriter.add_blocks``' argument, or a
        deferred part, see :func:`materialised`)."""
        if not self._cols:
            self._t0 = time.monotonic()
        self._cols.append(columns)
        self._rows += n
        if self._rows >= self.FLUSH_ROWS or time.monotonic() - self._t0 >= self.FLUSH_S:
            self.flush()

    def flush(self, wait: bool = False) -> None:
        """Hand the buffered rows to the writer thread; ``wait``: until they are written.

        Raises:
            Exception: with ``wait``, the error of a failed background write.
        """
        if self._cols:
            parts, self._cols, self._rows = self._cols, [], 0
            if self._writes is None:
                self._writes = queue.Queue()
                threading.Thread(
                    target=self._loop,
                    args=(self._writer(), self._writes),
                    name="spectrace-columns",
                    daemon=True,
                ).start()
            self._writes.put(parts)  # concatenated on the writer thread
        if wait and self._writes is not None:
            self._writes.join()
            if self._error is not None:
                exc, self._error = self._error, None
                raise exc

    def stop(self) -> None:
        """End the writer thread (after what it holds is written)."""
        if self._writes is not None:
            self._writes.put(None)
            self._writes.join()

    def _loop(self, writer: TraceWriter, q: queue.Queue) -> None:
        while True:
            cols = q.get()
            try:
                if cols is None:
                    return
                writer.add_blocks(concat_columns(materialised(cols)))
            except Exception as exc:  # raised on the recording thread at the next wait
                self._error = exc
            finally:
                q.task_done()


def _matrix(rows: list[list[int]], width: int = 1) -> np.ndarray:
    """Ragged id lists as an ``[n, w]`` int32 matrix padded with -1 (one C call when every
    list has the same length, the usual case: k drafts per row)."""
    w = max(width, max(map(len, rows), default=0), 1)
    if rows and all(len(r) == w for r in rows):
        return np.array(rows, dtype=np.int32)
    out = np.full((len(rows), w), PAD, dtype=np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


class RowBuffer:
    """The joiner's blocks gathered as column lists, handed over as ``add_blocks`` columns
    (:meth:`take`): a block costs a few list appends on the recording thread instead of a
    locked :meth:`~spectrace.tracer.store.TraceWriter.add_block` call and its flush.

    Args:
        request_row: request id -> its /requests row (registered on first sight).
    """

    _SCALARS: tuple[str, ...] = ("request", "step", "position", "anchor", "accepted", "t_ns")
    _SCALARS += ("batch_row", "batch_size", "proposal_source")

    def __init__(self, request_row: Callable[[str], int]) -> None:
        self._row = request_row
        self._reset()

    def _reset(self) -> None:
        self._cols: dict[str, list] = {c: [] for c in self._SCALARS}
        self._proposed: list[list[int]] = []
        self._verified: list[list[int] | None] = []
        self._emitted: list[list[int] | None] = []
        self._margins: list = []  # draft_margin per block (None: unknown)
        self._target: list[float] = []
        self.t0 = 0.0

    def __len__(self) -> int:
        return len(self._proposed)

    def add_block(self, req_id: str, step: int, position: int, anchor: int, proposed, **kw) -> None:
        """One block, with :meth:`TraceWriter.add_block`'s keyword arguments."""
        if not self._proposed:
            self.t0 = time.monotonic()
        c = self._cols
        c["request"].append(self._row(req_id))
        c["step"].append(step)
        c["position"].append(position)
        c["anchor"].append(anchor)
        c["accepted"].append(kw.get("accepted", PAD))
        t_ns = kw.get("t_ns")
        c["t_ns"].append(time.time_ns() if t_ns is None else t_ns)
        c["batch_row"].append(kw.get("batch_row", PAD))
        c["batch_size"].append(kw.get("batch_size", PAD))
        c["proposal_source"].append(kw.get("proposal_source", PAD))
        self._proposed.append(proposed)
        self._verified.append(kw.get("verified"))
        self._emitted.append(kw.get("emitted"))
        self._margins.append(kw.get("draft_margin"))
        self._target.append(kw.get("target_margin", float("nan")))

    def take(self) -> dict[str, np.ndarray]:
        """The buffered blocks as ``TraceWriter.add_blocks`` columns (then empty).

        ``proposed``/``verified`` share one width (k), ``emitted`` is padded on its own;
        a block without a verify record has ``num_verified``/``num_emitted`` -1.
        """
        c, prop = self._cols, self._proposed
        ver, emi = self._verified, self._emitted
        out: dict[str, np.ndarray] = {name: np.asarray(v, dtype=np.int64) for name, v in c.items()}
        out["k"] = np.fromiter(map(len, prop), np.int64, len(prop))
        out["num_verified"] = np.array([PAD if v is None else len(v) for v in ver], np.int64)
        out["num_emitted"] = np.array([PAD if e is None else len(e) for e in emi], np.int64)
        out["proposed"] = _matrix(prop)
        out["verified"] = _matrix([v or [] for v in ver], out["proposed"].shape[1])
        out["proposed"] = pad_to(out["proposed"], out["verified"].shape[1])
        out["emitted"] = _matrix([e or [] for e in emi])
        if any(m is not None for m in self._margins):
            margin = np.full(out["proposed"].shape, np.nan, dtype=np.float32)
            for i, m in enumerate(self._margins):
                if m is not None:
                    margin[i, : len(m)] = m
            out["draft_margin"] = margin
        out["target_margin"] = np.asarray(self._target, dtype=np.float32)
        self._reset()
        return out
