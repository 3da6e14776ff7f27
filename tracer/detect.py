"""Detectors: turn one trace, or an alignment of two, into typed findings.

Each detector recognises one class of ``shared/reference/spec_decode_bugs.md`` by its
signature, generally (any shift size, any constant offset or id permutation, any slot), and
returns at most one :class:`~spectrace.tracer.findings.Finding` pointing at the first block
where it shows. Thresholds are module constants, each with the reason for its value.
Everything is vectorised over block columns, in chunks of rows (:data:`parallel.CHUNK`) so
temporaries stay small; per-request Python loops only touch request tables (thousands of
rows, not millions). Each side's own checks run on a thread of their own (numpy releases the
GIL), as does each side's preparation.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .align import NO_DIVERGENCE, Alignment
from . import schema
from .findings import Finding, sort_findings
from .index import block_order, drafts_checked, memo, sequence_index
from .metrics import recompute_accepted
from .parallel import chunks, in_parallel
from .store import Trace
from .tokens import Decoder, show

#: A loop is a repeating tail of at least this many tokens (and 3 periods): shorter repeats
#: occur in healthy code and prose (indentation, closing brackets).
LOOP_MIN_TOKENS = 24
LOOP_MAX_PERIOD = 32
#: A pattern must hold in this share of the blocks it is measured on to be called systematic.
SYSTEMATIC = 0.5
#: Fewest blocks a rate-based verdict is drawn from.
MIN_BLOCKS = 3
#: Below this share, proposal mismatches are reported as a warning (possible numerical ties).
MISMATCH_ERROR_RATE = 0.02


@dataclass
class TraceData:
    """Per-trace columns the detectors share (computed once, vectorised).

    Attributes:
        t: the trace; side: ``ours`` | ``theirs``.
        ids, nchecked: drafts the target checked (int32 [n, w]) and their count [n].
        recomputed: int16 [n] accepted recomputed from the output (-1 unknown).
        order: int64 [n] block indices sorted by (request, position).
        last: bool [n] block is its request's last; prev: int64 [n] previous block of the
            same request (-1 for the first).
        flat, start, length: concatenated full sequences (see index.sequence_index).
    """

    t: Trace
    side: str
    ids: np.ndarray
    nchecked: np.ndarray
    recomputed: np.ndarray
    order: np.ndarray
    last: np.ndarray
    prev: np.ndarray
    flat: np.ndarray
    start: np.ndarray
    length: np.ndarray

    @classmethod
    def build(cls, t: Trace, side: str) -> TraceData:
        """Build (once per trace and side; memoised in ``t.cache``)."""
        return memo(t, f"TraceData.{side}", lambda: cls._build(t, side))

    #: Block columns the detectors read (:func:`prepare` reads them up front).
    COLUMNS = ("request", "position", "anchor", "k", "proposed", "num_verified", "verified",
               "accepted", "num_emitted", "batch_row", "batch_size")

    @classmethod
    def _build(cls, t: Trace, side: str) -> TraceData:
        b = t.blocks
        order = block_order(t)[0]
        n = len(order)
        last, prev = np.zeros(n, bool), np.full(n, -1, np.int64)
        if n:
            rs = b.request[order]
            same = rs[1:] == rs[:-1]  # order[i + 1] continues order[i]'s request
            last[order[:-1][~same]] = True
            last[order[-1]] = True
            prev[order[1:][same]] = order[:-1][same]
        ids, nchecked = drafts_checked(t)
        flat, start, length = sequence_index(t)
        return cls(t, side, ids, nchecked, recompute_accepted(t), order, last, prev,
                   flat, start, length)

    def req_id(self, block: int) -> str:
        """Request id of block row ``block``."""
        return self.t.requests.req_id[int(self.t.blocks.request[block])]

    def at(self, block: int) -> dict:
        """Location fields of a finding at ``block``."""
        return {"request": self.req_id(block), "position": int(self.t.blocks.position[block])}


def _tok(dec: Decoder | None, ids) -> list:
    """Example ids, with decoded text when a tokenizer is known."""
    ids = [int(i) for i in ids]
    return ids if dec is None else [f"{i}:{show(dec.token(i))}" for i in ids]


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


# ----------------------------------------------------------------------------------------------
# Single-trace detectors
# ----------------------------------------------------------------------------------------------


def find_loop(ids: np.ndarray) -> tuple[int, int] | None:
    """Find a repetition loop at the end of an output.

    Args:
        ids: int [n] output ids.
    Returns:
        ``(start, period)`` of the shortest-period repeating tail of at least
        ``max(LOOP_MIN_TOKENS, 3 * period)`` tokens, or None.
    """
    n = len(ids)
    for p in range(1, min(LOOP_MAX_PERIOD, n // 3) + 1):
        eq = ids[p:] == ids[:-p]
        if not eq[-1]:
            continue
        breaks = np.flatnonzero(~eq)
        run = len(eq) - (breaks[-1] + 1 if len(breaks) else 0)
        if run + p >= max(LOOP_MIN_TOKENS, 3 * p):
            return int(n - (run + p)), p
    return None


def loop_candidates(td: TraceData) -> np.ndarray:
    """Requests whose output tail is periodic over the length :func:`find_loop` demands for
    some period (a necessary condition, tested for all requests at once per period).

    Returns:
        int64 request indices, ascending.
    """
    r = td.t.requests
    out_len = np.fromiter((len(o) for o in r.output_ids), np.int64, len(r))
    end = td.start + td.length - 1  # last output token in td.flat
    cand = np.zeros(len(r), bool)
    for p in range(1, LOOP_MAX_PERIOD + 1):
        need = max(LOOP_MIN_TOKENS, 3 * p)  # tail tokens a loop of period p covers
        idx = np.flatnonzero((out_len >= need) & (td.length > 0) & ~cand)
        idx = idx[td.flat[end[idx]] == td.flat[end[idx] - p]]
        if len(idx):
            tail = end[idx, None] - np.arange(need - p)
            cand[idx[(td.flat[tail] == td.flat[tail - p]).all(axis=1)]] = True
    return np.flatnonzero(cand)


def degenerate(td: TraceData, dec: Decoder | None) -> list[tuple[int, int, int]]:
    """Requests whose output ends in a loop: list of ``(request, loop_start_pos, period)``."""
    r = td.t.requests
    out = []
    for i in loop_candidates(td).tolist():
        loop = find_loop(r.output_ids[i])
        if loop:
            out.append((i, int(len(r.prompt_ids[i]) + loop[0]), int(loop[1])))
    return out


def degenerate_finding(td: TraceData, loops: list, dec: Decoder | None,
                       severity: str, why: str) -> Finding | None:
    """The degenerate_output finding for ``loops`` (list of (request, loop start position, period)) at ``severity``, or None when there are none."""
    if not loops:
        return None
    r = td.t.requests
    i, start, period = loops[0]
    seq = r.full_sequence(i)
    unit = seq[start:start + period]
    text = f" {show(dec.text(unit))!r}" if dec else ""
    looped = sum(len(r.full_sequence(j)) - s for j, s, _ in loops)
    return Finding(
        "degenerate_output", severity, side=td.side, request=r.req_id[i], position=start,
        message=(f"{td.side} output degenerates into a loop in {len(loops)} of {len(r)} "
                 f"requests (first: request {r.req_id[i]} from position {start}, period "
                 f"{period}{text}); {why}"),
        evidence={"requests": len(loops), "looped_tokens": int(looped), "period": period,
                  "loop_start": start, "unit": _tok(dec, unit),
                  "loops": [{"request": r.req_id[j], "start": s, "period": p}
                            for j, s, p in loops[:10]]})


def _token_at(td: TraceData, req: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """int64 [n] the token of request ``req`` at position ``pos`` (-1 outside the sequence)."""
    length = td.length[req]
    ok = (pos >= 0) & (pos < length)
    out = np.full(len(req), -1, np.int64)
    out[ok] = td.flat[td.start[req[ok]] + pos[ok]]
    return out


def anchor_consistency(td: TraceData) -> Finding | None:
    """anchor_shift within a trace: the recorded anchor is not the sequence at its position."""
    b = td.t.blocks
    n = len(b)
    known, bad = np.zeros(n, bool), np.zeros(n, bool)
    for c in chunks(n):
        req, anchor, pos = b.request[c], b.anchor[c], b.position[c].astype(np.int64)
        known[c] = (anchor >= 0) & (pos >= 0) & (pos < td.length[req])
        bad[c] = known[c] & (_token_at(td, req, pos) != anchor)
    nknown, nbad = int(known.sum()), int(bad.sum())
    if nknown < MIN_BLOCKS or nbad < SYSTEMATIC * nknown or nbad < MIN_BLOCKS:
        return None
    # Which neighbouring position holds the recorded anchor, over the bad blocks only.
    idx = np.flatnonzero(bad)
    req, pos, anchor = b.request[idx], b.position[idx].astype(np.int64), b.anchor[idx]
    shifts = {s: float((_token_at(td, req, pos + s) == anchor).mean())
              for s in range(-4, 5) if s != 0}
    best = max(shifts, key=shifts.get)
    first = int(idx[0])
    shift_txt = (f"; the anchor is the token at position{best:+d} in {_pct(shifts[best])}"
                 if shifts[best] >= SYSTEMATIC else "")
    return Finding(
        "anchor_shift", "error", side=td.side, **td.at(first),
        message=(f"{td.side}: the recorded anchor is not the sequence's token at the anchor "
                 f"position in {nbad} of {nknown} blocks{shift_txt}"),
        evidence={"blocks": nbad, "checked": nknown,
                  "shift": best if shifts[best] >= SYSTEMATIC else None,
                  "shift_rates": {str(k): v for k, v in shifts.items()}})


def verified_vs_proposed(td: TraceData, dec: Decoder | None) -> Finding | None:
    """verified_differs: what the target consumed is not what the drafter produced."""
    b = td.t.blocks
    if b.verified is b.proposed or (b.proposed.shape == b.verified.shape
                                    and np.array_equal(b.proposed, b.verified)):
        return None  # the common case: the store said so, or one pass
    nv = b.num_verified.astype(np.int64)
    w = min(b.proposed.shape[1], b.verified.shape[1])
    slots = np.arange(w)
    live = (slots < np.minimum(nv, b.k)[:, None]) & (nv >= 0)[:, None]
    diff = live & (b.proposed[:, :w] != b.verified[:, :w])
    bad = diff.any(axis=1)
    trimmed = (nv >= 0) & (nv < b.k)
    if not bad.any():
        return None
    first = int(np.flatnonzero(bad)[0])
    per_slot = diff.sum(axis=0)
    worst = int(per_slot.argmax())
    vals = b.verified[:, :w][diff]
    anchors = np.broadcast_to(b.anchor[:, None], diff.shape)[diff]
    equals_anchor = float((vals == anchors).mean())
    placeholder = float((vals < 0).mean())
    note = ""
    if equals_anchor >= SYSTEMATIC:
        note = (f"; the verified value equals the block's anchor (the previous emitted token) "
                f"in {_pct(equals_anchor)}")
    elif placeholder >= SYSTEMATIC:
        note = f"; {_pct(placeholder)} of them are placeholder ids (-1)"
    j = int(np.flatnonzero(diff[first])[0])
    return Finding(
        "verified_differs", "error", side=td.side, slot=j, **td.at(first),
        message=(f"{td.side}: the target verified other ids than the drafter proposed in "
                 f"{int(bad.sum())} of {int((nv >= 0).sum())} blocks, mostly slot {worst} "
                 f"({int(per_slot[worst])} blocks){note}"),
        evidence={"blocks": int(bad.sum()), "per_slot": per_slot.tolist(),
                  "equals_anchor": equals_anchor, "placeholders": placeholder,
                  "trimmed_blocks": int(trimmed.sum()),
                  "example": {"proposed": _tok(dec, b.proposed[first, :b.k[first]]),
                              "verified": _tok(dec, b.verified[first, :max(nv[first], 0)])}})


def constant_rate(td: TraceData) -> tuple[np.ndarray, np.ndarray]:
    """Blocks (k >= 2) whose proposed ids are all equal: (mask [n], eligible [n])."""
    return memo(td.t, "constant_rate", lambda: _constant_rate(td))


def _constant_rate(td: TraceData) -> tuple[np.ndarray, np.ndarray]:
    b = td.t.blocks
    p, k = b.proposed, b.k
    elig = k >= 2
    const = elig.copy()
    for c in chunks(len(k)):
        pc, kc, out = p[c], k[c], const[c]
        for j in range(1, p.shape[1]):
            out &= (pc[:, j] == pc[:, 0]) | (kc <= j)  # padded slots count as equal
    return const, elig


def constant_drafts(td: TraceData, ref: TraceData | None, dec: Decoder | None) -> Finding | None:
    """constant_drafts: one id repeated across every slot in most blocks (vs the reference)."""
    const, elig = constant_rate(td)
    if elig.sum() < MIN_BLOCKS:
        return None
    rate = const.sum() / elig.sum()
    ref_rate = None
    if rate < SYSTEMATIC:
        return None
    first = int(np.flatnonzero(const)[0])
    if ref is not None:
        rc, re_ = constant_rate(ref)
        ref_rate = rc.sum() / re_.sum() if re_.sum() else 0.0
        if rate < 3 * ref_rate:
            # Both sides: no difference between the engines, but still worth a look (or the
            # output loops on both). Reported once, from our side.
            if td.side != "ours":
                return None
            return Finding(
                "constant_drafts", "warning", side="both", slot=1, **td.at(first),
                message=(f"both engines hold one id in every slot in most blocks (ours "
                         f"{_pct(rate)}, theirs {_pct(ref_rate)}): not a difference between "
                         f"them, but either both drafters copy the step-0 draft across depth "
                         f"or the output repeats one token (see degenerate_output)"),
                evidence={"blocks": int(const.sum()), "eligible": int(elig.sum()),
                          "rate": float(rate), "reference_rate": float(ref_rate),
                          "example": _tok(dec, td.t.blocks.proposed[first, :td.t.blocks.k[first]])})
    b = td.t.blocks
    ref_txt = f" (reference: {_pct(ref_rate)})" if ref_rate is not None else ""
    return Finding(
        "constant_drafts", "error", side=td.side, slot=1, **td.at(first),
        message=(f"{td.side}: every slot holds the same id in {int(const.sum())} of "
                 f"{int(elig.sum())} blocks ({_pct(rate)}){ref_txt}: the step-0 draft is "
                 f"copied across depth, or the blocks are placeholders"),
        evidence={"blocks": int(const.sum()), "eligible": int(elig.sum()), "rate": float(rate),
                  "reference_rate": None if ref_rate is None else float(ref_rate),
                  "example": _tok(dec, b.proposed[first, :b.k[first]])})


def skipped_anchors(td: TraceData, ref: TraceData, al: Alignment, side_a: bool) -> np.ndarray:
    """Blocks of ``td`` that follow a gap: the engine emitted up to anchor position q without
    drafting from q, although ``ref`` drafted from q on matched content.

    Returns:
        int64 block indices (the block after each such gap).
    """
    b = td.t.blocks
    pob = al.pair_of_block_a if side_a else al.pair_of_block_b
    rpob = al.pair_of_block_b if side_a else al.pair_of_block_a
    rcomp = al.comparable_b if side_a else al.comparable_a
    gaps, exp = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for c in chunks(len(b)):
        pv = td.prev[c]
        has = pv >= 0
        pv = np.maximum(pv, 0)
        acc = b.accepted[pv]
        expected = b.position[pv].astype(np.int64) + acc + 1
        gap = np.flatnonzero(has & (acc >= 0) & (b.position[c] > expected) & (pob[c] >= 0))
        gaps.append(gap + c.start)
        exp.append(expected[gap])
    idx, expected = np.concatenate(gaps), np.concatenate(exp)
    if not len(idx):
        return idx
    stride = int(max(b.position.max(initial=0), ref.t.blocks.position.max(initial=0),
                     expected.max())) + 2
    want = pob[idx] * stride + expected
    have = rpob[rcomp] * stride + ref.t.blocks.position[rcomp].astype(np.int64)
    return idx[np.isin(want, have)]


def unverified(td: TraceData, skipped: np.ndarray | None = None) -> Finding | None:
    """unverified_drafts: proposals without a verify record, requests whose blocks stop, or
    (with ``skipped`` from :func:`skipped_anchors`) anchors the reference drafted from and
    this engine silently skipped."""
    b = td.t.blocks
    none = (b.num_verified < 0) & (b.accepted < 0)
    # The last proposal of a request is legitimately never verified (the request finished).
    bad = none & ~td.last
    req = b.request.astype(np.int64)
    stops = []
    kmax = int(b.k.max(initial=0))
    for blk in np.flatnonzero(td.last):
        r = req[blk]
        if td.length[r] and b.position[blk] + 1 + kmax + 1 < td.length[r] - 1:
            stops.append(int(blk))
    skipped = np.zeros(0, np.int64) if skipped is None else skipped
    if not bad.any() and len(stops) < 1 and len(skipped) < MIN_BLOCKS:
        return None
    if len(skipped) >= MIN_BLOCKS and not bad.any() and not stops:
        first = int(skipped[0])
        msg = (f"{td.side}: {len(skipped)} times a request went on without drafting from an "
               f"anchor the other engine drafted from (first: request {td.req_id(first)} "
               f"before position {int(b.position[first])}): drafts dropped before "
               f"verification")
    elif bad.any():
        first = int(np.flatnonzero(bad)[0])
        msg = (f"{td.side}: {int(bad.sum())} of {len(bad)} draft blocks were proposed but "
               f"never verified")
    else:
        first = stops[0]
        msg = (f"{td.side}: {len(stops)} requests stop proposing long before their output "
               f"ends (first: request {td.req_id(first)} after position "
               f"{int(b.position[first])})")
    return Finding("unverified_drafts", "error", side=td.side, **td.at(first), message=msg,
                   evidence={"unverified_blocks": int(bad.sum()), "requests_stopping":
                             [td.req_id(s) for s in stops[:10]],
                             "skipped_anchors": int(len(skipped))})


def bookkeeping(td: TraceData) -> Finding | None:
    """acceptance_bookkeeping: recorded accepted counts disagree with the emitted stream."""
    b = td.t.blocks
    n = len(b)
    known, bad, bad_emit = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool)
    for c in chunks(n):
        rec, rc = b.accepted[c].astype(np.int64), td.recomputed[c]
        known[c] = (rec >= 0) & (rc >= 0)
        # Where the recorded emission runs past the end of the stored output (trimmed at
        # max_tokens or a stop), the recomputed count can only undercount.
        trimmed = b.position[c] + 1 + rec >= td.length[b.request[c]]
        ne = b.num_emitted[c]
        bad_emit[c] = (ne >= 0) & (rec >= 0) & (ne != rec + 1) & ~trimmed
        bad[c] = (known[c] & (rc != rec) & ~(trimmed & (rc < rec))) | bad_emit[c]
    if not bad.any():
        return None
    rec, rc = b.accepted.astype(np.int64), td.recomputed.astype(np.int64)
    first = int(np.flatnonzero(bad)[0])
    return Finding(
        "acceptance_bookkeeping", "error", side=td.side, **td.at(first),
        message=(f"{td.side}: the recorded accepted count disagrees with the emitted stream in "
                 f"{int(bad.sum())} of {int(known.sum())} blocks (recorded "
                 f"{int(rec[known].sum())}, recomputed {int(rc[known].sum())} accepted tokens)"),
        evidence={"blocks": int(bad.sum()), "recorded_total": int(rec[known].sum()),
                  "recomputed_total": int(rc[known].sum()),
                  "emitted_count_mismatch": int(bad_emit.sum()),
                  "first": {"recorded": int(rec[first]), "recomputed": int(rc[first])}})


def vocab_range(td: TraceData) -> Finding | None:
    """vocab_mapping within a trace: ids outside the vocabulary or bunched below the draft
    vocabulary size (d2t not applied)."""
    b = td.t.blocks
    meta = td.t.meta
    if len(b) < MIN_BLOCKS:
        return None
    vocab = meta.get("vocab_size")
    dvs = meta.get("draft_vocab_size")
    max_id = int(b.proposed.max(initial=-1))  # the -1 pad never raises the max
    # Negative ids are placeholders (-1, elided ids): not a vocabulary problem.
    if vocab and max_id >= vocab:
        live = np.arange(b.proposed.shape[1]) < b.k[:, None]
        bad = live & (b.proposed >= vocab)
        first = int(np.flatnonzero(bad.any(axis=1))[0])
        return Finding("vocab_mapping", "error", side=td.side, **td.at(first),
                       slot=int(np.flatnonzero(bad[first])[0]),
                       message=(f"{td.side}: {int(bad.sum())} proposed ids lie outside the "
                                f"target vocabulary of {vocab} ids (up to {max_id})"),
                       evidence={"ids": int(bad.sum()), "vocab_size": vocab,
                                 "max_id": max_id})
    if dvs and vocab and dvs < vocab and meta.get("d2t") and max_id < dvs:
        return Finding("vocab_mapping", "error", side=td.side, **td.at(0),
                       message=(f"{td.side}: every proposed id is below the draft vocabulary "
                                f"size {dvs} although a d2t mapping exists: the mapping to "
                                f"target ids was not applied"),
                       evidence={"draft_vocab_size": dvs, "max_id": max_id})
    return None


def check_trace(t: Trace, decoder: Decoder | None = None, side: str = "ours") -> list[Finding]:
    """Single-trace findings (``spectrace check``): degenerate output, constant drafts,
    unverified drafts, bookkeeping, vocabulary range, verified vs proposed, anchors.

    Returns:
        Findings, most severe first.
    """
    td = TraceData.build(t, side)
    loops = degenerate(td, decoder)
    found = [
        degenerate_finding(td, loops, decoder, "warning",
                           "acceptance measured on a loop is inflated and not comparable"),
        anchor_consistency(td), verified_vs_proposed(td, decoder),
        constant_drafts(td, None, decoder), unverified(td), bookkeeping(td), vocab_range(td),
    ]
    return sort_findings([f for f in found if f is not None])


# ----------------------------------------------------------------------------------------------
# Pair detectors
# ----------------------------------------------------------------------------------------------


@dataclass
class PairData:
    """Paired-block arrays shared by the pair detectors.

    Attributes:
        ka, kb: int64 [P] proposal lengths (ours, theirs).
        eq: bool [P, w] slot equal (and present on both sides); ``eq_count``,
            ``both_count``: int64 [w] per-slot counts of equal / present on both sides.
        exact: bool [P]; anchor_eq: bool [P].
        both: bool [P, w] slot present on both sides; pa, pb: int32 [P, w] paired
            proposals (-1 padded); these three are built on first use: most detectors
            decide from the counts alone.
    """

    al: Alignment
    oa: TraceData
    ob: TraceData
    ka: np.ndarray
    kb: np.ndarray
    eq: np.ndarray
    exact: np.ndarray
    anchor_eq: np.ndarray
    eq_count: np.ndarray
    both_count: np.ndarray
    #: bool [P]: our proposal is the drafter's own output, or nothing says otherwise. False
    #: for blocks whose "proposal" only copies verified ids when verified ids are corrupted.
    trusted: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.trusted is None:
            self.trusted = np.ones(len(self.exact), bool)

    @functools.cached_property
    def both(self) -> np.ndarray:
        """bool [P, w]: slot j present on both sides."""
        return np.arange(self.eq.shape[1]) < np.minimum(self.ka, self.kb)[:, None]

    @functools.cached_property
    def pa(self) -> np.ndarray:
        """int32 [P, w] our paired proposals."""
        return schema.pad_to(self.al.a.blocks.proposed[self.al.ia], self.eq.shape[1])

    @functools.cached_property
    def pb(self) -> np.ndarray:
        """int32 [P, w] their paired proposals."""
        return schema.pad_to(self.al.b.blocks.proposed[self.al.ib], self.eq.shape[1])

    def example(self, x: int, dec: Decoder | None) -> dict:
        """Both proposals of paired block ``x`` (ids, decoded when ``dec`` is given)."""
        a, b = int(self.al.ia[x]), int(self.al.ib[x])
        return {"ours": _tok(dec, self.al.a.blocks.proposed[a, :self.ka[x]]),
                "theirs": _tok(dec, self.al.b.blocks.proposed[b, :self.kb[x]])}

    def at(self, x: int) -> dict:
        """Location fields (request, position) of paired block ``x`` on our side."""
        return self.oa.at(int(self.al.ia[x]))


def shift_rates(pa, pb, ka, kb, max_shift: int) -> dict[int, tuple[float, int]]:
    """Slot-shift agreement: for s != 0, share of slot pairs with ours[i] == theirs[i+s].

    Returns:
        ``{s: (rate, slot_pairs)}`` for s in ±1..±max_shift (rate 0 where no slot pairs).
    """
    out = {}
    w = pa.shape[1]
    for s in range(-max_shift, max_shift + 1):
        if s == 0 or abs(s) >= w:
            continue
        i = np.arange(max(0, -s), min(w, w - s))
        ok = (i[None, :] < ka[:, None]) & ((i + s)[None, :] < kb[:, None])
        hit = ok & (pa[:, i] == pb[:, i + s])
        n = int(ok.sum())
        out[s] = (float(hit.sum() / n) if n else 0.0, n)
    return out


def layout_shift(pd: PairData, dec: Decoder | None) -> Finding | None:
    """layout_shift: ours[i] == theirs[i+s] for most slots while ours[i] == theirs[i] is rare."""
    P = len(pd.exact)
    if P < MIN_BLOCKS:
        return None
    w = pd.eq.shape[1]
    base = float(pd.eq_count.sum() / max(pd.both_count.sum(), 1))
    if base >= 0.45:  # no shift can then reach 2 x base + 0.05 while ours[i] == theirs[i]
        return None
    # A block of one repeated id "agrees" with any shift: leave those to constant_drafts.
    varied = ~(constant_rate(pd.oa)[0][pd.al.ia] | constant_rate(pd.ob)[0][pd.al.ib])
    if varied.sum() < MIN_BLOCKS:
        return None
    # Shifts up to the block length, keeping at least two slot pairs per block.
    rates = shift_rates(pd.pa[varied], pd.pb[varied], pd.ka[varied], pd.kb[varied],
                        max(1, w - 2))
    if not rates:
        return None
    s = max(rates, key=lambda x: rates[x][0])
    rate, n = rates[s]
    if rate < 0.6 or rate < 2 * base + 0.05:
        return None
    i = np.arange(max(0, -s), min(w, w - s))
    hold = (pd.pa[:, i] == pd.pb[:, i + s]).all(axis=1) & ~pd.exact & varied
    first = int(np.flatnonzero(hold)[0]) if hold.any() else int(np.flatnonzero(varied)[0])
    rel = f"ours[i] equals theirs[i{s:+d}]"
    return Finding(
        "layout_shift", "error", side="ours", slot=0, **pd.at(first),
        message=(f"draft layout shifted by {abs(s)} slot{'s' if abs(s) > 1 else ''}: {rel} in "
                 f"{_pct(rate)} of {n} slot pairs over {P} paired blocks, while ours[i] equals "
                 f"theirs[i] in {_pct(base)} (the N vs 1+N anchor layout, sample_from_anchor)"),
        evidence={"shift": s, "rate": rate, "slot_pairs": n, "same_slot_rate": base,
                  "paired_blocks": P, "rates": {str(k): v[0] for k, v in rates.items()},
                  "example": pd.example(first, dec)})


def anchor_pairs(pd: PairData, dec: Decoder | None) -> Finding | None:
    """anchor_shift across traces: anchors differ at the same position on matched content."""
    known = (pd.oa.t.blocks.anchor[pd.al.ia] >= 0) & (pd.ob.t.blocks.anchor[pd.al.ib] >= 0)
    bad = known & ~pd.anchor_eq
    if known.sum() < MIN_BLOCKS or bad.sum() < SYSTEMATIC * known.sum():
        return None
    first = int(np.flatnonzero(bad)[0])
    ia, ib = int(pd.al.ia[first]), int(pd.al.ib[first])
    return Finding(
        "anchor_shift", "error", side="ours", **pd.at(first),
        message=(f"anchors differ at the same position on matched content in {int(bad.sum())} "
                 f"of {int(known.sum())} paired blocks: the block recorded at position p is "
                 f"not drafted from the token at p"),
        evidence={"blocks": int(bad.sum()), "paired": int(known.sum()),
                  "example": {"ours_anchor": _tok(dec, [pd.oa.t.blocks.anchor[ia]]),
                              "theirs_anchor": _tok(dec, [pd.ob.t.blocks.anchor[ib]])}})


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


def vocab_pairs(pd: PairData, dec: Decoder | None) -> Finding | None:
    """vocab_mapping across traces: ours ids are a fixed function of theirs (offset, factor,
    permutation) on slots where they differ."""
    ndiff = int(pd.both_count.sum() - pd.eq_count.sum())
    if ndiff < 20 or ndiff < SYSTEMATIC * pd.both_count.sum():
        return None
    diff = pd.both & ~pd.eq
    o, t = pd.pa[diff].astype(np.int64), pd.pb[diff].astype(np.int64)
    share, n = functional_map(t, o)
    if n < 20 or share < 0.9 or len(np.unique(t)) < 5:
        return None
    off = o - t
    vals, cnt = np.unique(off, return_counts=True)
    relation = "a fixed per-id mapping (permuted ids)"
    ev = {"consistency": share, "slots": int(diff.sum())}
    if cnt.max() >= 0.9 * len(off):
        c = int(vals[cnt.argmax()])
        relation, ev["offset"] = f"a constant offset ({c:+d})", c
    else:
        nz = t != 0
        if nz.any():
            ratio = o[nz] / t[nz]
            rv, rc = np.unique(np.round(ratio, 6), return_counts=True)
            if rc.max() >= 0.9 * nz.sum():
                relation, ev["factor"] = f"a constant factor (x{rv[rc.argmax()]:g})", float(
                    rv[rc.argmax()])
    below = int(o.max())
    ev["ours_max_id"], ev["theirs_max_id"] = below, int(t.max())
    first = int(np.flatnonzero(diff.any(axis=1))[0])
    return Finding(
        "vocab_mapping", "error", side="ours", slot=int(np.flatnonzero(diff[first])[0]),
        **pd.at(first),
        message=(f"ours relate to theirs by {relation} on {_pct(share)} of {int(diff.sum())} "
                 f"differing slots: a reduced-vocabulary (d2t/t2d) mapping is missing, applied "
                 f"twice or regenerated (ours ids reach {below}, theirs {int(t.max())})"),
        evidence=ev | {"example": pd.example(first, dec)})


def k_pairs(pd: PairData) -> Finding | None:
    """k_mismatch: the number of proposed ids differs between matched blocks."""
    bad = pd.ka != pd.kb
    if bad.sum() < MIN_BLOCKS or bad.mean() < SYSTEMATIC:
        return None
    first = int(np.flatnonzero(bad)[0])
    d = pd.ka[bad] - pd.kb[bad]
    vals, cnt = np.unique(d, return_counts=True)
    typical = int(vals[cnt.argmax()])
    return Finding(
        "k_mismatch", "error", side="ours", **pd.at(first),
        message=(f"k differs in {int(bad.sum())} of {len(bad)} paired blocks: ours proposes "
                 f"{abs(typical)} {'fewer' if typical < 0 else 'more'} draft "
                 f"id{'s' if abs(typical) != 1 else ''} than theirs "
                 f"(ours k={int(pd.ka[first])}, theirs "
                 f"k={int(pd.kb[first])} at the first); one side may count the anchor in k"),
        evidence={"blocks": int(bad.sum()), "typical_difference": typical,
                  "ours_k": np.unique(pd.ka).tolist(), "theirs_k": np.unique(pd.kb).tolist()})


def depth(pd: PairData) -> Finding | None:
    """depth_divergence: slot 0 agrees, deeper slots do not (the multi-step loop is broken)."""
    both = pd.both_count
    agree = pd.eq_count / np.maximum(both, 1)
    if len(agree) < 2 or both[0] < MIN_BLOCKS or agree[0] < 0.9:
        return None
    # Conditional on slot 0 agreeing, how often does slot 1 agree?
    s0 = pd.eq[:, 0] & (np.minimum(pd.ka, pd.kb) > 1)
    if s0.sum() < MIN_BLOCKS:
        return None
    cond1 = float(pd.eq[s0, 1].mean())
    if cond1 > 1 - SYSTEMATIC:
        return None
    first = int(np.flatnonzero(s0 & ~pd.eq[:, 1])[0])
    return Finding(
        "depth_divergence", "error", side="ours", slot=1, **pd.at(first),
        message=(f"slot 0 agrees in {_pct(agree[0])} of paired blocks but slot 1 in only "
                 f"{_pct(cond1)} of those: the multi-step draft loop is broken beyond depth 0 "
                 f"(positions, seq_lens or the previous token not advanced)"),
        evidence={"per_position": [float(x) for x in agree], "slot1_given_slot0": cond1})


def stale(pd: PairData) -> Finding | None:
    """stale_state: right after a rejection the next block differs while the anchor agrees."""
    oa = pd.oa
    b = oa.t.blocks
    ia = pd.al.ia
    prev = oa.prev[ia]
    has_prev = prev >= 0
    pv = np.where(has_prev, prev, 0)
    rejected = pd.trusted & has_prev & (b.accepted[pv] >= 0) & (b.accepted[pv] < oa.nchecked[pv])
    clean = pd.trusted & ~rejected
    mism = ~pd.exact & pd.anchor_eq
    if rejected.sum() < MIN_BLOCKS or clean.sum() < MIN_BLOCKS:
        return None
    r_rej, r_clean = float(mism[rejected].mean()), float(mism[clean].mean())
    if r_rej < SYSTEMATIC or r_clean > 0.2 or r_rej < 3 * r_clean:
        return None
    first = int(np.flatnonzero(rejected & mism)[0])
    return Finding(
        "stale_state", "error", side="ours", **pd.at(first),
        message=(f"right after a rejection ours proposes differently in {_pct(r_rej)} of "
                 f"{int(rejected.sum())} paired blocks, otherwise in {_pct(r_clean)}: the "
                 f"drafter keeps stale state (KV or hidden state of rejected tokens)"),
        evidence={"after_rejection": r_rej, "otherwise": r_clean,
                  "blocks_after_rejection": int(rejected.sum())})


def batch(pd: PairData) -> Finding | None:
    """batch_dependence: mismatches concentrate on batch rows > 0 or batch sizes > 1."""
    b = pd.oa.t.blocks
    ia = pd.al.ia
    mism = ~pd.exact & pd.trusted
    for col, label in (("batch_row", "batch row"), ("batch_size", "batch size")):
        v = getattr(b, col)[ia].astype(np.int64)
        lo = pd.trusted & (v == (0 if col == "batch_row" else 1))
        hi = pd.trusted & (v > (0 if col == "batch_row" else 1))
        if lo.sum() < MIN_BLOCKS or hi.sum() < MIN_BLOCKS:
            continue
        r_lo, r_hi = float(mism[lo].mean()), float(mism[hi].mean())
        if r_hi >= SYSTEMATIC and r_lo <= 0.1:
            first = int(np.flatnonzero(hi & mism)[0])
            base = "0" if col == "batch_row" else "1"
            return Finding(
                "batch_dependence", "error", side="ours", **pd.at(first),
                message=(f"proposals differ in {_pct(r_hi)} of blocks at {label} > {base} but "
                         f"{_pct(r_lo)} at {label} {base}: drafts depend on the batch "
                         f"(indexing in padded or sorted batches)"),
                evidence={"by": col, "mismatch_rate_low": r_lo, "mismatch_rate_high": r_hi,
                          "blocks_low": int(lo.sum()), "blocks_high": int(hi.sum())})
    return None


def mismatch(pd: PairData, dec: Decoder | None) -> Finding | None:
    """draft_mismatch: proposals differ at matched anchors with no more specific pattern."""
    bad = ~pd.exact & pd.anchor_eq
    if not bad.any():
        return None
    P = len(bad)
    rate = float(bad.mean())
    first = int(np.flatnonzero(bad)[0])
    slot0 = float(((np.minimum(pd.ka, pd.kb) > 0) & ~pd.eq[:, 0])[bad].mean())
    sev = "error" if rate >= MISMATCH_ERROR_RATE else "warning"
    tie = "" if sev == "error" else " (few: possibly numerical near-ties)"
    differs = ~pd.eq[first] & (np.arange(pd.eq.shape[1]) < min(pd.ka[first], pd.kb[first]))
    slot = int(np.flatnonzero(differs)[0]) if differs.any() else None
    return Finding(
        "draft_mismatch", sev, side="ours", slot=slot, **pd.at(first),
        message=(f"proposals differ at matched anchors in {int(bad.sum())} of {P} paired blocks "
                 f"({_pct(rate)}), from slot 0 in {_pct(slot0)} of them, with no shift or "
                 f"mapping pattern{tie}"),
        evidence={"blocks": int(bad.sum()), "paired": P, "rate": rate, "from_slot0": slot0,
                  "example": pd.example(first, dec)})


def content(al: Alignment, oa: TraceData, ob: TraceData, dec: Decoder | None) -> Finding | None:
    """content_divergence: the two outputs differ from some position on."""
    div = np.flatnonzero(al.divergence != NO_DIVERGENCE)
    if not len(div):
        return None
    p = int(div[0])
    i, j, d = int(al.req_a[p]), int(al.req_b[p]), int(al.divergence[p])
    sa, sb = oa.t.requests.full_sequence(i), ob.t.requests.full_sequence(j)
    beyond_a = int((al.pair_of_block_a == p).sum() - (al.comparable_a &
                                                     (al.pair_of_block_a == p)).sum())
    plen = len(oa.t.requests.prompt_ids[i])
    return Finding(
        "content_divergence", "error", side="both", request=oa.t.requests.req_id[i],
        position=d,
        message=(f"the outputs differ in {len(div)} of {al.pairs} matched requests (first: "
                 f"request {oa.t.requests.req_id[i]} at position {d}, output token {d - plen}: "
                 f"ours {_tok(dec, [sa[d]])[0]} vs theirs {_tok(dec, [sb[d]])[0]}); blocks "
                 f"past it are not compared and acceptance totals on all content compare "
                 f"different text"),
        evidence={"requests": len(div), "position": d, "ours_token": _tok(dec, [sa[d]]),
                  "theirs_token": _tok(dec, [sb[d]]), "blocks_not_compared_ours": beyond_a,
                  "divergences": [{"request": oa.t.requests.req_id[int(al.req_a[q])],
                                   "position": int(al.divergence[q])} for q in div[:10]]})


def _loop_findings(al: Alignment, oa: TraceData, ob: TraceData, loops_a: list, loops_b: list,
                   dec: Decoder | None) -> list[Finding | None]:
    """Loops on both sides of matched text are the model's, not a bug (warning); a loop on
    one side only makes the other engine's acceptance look broken (error), unless it starts
    after the pair's content already diverged: then the divergence is the cause (warning)."""
    partner_a = dict(zip(al.req_a.tolist(), al.req_b.tolist()))
    partner_b = dict(zip(al.req_b.tolist(), al.req_a.tolist()))
    div_a = dict(zip(al.req_a.tolist(), al.divergence.tolist()))
    div_b = dict(zip(al.req_b.tolist(), al.divergence.tolist()))
    start_a = {i: st for i, st, _ in loops_a}
    start_b = {i: st for i, st, _ in loops_b}
    out: list[Finding | None] = []
    said_shared = False  # a shared loop is one warning, not one per side
    for td, loops, partner, other, div in ((oa, loops_a, partner_a, start_b, div_a),
                                           (ob, loops_b, partner_b, start_a, div_b)):
        # The partner looping too (even from another start, after the content diverged)
        # makes it the model's loop; only a loop the partner lacks is one-sided.
        one_sided = [lp for lp in loops
                     if lp[0] in partner and partner[lp[0]] not in other]
        later = [lp for lp in one_sided if lp[1] > div.get(lp[0], NO_DIVERGENCE)]
        own = [lp for lp in one_sided if lp not in later]
        shared = [lp for lp in loops if lp[0] in partner and lp not in one_sided]
        out.append(degenerate_finding(
            td, own, dec, "error", "the other engine's output does not loop there, so "
            "acceptance totals compare different text"))
        if not own:
            out.append(degenerate_finding(
                td, later, dec, "warning", "it starts after the content already diverged "
                "(see content_divergence); acceptance on the loop is inflated"))
        unmatched = [lp for lp in loops if lp[0] not in partner]
        if not own and not later and not said_shared:
            out.append(degenerate_finding(
                td, shared, dec, "warning", "both engines loop identically (the model's "
                "doing); acceptance on the loop is inflated"))
            said_shared = out[-1] is not None
        if not own and not later and not shared:
            out.append(degenerate_finding(
                td, unmatched, dec, "warning", "in requests the other trace lacks; "
                "acceptance on the loop is inflated"))
    return out


def _own_checks(td: TraceData, ref: TraceData, al: Alignment, side_a: bool,
                dec: Decoder | None) -> tuple[list, tuple]:
    """One side's work for :func:`detect_pair` (it reads ``ref`` and ``al``, writes only
    ``td``'s memos): its loops and the findings of anchor_consistency,
    verified_vs_proposed, unverified (with the anchors skipped against ``ref``),
    bookkeeping and vocab_range, and the memo of :func:`constant_rate` that the cross-side
    constant_drafts check reads."""
    constant_rate(td)
    skipped = skipped_anchors(td, ref, al, side_a)
    return degenerate(td, dec), (anchor_consistency(td), verified_vs_proposed(td, dec),
                                 unverified(td, skipped), bookkeeping(td), vocab_range(td))


def prepare(traces: list[tuple[Trace, str]]) -> list[TraceData]:
    """Build each trace's :class:`TraceData`: the block columns are read here, one trace
    after the other (h5py holds the GIL), and each trace's derived columns (order,
    recomputed acceptance) are computed on a worker thread while the next trace reads."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, len(traces))) as pool:
        futures = []
        for t, side in traces:
            for col in TraceData.COLUMNS:
                getattr(t.blocks, col)
            futures.append(pool.submit(TraceData.build, t, side))
        return [f.result() for f in futures]


def detect_pair(al: Alignment, pd_arrays: dict, decoder: Decoder | None = None) -> list[Finding]:
    """All findings of a diff: both traces' single-trace checks and the pair detectors.

    Args:
        al: the alignment (ours = ``al.a``).
        pd_arrays: paired arrays from :func:`spectrace.tracer.diff.diff_traces` (``pa``,
            ``pb``, ``ka``, ``kb``, ``eq``, ``both``, ``exact``, ``anchor_eq``).
        decoder: decodes example ids, or None.
    Returns:
        Findings, most severe first (see :func:`findings.sort_findings`).
    """
    oa, ob = prepare([(al.a, "ours"), (al.b, "theirs")])
    pd = PairData(al=al, oa=oa, ob=ob, **pd_arrays)
    # Each side's own checks, both sides at once (they write nothing shared).
    (loops_a, own_a), (loops_b, own_b) = in_parallel(
        [lambda: _own_checks(oa, ob, al, True, decoder),
         lambda: _own_checks(ob, oa, al, False, decoder)])
    if own_a[1] is not None:  # verified_differs on our side
        # Corrupted verified ids explain mismatches of blocks whose proposal is their copy.
        src = al.a.blocks.proposal_source[al.ia]
        pd.trusted = src != schema.PROPOSAL_COPIED_FROM_VERIFIED
    found: list[Finding | None] = []
    found += _loop_findings(al, oa, ob, loops_a, loops_b, decoder)
    found.append(content(al, oa, ob, decoder))
    for td, ref, own in ((oa, ob, own_a), (ob, oa, own_b)):
        anchors, verified, unverified_, checks, vocab = own
        found += [anchors, verified, constant_drafts(td, ref, decoder), unverified_, checks,
                  vocab]
    # Two groups on two threads; only the first touches the lazily built pd.both/pa/pb.
    slots, blocks = in_parallel([
        lambda: [anchor_pairs(pd, decoder), layout_shift(pd, decoder),
                 vocab_pairs(pd, decoder), k_pairs(pd), depth(pd)],
        lambda: [stale(pd), batch(pd)]])
    pair = slots + blocks
    found += pair
    if not any(pair):
        found.append(mismatch(pd, decoder))
    return sort_findings([f for f in found if f is not None])
