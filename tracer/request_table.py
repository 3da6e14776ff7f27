"""Per-request figures of a diff (``spectrace diff --by-request``): one
:class:`~spectrace.tracer.diff_result.RequestRow` per matched request pair.

Every comparison is the kernel's (:func:`~spectrace.tracer.diff.compare_alignment`) and every
acceptance count :func:`~spectrace.tracer.metrics.acceptance_counts`'s, grouped by pair.
"""

from __future__ import annotations

import numpy as np

from .align import Alignment
from .compare import NO_DIVERGENCE
from .diff import compare_alignment
from .diff_result import DiffResult, RequestRow
from .findings import TraceData
from .findings.model import Side, tok
from .findings.values import impossible_rows
from .index import checked_counts
from .metrics import acceptance_counts
from .rows import gather
from .store import Trace
from .tokens import Decoder


def _rates(t: Trace, side: Side, pair_of_block: np.ndarray, comparable: np.ndarray, m: int) -> list:
    """Recorded acceptance rate per request pair (m) of ``t``'s blocks on matched content;
    blocks with impossible values are left out, as in the diff's acceptance figures."""
    checked = checked_counts(t)
    group = np.where(comparable & (pair_of_block >= 0), pair_of_block + 1, 0)
    accepted = np.where(impossible_rows(TraceData.build(t, side)), -1, t.blocks.accepted)
    by_acc, ver = acceptance_counts(accepted, checked, group, m + 1)
    acc = (by_acc * np.arange(by_acc.shape[1])).sum(axis=1)
    return [float(acc[g] / ver[g]) if ver[g] else None for g in range(1, m + 1)]


def request_rows(al: Alignment, r: DiffResult, decoder: Decoder | None = None) -> list[RequestRow]:
    """One row per matched request pair of ``al`` (in pair order).

    Args:
        al: the (possibly narrowed) alignment ``r`` was computed from.
        r: its diff result (for the error findings' locations).
        decoder: decodes the first divergent block's proposals, or None (ids).
    Returns:
        :class:`RequestRow` per pair: paired and exact block counts, the first divergent
        block, the first error finding's kind, and acceptance rates of both sides (None
        where a side verified nothing).
    """
    m = al.pairs
    pc = r.paired if r.paired is not None and len(r.paired.ka) == len(al.ia) else None
    pc = pc if pc is not None else compare_alignment(al)
    pair = al.pair_of_block_a[al.ia].astype(np.int64)
    paired = np.bincount(pair, minlength=m)
    exact = np.bincount(pair, weights=pc.blocks.exact, minlength=m).astype(np.int64)
    div = np.flatnonzero(pc.blocks.divergent)
    first_div = dict(zip(*(x.tolist() for x in np.unique(pair[div], return_index=True))))
    rates_a = _rates(al.a, "ours", al.pair_of_block_a, al.comparable_a, m)
    rates_b = _rates(al.b, "theirs", al.pair_of_block_b, al.comparable_b, m)
    errors = [f for f in r.findings if f.severity == "error" and f.request is not None]
    # The proposals of each pair's first divergent block only (a few rows, not [P, w]).
    xs = np.array([div[first_div[p]] for p in range(m) if p in first_div], np.int64)
    got_a, got_b = gather(al.a, "proposed", al.ia[xs]), gather(al.b, "proposed", al.ib[xs])
    at = {int(x): e for e, x in enumerate(xs.tolist())}
    rows = []
    for p in range(m):
        ida, idb = al.a.requests.req_id[al.req_a[p]], al.b.requests.req_id[al.req_b[p]]
        first = next((f.kind for f in errors if f.request in (ida, idb)), None)
        d = int(al.divergence[p])
        x = int(div[first_div[p]]) if p in first_div else None
        i = int(al.ia[x]) if x is not None else -1
        slot = int(pc.blocks.first_slot[x]) if x is not None else -1
        rows.append(
            RequestRow(
                ours_req=ida,
                theirs_req=idb,
                paired_blocks=int(paired[p]),
                exact_matches=int(exact[p]),
                exact_match_rate=float(exact[p] / paired[p]) if paired[p] else None,
                content_divergence=None if d == NO_DIVERGENCE else d,
                first_divergent_position=None if x is None else int(al.a.blocks.position[i]),
                first_divergent_slot=slot if slot >= 0 else None,
                ours=[] if x is None else tok(decoder, got_a[at[x], : pc.ka[x]]),
                theirs=[] if x is None else tok(decoder, got_b[at[x], : pc.kb[x]]),
                first_error=first,
                acceptance_ours=rates_a[p],
                acceptance_theirs=rates_b[p],
            )
        )
    return rows
