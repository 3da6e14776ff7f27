"""Pair detectors: each reads the paired blocks (:class:`~.data.PairData`, built on the
comparison kernel) and returns at most one :class:`~.model.Finding`, located on our side at
the first paired block where its pattern shows. :func:`content` reads the alignment only.
"""

from __future__ import annotations

import numpy as np

from ..align import Alignment, drafts_configured
from ..compare import NO_DIVERGENCE, count_anchors_known, shift_equal, shift_present
from ..fmt import pct
from ..index import memo, sequence_index
from ..store import Trace
from ..tokens import Decoder
from .data import PairData, TraceData, token_at
from .evidence import (
    AnchorEvidence,
    AnchorPair,
    ContentEvidence,
    ContentOnlyEvidence,
    DivergenceRef,
    LayoutEvidence,
    MismatchEvidence,
)
from .ksize import config_difference
from .model import Finding, Severity, Side, tok
from .single import constant_rate
from .thresholds import MIN_BLOCKS, MISMATCH_ERROR_RATE, SYSTEMATIC


def shift_rates(
    pa: np.ndarray, pb: np.ndarray, ka: np.ndarray, kb: np.ndarray, max_shift: int
) -> dict[int, tuple[float, int]]:
    """Slot-shift agreement (the kernel's :func:`~spectrace.tracer.compare.shift_equal`):
    for s != 0, the share of slot pairs present on both sides with ours[i] == theirs[i+s].

    Args:
        pa, pb: int32 [n, w] paired proposals (-1 padded); ka, kb: int [n] lengths.
    Returns:
        ``{s: (rate, slot_pairs)}`` for s in ±1..±max_shift with |s| < w (rate 0 where no
        slot pairs).
    """
    out = {}
    w = pa.shape[1]
    for s in range(-max_shift, max_shift + 1):
        if s == 0 or abs(s) >= w:
            continue
        n = int(shift_present(ka, kb, w, s).sum())
        hit = int(shift_equal(pa, pb, ka, kb, s).sum())
        out[s] = (float(hit / n) if n else 0.0, n)
    return out


def layout_shift(pd: PairData) -> Finding | None:
    """layout_shift: ours[i] == theirs[i+s] for most slots while ours[i] == theirs[i] is rare."""
    P = len(pd.ka)
    if P < MIN_BLOCKS:
        return None
    w = pd.width
    base = float(pd.counts.equal.sum() / max(pd.counts.present.sum(), 1))
    if base >= 0.45:  # no shift can then reach 2 x base + 0.05 while ours[i] == theirs[i]
        return None
    # A block of one repeated id "agrees" with any shift: leave those to constant_drafts.
    varied = ~(constant_rate(pd.oa)[0][pd.al.ia] | constant_rate(pd.ob)[0][pd.al.ib])
    if varied.sum() < MIN_BLOCKS:
        return None
    # Shifts up to the block length, keeping at least two slot pairs per block.
    rates = shift_rates(pd.pa[varied], pd.pb[varied], pd.ka[varied], pd.kb[varied], max(1, w - 2))
    if not rates:
        return None
    s = max(rates, key=lambda x: rates[x][0])
    rate, n = rates[s]
    if rate < 0.6 or rate < 2 * base + 0.05:
        return None
    # The first block where the shift holds on every slot pair both sides have.
    holds = shift_equal(pd.pa, pd.pb, pd.ka, pd.kb, s) | ~shift_present(pd.ka, pd.kb, w, s)
    hold = holds.all(axis=1) & ~pd.cmp.exact & varied
    first = int(np.flatnonzero(hold)[0]) if hold.any() else int(np.flatnonzero(varied)[0])
    rel = f"ours[i] equals theirs[i{s:+d}]"
    return Finding(
        "layout_shift",
        "error",
        side="ours",
        slot=0,
        **pd.at(first),
        message=(
            f"draft layout shifted by {abs(s)} slot{'s' if abs(s) > 1 else ''}: {rel} in "
            f"{pct(rate, 0)} of {n} slot pairs over {P} paired blocks, while ours[i] equals "
            f"theirs[i] in {pct(base, 0)} (the N vs 1+N anchor layout, sample_from_anchor)"
        ),
        evidence=LayoutEvidence(
            shift=s,
            rate=rate,
            slot_pairs=n,
            same_slot_rate=base,
            paired_blocks=P,
            rates={str(k): v[0] for k, v in rates.items()},
            example=pd.example(first),
        ),
    )


def anchor_pairs(pd: PairData) -> Finding | None:
    """anchor_shift across traces: anchors differ at the same position on matched content."""
    anc_a, anc_b = pd.oa.t.blocks.anchor, pd.ob.t.blocks.anchor
    known = count_anchors_known(anc_a, anc_b, pd.al.ia, pd.al.ib)
    bad = ~pd.cmp.anchor_eq  # anchor equality holds where either anchor is unknown
    if known < MIN_BLOCKS or bad.sum() < SYSTEMATIC * known:
        return None
    first = int(np.flatnonzero(bad)[0])
    i, j = int(pd.al.ia[first]), int(pd.al.ib[first])
    side, whose = _wrong_anchors(pd, bad)
    return Finding(
        "anchor_shift",
        "error",
        side=side,
        **pd.at(first),
        message=(
            f"anchors differ at the same position on matched content in {int(bad.sum())} "
            f"of {known} paired blocks: the block recorded at position p is "
            f"not drafted from the token at p{whose}"
        ),
        evidence=AnchorEvidence(
            blocks=int(bad.sum()),
            paired=known,
            example=AnchorPair(
                ours_anchor=tok(pd.decoder, [anc_a[i]]),
                theirs_anchor=tok(pd.decoder, [anc_b[j]]),
            ),
        ),
    )


def _wrong_anchors(pd: PairData, bad: np.ndarray) -> tuple[Side, str]:
    """Which side's anchors contradict its own sequence in the paired blocks ``bad`` (bool
    [P]): ``(side, clause for the message)``; ``both`` with no clause when both do, or
    neither (the sequences differ there)."""
    rows = np.flatnonzero(bad)
    wrong = []
    for td, blocks in ((pd.oa, pd.al.ia[rows]), (pd.ob, pd.al.ib[rows])):
        b = td.t.blocks
        req, pos = b.request[blocks], b.position[blocks].astype(np.int64)
        wrong.append(int((token_at(td, req, pos) != b.anchor[blocks]).sum()))
    if wrong[0] and not wrong[1]:
        return "ours", f" (ours' anchor is not its own sequence's token in {wrong[0]})"
    if wrong[1] and not wrong[0]:
        return "theirs", f" (theirs' anchor is not its own sequence's token in {wrong[1]})"
    return "both", ""


def mismatch(pd: PairData) -> Finding | None:
    """draft_mismatch: proposals differ at matched anchors with no more specific pattern."""
    bad = ~pd.cmp.exact & pd.cmp.anchor_eq
    if not bad.any():
        return None
    P = len(bad)
    rate = float(bad.mean())
    first = int(np.flatnonzero(bad)[0])
    slot0 = float((pd.both_at(0) & ~pd.cmp.eq[:, 0])[bad].mean())
    sev: Severity = "error" if rate >= MISMATCH_ERROR_RATE else "warning"
    note = "" if sev == "error" else " (few: possibly numerical near-ties)"
    why = config_difference(pd.al.a.meta, pd.al.b.meta)
    note += f"; {why}" if why else ""
    # The first differing slot both sides have (None: only the lengths differ).
    fs = int(pd.cmp.first_slot[first])
    slot = fs if 0 <= fs < min(pd.ka[first], pd.kb[first]) else None
    return Finding(
        "draft_mismatch",
        sev,
        side="ours",
        slot=slot,
        **pd.at(first),
        message=(
            f"proposals differ at matched anchors in {int(bad.sum())} of {P} paired blocks "
            f"({pct(rate, 0)}), from slot 0 in {pct(slot0, 0)} of them, with no shift or "
            f"mapping pattern{note}"
        ),
        evidence=MismatchEvidence(
            blocks=int(bad.sum()), paired=P, rate=rate, from_slot0=slot0, example=pd.example(first)
        ),
    )


def content_only(al: Alignment) -> bool:
    """A side has no draft blocks (a vanilla run), or only its requests' final proposals
    (see :func:`drafted_before_end`), while both have outputs: every request of each side
    is matched and every matched pair's content is known. Only the outputs are then
    compared (identical outputs pass). A side whose /meta says it decoded speculatively
    (:func:`~spectrace.tracer.align.drafts_configured`) while the other drafts lost its
    drafts: no content_only pair (``unverified_drafts`` names it)."""
    drafting = [drafted_before_end(t) for t in (al.a, al.b)]
    if all(drafting):
        return False
    if any(drafting) and any(
        not d and drafts_configured(t) for d, t in zip(drafting, (al.a, al.b))
    ):
        return False
    every = len(al.unmatched_a) == 0 and len(al.unmatched_b) == 0
    return al.pairs > 0 and every and bool(al.content_known.all())


def drafted_before_end(t: Trace) -> bool:
    """Whether ``t`` has a block that is not its request's final proposal (one without a
    verify record anchored at the request's last token: what vLLM's drafter proposes after
    the step that sampled that token, e.g. every block of a max_tokens 1 run, which never
    reached a verify step). A block of a request with unknown output ids counts. Memoised
    in ``t.cache`` (a diff asks it for its finding, its reasons and its gate)."""
    return memo(t, "drafted_before_end", lambda: _drafted_before_end(t))


def _drafted_before_end(t: Trace) -> bool:
    b = t.blocks
    if not len(b) or (b.num_verified >= 0).any() or (b.accepted >= 0).any():
        return bool(len(b))
    length = sequence_index(t)[2]
    return bool((b.position.astype(np.int64) != length[b.request] - 1).any())


def vanilla(al: Alignment) -> Finding | None:
    """content_only (info): no draft comparison was possible, the outputs were compared."""
    if not content_only(al):
        return None
    without = [(s, t) for s, t in (("ours", al.a), ("theirs", al.b)) if not drafted_before_end(t)]
    sides = [s for s, _ in without]
    side: Side = "both" if len(sides) == 2 else ("ours" if sides[0] == "ours" else "theirs")
    same = int((al.divergence == NO_DIVERGENCE).sum())
    # Configured to draft without a block before the end: no request reached a verify step
    # (e.g. max_tokens 1; vLLM still proposes once after the last token), not a vanilla run.
    finals = any(len(t.blocks) for _, t in without)
    configured = finals or any(drafts_configured(t) for _, t in without)
    why = (
        "configured to draft, none verified" if configured else "a run without speculative decoding"
    )
    return Finding(
        "content_only",
        "info",
        side=side,
        message=(
            f"{_without_words(without)} ({why}): no draft comparison was possible; the "
            f"outputs were compared, "
            f"identical in {same} of {al.pairs} matched requests"
        ),
        evidence=ContentOnlyEvidence(without_drafts=sides, requests=al.pairs, identical=same),
    )


def _without_words(without: list[tuple[str, Trace]]) -> str:
    """``ours has no draft blocks``, ``ours and theirs have only final proposals``, ``ours
    has no draft blocks and theirs only final proposals``: what each side lacks."""
    what = ["only final proposals" if len(t.blocks) else "no draft blocks" for _, t in without]
    names = [s for s, _ in without]
    if len(set(what)) == 1:
        return f"{' and '.join(names)} {'has' if len(names) == 1 else 'have'} {what[0]}"
    return f"{names[0]} has {what[0]} and {names[1]} {what[1]}"


def content(al: Alignment, oa: TraceData, dec: Decoder | None) -> Finding | None:
    """content_divergence: the two outputs differ from some position on."""
    div = np.flatnonzero(al.divergence != NO_DIVERGENCE)
    if not len(div):
        return None
    p = int(div[0])
    i, j, d = int(al.req_a[p]), int(al.req_b[p]), int(al.divergence[p])
    sa, sb = oa.t.requests.full_sequence(i), al.b.requests.full_sequence(j)
    in_pair = al.pair_of_block_a == p
    beyond_a = int(in_pair.sum() - (al.comparable_a & in_pair).sum())
    plen = len(oa.t.requests.prompt_ids[i])
    return Finding(
        "content_divergence",
        "error",
        side="both",
        request=oa.t.requests.req_id[i],
        position=d,
        message=(
            f"the outputs differ in {len(div)} of {al.pairs} matched requests (first: "
            f"request {oa.t.requests.req_id[i]} at position {d}, output token {d - plen}: "
            f"ours {tok(dec, [sa[d]])[0]} vs theirs {tok(dec, [sb[d]])[0]}); blocks "
            f"past it are not compared and acceptance totals on all content compare "
            f"different text"
        ),
        evidence=ContentEvidence(
            requests=len(div),
            position=d,
            ours_token=tok(dec, [sa[d]]),
            theirs_token=tok(dec, [sb[d]]),
            blocks_not_compared_ours=beyond_a,
            divergences=[
                DivergenceRef(
                    request=oa.t.requests.req_id[int(al.req_a[q])], position=int(al.divergence[q])
                )
                for q in div[:10]
            ],
        ),
    )
