"""Many rows at once into a :class:`~.writer.TraceWriter`'s buffers (importers): the same
rows, in the same order, as one :meth:`~.writer.TraceWriter.add_phase` /
:meth:`~.writer.TraceWriter.request` call per row, without a Python call per row."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .writer import TraceWriter


def add_phases(
    writer: TraceWriter,
    step: np.ndarray,
    labels: Sequence[str],
    label: np.ndarray,
    ms: np.ndarray,
    level: np.ndarray,
) -> None:
    """Record n per-step timings, as ``add_phase(step[i], labels[label[i]], ms[i], level[i])``
    for i in order (phase names are numbered in order of first use, as there).

    Args:
        step: engine step per row (int [n]); label: index into ``labels`` (int [n]);
        ms: milliseconds (float [n]); level: trace level (int [n]).
    """
    with writer._lock:
        names = writer._phase_names
        used, first = np.unique(np.asarray(label, np.int64), return_index=True)
        for k in used[np.argsort(first)].tolist():
            names.setdefault(labels[k], len(names))
        code = np.array([names.get(x, -1) for x in labels] or [0], np.int64)
        p = writer._phases
        p["step"].extend(np.asarray(step, np.int64).tolist())
        p["name"].extend(code[np.asarray(label, np.int64)].tolist())
        p["ms"].extend(np.asarray(ms, np.float64).tolist())
        p["level"].extend(np.asarray(level, np.int64).tolist())


def register_requests(writer: TraceWriter, req_ids: Sequence[str]) -> np.ndarray:
    """Row index of each request id (int64 [n]), registering the new ones in order, as
    ``writer.request(r)`` for each r (ids already registered keep their rows; every row
    is marked for the next flush, as there)."""
    with writer._lock:
        index = writer._req_index
        out = np.empty(len(req_ids), np.int64)
        for i, r in enumerate(req_ids):
            idx = index.get(r)
            if idx is None:
                idx = len(writer._requests)
                index[r] = idx
                writer._requests.append([r, [], [], ""])
            writer._dirty_requests.add(idx)
            out[i] = idx
        return out
