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
    return_freed_arrays()


#: glibc's ``M_MMAP_THRESHOLD`` (``mallopt`` parameter -3) and the value set: allocations of
#: at least 1 MiB (a whole-column temporary, a chunk of an id matrix) are their own mappings.
_M_MMAP_THRESHOLD, MMAP_THRESHOLD = -3, 1 << 20


def return_freed_arrays() -> None:
    """Give large freed arrays back to the system at once (glibc only; process-wide).

    glibc raises its mmap threshold to the size of each mapped block freed (up to 32 MiB),
    after which whole-column temporaries of a 5M-block diff (5 to 40 MB) come from the heap
    and per-thread arenas, whose freed pages stay resident: about 200 MB of a 1.5 GB diff
    peak. A fixed threshold stops that adjustment. No-op where ``mallopt`` is missing.
    """
    libc = _libc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)


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
