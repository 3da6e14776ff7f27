"""Memoised per-trace indexes shared by alignment, metrics and the detectors.

Each is computed once per open :class:`~spectrace.tracer.store.Trace` and kept in
``trace.cache`` (see :func:`memo`): the concatenated full sequences, the (request, position)
block order, and the draft ids each block's acceptance was checked against.
"""

from __future__ import annotations

import numpy as np

from .pages import trim_heap
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
    # One flat array over [prompt0, output0, prompt1, ...]; unknown outputs contribute nothing.
    length = np.zeros(len(r), np.int64)
    for i, (p, o) in enumerate(zip(r.prompt_ids, r.output_ids)):
        if len(o):
            length[i] = len(p) + len(o)
    start = np.zeros(len(r), np.int64)
    np.cumsum(length[:-1], out=start[1:])
    if not (isinstance(r.prompt_ids, list) and isinstance(r.output_ids, list)):
        return _concatenated(r, length), start, length
    flat = np.empty(int(length.sum()), np.int32)
    copied = 0
    for i in np.flatnonzero(length).tolist():
        p, o = r.prompt_ids[i], r.output_ids[i]
        s, m = int(start[i]), len(p)
        flat[s : s + m] = p
        flat[s + m : s + m + len(o)] = o
        if p.dtype == np.int32 and o.dtype == np.int32:
            # The request table's arrays become read-only views into flat (same values),
            # so that a trace holds its token ids once, not twice, even while it is built.
            r.prompt_ids[i], r.output_ids[i] = _view(flat, s, m), _view(flat, s + m, len(o))
            copied += m + len(o)
            if copied >= TRIM_EVERY:  # the freed rows are small heap blocks: hand them back
                trim_heap()
                copied = 0
    trim_heap()
    flat.flags.writeable = False  # shared with the request table: never written
    return flat, start, length


#: Token ids copied into the flat sequence index between two heap trims.
TRIM_EVERY = 1 << 22


def _view(flat: np.ndarray, s: int, n: int) -> np.ndarray:
    v = flat[s : s + n]
    v.flags.writeable = False
    return v


def _concatenated(r, length: np.ndarray) -> np.ndarray:
    """The flat ids of a request table whose columns are not lists (lazily read output ids:
    a :class:`~spectrace.tracer.store.columns.RaggedColumn`), which are left alone."""
    parts: list[np.ndarray] = []
    for i in np.flatnonzero(length).tolist():
        parts += (r.prompt_ids[i], r.output_ids[i])
    flat = np.concatenate(parts).astype(np.int32, copy=False) if parts else np.zeros(0, np.int32)
    flat.flags.writeable = False
    return flat


def block_order(trace: Trace) -> np.ndarray:
    """Blocks sorted by (request, position), ties in record order (memoised).

    Returns:
        order: block indices [blocks], int32 (int64 past 2**31 - 1 blocks).
    """
    return memo(trace, "block_order", lambda: _block_order(trace))


def _sort_key(trace: Trace) -> tuple[np.ndarray, int, int]:
    """``(key, stride, pmin)``: int64 [blocks] ``request * stride + position - pmin``."""
    b = trace.blocks
    pos = b.position
    pmin, pmax = (int(pos.min()), int(pos.max())) if len(pos) else (0, 0)
    stride = pmax - pmin + 1
    key = b.request.astype(np.int64) * stride
    key += pos
    key -= pmin
    return key, stride, pmin


def _block_order(trace: Trace) -> np.ndarray:
    order = np.argsort(_sort_key(trace)[0], kind="stable")
    return order.astype(np.int32) if len(order) < np.iinfo(np.int32).max else order


def block_keys(trace: Trace) -> tuple[np.ndarray, int, int]:
    """The sorted (request, position) keys of :func:`block_order` (computed per call, not
    kept: only alignment searches them).

    Returns:
        ``(keys, stride, pmin)``: keys int64 [blocks], ``keys[i]`` the key
        ``request * stride + position - pmin`` of block ``order[i]``, so that
        ``np.searchsorted(keys, key)`` finds a (request, position) in O(log n).
    """
    key, stride, pmin = _sort_key(trace)
    return key[block_order(trace)], stride, pmin


def checked_counts(trace: Trace) -> np.ndarray:
    """int16 [blocks]: how many drafts the target checked per block: ``num_verified`` where
    recorded, else k (the column itself, read-only, where every block has one; memoised)."""
    return memo(trace, "checked_counts", lambda: _checked_counts(trace))


def _checked_counts(trace: Trace) -> np.ndarray:
    return checked_of(trace.blocks.num_verified, trace.blocks.k)


def checked_of(nv: np.ndarray, k: np.ndarray) -> np.ndarray:
    """The drafts the target checked per block of some rows: ``nv`` (int16 [n]
    num_verified) where recorded (``>= 0``), else ``k`` (int16 [n]); one of the inputs
    itself where every row or none has a record (no copy)."""
    has_v = nv >= 0
    if has_v.all():
        return nv
    return k if not has_v.any() else np.where(has_v, nv, k)


def checked_ids(prop: np.ndarray, ver: np.ndarray, nv: np.ndarray) -> np.ndarray:
    """The checked drafts of some rows: ``ver`` where ``nv >= 0``, else ``prop``.

    Args:
        prop, ver: int32 [n, wp] / [n, wv] proposed and verified ids (-1 padded).
        nv: int [n] num_verified (-1: not recorded).
    Returns:
        int32 [n, max(wp, wv)] (-1 padded; ``ver`` or ``prop`` itself where every row or
        none has a verify record: no copy).
    """
    has_v = nv >= 0
    if has_v.all():  # the common cases need no copy
        return ver
    if not has_v.any():
        return prop
    w = max(prop.shape[1], ver.shape[1])
    ids = np.full((len(nv), w), -1, np.int32)
    ids[:, : prop.shape[1]] = prop
    ids[has_v] = -1
    ids[has_v, : ver.shape[1]] = ver[has_v]
    return ids
