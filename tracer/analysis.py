"""Whole-trace analyses beside the diff: per-request acceptance, acceptance along the
sequence, and a diff's differing blocks per request pair.

Headless (numpy only) and streamed: each pass reads :data:`CHUNK` block rows at a time
(:meth:`~spectrace.tracer.store.Trace.read_rows`, served from a column already loaded, else
from the file) in the columns' stored dtypes, so its memory is a few MB whatever the trace's
length, and it loads no column whole. ``spectrace view`` shows them (in its background
analysis) and any CLI report may print them. Acceptance uses the same "drafts checked" count
as :mod:`spectrace.tracer.metrics` (:func:`index.checked_counts`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from .align import Alignment
from .index import checked_of
from .store import Trace

#: Block rows per pass of a streamed analysis.
CHUNK = 1 << 18


def _chunks(t: Trace, names: Sequence[str]) -> Iterator[dict[str, np.ndarray]]:
    """Block columns ``names`` of ``t``, :data:`CHUNK` rows at a time, with ``checked``
    (:func:`~spectrace.tracer.index.checked_of` of the chunk)."""
    n = len(t.blocks)
    for lo in range(0, n, CHUNK):
        hi = min(lo + CHUNK, n)
        c = {name: t.read_rows(name, lo, hi) for name in (*names, "num_verified", "k")}
        c["checked"] = checked_of(c["num_verified"], c["k"])
        yield c


def _add(total: np.ndarray, part: np.ndarray) -> np.ndarray:
    """``total + part`` for int64 count arrays of different lengths (the longer's length)."""
    if len(part) > len(total):
        total = np.concatenate([total, np.zeros(len(part) - len(total), np.int64)])
    total[: len(part)] += part.astype(np.int64)
    return total


def per_request_acceptance(t: Trace) -> dict[str, list[int]]:
    """Blocks, accepted drafts and checked drafts of every request row.

    Returns:
        ``{"blocks", "accepted", "checked"}``: lists of int, one per request row of ``t``
        (blocks whose accepted count is unknown (-1) add to ``blocks`` only).
    """
    n = len(t.requests)  # placeholders of a live trace's unflushed requests included
    blocks, accepted, checked = (np.zeros(n, np.int64) for _ in range(3))
    for c in _chunks(t, ("request", "accepted")):
        req, acc = c["request"], c["accepted"]
        known = acc >= 0
        blocks = _add(blocks, np.bincount(req, minlength=n))
        rk = req[known]
        accepted = _add(accepted, np.bincount(rk, weights=acc[known], minlength=n))
        w = np.maximum(c["checked"][known], 0)
        checked = _add(checked, np.bincount(rk, weights=w, minlength=n))
    return {"blocks": blocks.tolist(), "accepted": accepted.tolist(), "checked": checked.tolist()}


def _top_position(t: Trace) -> int:
    """The largest anchor position of ``t`` plus one (1 for no blocks)."""
    top = 0
    n = len(t.blocks)
    for lo in range(0, n, CHUNK):
        top = max(top, int(t.read_rows("position", lo, min(lo + CHUNK, n)).max(initial=0)))
    return top + 1


def acceptance_along(t: Trace, buckets: int = 96) -> dict:
    """Acceptance rate by anchor-position bucket (where along the sequence it collapses).

    Args:
        t: the trace; buckets: about how many equal-width position buckets.
    Returns:
        ``{"width": tokens per bucket, "rate": [accepted / checked or None per bucket],
        "blocks": [blocks with a known accepted count per bucket]}``; buckets run to the
        last one holding such a block.
    """
    width = max(1, -(-_top_position(t) // buckets))
    a, c, cnt = (np.zeros(0, np.int64) for _ in range(3))
    for ch in _chunks(t, ("position", "accepted")):
        known = ch["accepted"] >= 0
        bk = ch["position"][known] // width
        a = _add(a, np.bincount(bk, weights=ch["accepted"][known]))
        c = _add(c, np.bincount(bk, weights=np.maximum(ch["checked"][known], 0)))
        cnt = _add(cnt, np.bincount(bk))
    n = max(len(a), len(c), len(cnt))
    a, c, cnt = (_add(np.zeros(n, np.int64), x) for x in (a, c, cnt))
    rate = [float(x / y) if y else None for x, y in zip(a.tolist(), c.tolist())]
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
    m = al.pairs
    nbad, npaired = np.zeros(m, np.int64), np.zeros(m, np.int64)
    first_bad: list[int | None] = [None] * m
    for lo in range(0, len(al.ia), CHUNK):
        ia, bd = al.ia[lo : lo + CHUNK], bad[lo : lo + CHUNK]
        pair = al.pair_of_block_a[ia]
        npaired += np.bincount(pair, minlength=m)[:m]
        bp = pair[bd]
        nbad += np.bincount(bp, minlength=m)[:m]
        if len(bp):  # al.ia is sorted by (pair, position): a pair's first is its first seen
            u, first = np.unique(bp, return_index=True)
            positions = al.a.blocks.position[ia[bd][first]]
            for p, x in zip(u.tolist(), positions.tolist()):
                if p < m and first_bad[p] is None:
                    first_bad[p] = int(x)
    return [
        {"bad": int(nbad[p]), "paired": int(npaired[p]), "first_bad": first_bad[p]}
        for p in range(m)
    ]
