"""Acceptance metrics over block columns, recorded and recomputed from the emitted stream.

Conventions (vLLM's, stated in every report):

* acceptance rate = accepted drafts / verified drafts;
* mean acceptance length = 1 + accepted / blocks (the bonus token counts);
* per-position acceptance at slot i = share of blocks with accepted > i (a survival curve,
  as ``vllm:spec_decode_num_accepted_tokens_per_pos`` / ``num_drafts``), not conditional.

Everything is vectorised over whole columns.
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
    seqs = [np.concatenate([p, o]) if len(o) else np.zeros(0, np.int32)
            for p, o in zip(r.prompt_ids, r.output_ids)]
    length = np.array([len(s) for s in seqs], dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(length)[:-1]]).astype(np.int64) if len(seqs) else \
        np.zeros(0, np.int64)
    flat = np.concatenate(seqs).astype(np.int32) if seqs else np.zeros(0, np.int32)
    return flat, start, length


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


def leading_true(match: np.ndarray) -> np.ndarray:
    """Length of the leading run of True per row of a bool [n, w] matrix (int64 [n])."""
    if match.shape[1] == 0:
        return np.zeros(len(match), np.int64)
    first_false = np.argmin(match, axis=1)
    return np.where(match[np.arange(len(match)), first_false], match.shape[1], first_false)


def _recompute_accepted(trace: Trace) -> np.ndarray:
    b = trace.blocks
    flat, start, length = sequence_index(trace)
    ids, n = drafts_checked(trace)
    req = b.request.astype(np.int64)
    if len(req) == 0:
        return np.zeros(0, np.int16)
    w = ids.shape[1]
    first = b.position.astype(np.int64) + 1                           # first target position
    room = np.minimum(n, length[req] - first)                         # checkable slots
    # Row i of the window view is flat[i : i + w]: one contiguous copy per block.
    padded = np.concatenate([flat, np.full(w, -2, np.int32)])
    windows = np.lib.stride_tricks.sliding_window_view(padded, w)
    base = np.clip(start[req] + first, 0, len(padded) - w)
    got = windows[base]
    got[np.arange(w) >= room[:, None]] = -2  # never equal to a draft id or the -1 pad
    out = leading_true(got == ids).astype(np.int16)
    out[length[req] == 0] = -1
    out[(b.num_verified < 0) & (b.accepted < 0)] = -1  # never verified: nothing accepted
    return out


def acceptance(accepted: np.ndarray, verified: np.ndarray, kmax: int | None = None) -> dict:
    """Acceptance figures of a set of blocks.

    Args:
        accepted: int [blocks] accepted drafts; blocks with -1 (unknown) are left out.
        verified: int [blocks] drafts verified per block (tokens).
        kmax: slots for the per-position curve (default: max verified).
    Returns:
        dict with ``blocks``, ``verified_tokens``, ``accepted_tokens``, ``acceptance_rate``
        (accepted/verified or None), ``mean_acceptance_length`` (1 + accepted/blocks or
        None) and ``per_position`` (list of kmax shares of blocks with accepted > i).
    """
    known = accepted >= 0
    acc = accepted[known].astype(np.int64)
    ver = np.maximum(verified[known].astype(np.int64), 0)
    nblk = int(known.sum())
    kmax = int(kmax if kmax is not None else (ver.max() if len(ver) else 0))
    # Survival curve in one pass: blocks with accepted > i = total - blocks with accepted <= i.
    counts = np.bincount(acc, minlength=kmax + 1) if nblk else np.zeros(kmax + 1, np.int64)
    above = nblk - np.cumsum(counts)[:kmax]
    per_pos = [(float(x / nblk) if nblk else None) for x in above]
    tot_acc, tot_ver = int(acc.sum()), int(ver.sum())
    return {
        "blocks": nblk,
        "verified_tokens": tot_ver,
        "accepted_tokens": tot_acc,
        "acceptance_rate": tot_acc / tot_ver if tot_ver else None,
        "mean_acceptance_length": 1 + tot_acc / nblk if nblk else None,
        "per_position": per_pos,
    }


CONVENTIONS = ("acceptance rate = accepted/verified drafts; mean acceptance length = "
               "1 + accepted/verified blocks (bonus token counted); per-position acceptance at "
               "slot i = share of verified blocks with accepted > i")


def trace_summary(trace: Trace) -> dict:
    """Everything ``spectrace info`` shows: metadata and acceptance figures of one trace.

    Returns:
        A JSON-serialisable dict: ``files``, ``status``, ``warnings``, ``meta``, ``requests``,
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
