"""vocab_mapping across a pair: our ids are a fixed function of theirs, or lie in a range only
a reduced draft vocabulary explains.

Three tests, in order; the first that holds decides (``evidence.decided_by``):

- ``pooled``: on every differing slot, ours is a fixed function of theirs (offset, factor,
  permutation): the mapping is wrong but the drafter is fed the right ids.
- ``slot``: the same on one slot alone (the first that holds): when the wrongly mapped ids
  are fed back into the drafter, only slot 0 is a function of the reference, deeper slots
  are drafted from another context. Per slot the map must hold both ways (ours from theirs
  and theirs from ours), as a mapping between vocabularies does.
- ``id_range``: our ids all lie below a power of two (a plausible draft-vocabulary size)
  while a good share of theirs lie at or above it: the draft indices were never mapped to
  target ids. No metadata is needed (VT logs carry no vocabulary sizes).
"""

from __future__ import annotations

import numpy as np

from ..fmt import pct
from .data import PairData
from .evidence import VocabEvidence
from .model import Finding
from .thresholds import RANGE_MIN_IDS, RANGE_MIN_SHARE, SYSTEMATIC

#: Fewest differing slots (and covered pairs) a mapping is judged on; its least consistency.
MIN_SLOTS = 20
MIN_CONSISTENCY = 0.9


def functional_map(src: np.ndarray, dst: np.ndarray) -> tuple[float, int]:
    """How well ``dst`` is a function of ``src``: share of pairs (over src ids seen at least
    twice) whose dst equals the most frequent dst of their src. Returns (share, pairs)."""
    if len(src) == 0:
        return 0.0, 0
    key = src.astype(np.int64) * (1 << 32) + (dst.astype(np.int64) & 0xFFFFFFFF)
    uk, cnt = np.unique(key, return_counts=True)
    us = uk >> 32
    # per src: total count and count of its mode
    src_ids, inv = np.unique(us, return_inverse=True)
    total = np.bincount(inv, weights=cnt)
    mode = np.zeros(len(src_ids))
    np.maximum.at(mode, inv, cnt)
    rep = total >= 2
    n = int(total[rep].sum())
    return (float(mode[rep].sum() / n) if n else 0.0), n


def _relation(o: np.ndarray, t: np.ndarray, ev: VocabEvidence) -> str:
    """How ours ids ``o`` relate to theirs ``t`` (int64 [n]); adds offset/factor to ``ev``."""
    off = o - t
    vals, cnt = np.unique(off, return_counts=True)
    if cnt.max() >= 0.9 * len(off):
        c = int(vals[cnt.argmax()])
        ev["offset"] = c
        return f"a constant offset ({c:+d})"
    nz = t != 0
    if nz.any():
        rv, rc = np.unique(np.round(o[nz] / t[nz], 6), return_counts=True)
        if rc.max() >= 0.9 * nz.sum():
            ev["factor"] = float(rv[rc.argmax()])
            return f"a constant factor (x{rv[rc.argmax()]:g})"
    return "a fixed per-id mapping (permuted ids)"


def _mapped(o: np.ndarray, t: np.ndarray, both_ways: bool) -> float | None:
    """Consistency of ours ``o`` as a function of theirs ``t`` when it can be judged (enough
    covered pairs and distinct ids), else None; with ``both_ways`` the lower of the two
    directions (theirs as a function of ours counts where enough of our ids recur)."""
    share, n = functional_map(t, o)
    if n < MIN_SLOTS or len(np.unique(t)) < 5:
        return None
    if both_ways:
        back, m = functional_map(o, t)
        share = min(share, back) if m >= MIN_SLOTS else share
    return share


def _finding(pd: PairData, diff: np.ndarray, ev: VocabEvidence, what: str) -> Finding:
    """The mapping finding over the differing slots ``diff`` (bool [P, w])."""
    o, t = pd.pa[diff].astype(np.int64), pd.pb[diff].astype(np.int64)
    relation = _relation(o, t, ev)
    first = int(np.flatnonzero(diff.any(axis=1))[0])
    below, share = int(o.max()), ev["consistency"]
    ev["ours_max_id"], ev["theirs_max_id"] = below, int(t.max())
    ev["example"] = pd.example(first)
    return Finding(
        "vocab_mapping",
        "error",
        side="ours",
        slot=int(np.flatnonzero(diff[first])[0]),
        **pd.at(first),
        message=(
            f"ours relate to theirs by {relation} on {pct(share, 0)} of {int(diff.sum())} "
            f"differing {what}: a reduced-vocabulary (d2t/t2d) mapping is missing, applied "
            f"twice or regenerated (ours ids reach {below}, theirs {int(t.max())})"
        ),
        evidence=ev,
    )


def _pooled(pd: PairData) -> Finding | None:
    present = int(pd.counts.present.sum())
    ndiff = present - int(pd.counts.equal.sum())
    if ndiff < MIN_SLOTS or ndiff < SYSTEMATIC * present:
        return None
    diff = pd.both & ~pd.cmp.eq
    share = _mapped(pd.pa[diff], pd.pb[diff], both_ways=False)
    if share is None or share < MIN_CONSISTENCY:
        return None
    ev = VocabEvidence(decided_by="pooled", consistency=share, slots=int(diff.sum()))
    return _finding(pd, diff, ev, "slots")


def _per_slot(pd: PairData) -> Finding | None:
    shares: list[float | None] = []
    for j in range(pd.width):
        both = pd.both_at(j)
        d = both & ~pd.cmp.eq[:, j]
        ok = d.sum() >= MIN_SLOTS and d.sum() >= SYSTEMATIC * both.sum()
        shares.append(_mapped(pd.pa[d, j], pd.pb[d, j], both_ways=True) if ok else None)
    hits = [j for j, x in enumerate(shares) if x is not None and x >= MIN_CONSISTENCY]
    if not hits:
        return None
    j = hits[0]
    diff = np.zeros_like(pd.both)
    diff[:, j] = pd.both[:, j] & ~pd.cmp.eq[:, j]
    ev = VocabEvidence(
        decided_by="slot",
        consistency=float(shares[j]),  # type: ignore[arg-type]
        slots=int(diff.sum()),
        per_slot_consistency=shares,
    )
    slots = ", ".join("-" if x is None else f"{x:.2f}" for x in shares)
    return _finding(pd, diff, ev, f"ids at slot {j} alone (consistency per slot: [{slots}])")


def _live(p: np.ndarray, k: np.ndarray) -> np.ndarray:
    """bool [P, w]: proposed slots (j < k) holding a real id (not a negative placeholder)."""
    return (np.arange(p.shape[1]) < k[:, None]) & (p >= 0)


def _id_range(pd: PairData) -> Finding | None:
    present = int(pd.counts.present.sum())
    if present - int(pd.counts.equal.sum()) < SYSTEMATIC * present:
        return None
    la, lb = _live(pd.pa, pd.ka), _live(pd.pb, pd.kb)
    ours, theirs = pd.pa[la], pd.pb[lb]
    if len(ours) < RANGE_MIN_IDS or not len(theirs):
        return None
    top = int(ours.max())
    bound = 1 << max(top, 1).bit_length()  # the smallest power of two above our highest id
    above = lb & (pd.pb >= bound)
    n_above = int(above.sum())
    if n_above < RANGE_MIN_IDS or n_above < RANGE_MIN_SHARE * len(theirs):
        return None
    first = int(np.flatnonzero(above.any(axis=1))[0])
    ev = VocabEvidence(
        decided_by="id_range",
        range_bound=bound,
        ours_max_id=top,
        theirs_max_id=int(theirs.max()),
        theirs_at_or_above=n_above,
        theirs_ids=len(theirs),
        ours_ids=len(ours),
        example=pd.example(first),
    )
    return Finding(
        "vocab_mapping",
        "error",
        side="ours",
        slot=int(np.flatnonzero(above[first])[0]),
        **pd.at(first),
        message=(
            f"every one of our {len(ours)} proposed ids on {len(pd.ka)} paired blocks lies "
            f"below {bound} (highest {top}) while {n_above} of their {len(theirs)} "
            f"({pct(n_above / len(theirs), 0)}) lie at or above it, up to "
            f"{int(theirs.max())}: ours are clustered below a plausible draft-vocabulary "
            f"size, the draft indices were not mapped to target ids (d2t)"
        ),
        evidence=ev,
    )


def vocab_pairs(pd: PairData) -> Finding | None:
    """vocab_mapping across traces: the pooled, per-slot and id-range tests of the module
    docstring, the first that holds."""
    return _pooled(pd) or _per_slot(pd) or _id_range(pd)
