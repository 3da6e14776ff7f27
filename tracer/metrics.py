"""Acceptance metrics over block columns, recorded and recomputed from the emitted stream.

Conventions (vLLM's, stated in every report):

* acceptance rate = accepted drafts / verified drafts;
* mean acceptance length = 1 + accepted / verified blocks (the bonus token counts);
* per-position acceptance at slot i = share of blocks with accepted > i (a survival curve,
  as ``vllm:spec_decode_num_accepted_tokens_per_pos`` / ``num_drafts``), not conditional.

Everything is vectorised over block columns, in chunks of :data:`CHUNK` rows (and shares of
chunks on :data:`WORKERS` threads where a pass is long).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

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
    parts, length = [], np.zeros(len(r), np.int64)
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
    ids[:, :prop.shape[1]] = prop
    if has_v.any():
        ids[has_v] = -1
        ids[has_v, :ver.shape[1]] = ver[has_v]
    n = np.where(has_v, nv, b.k.astype(np.int64))
    return ids, n


def recompute_accepted(trace: Trace) -> np.ndarray:
    """Accepted drafts recomputed from the output: the longest draft prefix the output took.

    For block b of request r at anchor position p with checked drafts d[0..n), the count is
    the largest m with ``d[j] == full_r[p+1+j]`` for all j < m. Exact under greedy decoding;
    the last block of a request may undercount (output trimmed at max_tokens). Blocks
    without a verify record (neither verified ids nor an accepted count) get -1.
    Mirrors the parity gate of our engine's ``test_qwen38_dflash2_spec_decode.cpp``.

    Returns:
        int16 [blocks]; -1 where the request's output ids are unknown.
    """
    return memo(trace, "recompute_accepted", lambda: _recompute_accepted(trace))


#: Threads for :func:`in_parallel` (the cores we may use).
WORKERS = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                     else (os.cpu_count() or 1)))

#: Rows per chunk of the block-wise loops: temporaries of a few MB stay in cache and are
#: reused by the allocator, where whole-column temporaries (tens of MB) cost page faults.
CHUNK = 1 << 18


def in_parallel(calls: list):
    """Run zero-argument callables on a small thread pool; returns their results in order.

    numpy releases the GIL inside its loops, so the two sides of a diff (or two halves of a
    pass) use both cores of a 2-core machine. h5py reads hold the GIL: read first, then
    compute here.
    """
    if len(calls) <= 1:
        return [c() for c in calls]
    with ThreadPoolExecutor(max_workers=min(len(calls), WORKERS)) as pool:
        return list(pool.map(lambda c: c(), calls))


def each_chunk(n: int, fn) -> list:
    """Call ``fn(list_of_slices)`` on :data:`WORKERS` interleaved shares of ``chunks(n)``, in
    parallel; ``fn`` writes its rows in place and may return a partial result (listed)."""
    cs = list(chunks(n))
    shares = [cs[i::WORKERS] for i in range(min(WORKERS, max(len(cs), 1)))]
    return in_parallel([lambda share=share: fn(share) for share in shares])


def chunks(n: int, size: int = CHUNK):
    """Slices covering ``range(n)`` in steps of ``size`` rows."""
    return (slice(i, min(i + size, n)) for i in range(0, n, size))


def _recompute_accepted(trace: Trace) -> np.ndarray:
    b = trace.blocks
    flat, start, length = sequence_index(trace)
    ids, n = drafts_checked(trace)
    out = np.zeros(len(b), np.int16)
    req_all, pos_all = b.request, b.position

    def part(cs: list[slice]) -> None:
        for c in cs:
            req, first = req_all[c], pos_all[c].astype(np.int64) + 1  # first target position
            room = np.minimum(n[c], length[req] - first)                 # checkable slots
            base = start[req] + first
            o = out[c]
            # Slot by slot over the blocks still matching: the work shrinks with the
            # acceptance survival curve instead of touching all [n, w] cells.
            alive = np.flatnonzero((room > 0) & (first >= 0))
            idc = ids[c]
            for j in range(ids.shape[1]):
                if not len(alive):
                    break
                alive = alive[flat[base[alive] + j] == idc[alive, j]]
                o[alive] = j + 1
                alive = alive[room[alive] > j + 1]
            o[length[req] == 0] = -1

    each_chunk(len(out), part)
    out[(b.num_verified < 0) & (b.accepted < 0)] = -1  # never verified: nothing accepted
    return out


def acceptance_counts(accepted: np.ndarray, verified: np.ndarray,
                      group: np.ndarray | None = None,
                      groups: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Per group, blocks per accepted count and verified drafts of known blocks (chunked).

    Args:
        accepted: int [blocks] accepted drafts (negative: unknown, left out).
        verified: int [blocks] drafts verified per block (tokens; negative counts as 0).
        group: int [blocks] in ``0..groups-1`` (e.g. a bool mask), or None for one group.
    Returns:
        ``(by_accepted, verified_tokens)``: int64 [groups, A + 1] blocks with accepted = a
        (A the largest accepted count), int64 [groups] verified drafts of those blocks.
    """
    A = max(int(accepted.max(initial=0)), 0) + 1
    by_acc = np.zeros(groups * A, np.int64)
    ver = np.zeros(groups, np.int64)
    for c in chunks(len(accepted)):
        acc, known = accepted[c], accepted[c] >= 0
        g = np.zeros(len(acc), np.int64) if group is None else group[c].astype(np.int64)
        by_acc += np.bincount((g * A + acc)[known], minlength=len(by_acc))
        v = np.maximum(verified[c], 0)[known]
        ver += np.bincount(g[known], weights=v, minlength=groups).astype(np.int64)
    return by_acc.reshape(groups, A), ver


def acceptance_from_counts(by_accepted: np.ndarray, verified_tokens: int, kmax: int) -> dict:
    """:func:`acceptance` figures of one group of :func:`acceptance_counts`."""
    nblk = int(by_accepted.sum())
    tot_acc = int((np.arange(len(by_accepted)) * by_accepted).sum())
    tot_ver = int(verified_tokens)
    # Survival curve: blocks with accepted > i = total - blocks with accepted <= i.
    cum = np.cumsum(by_accepted)
    above = [nblk - int(cum[min(i, len(cum) - 1)]) for i in range(kmax)]
    return {
        "blocks": nblk,
        "verified_tokens": tot_ver,
        "accepted_tokens": tot_acc,
        "acceptance_rate": tot_acc / tot_ver if tot_ver else None,
        "mean_acceptance_length": 1 + tot_acc / nblk if nblk else None,
        "per_position": [(float(x / nblk) if nblk else None) for x in above],
    }


def acceptance(accepted: np.ndarray, verified: np.ndarray, kmax: int | None = None) -> dict:
    """Acceptance figures of a set of blocks.

    Args:
        accepted: int [blocks] accepted drafts; blocks with -1 (unknown) are left out.
        verified: int [blocks] drafts verified per block (tokens).
        kmax: slots for the per-position curve (default: max verified of known blocks).
    Returns:
        dict with ``blocks``, ``verified_tokens``, ``accepted_tokens``, ``acceptance_rate``
        (accepted/verified or None), ``mean_acceptance_length`` (1 + accepted/blocks or
        None) and ``per_position`` (list of kmax shares of blocks with accepted > i).
    """
    if kmax is None:
        kmax = int(np.maximum(verified[accepted >= 0], 0).max(initial=0))
    by_acc, ver = acceptance_counts(accepted, verified)
    return acceptance_from_counts(by_acc[0], ver[0], int(kmax))


CONVENTIONS = ("acceptance rate = accepted/verified drafts; mean acceptance length = "
               "1 + accepted/verified blocks (bonus token counted); per-position acceptance at "
               "slot i = share of verified blocks with accepted > i")


def trace_summary(trace: Trace) -> dict:
    """Everything ``spectrace info`` shows: metadata and acceptance figures of one trace.

    Returns:
        A JSON-serialisable dict: ``files``, ``status``, ``format_version`` (the files'
        trace format versions), ``warnings``, ``meta``, ``requests``,
        ``blocks``, ``proposed_tokens``, ``verified_tokens``, ``unverified_blocks``,
        ``recorded`` and ``recomputed`` (see :func:`acceptance`), ``phases_ms`` (median ms
        per phase name), ``conventions``.
    """
    b = trace.blocks
    _, checked = drafts_checked(trace)
    k = b.k.astype(np.int64)
    kmax = int(k.max()) if len(k) else 0
    unverified = int(((b.num_verified < 0) & (b.accepted < 0)).sum())
    recomputed = recompute_accepted(trace)
    phases = trace.phases()
    phase_ms = {}
    for name in dict.fromkeys(phases["name"].tolist()):
        phase_ms[name] = float(np.median(phases["ms"][phases["name"] == name]))
    return {
        "files": [str(p) for p in trace.paths],
        "status": trace.status,
        "format_version": sorted(set(trace.formats)),
        "warnings": list(trace.warnings),
        "meta": trace.meta,
        "requests": len(trace.requests),
        "blocks": len(b),
        "proposed_tokens": int(k.sum()),
        "verified_tokens": int(np.maximum(b.num_verified, 0).sum()),
        "unverified_blocks": unverified,
        "recorded": acceptance(b.accepted, checked, kmax),
        "recomputed": acceptance(recomputed, checked, kmax),
        "phases_ms": phase_ms,
        "conventions": CONVENTIONS,
    }
