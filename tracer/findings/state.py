"""Detectors of drafts that depend on state they should not: the verdict of the request's
previous block (stale_state) and the request's place in the batch (batch_dependence).

Both test whether the mismatching paired blocks (our proposal differs, the anchors agree)
concentrate in one group of blocks, against the rest: by the rate rule of the first version
(most of the group differs, little of the rest), or, at low mismatch rates, by a one-sided
Fisher exact test (:func:`~.stats.concentration_p`). Groups are tried in a fixed order and
the first that holds decides; the message names the group, its counts and the p-value.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..fmt import pct
from ..parallel import chunks
from .data import PairData
from .evidence import BatchChange, BatchEvidence, GroupCount, StaleEvidence
from .ksize import config_difference
from .model import Finding
from .stats import concentration_p
from .thresholds import CONCENTRATION_P, CONCENTRATION_RATIO, MIN_BLOCKS, SYSTEMATIC


@dataclass(frozen=True)
class Concentration:
    """Mismatches in a group of paired blocks and outside it (blocks counted where eligible).

    Attributes:
        hits_in, n_in: mismatching and eligible blocks in the group.
        hits_out, n_out: the same outside it.
        p: one-sided Fisher exact p-value of the group holding that many mismatches.
    """

    hits_in: int
    n_in: int
    hits_out: int
    n_out: int
    p: float

    @property
    def rate_in(self) -> float:
        """Mismatch rate in the group (0 when empty)."""
        return self.hits_in / self.n_in if self.n_in else 0.0

    @property
    def rate_out(self) -> float:
        """Mismatch rate outside the group (0 when empty)."""
        return self.hits_out / self.n_out if self.n_out else 0.0

    def holds(self, max_out: float) -> bool:
        """The group explains the mismatches: the rate rule (at least SYSTEMATIC in the
        group, at most ``max_out`` outside and a third of the group's rate), or a
        significant concentration (p <= CONCENTRATION_P, CONCENTRATION_RATIO times the
        outside rate, at least MIN_BLOCKS mismatches in the group)."""
        if self.n_in < MIN_BLOCKS or self.n_out < MIN_BLOCKS:
            return False
        if self.rate_in >= SYSTEMATIC and self.rate_out <= max_out:
            return self.rate_in >= 3 * self.rate_out
        return (
            self.hits_in >= MIN_BLOCKS
            and self.p <= CONCENTRATION_P
            and self.rate_in >= CONCENTRATION_RATIO * self.rate_out
        )


def concentration(mism: np.ndarray, group: np.ndarray, eligible: np.ndarray) -> Concentration:
    """Count ``mism`` (bool [P]) in ``group`` and outside it, among ``eligible`` blocks."""
    g, o = eligible & group, eligible & ~group
    hi, ni, ho, no = (int(x) for x in ((mism & g).sum(), g.sum(), (mism & o).sum(), o.sum()))
    return Concentration(hi, ni, ho, no, concentration_p(hi, ni, ho, no))


def _mismatch(pd: PairData) -> np.ndarray:
    """bool [P]: our proposal differs while the anchors agree."""
    return ~pd.cmp.exact & pd.cmp.anchor_eq


# ---------------------------------------------------------------------------- stale_state

#: The previous block's verdict, per paired block: no previous block (or its count unknown),
#: every draft accepted, some accepted then one rejected, slot 0 rejected.
FIRST, ACCEPTED, PARTIAL, REJECTED = -1, 0, 1, 2
VERDICT_NAMES = {FIRST: "first", ACCEPTED: "accepted", PARTIAL: "partial", REJECTED: "rejected"}

#: Groups stale_state tests, in order: (name, verdicts, the words for them, the cause).
STALE_GROUPS = (
    ("rejection", (PARTIAL, REJECTED), "a rejection", "KV or hidden state of rejected tokens"),
    (
        "acceptance",
        (ACCEPTED,),
        "a full acceptance",
        "its own approximate hidden state or KV for accepted tokens",
    ),
    ("partial", (PARTIAL,), "a partial acceptance", "state of the rejected tail of the block"),
    ("rejected", (REJECTED,), "a rejection at slot 0", "state of the rejected drafts"),
)


def previous_verdict(pd: PairData) -> np.ndarray:
    """int8 [P]: the verdict of our previous block of the same request (FIRST, ACCEPTED,
    PARTIAL or REJECTED; FIRST also where its accepted count is unknown)."""
    oa, ia = pd.oa, pd.al.ia
    out = np.full(len(ia), FIRST, np.int8)
    for c in chunks(len(ia)):  # in chunks: the gathered temporaries stay small
        prev = oa.prev[ia[c]]
        pv = np.where(prev >= 0, prev, 0)
        acc, n = oa.t.blocks.accepted[pv], oa.nchecked[pv]  # int16 both: compared only
        o = out[c]
        known = (prev >= 0) & (acc >= 0)
        o[known & (acc >= n)] = ACCEPTED
        o[known & (acc > 0) & (acc < n)] = PARTIAL
        o[known & (acc == 0) & (n > 0)] = REJECTED
    return out


def _by_verdict(v: np.ndarray, mism: np.ndarray, ok: np.ndarray) -> dict[str, GroupCount]:
    return {
        name: GroupCount(
            blocks=int((ok & (v == c)).sum()), mismatches=int((ok & mism & (v == c)).sum())
        )
        for c, name in VERDICT_NAMES.items()
    }


def stale(pd: PairData) -> Finding | None:
    """stale_state: mismatches concentrate on blocks that follow a given verdict of the
    request's previous block (a rejection, a full acceptance, a partial acceptance, a
    rejection at slot 0); located at the first mismatching block of that group."""
    if config_difference(pd.al.a.meta, pd.al.b.meta):  # drafts differ by configuration
        return None  # draft_mismatch names it: no state to blame
    v, mism, ok = previous_verdict(pd), _mismatch(pd), pd.trusted
    rej = concentration(mism, np.isin(v, (PARTIAL, REJECTED)), ok)
    for name, verdicts, words, cause in STALE_GROUPS:
        group = np.isin(v, verdicts)
        c = concentration(mism, group, ok)
        if not c.holds(max_out=0.2):
            continue
        first = int(np.flatnonzero(ok & group & mism)[0])
        by = _by_verdict(v, mism, ok)
        counts = ", ".join(f"{k} {x['mismatches']}/{x['blocks']}" for k, x in by.items())
        return Finding(
            "stale_state",
            "error",
            side="ours",
            **pd.at(first),
            message=(
                f"right after {words} of the request's previous block ours proposes "
                f"differently in {c.hits_in} of {c.n_in} paired blocks ({pct(c.rate_in, 0)}), "
                f"otherwise in {c.hits_out} of {c.n_out} ({pct(c.rate_out, 0)}; by previous "
                f"verdict, mismatches/blocks: {counts}; Fisher p={c.p:.1g}): the drafter "
                f"keeps stale state ({cause})"
            ),
            evidence=StaleEvidence(
                verdict=name,
                mismatch_rate=c.rate_in,
                otherwise=c.rate_out,
                blocks_after=c.n_in,
                mismatches_after=c.hits_in,
                blocks_otherwise=c.n_out,
                mismatches_otherwise=c.hits_out,
                p_value=c.p,
                by_verdict=by,
                after_rejection=rej.rate_in,
                blocks_after_rejection=rej.n_in,
            ),
        )
    return None


# ----------------------------------------------------------------------- batch_dependence

#: Groups batch_dependence tests, in order: (evidence ``by``, the words for the group).
BATCH_GROUPS = (
    ("batch_row", "at batch row > 0"),
    ("batch_size", "at batch size > 1"),
    ("batch_row_change", "where the request's batch row changed since its previous block"),
    ("batch_size_change", "where the batch size changed since the request's previous block"),
    ("batch_row_moved", "at or after the request's first change of batch row"),
    ("batch_size_moved", "at or after the request's first change of batch size"),
)
#: The groups of the first version (rows > 0, sizes > 1): they decide before any change.
STATIC_GROUPS = ("batch_row", "batch_size")


def _changes(pd: PairData, col: str) -> tuple[np.ndarray, np.ndarray]:
    """Per block of our trace (bool [n] each): ``col`` differs from the request's previous
    block (both known), and at or after the request's first such change."""
    oa = pd.oa
    v = getattr(oa.t.blocks, col)  # compared in its own dtype: no int64 copies of [n]
    has = oa.prev >= 0
    vp = v[np.where(has, oa.prev, 0)]
    changed = has & (v >= 0) & (vp >= 0) & (v != vp)
    del vp
    # Per request, in (request, position) order: changes so far, minus those of earlier
    # requests.
    o = oa.order
    co = changed[o]
    cs = np.cumsum(co, dtype=o.dtype)  # o's dtype holds any count of blocks
    starts = np.flatnonzero(~has[o])
    cs -= np.repeat(cs[starts] - co[starts], np.diff(np.append(starts, len(o))))
    moved = np.zeros(len(v), bool)
    moved[o] = cs > 0
    return changed, moved


def batch_groups(pd: PairData) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """For each of :data:`BATCH_GROUPS`: (group, eligible), bool [P] each, over the paired
    blocks (eligible: the block's batch value is known, and for changes its previous
    block's too)."""
    b, ia = pd.oa.t.blocks, pd.al.ia
    row, size = b.batch_row[ia], b.batch_size[ia]  # their own dtypes: compared only
    out = {"batch_row": (row > 0, row >= 0), "batch_size": (size > 1, size >= 1)}
    for col, v in (("batch_row", row), ("batch_size", size)):
        if not (v >= 0).any():  # no paired block's value known: no change is eligible
            none = np.zeros(len(ia), bool)
            out[f"{col}_change"] = out[f"{col}_moved"] = (none, none)
            continue
        prev = pd.oa.prev[ia]
        changed, moved = _changes(pd, col)
        pv = getattr(b, col)[np.where(prev >= 0, prev, 0)]
        known = (v >= 0) & (prev >= 0) & (pv >= 0)
        out[f"{col}_change"] = (changed[ia], known)
        out[f"{col}_moved"] = (moved[ia], known)
    return out


def _change_at(pd: PairData, x: int, by: str) -> BatchChange:
    """The batch change that put paired block ``x`` in group ``by``: for a ``moved`` group
    the request's first change, otherwise block x against its previous block."""
    oa, b = pd.oa, pd.oa.t.blocks
    blk = int(pd.al.ia[x])
    if by.endswith("_moved"):
        col = by.removesuffix("_moved")
        changed, _ = _changes(pd, col)
        same = np.flatnonzero((b.request == b.request[blk]) & changed)
        blk = int(same[np.argmin(b.position[same])])
    p = int(oa.prev[blk])
    return BatchChange(
        position=int(b.position[blk]),
        from_row=int(b.batch_row[p]) if p >= 0 else None,
        to_row=int(b.batch_row[blk]),
        from_size=int(b.batch_size[p]) if p >= 0 else None,
        to_size=int(b.batch_size[blk]),
    )


def _change_text(ch: BatchChange) -> str:
    return (
        f"batch row {ch['from_row']} -> {ch['to_row']}, batch size {ch['from_size']} -> "
        f"{ch['to_size']} at position {ch['position']}"
    )


def _deciding_group(pd: PairData, mism: np.ndarray) -> tuple[str, Concentration] | None:
    """The group of :data:`BATCH_GROUPS` that explains the mismatches: the first static
    group (rows > 0, sizes > 1) that holds, else the change group that holds with the
    smallest p-value (ties: table order). None when none holds."""
    groups = batch_groups(pd)
    held: list = []
    for by, _ in BATCH_GROUPS:
        group, eligible = groups[by]
        c = concentration(mism, group, eligible & pd.trusted)
        if c.holds(max_out=0.1):
            if by in STATIC_GROUPS:
                return by, c
            held.append((c.p, len(held), by, c))
    return min(held)[2:] if held else None


def batch(pd: PairData) -> Finding | None:
    """batch_dependence: mismatches concentrate at batch rows > 0 or sizes > 1, or where the
    request's batch row or batch size changes (at the change, or from it on; see
    :func:`_deciding_group`); located at the first mismatching block of the deciding group,
    whose change the message names."""
    mism = _mismatch(pd) & pd.trusted
    decided = _deciding_group(pd, mism)
    if decided is None:
        return None
    by, c = decided
    group, eligible = batch_groups(pd)[by]
    words = dict(BATCH_GROUPS)[by]
    first = int(np.flatnonzero(group & eligible & mism)[0])
    change = None if by in STATIC_GROUPS else _change_at(pd, first, by)
    where = "" if change is None else f"; the request's change: {_change_text(change)}"
    at = pd.at(first)
    return Finding(
        "batch_dependence",
        "error",
        side="ours",
        **at,
        message=(
            f"proposals differ in {c.hits_in} of {c.n_in} blocks {words} "
            f"({pct(c.rate_in, 0)}) but in {c.hits_out} of {c.n_out} otherwise "
            f"({pct(c.rate_out, 0)}; Fisher p={c.p:.1g}); mismatches start at request "
            f"{at['request']} position {at['position']}{where}: drafts depend on the "
            f"batch (draft state keyed by batch row, indexing in padded or sorted batches)"
        ),
        evidence=BatchEvidence(
            by=by,
            mismatch_rate_low=c.rate_out,
            mismatch_rate_high=c.rate_in,
            blocks_low=c.n_out,
            blocks_high=c.n_in,
            mismatches_low=c.hits_out,
            mismatches_high=c.hits_in,
            p_value=c.p,
            change=change,
        ),
    )
