"""Chunking and threads for the block-wise passes.

Block loops run in chunks of :data:`CHUNK` rows (temporaries stay in cache) and, where a pass
is long, in shares of chunks on :data:`WORKERS` threads: numpy releases the GIL in its loops.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

#: Threads for :func:`in_parallel` (the cores we may use).
WORKERS = max(
    1,
    min(
        4,
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1),
    ),
)


#: Rows per chunk of the block-wise loops: temporaries of a few MB stay in cache and are
#: reused by the allocator, where whole-column temporaries (tens of MB) cost page faults.
CHUNK = 1 << 18


def in_parallel(calls: list):
    """Run zero-argument callables on a small thread pool; returns their results in order.

    numpy releases the GIL inside its loops, so the two sides of a diff (or two halves of a
    pass) use both cores of a 2-core machine. h5py reads hold the GIL: read first, then
    compute here.
    """
    if len(calls) <= 1:
        return [c() for c in calls]
    with ThreadPoolExecutor(max_workers=min(len(calls), WORKERS)) as pool:
        return list(pool.map(lambda c: c(), calls))


def each_chunk(n: int, fn) -> list:
    """Call ``fn(list_of_slices)`` on :data:`WORKERS` interleaved shares of ``chunks(n)``, in
    parallel; ``fn`` writes its rows in place and may return a partial result (listed)."""
    cs = list(chunks(n))
    shares = [cs[i::WORKERS] for i in range(min(WORKERS, max(len(cs), 1)))]
    return in_parallel([lambda share=share: fn(share) for share in shares])


def chunks(n: int, size: int = CHUNK):
    """Slices covering ``range(n)`` in steps of ``size`` rows."""
    return (slice(i, min(i + size, n)) for i in range(0, n, size))


def bounds(c: slice, sorted_rows: np.ndarray) -> np.ndarray:
    """``[c.start, c.stop]`` in the dtype of ``sorted_rows``, as needles of a search in it
    (a list would be int64: ``np.searchsorted`` would cast the whole int32 array per call)."""
    return np.array([c.start, c.stop], dtype=sorted_rows.dtype)


def row_order(rows) -> tuple[np.ndarray, np.ndarray]:
    """``(order, sorted_rows)`` of block rows ``rows`` (int [n], any order, repeats
    allowed): the stable argsort, int32 below 2**31 - 1 rows (half the memory of the
    kernel's int64), and ``rows[order]``; a streaming pass finds the rows of each chunk in
    ``sorted_rows`` with :func:`bounds`."""
    order = np.argsort(rows, kind="stable")
    if len(order) < np.iinfo(np.int32).max:
        order = order.astype(np.int32)
    return order, np.asarray(rows)[order]
