"""depth_divergence: the per-slot agreement curve of the paired blocks breaks at some slot s.

The curve is CONDITIONAL: ``curve[j]`` is the share of paired blocks with slot j on both sides
and slots < j all agreeing whose slot j agrees too (``curve[0]`` is slot 0's plain agreement).
Unconditional agreement decays geometrically on a healthy pair (one early difference takes
every later slot with it), so only the conditional curve separates a drafter whose multi-step
loop breaks at depth s from ordinary drift: a healthy pair's conditional curve stays flat, a
broken loop's falls at s to near zero, whatever slot 0 does (a drafter whose slot 0 agrees 58%
and whose deeper slots never agree breaks at s = 1).
"""

from __future__ import annotations

import numpy as np

from ..fmt import pct
from ..parallel import chunks
from .data import PairData
from .evidence import DepthEvidence
from .model import Finding
from .thresholds import DEPTH_BREAK_DROP, MIN_BLOCKS, SYSTEMATIC


def agreement_curve(prefix: np.ndarray, ka: np.ndarray, kb: np.ndarray, w: int):
    """The conditional per-slot agreement curve (see the module docstring).

    Args:
        prefix: int [P] common-prefix lengths (the kernel's ``BlockComparison.prefix``).
        ka, kb: int [P] proposal lengths; w: slots compared.
    Returns:
        ``(curve, support)``: float64 [w] (NaN where no support) and int64 [w], the blocks
        with slot j on both sides and slots < j agreeing.
    """
    by_pre, ended = np.zeros(w + 1, np.int64), np.zeros(w + 1, np.int64)
    for c in chunks(len(prefix)):  # in chunks: no whole-column temporaries
        kmin = np.clip(np.minimum(ka[c], kb[c]), 0, w)
        pre = np.minimum(prefix[c], kmin)
        by_pre += np.bincount(pre, minlength=w + 1)[: w + 1]
        # support_j = #(prefix >= j and kmin > j); prefix <= kmin, so the only blocks with
        # prefix >= j and kmin <= j are those with prefix == kmin == j.
        ended += np.bincount(pre[pre == kmin], minlength=w + 1)[: w + 1]
    at_least = len(prefix) - np.concatenate([[0], np.cumsum(by_pre)])
    support = at_least[:w] - ended[:w]
    agree = at_least[1 : w + 1]
    with np.errstate(invalid="ignore", divide="ignore"):
        curve = np.where(support > 0, agree / np.maximum(support, 1), np.nan)
    return curve, support


def break_slot(curve: np.ndarray, support: np.ndarray) -> int | None:
    """The first slot s >= 1 where the curve breaks: at least MIN_BLOCKS blocks support it,
    it agrees in at most ``1 - SYSTEMATIC`` of them, every earlier slot agrees in at least
    SYSTEMATIC of its own, and it falls to at most DEPTH_BREAK_DROP of the lowest earlier
    slot (a break, not a gentle decline). None when the curve never breaks."""
    for s in range(1, len(curve)):
        before = curve[:s]
        if np.isnan(before).any() or before.min() < SYSTEMATIC:
            return None
        if support[s] < MIN_BLOCKS:
            continue
        if curve[s] <= 1 - SYSTEMATIC and curve[s] <= DEPTH_BREAK_DROP * before.min():
            return s
    return None


def _curve_text(curve: np.ndarray) -> str:
    return "[" + ", ".join("-" if np.isnan(x) else f"{x:.2f}" for x in curve) + "]"


def _first_break(prefix: np.ndarray, ka: np.ndarray, kb: np.ndarray, s: int) -> int:
    """The first paired block whose slots < s agree and whose slot s is on both sides and
    differs (searched chunk by chunk; one exists where the curve breaks at s)."""
    for c in chunks(len(prefix)):
        at = np.flatnonzero((prefix[c] == s) & (np.minimum(ka[c], kb[c]) > s))
        if len(at):
            return c.start + int(at[0])
    raise AssertionError("the curve breaks at a slot no block reaches")


def depth(pd: PairData) -> Finding | None:
    """depth_divergence: the conditional agreement curve breaks at slot s (the multi-step
    draft loop is broken from depth s on); located at the first paired block whose slots < s
    agree and whose slot s differs."""
    if len(pd.ka) < MIN_BLOCKS or pd.width < 2:
        return None
    curve, support = agreement_curve(pd.cmp.prefix, pd.ka, pd.kb, pd.width)
    s = break_slot(curve, support)
    if s is None:
        return None
    first = _first_break(pd.cmp.prefix, pd.ka, pd.kb, s)
    uncond = pd.counts.equal / np.maximum(pd.counts.present, 1)
    before = float(np.nanmin(curve[:s]))
    return Finding(
        "depth_divergence",
        "error",
        side="ours",
        slot=s,
        **pd.at(first),
        message=(
            f"the per-slot agreement curve (slot j agreeing given slots < j agree) breaks at "
            f"slot {s}: {_curve_text(curve)} over {len(pd.ka)} paired blocks; slots before "
            f"{s} agree in at least {pct(before, 0)}, slot {s} in {pct(curve[s], 0)} of "
            f"{int(support[s])}: the multi-step draft loop is broken from depth {s} on "
            f"(positions, seq_lens or the fed-back token not advanced)"
        ),
        evidence=DepthEvidence(
            per_position=[float(x) for x in uncond],
            conditional=[None if np.isnan(x) else float(x) for x in curve],
            conditional_blocks=[int(x) for x in support],
            break_slot=s,
            slot1_given_slot0=None if np.isnan(curve[1]) else float(curve[1]),
        ),
    )
