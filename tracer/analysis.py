"""Whole-trace analyses beside the diff: per-request acceptance, acceptance along the
sequence, and a diff's differing blocks per request pair.

Headless (numpy only) and vectorised over the block columns; ``spectrace view`` shows them
(in its background analysis) and any CLI report may print them. Acceptance uses the same
"drafts checked" count as :mod:`spectrace.tracer.metrics` (:func:`index.checked_counts`).
"""

from __future__ import annotations

import numpy as np

from .align import Alignment
from .index import checked_counts
from .store import Trace


def per_request_acceptance(t: Trace) -> dict[str, list[int]]:
    """Blocks, accepted drafts and checked drafts of every request row.

    Returns:
        ``{"blocks", "accepted", "checked"}``: lists of int, one per request row of ``t``
        (blocks whose accepted count is unknown (-1) add to ``blocks`` only).
    """
    b = t.blocks
    n = len(t.requests)
    req = b.request.astype(np.int64)
    acc = b.accepted.astype(np.int64)
    checked = checked_counts(t)
    known = acc >= 0
    return {
        "blocks": np.bincount(req, minlength=n).tolist(),
        "accepted": np.bincount(req[known], weights=acc[known], minlength=n)
        .astype(np.int64)
        .tolist(),
        "checked": np.bincount(req[known], weights=np.maximum(checked[known], 0), minlength=n)
        .astype(np.int64)
        .tolist(),
    }


def acceptance_along(t: Trace, buckets: int = 96) -> dict:
    """Acceptance rate by anchor-position bucket (where along the sequence it collapses).

    Args:
        t: the trace; buckets: about how many equal-width position buckets.
    Returns:
        ``{"width": tokens per bucket, "rate": [accepted / checked or None per bucket],
        "blocks": [blocks with a known accepted count per bucket]}``.
    """
    b = t.blocks
    pos = b.position.astype(np.int64)
    acc = b.accepted.astype(np.int64)
    checked = checked_counts(t)
    known = acc >= 0
    top = int(pos.max(initial=0)) + 1
    width = max(1, -(-top // buckets))
    bk = pos[known] // width
    nb = int(bk.max(initial=-1)) + 1
    a = np.bincount(bk, weights=acc[known], minlength=nb)
    c = np.bincount(bk, weights=np.maximum(checked[known], 0), minlength=nb)
    cnt = np.bincount(bk, minlength=nb)
    rate = [float(x / y) if y else None for x, y in zip(a, c)]
    return {"width": width, "rate": rate, "blocks": cnt.tolist()}


def differing_per_pair(al: Alignment, bad: np.ndarray) -> list[dict]:
    """A diff's differing blocks counted per matched request pair.

    Args:
        al: the alignment; bad: bool [P] per paired block (``DiffResult.bad``).
    Returns:
        One dict per pair (order of ``al.req_a``): ``bad`` (differing paired blocks),
        ``paired`` (paired blocks), ``first_bad`` (anchor position of the first differing
        block, tokens, or None).
    """
    ia = al.ia
    pair = al.pair_of_block_a[ia]
    m = al.pairs
    nbad = np.bincount(pair[bad], minlength=m)
    npaired = np.bincount(pair, minlength=m)
    first_bad: list[int | None] = [None] * m
    bp = pair[bad]
    if len(bp):
        u, first = np.unique(bp, return_index=True)  # al.ia is sorted by (pair, position)
        positions = al.a.blocks.position[ia[bad]][first]
        for p, x in zip(u.tolist(), positions.tolist()):
            first_bad[p] = int(x)
    return [
        {"bad": int(nbad[p]), "paired": int(npaired[p]), "first_bad": first_bad[p]}
        for p in range(m)
    ]
