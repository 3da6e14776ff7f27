"""Writing the ragged (vlen) request columns a run of rows at a time.

h5py costs about 0.2 ms per call: one call per request and column was most of a vLLM
capture's writer time (three per request), so rows are written per run of consecutive rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import h5py
import numpy as np


def row_runs(idx: list[int]) -> list[tuple[int, int]]:
    """Sorted row indexes as ``[(lo, hi), ...]`` runs of consecutive rows (hi exclusive)."""
    starts = [i for j, i in enumerate(idx) if j == 0 or idx[j - 1] != i - 1]
    ends = [i + 1 for j, i in enumerate(idx) if j == len(idx) - 1 or idx[j + 1] != i + 1]
    return list(zip(starts, ends))


def write_ragged(ds: h5py.Dataset, rows: dict[int, Sequence[int]]) -> None:
    """Write int32 id lists into vlen dataset ``ds``: ``rows`` maps a row index to its ids.

    One ``write_direct`` per run of consecutive rows (``ds[a:b] = arr`` would stack an object
    array of equal-length rows into a matrix and be refused).
    """
    for a, b in row_runs(sorted(rows)):
        ids = np.empty(b - a, dtype=object)
        for j in range(a, b):
            ids[j - a] = np.asarray(rows[j], dtype=np.int32)
        ds.write_direct(ids, dest_sel=np.s_[a:b])


def finished_runs(requests: list[list], rows: set[int]) -> list[tuple[int, int]]:
    """:func:`row_runs` of ``rows`` bridged across rows of ``requests`` (the writer's
    ``[req_id, prompt, output, finish_reason]`` lists) whose output and finish reason are
    still empty (rewritten, they read the same): requests finishing in any order cost one
    write per column, not one per request (h5py costs about 0.2 ms a call)."""
    out: list[tuple[int, int]] = []
    for lo, hi in row_runs(sorted(rows)):
        if out and not any(requests[i][2] or requests[i][3] for i in range(out[-1][1], lo)):
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


#: The /requests columns in the order of the writer's request rows ``[req_id, prompt ids,
#: output ids, finish reason]``.
REQUEST_FIELDS = ("req_id", "prompt_ids", "output_ids", "finish_reason")


def write_request_rows(g, requests: list[list], lo: int, hi: int, old: int,
                       fields: Sequence[str]) -> None:  # fmt: skip
    """Write rows ``lo:hi`` of ``requests`` (the writer's ``[req_id, prompt, output,
    finish_reason]`` lists) into the /requests columns ``fields`` (``g``: column name ->
    dataset): strings in one write each, ragged ids only where there are some for rows
    from ``old`` on (new rows read as empty)."""
    rows = requests[lo:hi]
    for name in fields:
        col = REQUEST_FIELDS.index(name)
        if name in ("req_id", "finish_reason"):
            g[name][lo:hi] = np.array([r[col] for r in rows], dtype=object)
        else:
            write_ragged(g[name], {i: r[col] for i, r in enumerate(rows, lo) if r[col] or i < old})
