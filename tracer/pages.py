"""Process-wide memory policy for the big vectorised passes of ``spectrace diff``."""

from __future__ import annotations


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
