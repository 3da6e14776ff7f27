"""Single-trace detectors: each reads one side (:class:`~.data.SideInput`) and returns at
most one :class:`~.model.Finding`, pointing at the first block where its pattern shows.

Vectorised over block columns, in chunks of rows (:data:`~spectrace.tracer.parallel.CHUNK`)
so temporaries stay small. The loop detector lives in :mod:`.loops`.
"""

from __future__ import annotations

import numpy as np

from ..align import is_replay
from ..fmt import pct
from ..index import memo
from ..parallel import chunks
from ..rows import row, row_chunks
from .capture import import_bookkeeping
from .data import SideInput, TraceData, token_at
from .evidence import (
    AcceptedPair,
    AnchorEvidence,
    BookkeepingEvidence,
    ConstantEvidence,
    VerifiedEvidence,
    VerifiedExample,
    VocabEvidence,
)
from .model import Finding, tok
from .sweep import sweep
from .thresholds import MIN_BLOCKS, SYSTEMATIC


def anchor_consistency(s: SideInput) -> Finding | None:
    """anchor_shift within a trace: the recorded anchor is not the sequence's token at its
    position, in any block (no engine drafts from a token its output does not hold there: a
    single one is a corrupt record; in a replay, in a systematic share); the shift that
    explains them is named when it holds in at least :data:`~.thresholds.SYSTEMATIC` of
    them."""
    td = s.td
    b = td.t.blocks
    known, bad = td.anchor_check
    nknown, nbad = int(known.sum()), int(bad.sum())
    if is_replay(td.t):
        # A replay's anchor is what its target sampled at a given prefix: it differs from
        # the reference sequence wherever the targets disagree. Only a systematic share
        # says the recording is shifted.
        if nknown < MIN_BLOCKS or nbad < SYSTEMATIC * nknown or nbad < MIN_BLOCKS:
            return None
    elif not nbad:
        return None
    # Which neighbouring position holds the recorded anchor, over the bad blocks only.
    idx = np.flatnonzero(bad)
    req, pos, anchor = b.request[idx], b.position[idx].astype(np.int64), b.anchor[idx]
    shifts = {
        d: float((token_at(td, req, pos + d) == anchor).mean()) for d in range(-4, 5) if d != 0
    }
    best = max(shifts, key=lambda d: shifts[d])
    first = int(idx[0])
    shift_txt = (
        f"; the anchor is the token at position{best:+d} in {pct(shifts[best], 0)}"
        if shifts[best] >= SYSTEMATIC
        else ""
    )
    return Finding(
        "anchor_shift",
        "error",
        side=td.side,
        **td.at(first),
        message=(
            f"{td.side}: the recorded anchor is not the sequence's token at the anchor "
            f"position in {nbad} of {nknown} blocks{shift_txt}"
        ),
        evidence=AnchorEvidence(
            blocks=nbad,
            checked=nknown,
            shift=best if shifts[best] >= SYSTEMATIC else None,
            shift_rates={str(k): v for k, v in shifts.items()},
        ),
    )


def verified_vs_proposed(s: SideInput) -> Finding | None:
    """verified_differs: what the target consumed is not what the drafter produced (the
    kernel's slot equality of each block's proposal with its own verified ids, from the
    trace's :func:`~.sweep.sweep`)."""
    td, dec = s.td, s.decoder
    vs = sweep(td.t).verified
    if vs is None:
        return None  # the common case: the store said so, or no slot differs
    b = td.t.blocks
    nv = b.num_verified.astype(np.int64)
    k = b.k.astype(np.int64)
    bad = vs.bad
    trimmed = (nv >= 0) & (nv < k)
    first = int(np.flatnonzero(bad)[0])
    per_slot = vs.per_slot
    worst = int(per_slot.argmax())
    equals_anchor = vs.equals_anchor / vs.values
    placeholder = vs.placeholders / vs.values
    note = ""
    if equals_anchor >= SYSTEMATIC:
        note = (
            f"; the verified value equals the block's anchor (the previous emitted token) "
            f"in {pct(equals_anchor, 0)}"
        )
    elif placeholder >= SYSTEMATIC:
        note = f"; {pct(placeholder, 0)} of them are placeholder ids (-1)"
    return Finding(
        "verified_differs",
        "error",
        side=td.side,
        slot=vs.first_slot,
        **td.at(first),
        message=(
            f"{td.side}: the target verified other ids than the drafter proposed in "
            f"{int(bad.sum())} of {int((nv >= 0).sum())} blocks, mostly slot {worst} "
            f"({int(per_slot[worst])} blocks){note}"
        ),
        evidence=VerifiedEvidence(
            blocks=int(bad.sum()),
            per_slot=per_slot.tolist(),
            equals_anchor=equals_anchor,
            placeholders=placeholder,
            trimmed_blocks=int(trimmed.sum()),
            example=VerifiedExample(
                proposed=tok(dec, row(td.t, "proposed", first)[: b.k[first]]),
                verified=tok(dec, row(td.t, "verified", first)[: max(nv[first], 0)]),
            ),
        ),
    )


def constant_rate(td: TraceData) -> tuple[np.ndarray, np.ndarray]:
    """Blocks (k >= 2) whose proposed ids are all equal: ``(mask, eligible)``, bool [n]
    each (memoised in the trace's cache)."""
    return memo(td.t, "constant_rate", lambda: _constant_rate(td))


def _constant_rate(td: TraceData) -> tuple[np.ndarray, np.ndarray]:
    return sweep(td.t).constant, td.t.blocks.k >= 2


def _constant_both(td: TraceData, rate: float, ref_rate: float, first: int, dec) -> Finding | None:
    """Both sides hold one id across slots: no difference between the engines, but still
    worth a look (or the output loops on both). Reported once, from our side."""
    if td.side != "ours":
        return None
    const, elig = constant_rate(td)
    return Finding(
        "constant_drafts",
        "warning",
        side="both",
        slot=1,
        **td.at(first),
        message=(
            f"both engines hold one id in every slot in most blocks (ours "
            f"{pct(rate, 0)}, theirs {pct(ref_rate, 0)}): not a difference between "
            f"them, but either both drafters copy the step-0 draft across depth "
            f"or the output repeats one token (see degenerate_output)"
        ),
        evidence=ConstantEvidence(
            blocks=int(const.sum()),
            eligible=int(elig.sum()),
            rate=float(rate),
            reference_rate=float(ref_rate),
            example=tok(dec, row(td.t, "proposed", first)[: td.t.blocks.k[first]]),
        ),
    )


def constant_drafts(s: SideInput) -> Finding | None:
    """constant_drafts: one id repeated across every slot in most blocks (vs the reference,
    when ``s.ref`` is given: it reads the reference's :func:`constant_rate` memo)."""
    td, ref, dec = s.td, s.ref, s.decoder
    const, elig = constant_rate(td)
    if elig.sum() < MIN_BLOCKS:
        return None
    rate = const.sum() / elig.sum()
    if rate < SYSTEMATIC:
        return None
    first = int(np.flatnonzero(const)[0])
    ref_rate = None
    if ref is not None:
        rc, re_ = constant_rate(ref)
        ref_rate = rc.sum() / re_.sum() if re_.sum() else 0.0
        if rate < 3 * ref_rate:
            return _constant_both(td, rate, ref_rate, first, dec)
    b = td.t.blocks
    ref_txt = f" (reference: {pct(ref_rate, 0)})" if ref_rate is not None else ""
    return Finding(
        "constant_drafts",
        "error",
        side=td.side,
        slot=1,
        **td.at(first),
        message=(
            f"{td.side}: every slot holds the same id in {int(const.sum())} of "
            f"{int(elig.sum())} blocks ({pct(rate, 0)}){ref_txt}: the step-0 draft is "
            f"copied across depth, or the blocks are placeholders"
        ),
        evidence=ConstantEvidence(
            blocks=int(const.sum()),
            eligible=int(elig.sum()),
            rate=float(rate),
            reference_rate=None if ref_rate is None else float(ref_rate),
            example=tok(dec, row(td.t, "proposed", first)[: b.k[first]]),
        ),
    )


def bookkeeping(s: SideInput) -> Finding | None:
    """acceptance_bookkeeping: recorded accepted counts disagree with the emitted stream."""
    td = s.td
    b = td.t.blocks
    n = len(b)
    known, bad, bad_emit = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool)
    for c in chunks(n):
        rec, rc = b.accepted[c].astype(np.int64), td.recomputed[c]
        known[c] = (rec >= 0) & (rc >= 0)
        # Where the recorded emission runs past the end of the stored output (trimmed at
        # max_tokens or a stop), the recomputed count can only undercount, and only if it
        # ran to that end: a draft the output contradicts inside it is no trimming. With the
        # output unknown, only a request's last block may be so trimmed.
        length, first = td.length[b.request[c]], b.position[c].astype(np.int64) + 1
        trimmed = np.where(length > 0, first + rec >= length, td.last[c])
        short = trimmed & (rc < rec) & ((length == 0) | (first + rc >= length))
        ne = b.num_emitted[c]
        bad_emit[c] = (ne >= 0) & (rec >= 0) & (ne != rec + 1) & ~trimmed
        bad[c] = (known[c] & (rc != rec) & ~short) | bad_emit[c]
    sw = sweep(td.t)
    off = sw.emitted_off  # emitted ids the output contradicts
    counts_bad, bad_ids = bad, off if off is not None else np.zeros(n, bool)
    bad = counts_bad | bad_ids
    lines, first_line = import_bookkeeping(td.t)
    if not bad.any() and not lines:
        return None
    rec, rc = b.accepted.astype(np.int64), td.recomputed.astype(np.int64)
    both = counts_bad & known  # the disagreeing blocks whose two counts are known
    ev = BookkeepingEvidence(
        blocks=int(bad.sum()),
        recorded_total=int(rec[known].sum()),
        recomputed_total=int(rc[known].sum()),
        recorded_disagreeing=int(rec[both].sum()),
        recomputed_disagreeing=int(rc[both].sum()),
        emitted_count_mismatch=int(bad_emit.sum()),
    )
    if bad_ids.any():
        ev["emitted_ids_mismatch"] = int(bad_ids.sum())
    reemitted = sw.rejected_emitted if counts_bad.any() else 0
    if reemitted:
        ev["rejected_draft_emitted"] = reemitted
    if lines:
        ev["import_lines"], ev["first_line"] = lines, first_line or "?"
    if not bad.any():  # the import's lines say what its blocks no longer show
        return _bookkeeping_lines(td, ev)
    first = int(np.flatnonzero(bad)[0])
    ev["first"] = AcceptedPair(recorded=int(rec[first]), recomputed=int(rc[first]))
    ids = _emitted_ids_words(int(bad_ids.sum()), bool(counts_bad.any()))
    if not counts_bad.any():
        message = f"{td.side}: {ids}"
    else:
        n_bad, n_both = int(counts_bad.sum()), int(both.sum())
        those = (
            ("that block" if n_bad == 1 else "those blocks")
            if n_both == n_bad
            else f"the {n_both} of them with both counts"
        )
        message = (
            f"{td.side}: the recorded accepted count disagrees with the emitted stream in "
            f"{n_bad} of {int(known.sum())} blocks (recorded {ev['recorded_disagreeing']}, "
            f"recomputed {ev['recomputed_disagreeing']} accepted tokens in {those})"
            + (f"; {ids}" if bad_ids.any() else "")
            + (f"; {_reemitted_words(reemitted)}" if reemitted else "")
        )
    return Finding(
        "acceptance_bookkeeping", "error", side=td.side, **td.at(first), message=message,
        evidence=ev,
    )  # fmt: skip


def _reemitted_words(n: int) -> str:
    """The rejected-draft clause of acceptance_bookkeeping (``n`` blocks)."""
    return (
        f"{n} block{'s' if n != 1 else ''} emit{'s' if n == 1 else ''} the rejected draft "
        f"itself as the correction, which neither greedy verification nor exact rejection "
        f"sampling does (vLLM's sample_recovered_tokens masks the draft): the engine's "
        f"sampler, not its count, is the likely defect"
    )


def _emitted_ids_words(n: int, counts_too: bool) -> str:
    """The emitted-ids clause of acceptance_bookkeeping (``n`` blocks)."""
    what = f"{n} block{'s' if n != 1 else ''} emit{'s' if n == 1 else ''} ids"
    tail = (
        ""
        if counts_too
        else ": the recorded emission is not the output (a row joined to another request's tokens?)"
    )
    return f"{what} that the output does not hold at their positions{tail}"


def _bookkeeping_lines(td: TraceData, ev: BookkeepingEvidence) -> Finding:
    """acceptance_bookkeeping from the VT import's counts alone (``ev``'s ``import_lines``):
    lines whose accepted count disagrees with their own emitted ids (an ``emit != draft``
    line keeps a plausible count; its emitted ids are what contradicts it)."""
    lines = ev["import_lines"]
    n = sum(lines.values())
    kinds = ", ".join(f"{k}: {v}" for k, v in lines.items())
    return Finding(
        "acceptance_bookkeeping",
        "error",
        side=td.side,
        message=(
            f"{td.side}: the VT import read {n} line{'s' if n > 1 else ''} whose accepted "
            f"count disagrees with its emitted ids ({kinds}; first: {ev['first_line']}): "
            f"the recorded acceptance is not what the engine emitted"
        ),
        evidence=ev,
    )


def _vocab_size(s: SideInput) -> int | None:
    """The target vocabulary size: /meta ``vocab_size``, else the tokenizer's (when a
    tokenizer is given), else None (unknown: ids are not range-checked)."""
    vocab = s.td.t.meta.get("vocab_size")
    if isinstance(vocab, int) and not isinstance(vocab, bool) and vocab > 0:
        return vocab
    return s.decoder.vocab_size if s.decoder is not None else None


def vocab_range(s: SideInput) -> Finding | None:
    """vocab_mapping within a trace: proposed ids (of the k live slots) outside the
    vocabulary (any one block; the size from :func:`_vocab_size`), or, in at least
    :data:`~.thresholds.MIN_BLOCKS` blocks, all bunched below the draft vocabulary size
    (d2t not applied)."""
    td = s.td
    b = td.t.blocks
    meta = td.t.meta
    if not len(b):
        return None
    vocab = _vocab_size(s)
    dvs = meta.get("draft_vocab_size")
    max_id = sweep(td.t).max_id  # the -1 pad never raises the max
    out = _out_of_vocab(td, vocab) if vocab and max_id >= vocab else None
    if vocab and out is not None:
        nbad, first, slot = out
        return Finding(
            "vocab_mapping",
            "error",
            side=td.side,
            **td.at(first),
            slot=slot,
            message=(
                f"{td.side}: {nbad} proposed ids lie outside the "
                f"target vocabulary of {vocab} ids (ids out of range, up to {max_id})"
            ),
            evidence=VocabEvidence(ids=nbad, vocab_size=vocab, max_id=max_id),
        )
    if len(b) < MIN_BLOCKS:
        return None
    if dvs and vocab and dvs < vocab and meta.get("d2t") and max_id < dvs:
        return Finding(
            "vocab_mapping",
            "error",
            side=td.side,
            **td.at(0),
            message=(
                f"{td.side}: every proposed id is below the draft vocabulary "
                f"size {dvs} although a d2t mapping exists: the mapping to "
                f"target ids was not applied"
            ),
            evidence=VocabEvidence(draft_vocab_size=dvs, max_id=max_id),
        )
    return None


def _out_of_vocab(td: TraceData, vocab: int) -> tuple[int, int, int] | None:
    """Live proposed ids (slots < k) at or above ``vocab``: ``(ids, first block, its first
    such slot)``, or None (a pass of its own: only a trace whose largest id is out of range
    takes it). Negative ids are placeholders (-1) or impossible values: not a vocabulary
    problem."""
    k = td.t.blocks.k
    nbad, first = 0, None
    for c, cols in row_chunks(td.t, ("proposed",)):
        p = cols["proposed"]
        bad = (np.arange(p.shape[1]) < k[c][:, None]) & (p >= vocab)
        nbad += int(bad.sum())
        rows = np.flatnonzero(bad.any(axis=1))
        if first is None and len(rows):
            first = (c.start + int(rows[0]), int(np.flatnonzero(bad[rows[0]])[0]))
    return None if first is None else (nbad, *first)
