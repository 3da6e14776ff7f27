"""Process-wide memory policy for the big vectorised passes of ``spectrace diff``."""

from __future__ import annotations

import functools


def prefer_small_pages() -> None:
    """Stop numpy from asking for transparent huge pages (process-wide; for the CLI).

    numpy marks every large array ``MADV_HUGEPAGE``. Where the kernel's THP defrag mode is
    ``madvise`` (common), each such allocation may stall in direct memory compaction once
    memory is fragmented: on the 2-core reference machine that was 3.9 s of system time in a
    10 s diff of 5M-block traces, and 1.0 s without. The ``spectrace`` command calls this at
    start (as does ``benchmarks/bench_diff.py``, for the pandas baseline too); library users
    decide for their own process (or set ``NUMPY_MADVISE_HUGEPAGE=0``).
    """
    import importlib

    try:
        multiarray = importlib.import_module("numpy._core.multiarray")
    except ImportError:  # numpy < 2
        multiarray = importlib.import_module("numpy.core.multiarray")
    multiarray._set_madvise_hugepage(False)
    share_heap_arenas()


#: glibc's ``M_ARENA_MAX`` (``mallopt`` parameter -8) and the value set.
_M_ARENA_MAX, ARENAS = -8, 2


def share_heap_arenas() -> None:
    """Share glibc's heap between at most :data:`ARENAS` arenas (glibc only; process-wide).

    Every worker thread of the diff's thread pools would otherwise get an arena of its own
    (up to 8 per core); a temporary freed in one arena is not reused by a thread allocating
    from another, so their freed pages stay resident side by side: about 100 MB of a 5M-block
    diff's 1.2 GB peak. (A fixed ``M_MMAP_THRESHOLD`` saves more but page-faults every large
    temporary afresh: 2 to 5 s more system time in that diff.) No-op where ``mallopt`` is
    missing.
    """
    libc = _libc()
    if libc is not None:
        libc.mallopt(_M_ARENA_MAX, ARENAS)


@functools.cache
def _libc():
    """glibc, when this process runs on it (``mallopt`` and ``malloc_trim``), else None."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 - glibc's, else AttributeError
    except (OSError, AttributeError):
        return None
    return libc


def trim_heap() -> None:
    """Hand the heap's free pages back to the system (glibc ``malloc_trim``; no-op
    elsewhere): after many small arrays were freed (a request table's rows copied into one
    array), which the allocator would otherwise keep resident."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
