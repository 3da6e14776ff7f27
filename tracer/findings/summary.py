"""``spectrace info``'s and ``check``'s figures with impossible values explained: the
blocks of the impossible_values finding are left out of the acceptance figures (as the diff
does), and the finding itself goes with the figures, so no rate outside [0, 1] and no
left-out block is ever shown without the line that explains it.
"""

from __future__ import annotations

# A module import: ``info``'s figures are metrics.trace_summary, looked up at call time.
import spectrace.tracer.metrics as metrics

from ..store import Trace
from .data import SideInput, TraceData
from .model import Side
from .values import impossible, impossible_rows


def explained_summary(t: Trace, side: Side = "trace") -> dict:
    """:func:`~spectrace.tracer.metrics.trace_summary` of ``t`` without the blocks that hold
    impossible values, plus ``impossible_values``: that finding as JSON (its message names
    the first block and says they were left out), or None when every value is possible.

    Returns:
        The summary dict (``left_out_blocks`` counts the blocks left out).
    """
    td = TraceData.build(t, side)
    found = impossible(SideInput(td=td))
    summary = metrics.trace_summary(t, impossible_rows(td) if found is not None else None)
    summary["impossible_values"] = None if found is None else found.to_json()
    return summary
