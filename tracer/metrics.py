"""Acceptance metrics over block columns, recorded and recomputed from the emitted stream.

Conventions (vLLM's, stated in every report):

* acceptance rate = accepted drafts / verified drafts;
* mean acceptance length = 1 + accepted / verified blocks (the bonus token counts);
* per-position acceptance at slot i = share of blocks with accepted > i (a survival curve,
  as ``vllm:spec_decode_num_accepted_tokens_per_pos`` / ``num_drafts``), not conditional.

Everything is vectorised over block columns, in chunks (see :mod:`spectrace.tracer.parallel`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import numpy as np

from .index import checked_counts, checked_ids, memo, sequence_index
from .parallel import chunks, each_chunk
from .rows import row_chunks
from .store import Trace
from .typed_json import Constraint, to_json

#: A count (blocks, tokens, requests): a non-negative int.
Count = Annotated[int, Constraint(minimum=0)]
#: A share in 0..1, None (JSON null) where nothing was counted.
Rate = Annotated[float | None, Constraint(minimum=0, maximum=1)]


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


def _recompute_accepted(trace: Trace) -> np.ndarray:
    b = trace.blocks
    out = np.zeros(len(b), np.int16)
    n = checked_counts(trace)
    for c, cols in row_chunks(trace, ("proposed", "verified")):
        ids = checked_ids(cols["proposed"], cols["verified"], b.num_verified[c])
        recompute_rows(trace, c, ids, n[c], out[c])
    out[(b.num_verified < 0) & (b.accepted < 0)] = -1  # never verified: nothing accepted
    return out


def recompute_rows(trace: Trace, c: slice, ids: np.ndarray, n: np.ndarray, out: np.ndarray) -> None:
    """:func:`recompute_accepted` of block rows ``c`` (before the never-verified rule), in
    place, on worker threads.

    Args:
        c: the block rows; ids: int32 [rows, w] their checked drafts
            (:func:`~spectrace.tracer.index.checked_ids`); n: int [rows] their counts;
        out: int16 [rows], written (a view of the whole result).
    """
    b = trace.blocks
    flat, start, length = sequence_index(trace)
    req_all, pos_all = b.request[c], b.position[c]
    last = len(flat) - 1

    def part(cs: list[slice]) -> None:
        """Fill ``out`` for the slices ``cs`` of these rows."""
        for s in cs:
            req, first = req_all[s], pos_all[s].astype(np.int64) + 1  # first target position
            room = np.minimum(n[s], length[req] - first)  # checkable slots
            alive = (room > 0) & (first >= 0)
            base = np.where(alive, start[req] + first, 0)
            o, idc, at = out[s], ids[s], np.empty(len(base), np.int64)
            o[:] = 0
            # Slot by slot over every row (1-D passes; faster than compacting the rows still
            # matching): o counts the leading slots the output took.
            for j in range(ids.shape[1]):
                alive &= room > j
                if not alive.any():
                    break
                np.minimum(np.add(base, j, out=at), last, out=at)  # in bounds where dead
                alive &= flat[at] == idc[:, j]
                o += alive
            o[length[req] == 0] = -1

    each_chunk(len(out), part)


def acceptance_counts(
    accepted: np.ndarray, verified: np.ndarray, group: np.ndarray | None = None, groups: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Per group, blocks per accepted count and verified drafts of known blocks (chunked).

    Args:
        accepted: int [blocks] accepted drafts (negative: unknown, left out).
        verified: int [blocks] drafts verified per block (tokens; negative counts as 0;
            blocks with 0 are left out: the target verified nothing there).
        group: int [blocks] in ``0..groups-1`` (e.g. a bool mask), or None for one group.
    Returns:
        ``(by_accepted, verified_tokens)``: int64 [groups, A + 1] blocks with accepted = a
        (A the largest accepted count), int64 [groups] verified drafts of those blocks.
    """
    A = max(int(accepted.max(initial=0)), 0) + 1
    by_acc = np.zeros(groups * A, np.int64)
    ver = np.zeros(groups, np.int64)
    for c in chunks(len(accepted)):
        # A block whose target checked no draft (k = 0, or every draft trimmed) is no
        # verified block: vLLM's num_drafts counts only requests with scheduled drafts
        # (v1/core/sched/scheduler.py update_from_output -> make_spec_decoding_stats).
        acc, known = accepted[c], (accepted[c] >= 0) & (verified[c] != 0)
        g = np.zeros(len(acc), np.int64) if group is None else group[c].astype(np.int64)
        by_acc += np.bincount((g * A + acc)[known], minlength=len(by_acc))
        v = np.maximum(verified[c], 0)[known]
        ver += np.bincount(g[known], weights=v, minlength=groups).astype(np.int64)
    return by_acc.reshape(groups, A), ver


@dataclass
class Acceptance:
    """Acceptance of a set of blocks; conventions in :data:`CONVENTIONS`.

    Attributes:
        blocks: verified blocks counted (accepted count known).
        verified_tokens: drafts verified in them.
        accepted_tokens: drafts accepted in them.
        acceptance_rate: accepted_tokens / verified_tokens, null when none verified.
        mean_acceptance_length: 1 + accepted_tokens / blocks (the bonus token counts),
            null when no block.
        per_position: per slot i, the share of the blocks with accepted > i.
    """

    blocks: Count
    verified_tokens: Count
    accepted_tokens: Count
    acceptance_rate: Rate
    mean_acceptance_length: Annotated[float | None, Constraint(minimum=1)]
    per_position: list[Rate]

    @classmethod
    def from_counts(cls, by_accepted: np.ndarray, verified_tokens: int, kmax: int) -> Acceptance:
        """The figures of one group of :func:`acceptance_counts` (int64 [A + 1] blocks per
        accepted count, verified drafts), with a ``kmax``-slot per-position curve."""
        nblk = int(by_accepted.sum())
        tot_acc = int((np.arange(len(by_accepted)) * by_accepted).sum())
        tot_ver = int(verified_tokens)
        # Survival curve: blocks with accepted > i = total - blocks with accepted <= i.
        cum = np.cumsum(by_accepted)
        above = [nblk - int(cum[min(i, len(cum) - 1)]) for i in range(kmax)]
        return cls(
            blocks=nblk,
            verified_tokens=tot_ver,
            accepted_tokens=tot_acc,
            acceptance_rate=tot_acc / tot_ver if tot_ver else None,
            mean_acceptance_length=1 + tot_acc / nblk if nblk else None,
            per_position=[(float(x / nblk) if nblk else None) for x in above],
        )


def acceptance_from_counts(by_accepted: np.ndarray, verified_tokens: int, kmax: int) -> dict:
    """:func:`acceptance` figures of one group of :func:`acceptance_counts`, as a dict
    (the keys of :class:`Acceptance`)."""
    return to_json(Acceptance.from_counts(by_accepted, verified_tokens, kmax))


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


CONVENTIONS = (
    "acceptance rate = accepted/verified drafts; mean acceptance length = "
    "1 + accepted/verified blocks (bonus token counted); per-position acceptance at "
    "slot i = share of verified blocks with accepted > i"
)


def trace_summary(trace: Trace, impossible: np.ndarray | None = None) -> dict:
    """Everything ``spectrace info`` shows: metadata and acceptance figures of one trace.

    Args:
        trace: the trace.
        impossible: bool [blocks], blocks holding values no engine produces (the
            impossible_values finding's rows), left out of the acceptance figures as unknown
            so no rate leaves [0, 1]; None: every block counts.
    Returns:
        A JSON-serialisable dict: ``files``, ``status``, ``format_version`` (the files'
        trace format versions), ``warnings``, ``meta``, ``requests``,
        ``blocks``, ``proposed_tokens``, ``verified_tokens``, ``unverified_blocks``,
        ``recorded`` and ``recomputed`` (see :func:`acceptance`), ``left_out_blocks``
        (blocks of ``impossible`` left out of them), ``phases_ms`` (median ms per phase
        name), ``conventions``.
    """
    b = trace.blocks
    checked = checked_counts(trace)
    k = b.k.astype(np.int64)
    kmax = int(k.max()) if len(k) else 0
    unverified = int(((b.num_verified < 0) & (b.accepted < 0)).sum())
    recorded, recomputed = b.accepted, recompute_accepted(trace)
    left_out = 0
    if impossible is not None and impossible.any():
        left_out = int(impossible.sum())
        recorded, recomputed = (np.where(impossible, -1, x) for x in (recorded, recomputed))
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
        "recorded": acceptance(recorded, checked, kmax),
        "recomputed": acceptance(recomputed, checked, kmax),
        "left_out_blocks": left_out,
        "phases_ms": phase_ms,
        "conventions": CONVENTIONS,
    }
