"""Missing-work detectors: the work a run should have done and did not, per side.

A comparison of the blocks that exist says nothing about the blocks that do not: a killed
engine, aborted or cut-short requests, drafting that stops or never starts where the other
engine drafts, proposals never verified and drafts trimmed before verification all leave the
existing blocks agreeing. Each detector here reads one side (:class:`~.data.SideInput`; in a
diff the alignment and the other side too) and returns at most one error finding.

Silence is judged against the other side, never against the end of the output: prompt-lookup
(n-gram) legitimately stops proposing when matches run out, on both sides alike.
"""

from __future__ import annotations

import numpy as np

from ..align import Alignment, drafts_configured, is_replay
from ..fmt import counted
from ..parallel import chunks
from ..store import Trace
from .data import SideInput, TraceData
from .evidence import IncompleteRef, RequestsEvidence, UnverifiedEvidence
from .ksize import config_difference
from .model import Finding

#: Finish reasons of a request the engine did not complete: aborted, still running when
#: the trace closed, or vLLM's ``FinishReason.ERROR`` (vllm/v1/engine/__init__.py: a
#: retryable request-level internal error, e.g. a KV load failure; the client gets a 500).
#: ``repetition`` (vLLM stopped a repetitive output) is the engine's decision, like ``stop``.
NOT_COMPLETED = ("abort", "unfinished", "error")


def work_complete(t: Trace) -> bool:
    """Whether ``t`` itself shows its work complete: every request finished (``length`` or
    ``stop``) and every file's /meta ``checks`` says ``ok`` (the vLLM hook's close found
    the trace equal to vLLM's own counters). A capture that ended uncleanly after that
    (``--timeout`` met in vLLM's shutdown) stopped after its work, not during it."""
    checks = [m.get("checks") for m in t.metas]
    counted_ok = bool(checks) and all(
        isinstance(c, dict) and c.get("status") == "ok" for c in checks
    )
    fin = t.requests.finish_reason
    return (
        bool(checks) and counted_ok and len(fin) > 0 and all(x in ("length", "stop") for x in fin)
    )


def _incomplete(s: SideInput) -> tuple[list[tuple[int, int | None]], list[str]]:
    """Requests of this side whose work is missing: ``[(row, other row or None)]`` in row
    order (not completed, empty output where the other has one, or a strict prefix of the
    other's output without a stop), and the other side's request ids this side lacks."""
    req = s.td.t.requests
    fin, out = req.finish_reason, req.output_ids
    if s.al is None:
        return [(i, None) for i in range(len(req)) if fin[i] in NOT_COMPLETED], []
    here, other = s.pairs()
    assert s.ref is not None  # an alignment has both sides
    oreq = s.ref.t.requests
    bad = []
    for p in range(len(here)):
        i, j = int(here[p]), int(other[p])
        n, m = len(out[i]), len(oreq.output_ids[j])
        if s.td.output_unknown(i):
            continue  # unknown, not empty: nothing says the work is missing
        shorter = n < m and fin[i] != "stop" and s.al.divergence[p] >= len(req.prompt_ids[i]) + n
        if fin[i] in NOT_COMPLETED or shorter:
            bad.append((i, j))
    lacking = s.al.unmatched_b if s.side_a else s.al.unmatched_a
    # Absent requests count where the runs pair some request (runs that pair none compare
    # nothing to miss); a --request selection of an unmatched request keeps none, but the
    # runs it was narrowed from did.
    paired = len(here) or s.al.pairs_before_selection
    missing = [oreq.req_id[int(j)] for j in lacking] if paired else []
    return sorted(bad), missing


def requests(s: SideInput) -> Finding | None:
    """requests_incomplete: requests aborted or unfinished, or (in a diff) cut short or with
    an empty output where the other side completed them, or absent where the other side has
    them. Located at the first such request's end of work (prompt + output tokens)."""
    td = s.td
    bad, missing = _incomplete(s)
    if not bad and not missing:
        return None
    req = td.t.requests
    fin, out = req.finish_reason, req.output_ids
    oreq = s.ref.t.requests if s.ref is not None else None
    first = None
    where: dict = {}
    if bad:
        i, j = bad[0]
        first = IncompleteRef(
            request=req.req_id[i],
            finish_reason=fin[i],
            output_tokens=len(out[i]),
            other_finish_reason=None if j is None or oreq is None else oreq.finish_reason[j],
            other_output_tokens=None if j is None or oreq is None else len(oreq.output_ids[j]),
        )
        # The end of its work, where the prompt is known (a VT import without its requests
        # file knows neither prompt nor output: no position then).
        end = len(req.prompt_ids[i]) + len(out[i]) if len(req.prompt_ids[i]) else None
        where = {"request": req.req_id[i], "position": end}
        what, tail = _cut_short(s, bad)
    else:
        what, tail = _absent(s, missing)
        where = {"request": missing[0]}  # the first absent request, by the other side's id
    return Finding(
        "requests_incomplete",
        "error",
        side=td.side,
        **where,
        message=f"{td.side}: {what}: {tail}",
        evidence=RequestsEvidence(
            requests=len(bad) + len(missing),
            aborted=[req.req_id[i] for i, _ in bad if fin[i] in NOT_COMPLETED][:10],
            empty_output=[req.req_id[i] for i, _ in bad if len(out[i]) == 0][:10],
            cut_short=[
                req.req_id[i] for i, j in bad if j is not None and fin[i] not in NOT_COMPLETED
            ][:10],
            missing=missing[:10],
            first=first,
        ),
    )


def _cut_short(s: SideInput, bad: list[tuple[int, int | None]]) -> tuple[str, str]:
    """What a finding says of this side's requests ``bad`` (:func:`_incomplete`'s rows), and
    why they are not compared: a max_tokens difference where :func:`_length_limits` sees
    one, else requests that did not complete."""
    td, req = s.td, s.td.t.requests
    fin, out = req.finish_reason, req.output_ids
    oreq = s.ref.t.requests if s.ref is not None else None
    (i, j), rid = bad[0], req.req_id[bad[0][0]]
    name = "theirs" if td.side == "ours" else "ours"
    limits = _length_limits(s, bad)
    if limits is not None:
        n, lo, hi = limits
        ran = str(hi) if lo == hi else f"{lo} to {hi}"
        mine, theirs = _max_tokens(td.t.meta), _max_tokens(s.ref.t.meta) if s.ref else None
        differ = "?" if mine is None or theirs is None else f" ({mine} vs {theirs}):"
        return (
            f"{counted(len(bad), 'request')} finished length after {n} output tokens where "
            f"{name} ran {ran} (first: request {rid})"
        ), f"the runs' max_tokens differ{differ} the work past {n} tokens is missing, not compared"
    other = ""
    if j is not None and oreq is not None:
        other = f"; {name}: {oreq.finish_reason[j] or '?'} after {len(oreq.output_ids[j])} tokens"
    what = (
        f"{counted(len(bad), 'request')} did not complete (first: request {rid}, finish "
        f"{fin[i] or '?'} after {len(out[i])} output tokens{other})"
    )
    return what, "their work is missing, not compared"


def _max_tokens(meta: dict) -> object:
    """/meta ``sampling.max_tokens`` (the vLLM hook records it), or None."""
    sampling = meta.get("sampling")
    return sampling.get("max_tokens") if isinstance(sampling, dict) else None


def _length_limits(s: SideInput, bad: list[tuple[int, int | None]]) -> tuple[int, int, int] | None:
    """``(n, lo, hi)`` when this side's cut-short requests ``bad`` look like a run of a
    smaller max_tokens: each paired and finished ``length`` after the same n output tokens,
    no request of this side holds more than n, and the other side's partners ran lo..hi > n
    tokens; None otherwise, or where both runs' /meta record the same max_tokens."""
    if s.ref is None or any(j is None for _, j in bad):
        return None
    req, oreq = s.td.t.requests, s.ref.t.requests
    lengths = {len(req.output_ids[i]) for i, _ in bad}
    if len(lengths) != 1 or any(req.finish_reason[i] != "length" for i, _ in bad):
        return None
    (n,) = lengths
    if max(map(len, req.output_ids), default=0) > n:
        return None  # a longer request of this side: no common limit at n
    mine, theirs = _max_tokens(s.td.t.meta), _max_tokens(s.ref.t.meta)
    if mine is not None and mine == theirs:
        return None
    other = [len(oreq.output_ids[j]) for _, j in bad if j is not None]
    return n, min(other), max(other)


def _absent(s: SideInput, missing: list[str]) -> tuple[str, str]:
    """What a diff says of the other side's requests ``missing`` here (ids), and why they
    are not compared: absent, or (an id both sides hold, unmatched on both) here with
    another prompt."""
    td, req = s.td, s.td.t.requests
    verb = "is" if len(missing) == 1 else "are"
    named = ", ".join(missing[:3]) + (", .." if len(missing) > 3 else "")
    other_side = "theirs" if td.side == "ours" else "ours"
    what = (
        f"{counted(len(missing), 'request')} of the other side {verb} absent "
        f"({other_side}' id{'s' if len(missing) > 1 else ''} {named})"
    )
    al = s.al  # a diff's: ``missing`` is empty without one
    assert al is not None
    own = {req.req_id[int(i)] for i in (al.unmatched_a if s.side_a else al.unmatched_b)}
    reprompted = [m for m in missing if m in own]
    if not reprompted:
        return what, "their work is missing, not compared"
    what += (
        f"; {td.side} has {'requests' if len(reprompted) > 1 else 'a request'} "
        f"{', '.join(reprompted[:3])}{', ..' if len(reprompted) > 3 else ''} with another prompt"
    )
    if len(reprompted) == len(missing):
        return what, "not compared, their prompts differ"
    return what, "their work is missing, not compared"


def skipped_anchors(td: TraceData, ref: TraceData, al: Alignment, side_a: bool) -> np.ndarray:
    """Blocks of ``td`` that follow a gap (:attr:`~.data.TraceData.chain_gaps`): the engine
    emitted from anchor position q up to this block without drafting, although ``ref``
    drafted from an anchor in that span on matched content.

    Args:
        side_a: ``td`` is the alignment's ours (``al.a``).
    Returns:
        int64 block indices (the block after each such gap); none when either side is a
        replay (its positions are chosen, the others never ran).
    """
    b = td.t.blocks
    if is_replay(td.t) or is_replay(ref.t):
        return np.zeros(0, np.int64)  # replayed positions are chosen: the rest never ran
    pob = al.pair_of_block_a if side_a else al.pair_of_block_b
    rpob = al.pair_of_block_b if side_a else al.pair_of_block_a
    rcomp = _drafted(ref, al.comparable_b if side_a else al.comparable_a)
    idx, expected = _gaps_and_heads(td)
    paired = pob[idx] >= 0
    idx, expected = idx[paired], expected[paired]
    if not len(idx):
        return idx
    stride = (
        int(max(b.position.max(initial=0), ref.t.blocks.position.max(initial=0), expected.max()))
        + 2
    )
    # A gap skips anchors expected .. (next block's position - 1): did ref draft from any?
    # (An n-gram drafter's own steps without a match leave gaps too, on both sides alike.)
    base = pob[idx].astype(np.int64) * stride
    have = rpob[rcomp].astype(np.int64) * stride + ref.t.blocks.position[rcomp].astype(np.int64)
    have.sort()
    lo = np.searchsorted(have, base + expected)
    hi = np.searchsorted(have, base + b.position[idx].astype(np.int64))
    return idx[hi > lo]


_NO_LIMIT = np.iinfo(np.int64).max


def _drafted(ref: TraceData, comparable: np.ndarray) -> np.ndarray:
    """bool [blocks of ref]: its comparable blocks that propose at least one draft (a k=0
    block, an n-gram step without a match that a writer kept, drafted nothing: silence
    beside it is no skipped work) and are not a request's final proposal (its last block,
    unverified: drafted after the request's last token, which no engine goes on from)."""
    b = ref.t.blocks
    out = comparable & ~(ref.last & (b.accepted < 0) & (b.num_verified < 0))
    return out if (b.k > 0).all() else out & (b.k > 0)


def _gaps_and_heads(td: TraceData) -> tuple[np.ndarray, np.ndarray]:
    """:attr:`~.data.TraceData.chain_gaps` and the span before each request's first block
    (:attr:`~.data.TraceData.late_starts`: from the first output token the engine emitted
    up to it without drafting; from position 0 where the prompt is unknown, e.g. a VT log
    imported without its requests file: the other side drafts only past its prompt, which
    a paired request shares), as ``(rows, expected)`` (gaps first, then first blocks)."""
    idx, expected = td.chain_gaps
    first, start = td.late_starts
    blind = td.blind_starts
    return (
        np.concatenate([idx, first, blind]),
        np.concatenate([expected, start, np.zeros(len(blind), np.int64)]),
    )


def drafting_ends(s: SideInput) -> tuple[list[int], list[tuple[int, int]]]:
    """Where this side stops drafting, or never drafts, while the other side drafts on
    matched content inside this side's sequence.

    A request stops when the other side drafted from an anchor past the end of this side's
    last verified block (its anchor + accepted + 1) that this side's sequence holds; it
    never drafts when it has no block at all (unverified proposals are reported as such).
    Two identical traces never differ here, whatever the distance from the last block to
    the output's end.

    Returns:
        ``(stops, never)``: stops, this side's last verified block row of each stopping
        request (its last block when none is verified; sorted); never, ``(request row
        here, the other side's first block row)``
        per request without a block here (sorted by request row). Both empty when either
        side has no blocks at all (a vanilla run: no draft comparison; but this side's
        /meta naming a speculative method, ``drafts_configured``, means it lost them all:
        every request it shares with the drafting side never drafts) or either side is
        a replay (``spectrace replay`` drafts only from chosen positions: the others are
        not dropped drafts).
    """
    td, ref, al = s.td, s.ref, s.al
    if al is None or ref is None or not len(ref.t.blocks):
        return [], []
    if not len(td.t.blocks) and not drafts_configured(td.t):
        return [], []
    if is_replay(td.t) or is_replay(ref.t):
        return [], []  # a replay drafts only from the positions it was given
    b = td.t.blocks
    last = td.last_verified
    any_last = np.full(len(last), -1, np.int64)  # the last block, verified or not
    rows = np.flatnonzero(td.last)
    any_last[b.request[rows]] = rows
    has_block = any_last >= 0
    rpob = al.pair_of_block_b if s.side_a else al.pair_of_block_a
    rcomp = _drafted(ref, al.comparable_b if s.side_a else al.comparable_a)
    here, _ = s.pairs()
    # Per pair: the other side's rows on matched content anchored inside this side's
    # sequence (past its end the request was cut short, and without output ids nothing
    # says how far it got), by their highest position.
    # A request whose output is unknown (no output ids) holds whatever the other drafted on.
    limit = np.where(td.length[here] > td.prompt_lengths[here], td.length[here] - 1, _NO_LIMIT)
    span = _OtherRows(s, rpob, rcomp, limit)
    never_p = np.flatnonzero(span.seen & ~has_block[here])
    ps = np.flatnonzero(span.seen & has_block[here])
    r = here[ps]
    x = np.where(last[r] >= 0, last[r], any_last[r])
    reach = b.position[x].astype(np.int64) + np.maximum(b.accepted[x], 0) + 1
    # ... or past its final proposal: an unverified last block drafted from that anchor
    # (the request ended there; further unverified blocks are drafts never verified)
    reach += b.position[any_last[r]].astype(np.int64) == reach
    # reach is the anchor of this side's next step: drafting there is what it skipped.
    stops = sorted(x[span.top[ps] >= reach].tolist())
    if not len(never_p):
        return stops, []
    first = span.first_lowest(~has_block[here])
    return stops, list(zip(here[never_p].tolist(), first[never_p].tolist()))


class _OtherRows:
    """Per request pair, the other side's block rows on matched content anchored before
    ``limit`` (int64 [m]: this side's sequence length - 1), reduced chunk by chunk (ufunc.at
    in matching dtypes: its fast path): whether any (``seen``, bool [m]) and their highest
    position (``top``, [m])."""

    def __init__(self, s: SideInput, rpob: np.ndarray, rcomp: np.ndarray, limit: np.ndarray):
        assert s.ref is not None
        self._pob, self._comp, self._limit = rpob, rcomp, limit
        self._pos = pos = s.ref.t.blocks.position
        m = len(limit)
        self.seen = np.zeros(m, bool)
        self.top = np.full(m, np.iinfo(pos.dtype).min, pos.dtype)
        for _, p, ps in self._rows():
            self.seen[p] = True
            np.maximum.at(self.top, p, ps)

    def _rows(self):
        """``(rows, pair, position)`` of the wanted rows, one chunk at a time."""
        for c in chunks(len(self._pob)):
            p = self._pob[c]
            ok = self._comp[c] & (p >= 0)
            ok[ok] = self._pos[c][ok] < self._limit[p[ok]]
            rows = np.flatnonzero(ok)
            yield rows + c.start, p[rows], self._pos[c][rows]

    def first_lowest(self, want: np.ndarray) -> np.ndarray:
        """int64 [m]: per pair ``want``-ed (bool [m]) with rows, its first row at the lowest
        of their positions (two more passes: the lowest positions, then the rows at them)."""
        low = np.full(len(self.top), np.iinfo(self._pos.dtype).max, self._pos.dtype)
        for _, p, ps in self._rows():
            sel = want[p]
            np.minimum.at(low, p[sel], ps[sel])
        first = np.full(len(self.top), np.iinfo(np.int64).max, np.int64)
        for rows, p, ps in self._rows():
            at = want[p] & (ps == low[p])
            np.minimum.at(first, p[at], rows[at])
        return first


def _unverified_message(
    td: TraceData, bad: np.ndarray, stops: list, never: list, skipped: np.ndarray, s: SideInput
) -> tuple[dict, str]:
    """The location and sentence of :func:`unverified`, from the pattern that shows first:
    requests that never draft, else unverified blocks or requests that stop drafting
    (whichever comes first in engine steps), else skipped anchors; the others follow."""
    b = td.t.blocks
    first_bad = int(np.flatnonzero(bad)[0]) if bad.any() else -1
    said = {
        "bad": f"{int(bad.sum())} of {len(bad)} draft blocks were proposed but never verified",
        "stops": (
            f"{counted(len(stops), 'request')} stop{'s' if len(stops) == 1 else ''} drafting "
            f"where the other engine goes on"
        ),
    }
    if never:
        r, o = never[0]
        assert s.ref is not None  # "never drafts" is judged against the other side
        rid, pos = td.t.requests.req_id[r], int(s.ref.t.blocks.position[o])
        where, head = (
            {"request": rid, "position": pos},
            (
                f"{counted(len(never), 'request')} never "
                f"draft{'s' if len(never) == 1 else ''} where "
                f"the other engine drafts (first: request {rid}, the other drafts from position "
                f"{pos})"
            ),
        )
    elif stops and (first_bad < 0 or b.step[stops[0]] < b.step[first_bad]):
        where = td.at(stops[0])
        head = (
            f"{said.pop('stops')} (first: request {td.req_id(stops[0])} after position "
            f"{int(b.position[stops[0]])})"
        )
    elif first_bad >= 0:
        where, head = td.at(first_bad), said.pop("bad")
    else:
        where = td.at(int(skipped[0]))
        head = (
            f"{counted(len(skipped), 'time')} a request went on without drafting from an "
            f"anchor the other engine drafted from (first: request "
            f"{td.req_id(int(skipped[0]))} before position {int(b.position[skipped[0]])}): "
            f"drafts dropped before verification"
        )
    rest = [said[k] for k, hit in (("bad", bad.any()), ("stops", bool(stops))) if hit and k in said]
    return where, f"{td.side}: " + "; ".join([head, *rest])


def unverified(s: SideInput) -> Finding | None:
    """unverified_drafts: proposals without a verify record (but a request's last one), and
    in a diff requests that never draft or stop drafting where the other side drafts
    (:func:`drafting_ends`) or anchors it silently skipped (``s.skipped``)."""
    td = s.td
    b = td.t.blocks
    # The last proposal of a request is legitimately never verified (the request finished).
    bad = np.empty(len(b), bool)
    for c in chunks(len(b)):  # in chunks: no whole-column temporaries
        bad[c] = (b.num_verified[c] < 0) & (b.accepted[c] < 0) & ~td.last[c]
    stops, never = drafting_ends(s)
    skipped = np.zeros(0, np.int64) if s.skipped is None else s.skipped
    if s.ref is not None and config_difference(td.t.meta, s.ref.t.meta):
        # another method or n-gram setting drafts from other anchors by design: where one
        # side drafts is no evidence of what the other dropped
        stops, never, skipped = [], [], np.zeros(0, np.int64)
    # One skipped anchor is enough: on identical content the same drafter drafts from the
    # same anchors (an n-gram drafter too: its match depends on the context alone).
    if not bad.any() and not stops and not never and not len(skipped):
        return None
    where, msg = _unverified_message(td, bad, stops, never, skipped, s)
    return Finding(
        "unverified_drafts",
        "error",
        side=td.side,
        **where,
        message=msg,
        evidence=UnverifiedEvidence(
            unverified_blocks=int(bad.sum()),
            requests_stopping=[td.req_id(x) for x in stops[:10]],
            requests_never_drafting=[td.t.requests.req_id[r] for r, _ in never[:10]],
            skipped_anchors=int(len(skipped)),
        ),
    )
