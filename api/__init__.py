"""spectrace's public Python API, for notebooks and scripts.

>>> import spectrace
>>> t = spectrace.open("traces/vllm.h5")          # a file, a list of files or a glob of ranks
>>> df = t.blocks_df()                             # pandas (t.blocks_arrow(): a pyarrow Table)
>>> r = spectrace.diff("traces/reference.h5", t)   # the typed DiffResult of `spectrace diff`
>>> float(df[df.accepted >= 0].accepted.mean()), r.diverged, r.agreement.exact_match_rate
(1.330935251798561, False, 1.0)

This package's ``__init__`` runs before every ``spectrace.*`` import (the CLI, the vLLM
plugin), so it imports nothing itself: :func:`open` and :func:`diff` load the library when
called, and pandas/pyarrow load only inside the methods that return their tables.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spectrace.tables import TraceTables
    from spectrace.tracer.diff_result import DiffResult
    from spectrace.tracer.store import TraceSpec


def open(path_or_glob: TraceSpec, *, run: str | None = None) -> TraceTables:  # noqa: A001
    """Open a trace (a file, a list of files or a glob of one run's rank files).

    Args:
        run: the run name its tables carry (default: the file name without ``.h5`` and a
            trailing rank tag, as ``spectrace export`` names it).
    Returns:
        A :class:`spectrace.tables.TraceTables`: ``.blocks_df()``, ``.requests_df()``,
        ``.blocks_arrow()``, ``.requests_arrow()``, ``.info()``, ``.trace`` (the reader).
    Raises:
        InputError: no such file, or ``run`` is not a run name ``spectrace export`` takes;
        TraceFormatError: not a spectrace trace. The tables' methods raise InputError once
        the trace is closed.
    """
    from spectrace.tables import TraceTables

    return TraceTables.open(path_or_glob, run=run)


def diff(a: TraceSpec | TraceTables, b: TraceSpec | TraceTables, *, examples: int | None = 5):
    """Align two traces per anchor and compare them: what ``spectrace diff`` reports.

    Args:
        a, b: ours and theirs, as paths/globs or opened traces.
        examples: how many divergent blocks to keep as examples; 0 or None keeps every one
            (as ``spectrace diff --examples 0``).
    Returns:
        The typed :class:`spectrace.tracer.diff_result.DiffResult` (``.diverged``,
        ``.agreement``, ``.acceptance``, ``.findings``, ``.to_json()``).
    Raises:
        InputError: ``examples`` negative or not an integer; as :func:`open` for the traces.
    """
    from spectrace.tables import as_trace
    from spectrace.tracer.align import align
    from spectrace.tracer.diff import diff_traces
    from spectrace.tracer.errors import InputError

    if examples is not None and (type(examples) is bool or not isinstance(examples, int)):
        raise InputError(f"examples: expected an integer or None, not {type(examples).__name__}")
    if examples is not None and examples < 0:
        raise InputError(f"examples: expected 0 (every one) or more, not {examples}")
    result: DiffResult = diff_traces(align(as_trace(a), as_trace(b)), examples=examples or None)
    return result


__all__ = ["diff", "open"]
