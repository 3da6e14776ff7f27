"""Background column reads: block columns are read on one thread while the caller computes.

h5py releases the GIL while it reads and decompresses, so a diff that prefetches the columns
it will need overlaps I/O with its own work (HDF5 itself reads one dataset at a time).

Prefetch threads are daemons, so they never keep the process alive. A daemon thread frozen
inside an h5py read at shutdown, though, holds h5py's lock while h5py's exit handler closes the
files: the process would hang (it did, after an input error raised on the main thread while
columns were read). So an exit handler, registered after h5py's and therefore run before it
(``atexit`` runs handlers last-registered first), stops every prefetch thread after the column
in hand and joins it. The running threads are found through :func:`threading.enumerate`; no
registry of our own.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Iterable, Sequence

import h5py  # noqa: F401 - imported first so that h5py's exit handler runs after ours

from .columns import Blocks


class _PrefetchThread(threading.Thread):
    """Reads columns ``names`` of each table in order until done or :meth:`stop` is called."""

    def __init__(self, tables: Sequence[Blocks], names: list[str]) -> None:
        super().__init__(name="spectrace-prefetch", daemon=True)
        self._tables = list(tables)
        self._names = names
        self._stop_reading = threading.Event()

    def run(self) -> None:
        for blocks in self._tables:
            for n in self._names:
                if self._stop_reading.is_set():
                    return
                try:
                    getattr(blocks, n)
                except Exception:  # noqa: BLE001 - re-raised where the column is used
                    pass

    def stop(self) -> None:
        """Stop after the column being read (the read in hand cannot be interrupted)."""
        self._stop_reading.set()


def _stop_prefetching() -> None:
    """Stop and join every running prefetch thread (the interpreter-exit handler)."""
    running = [th for th in threading.enumerate() if isinstance(th, _PrefetchThread)]
    for th in running:
        th.stop()
    for th in running:
        th.join()


atexit.register(_stop_prefetching)


def prefetch(tables: Sequence[Blocks], names: Iterable[str]) -> threading.Thread:
    """Start reading columns ``names`` of each :class:`Blocks` in ``tables``, in that order,
    on one background thread (see the module doc).

    Accessing a column waits for its read; a read that fails there is retried, and raises,
    on the accessing thread. ``request`` is never prefetched: reading it may add placeholder
    request rows, which the caller's thread does. At interpreter exit the thread stops after
    the column it is reading.

    Returns:
        The (daemon) thread, started.
    """
    th = _PrefetchThread(tables, [n for n in names if n != "request"])
    th.start()
    return th
