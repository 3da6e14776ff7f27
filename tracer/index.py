"""Memoised per-trace indexes shared by alignment, metrics and the detectors.

Each is computed once per open :class:`~spectrace.tracer.store.Trace` and kept in
``trace.cache`` (see :func:`memo`): the concatenated full sequences, the (request, position)
block order, and the draft ids each block's acceptance was checked against.
"""

from __future__ import annotations

import numpy as np

from .store import Trace


def memo(trace: Trace, key: str, fn):
    """Compute a derived value of ``trace`` once: ``fn()`` is cached in ``trace.cache``."""
    if key not in trace.cache:
        trace.cache[key] = fn()
    return trace.cache[key]


def sequence_index(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Concatenate every request's prompt + output ids for vectorised gathers.

    Returns:
        ``(flat, start, length)``: flat int32 [total] ids; start, length int64 [requests]
        (tokens). A request with unknown output ids has length 0.
    """
    return memo(trace, "sequence_index", lambda: _sequence_index(trace))


def _sequence_index(trace: Trace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r = trace.requests
    # One concatenate over [prompt0, output0, prompt1, ...]; unknown outputs contribute nothing.
    parts: list[np.ndarray] = []
    length = np.zeros(len(r), np.int64)
    for i, (p, o) in enumerate(zip(r.prompt_ids, r.output_ids)):
        if len(o):
            parts += (p, o)
            length[i] = len(p) + len(o)
    start = np.zeros(len(r), np.int64)
    np.cumsum(length[:-1], out=start[1:])
    flat = np.concatenate(parts).astype(np.int32, copy=False) if parts else np.zeros(0, np.int32)
    return flat, start, length


def block_order(trace: Trace) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Blocks sorted by (request, position), ties in record order (memoised).

    Returns:
        ``(order, keys, stride, pmin)``: order int64 [blocks] block indices; keys int64
        [blocks] the sorted keys ``request * stride + position - pmin``, so that
        ``np.searchsorted(keys, key)`` finds a (request, position) in O(log n).
    """
    return memo(trace, "block_order", lambda: _block_order(trace))


def _block_order(trace: Trace) -> tuple[np.ndarray, np.ndarray, int, int]:
    b = trace.blocks
    pos = b.position
    pmin, pmax = (int(pos.min()), int(pos.max())) if len(pos) else (0, 0)
    stride = pmax - pmin + 1
    key = b.request.astype(np.int64) * stride
    key += pos
    key -= pmin
    order = np.argsort(key, kind="stable")
    return order, key[order], stride, pmin


def drafts_checked(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """The drafts the target checked per block: verified ids where recorded, else proposed.

    Returns:
        ``(ids, n)``: ids int32 [blocks, kmax] (-1 padded), n int64 [blocks] (tokens).
    """
    return memo(trace, "drafts_checked", lambda: _drafts_checked(trace))


def _drafts_checked(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    b = trace.blocks
    nv = b.num_verified.astype(np.int64)
    has_v = nv >= 0
    prop, ver = b.proposed, b.verified
    if has_v.all():  # the common cases need no copy
        return ver, nv
    if not has_v.any():
        return prop, b.k.astype(np.int64)
    w = max(prop.shape[1], ver.shape[1])
    ids = np.full((len(nv), w), -1, np.int32)
    ids[:, : prop.shape[1]] = prop
    if has_v.any():
        ids[has_v] = -1
        ids[has_v, : ver.shape[1]] = ver[has_v]
    n = np.where(has_v, nv, b.k.astype(np.int64))
    return ids, n
