"""Columnar block writes off the recording thread (the V2 vectorised join's output).

Chunks of block columns are buffered and appended with one
:meth:`~spectrace.tracer.store.TraceWriter.add_blocks` call on a background thread once
:attr:`ColumnWriter.FLUSH_ROWS` rows or :attr:`ColumnWriter.FLUSH_S` seconds are buffered
(HDF5 releases the GIL while it compresses and writes, so the recording thread keeps running).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

import numpy as np

from spectrace.tracer.schema import pad_to
from spectrace.tracer.store import TraceWriter


def concat_columns(parts: list[dict]) -> dict:
    """Concatenate block column dicts row-wise; matrices are padded with -1 to the widest."""
    if len(parts) == 1:
        return parts[0]
    out = {}
    for name in parts[0]:
        arrs = [p[name] for p in parts]
        if arrs[0].ndim == 2:
            w = max(a.shape[1] for a in arrs)
            arrs = [pad_to(a, w) for a in arrs]
        out[name] = np.concatenate(arrs)
    return out


class ColumnWriter:
    """Buffers block column chunks for one writer and appends them on a background thread.

    Args:
        writer: returns the :class:`TraceWriter` (called on the first flush: the session
            opens its file lazily).
    """

    #: Buffered rows or seconds that trigger a hand-over to the writer thread (one bulk HDF5
    #: append instead of one per drain; the writer itself flushes each second).
    FLUSH_ROWS = 16384
    FLUSH_S = 1.0

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

    def add(self, columns: dict, n: int) -> None:
        """Buffer ``n`` rows of block columns (``TraceWriter.add_blocks``' argument)."""
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
            self._writes.put(concat_columns(parts))
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
                writer.add_blocks(cols)
            except Exception as exc:  # raised on the recording thread at the next wait
                self._error = exc
            finally:
                q.task_done()
