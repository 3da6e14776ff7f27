"""How a reader shares a trace file with the writer that is still recording it.

HDF5 without SWMR gives a reader of a file that another process writes no consistency: a
flush rewrites the last, partly filled compressed chunk of every column (at a new place in
the file when it grew) and the chunk index with it, so a reader can meet a torn chunk
(``filter returned failure during read``), a stale index, or an object header half written.
SWMR would need ``libver="latest"`` files and forbids what the writer does while recording
(variable-length request ids, /meta rewritten, attributes set), so the protocol is instead:

* **Announce.** After every flush the writer sets the ``/blocks`` attribute
  :data:`FLUSHED_ROWS` to the number of block rows it has completely written; the attribute is
  written in the same HDF5 flush as the rows. A reader of a live file reads at most that many
  rows (and never more than the shortest column), so it never sees rows being appended.
* **Retry.** Every read of a live file (the open and its checks, a column, a row range, the
  request table, the phases) that fails runs again up to :data:`ATTEMPTS` times after closing
  and re-opening the file (HDF5 keeps a file's metadata cache while any handle is open: only
  a fresh open sees the writer's new chunk index), with :func:`backoff` between attempts.
  Rows below the announced count never change (the writer only appends), so a re-read gives
  the same values. A file that still fails after the last attempt is damaged (a writer killed
  mid-flush): the error is raised as before. Complete files are never retried, and the open
  of a ``.partial`` file is retried only while it changed in the last :data:`LIVE_WINDOW`
  seconds (a dead writer's damaged file fails at once). A live file's last chunk that does
  not read back at open is a race, answered by a re-open; only a dead writer's file is cut
  back to the rows that read (:func:`readable_rows`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import h5py
import numpy as np

from .. import schema
from ..errors import TraceFormatError
from .h5file import short_reason

#: ``/blocks`` attribute: block rows completely written by the last flush (int).
FLUSHED_ROWS = "flushed_rows"
#: Reads of a live file tried at most this many times.
ATTEMPTS = 8
#: First wait between attempts (seconds); doubled each time, at most :data:`MAX_DELAY`.
FIRST_DELAY = 0.02
MAX_DELAY = 0.5
#: Exceptions h5py raises for a read that raced the writer (torn chunk, stale index, a
#: half-written object header).
RACE_ERRORS = (OSError, RuntimeError, KeyError, ValueError)

T = TypeVar("T")
_retried = [0]  # reads of this process retried so far (see retried())


def retried() -> int:
    """How many reads this process retried after a race with a writer (for tests and
    diagnostics)."""
    return _retried[0]


def backoff(attempt: int) -> float:
    """Seconds to wait before retry ``attempt`` (0-based): 0.02, 0.04, ... at most 0.5."""
    return min(FIRST_DELAY * 2**attempt, MAX_DELAY)


#: A file changed within this many seconds may have a live writer (it flushes every second).
LIVE_WINDOW = 5.0


def maybe_live(path: os.PathLike | str) -> bool:
    """Whether ``path`` changed within :data:`LIVE_WINDOW` seconds: a writer may be flushing
    it (a dead writer's file is not retried, so a damaged one fails at once)."""
    try:
        return time.time() - os.stat(path).st_mtime < LIVE_WINDOW
    except OSError:
        return False


def announce(f: h5py.File, rows: int) -> None:
    """Writer side: record that ``rows`` block rows are completely written (call before
    the HDF5 flush that writes them)."""
    f["blocks"].attrs[FLUSHED_ROWS] = int(rows)


def announced(f: h5py.File) -> int | None:
    """Reader side: the block rows the writer announced, or None (a file of an older
    writer, or no flush yet).

    Raises:
        TraceFormatError: a count that is not one integer >= 0 (a damaged file), named as
            the field ``/blocks.flushed_rows`` with its value.
    """
    v = f["blocks"].attrs.get(FLUSHED_ROWS)
    if v is None:
        return None
    if isinstance(v, np.ndarray) and v.shape in ((), (1,)):
        v = v.reshape(())[()]
    if not isinstance(v, int | np.integer) or isinstance(v, bool | np.bool_) or v < 0:
        shown = v.tolist() if isinstance(v, np.ndarray | np.generic) else v
        raise TraceFormatError(
            f"{f.filename}: expected an integer >= 0 (field=/blocks.{FLUSHED_ROWS}, "
            f"value={shown!r})"
        )
    return int(v)


def retrying(read: Callable[[], T], reopen: Callable[[], None], live: Callable[[], bool]) -> T:
    """``read()``; while the file is live (``live()``), a failure re-opens it (``reopen()``)
    and reads again, up to :data:`ATTEMPTS` reads in all.

    Raises:
        Whatever the last ``read()`` raised (or ``reopen()``, when the file cannot be opened
        any more).
    """
    for attempt in range(ATTEMPTS):
        try:
            return read()
        except RACE_ERRORS:
            if attempt == ATTEMPTS - 1 or not live():
                raise
        _retried[0] += 1
        time.sleep(backoff(attempt))
        reopen()
    raise AssertionError("unreachable")  # the loop returns or raises


def readable_rows(path: Path, f: h5py.File, n: int, step_back: bool = True) -> int:
    """Rows of a dead writer's file that read back: a kill during a flush can tear the
    last compressed chunks, so step back a chunk at a time until every column reads.

    Raises:
        TraceFormatError: with ``step_back`` False, instead of stepping back (the file's
            writer may be flushing right now: opening it again is the better answer).
    """
    g = f["blocks"]
    cols = [g[c.name] for c in schema.BLOCK_COLUMNS if c.name in g]
    while n > 0:
        try:
            for ds in cols:
                ds[max(0, n - ds.chunks[0]) : n]
            return n
        except (OSError, RuntimeError, ValueError) as exc:
            if not step_back:
                raise TraceFormatError(f"{path}: {short_reason(exc)}") from None
            step = min(ds.chunks[0] for ds in cols)
            n = (n - 1) // step * step
    return 0
