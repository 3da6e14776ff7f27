"""The trace a notebook holds: blocks and requests as Arrow tables or pandas DataFrames.

Columns and types are those of ``spectrace export`` (:mod:`spectrace.tracer.export`), so a
DataFrame here and the Parquet files of an export are the same table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from spectrace.tracer import export
from spectrace.tracer.errors import InputError
from spectrace.tracer.store import Trace, TraceSpec, open_trace

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa


class TraceTables:
    """An open trace with table views.

    Attributes:
        trace: the :class:`spectrace.tracer.store.Trace` reader (numpy columns).
        run: the run name the tables carry.
    """

    def __init__(self, trace: Trace, run: str | None = None) -> None:
        """Raises InputError: ``run`` is not None and not a run name ``spectrace export``
        takes (:func:`spectrace.tracer.export.check_run_names`)."""
        _check_run(run)
        self.trace = trace
        self.run = run or export.run_name(trace)

    def _open(self) -> Trace:
        """The reader, refused once closed (its columns would read as IndexError)."""
        return as_trace(self.trace)

    @classmethod
    def open(cls, spec: TraceSpec, *, run: str | None = None) -> TraceTables:
        """Open ``spec`` (see :func:`spectrace.open`); ``run`` is checked first."""
        _check_run(run)
        return cls(open_trace(spec), run)

    @property
    def meta(self) -> dict:
        """The first file's /meta document (kept after close)."""
        return self.trace.meta

    def __len__(self) -> int:
        return len(self._open().blocks)

    def blocks(self) -> dict[str, object]:
        """The blocks table as name -> numpy array (one value per block), a list (the string
        columns ``run``, ``req_id``) or, for the id and margin lists (``proposed``,
        ``verified``, ``emitted``, ``draft_margin``), :class:`spectrace.tracer.export.Ragged`
        (row i is ``values[offsets[i]:offsets[i + 1]]``, null where ``valid`` is False); no
        pandas/pyarrow needed."""
        return export.block_columns(self._open(), self.run)

    def requests(self) -> dict[str, object]:
        """The requests table as name -> numpy array (``rank``, ``request``) or list (the
        strings, and ``prompt_ids``/``output_ids``: one token-id sequence per request)."""
        return export.request_columns(self._open(), self.run)

    def blocks_arrow(self) -> pa.Table:
        """The blocks table (schema :func:`spectrace.tracer.export.arrow_schema`)."""
        return export.to_arrow(self.blocks(), "blocks")

    def requests_arrow(self) -> pa.Table:
        """The requests table as a pyarrow Table."""
        return export.to_arrow(self.requests(), "requests")

    def blocks_df(self) -> pd.DataFrame:
        """The blocks table as a pandas DataFrame (list columns hold Python lists)."""
        export.require("pandas")
        return self.blocks_arrow().to_pandas()

    def requests_df(self) -> pd.DataFrame:
        """The requests table as a pandas DataFrame."""
        export.require("pandas")
        return self.requests_arrow().to_pandas()

    def info(self) -> dict:
        """What ``spectrace info --format json`` prints (metadata, acceptance figures; blocks
        with impossible values left out of them, named by ``impossible_values``)."""
        from spectrace.tracer.findings.summary import explained_summary

        return explained_summary(self._open())

    def close(self) -> None:
        """Close the trace's HDF5 files."""
        self.trace.close()

    def __enter__(self) -> TraceTables:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_run(run: object) -> None:
    if run is not None:
        if not isinstance(run, str):
            raise InputError(f"run={run!r}: a run name is a string, e.g. run='ours'")
        export.check_run_names([run])


def as_trace(x: TraceSpec | TraceTables | Trace) -> Trace:
    """The reader of ``x``: an opened :class:`TraceTables` or :class:`Trace`, or a spec.

    Raises:
        InputError: ``x`` is a trace already closed (its blocks can no longer be read).
    """
    if not isinstance(x, TraceTables | Trace):
        return open_trace(x)
    t = x.trace if isinstance(x, TraceTables) else x
    if t.closed:
        raise InputError(f"{', '.join(map(str, t.paths))}: the trace is closed; open it again")
    return t
