"""near_ties (a warning): which differences are numerics, by the recorded top-2 margins.

Where both engines' greedy choice was nearly a tie (top-1 minus top-2 logit below
:data:`~.thresholds.NEAR_TIE_MARGIN` on either side), a flipped token is what two correct
fp32 implementations may produce; elsewhere a difference is not explained by numerics. The
detector reads the optional ``draft_margin`` / ``target_margin`` columns (format 1.2; NaN
unknown) and classifies:

* paired blocks whose proposals differ, by the margins at their first differing slot;
* the positions where the targets disagree: in a replay pair, where they sampled different
  anchors after the same prefix (:attr:`~spectrace.tracer.align.Alignment.disagree_a`); in a
  natural pair, the first divergent token of each request pair (the blocks anchored there).

It changes no other finding: an error stays an error, this says how much of it is ties.
"""

from __future__ import annotations

import numpy as np

from ..align import Alignment
from ..parallel import chunks
from ..rows import gather
from .data import PairData
from .evidence import NearTieEvidence, TargetTie
from .model import Finding
from .thresholds import NEAR_TIE_MARGIN

#: Target near-ties listed in the evidence (the count covers them all).
MAX_LISTED = 10


def _slot_margin(m: np.ndarray, rows: np.ndarray, slots: np.ndarray) -> np.ndarray:
    """float64 [n]: ``m[rows, slots]`` (NaN where the slot is outside the matrix)."""
    out = np.full(len(rows), np.nan)
    ok = (slots >= 0) & (slots < m.shape[1]) if m.ndim == 2 else np.zeros(len(rows), bool)
    out[ok] = m[rows[ok], slots[ok]]
    return out


def _tie(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """bool: either margin known and below the threshold (NaN compares False)."""
    with np.errstate(invalid="ignore"):
        return (x < NEAR_TIE_MARGIN) | (y < NEAR_TIE_MARGIN)


def _num(x: float) -> float | None:
    return None if not np.isfinite(x) else round(float(x), 6)


def _first_at_divergence(pair_of_block: np.ndarray, position: np.ndarray, div: np.ndarray):
    """int64 [m]: per request pair, the first block anchored at its divergence position
    (-1: none, or no divergence). One pass over the blocks (not one per pair)."""
    out = np.full(len(div), -1, np.int64)
    hits = [np.zeros(0, np.int64)]
    for c in chunks(len(position)):  # in chunks: no whole-column int64 temporaries
        p = pair_of_block[c]
        on = p >= 0
        hit = np.zeros(len(p), bool)
        hit[on] = position[c][on] == div[p[on]]  # NO_DIVERGENCE never equals a position
        hits.append(np.flatnonzero(hit) + c.start)
    rows = np.concatenate(hits)
    pairs, first = np.unique(pair_of_block[rows], return_index=True)
    out[pairs] = rows[first]
    return out


def _target_sites(al: Alignment) -> tuple[np.ndarray, np.ndarray]:
    """Block index pairs (ours, theirs; -1 none) where the targets disagree, by request pair."""
    if al.replay:
        return al.disagree_a, al.disagree_b
    fa = _first_at_divergence(al.pair_of_block_a, al.a.blocks.position, al.divergence)
    fb = _first_at_divergence(al.pair_of_block_b, al.b.blocks.position, al.divergence)
    keep = (fa >= 0) | (fb >= 0)
    return fa[keep], fb[keep]


def _target_margins(al: Alignment) -> list[TargetTie]:
    """Every target disagreement with its two margins (None: unknown)."""
    ra, rb = _target_sites(al)
    ta, tb = _margins_at(al.a, ra), _margins_at(al.b, rb)
    out: list[TargetTie] = []
    for x, (i, j) in enumerate(zip(ra.tolist(), rb.tolist())):
        t, row = (al.a, i) if i >= 0 else (al.b, j)
        out.append(
            TargetTie(
                request=str(t.requests.req_id[int(t.blocks.request[row])]),
                position=int(t.blocks.position[row]),
                ours=_num(ta[x]) if i >= 0 else None,
                theirs=_num(tb[x]) if j >= 0 else None,
            )
        )
    return out


def _margins_at(t, rows: np.ndarray) -> np.ndarray:
    """float32 [len(rows)]: ``target_margin`` at block rows ``rows`` (NaN where -1); only
    those rows are kept from the column's pass."""
    out = np.full(len(rows), np.nan, np.float32)
    known = rows >= 0
    out[known] = gather(t, "target_margin", rows[known], np.nan)
    return out


def near_ties(pd: PairData) -> Finding | None:
    """near_ties: mismatches and target disagreements whose margin on either side is below
    :data:`NEAR_TIE_MARGIN`; None when none is (or no margin is recorded)."""
    al = pd.al
    bad = np.flatnonzero(~pd.cmp.exact & pd.cmp.anchor_eq)
    slots = pd.cmp.first_slot[bad]
    # Only the differing rows of the margin matrices are read (one pass each).
    here = np.arange(len(bad))
    ma = _slot_margin(gather(al.a, "draft_margin", al.ia[bad], np.nan), here, slots)
    mb = _slot_margin(gather(al.b, "draft_margin", al.ib[bad], np.nan), here, slots)
    tie = _tie(ma, mb)
    targets = _target_margins(al)
    t_ties = [
        x
        for x in targets
        if _tie(
            np.array([np.nan if x["ours"] is None else x["ours"]]),
            np.array([np.nan if x["theirs"] is None else x["theirs"]]),
        )[0]
    ]
    if not tie.any() and not t_ties:
        return None
    known = int((np.isfinite(ma) | np.isfinite(mb)).sum())
    return _finding(pd, bad, slots, ma, mb, tie, known, targets, t_ties)


def _finding(pd, bad, slots, ma, mb, tie, known, targets, t_ties) -> Finding:
    """The Finding of :func:`near_ties` (first location: the first tied block, else the
    first tied target disagreement)."""
    n, m = int(tie.sum()), len(bad)
    if n:
        f = int(np.flatnonzero(tie)[0])
        where = {**pd.at(int(bad[f])), "slot": int(slots[f])}
        first = (
            f"first at request {where['request']}, position {where['position']}, slot "
            f"{where['slot']} (margins ours {_num(ma[f])}, theirs {_num(mb[f])})"
        )
    else:
        where = {"request": t_ties[0]["request"], "position": t_ties[0]["position"]}
        first = f"first at request {where['request']}, position {where['position']}"
    rest = m - n
    verdict = (
        "every one is numerics, not a bug"
        if rest == 0
        else f"the other {rest} are not near-ties (margins {'known' if known else 'unknown'})"
    )
    target = (
        f"; the targets disagree at {len(targets)} position(s), {len(t_ties)} of them near-ties"
        if targets
        else ""
    )
    return Finding(
        "near_ties",
        "warning",
        side="both",
        **where,
        message=(
            f"{n} of {m} differing paired blocks differ where a top-1/top-2 margin is below "
            f"{NEAR_TIE_MARGIN:g} ({first}): {verdict}{target}"
        ),
        evidence=NearTieEvidence(
            threshold=NEAR_TIE_MARGIN,
            differing=m,
            near_ties=n,
            margin_known=known,
            target_disagreements=len(targets),
            target_near_ties=len(t_ties),
            targets=t_ties[:MAX_LISTED],
        ),
    )
