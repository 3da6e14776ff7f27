"""A fault confined to part of a run, named by its pattern: the pattern detectors again on
the **onset region**, the paired blocks from each request pair's first differing block on.

A pattern detector measures its pattern over every paired block. A fault that starts late
(a layout shift from position 150, k changed mid-run, deeper slots broken after a cache
refill) or lives in one request of five is then a minority of the blocks: every rate stays
below its threshold, and the mismatches are named only by a concentration (the batch shrank
when the fault began: ``batch_dependence``) or as a generic ``draft_mismatch``. Before a
request pair's first differing block the pair agrees by definition; from it on the fault's
blocks are the whole population, so the same thresholds apply unchanged. The region is not
the differing blocks alone: conditioned on differing, the last slot of a block that agreed
on every earlier slot differs by construction, a depth break that is only selection.

The concentration detectors (``batch_dependence``) compare groups over the whole run and are
not re-run; ``stale_state`` is, since within the region blocks after a rejection and after an
acceptance are both present.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..compare import compare_paired
from .data import PairData
from .model import Finding
from .thresholds import MIN_BLOCKS

#: The pair detectors re-run on the onset region: patterns of the differing blocks.
REGION_KINDS: frozenset[str] = frozenset(
    {"anchor_shift", "layout_shift", "vocab_mapping", "k_mismatch", "depth_divergence",
     "stale_state"}
)  # fmt: skip


def onset_region(pd: PairData) -> np.ndarray:
    """bool [P]: paired blocks at or after their request pair's first divergent paired block
    (paired blocks are sorted by (pair, position): ``Alignment.ia``)."""
    P = len(pd.ka)
    div = pd.cmp.divergent
    if not div.any():
        return np.zeros(P, bool)
    pair = np.asarray(pd.al.pair_of_block_a)[pd.al.ia].astype(np.int64)
    at = np.flatnonzero(div)
    pairs, first = np.unique(pair[at], return_index=True)
    start = np.full(int(pair.max(initial=-1)) + 2, P, np.int64)  # index -1: never
    start[pairs] = at[first]
    return np.arange(P) >= start[pair]


def restricted(pd: PairData, keep: np.ndarray) -> PairData:
    """``pd`` on paired blocks ``keep`` (bool [P]): the alignment's ``ia``/``ib`` cut to them
    and their comparison recomputed from the paired proposals (same kernel, counts of the
    subset); locations stay the traces' own."""
    ia, ib = pd.al.ia[keep], pd.al.ib[keep]
    pa, pb = pd.pa[keep], pd.pb[keep]
    anchors = (pd.oa.t.blocks.anchor[ia], pd.ob.t.blocks.anchor[ib])
    pc = compare_paired(pa, pb, None, None, pd.ka[keep], pd.kb[keep], *anchors)
    al = dataclasses.replace(pd.al, ia=ia, ib=ib)
    sub = PairData(al=al, oa=pd.oa, ob=pd.ob, paired=pc, decoder=pd.decoder,
                   trusted=pd.trusted[keep])  # fmt: skip
    sub.__dict__["pa"], sub.__dict__["pb"] = pa, pb  # the cached properties, already cut
    return sub


def region_findings(pd: PairData, detectors) -> list[Finding]:
    """The pattern ``detectors`` (:class:`~.run.PairDetector` whose kind is in
    :data:`REGION_KINDS`) on :func:`onset_region`, each finding's message saying which blocks
    it was measured on; [] when the region is every paired block or too small."""
    keep = onset_region(pd)
    n, P = int(keep.sum()), len(keep)
    if n < MIN_BLOCKS or n == P:
        return []
    sub = restricted(pd, keep)
    note = (
        f" (measured from each request's first differing block on: {n} of {P} paired "
        f"blocks; the {P - n} before them agree)"
    )
    found = [d.run(sub) for d in detectors if d.kind in REGION_KINDS]
    return [dataclasses.replace(f, message=f.message + note) for f in found if f is not None]
