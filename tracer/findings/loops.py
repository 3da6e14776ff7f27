"""degenerate_output: outputs that end in a repetition loop, in one trace or across a pair.

A loop is found per request from the output ids alone (:func:`find_loop`), after a vectorised
necessary test over all requests at once (:func:`loop_candidates`). In a diff, loops on both
sides of matched text are the model's doing (a warning); a loop on one side only makes the
other engine's acceptance look broken (an error), unless it starts after the pair's content
already diverged (then the divergence is the cause: a warning).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..align import Alignment
from ..compare import NO_DIVERGENCE
from ..tokens import Decoder, show
from .data import TraceData
from .evidence import DegenerateEvidence, LoopRef
from .model import Finding, Severity, tok
from .thresholds import LOOP_MAX_PERIOD, LOOP_MIN_TOKENS


@dataclass(frozen=True)
class Loop:
    """A request whose output ends in a loop.

    Attributes:
        request: request index; start: absolute position where the loop starts (tokens);
        period: the loop's period (tokens).
    """

    request: int
    start: int
    period: int


def find_loop(ids: np.ndarray) -> tuple[int, int] | None:
    """Find a repetition loop at the end of an output.

    Args:
        ids: int [n] output ids.
    Returns:
        ``(start, period)`` of the shortest-period repeating tail of at least
        ``max(LOOP_MIN_TOKENS, 3 * period)`` tokens (start: index into ``ids``), or None.
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


def degenerate(td: TraceData) -> list[Loop]:
    """The requests of ``td`` whose output ends in a loop, in request order."""
    r = td.t.requests
    out = []
    for i in loop_candidates(td).tolist():
        loop = find_loop(r.output_ids[i])
        if loop:
            out.append(Loop(i, int(len(r.prompt_ids[i]) + loop[0]), int(loop[1])))
    return out


def degenerate_finding(
    td: TraceData, loops: list[Loop], dec: Decoder | None, severity: Severity, why: str
) -> Finding | None:
    """The degenerate_output finding for ``loops`` at ``severity`` (``why`` ends its
    sentence), or None when there are none."""
    if not loops:
        return None
    r = td.t.requests
    first = loops[0]
    i, start, period = first.request, first.start, first.period
    unit = r.full_sequence(i)[start : start + period]
    text = f" {show(dec.text(unit))!r}" if dec else ""
    looped = sum(len(r.full_sequence(lp.request)) - lp.start for lp in loops)
    return Finding(
        "degenerate_output",
        severity,
        side=td.side,
        request=r.req_id[i],
        position=start,
        message=(
            f"{td.side} output degenerates into a loop in {len(loops)} of {len(r)} "
            f"requests (first: request {r.req_id[i]} from position {start}, period "
            f"{period}{text}); {why}"
        ),
        evidence=DegenerateEvidence(
            requests=len(loops),
            looped_tokens=int(looped),
            period=period,
            loop_start=start,
            unit=tok(dec, unit),
            loops=[
                LoopRef(request=r.req_id[lp.request], start=lp.start, period=lp.period)
                for lp in loops[:10]
            ],
        ),
    )


def single_loop_finding(td: TraceData, dec: Decoder | None) -> Finding | None:
    """degenerate_output of one trace on its own (``spectrace check``): a warning."""
    return degenerate_finding(
        td,
        degenerate(td),
        dec,
        "warning",
        "acceptance measured on a loop is inflated and not comparable",
    )


@dataclass
class _SideLoops:
    """One side's loops split by what explains them (see :func:`pair_loop_findings`)."""

    own: list[Loop]  # one-sided, before any content divergence: an error
    later: list[Loop]  # one-sided, after the pair's content diverged
    shared: list[Loop]  # the partner loops too
    unmatched: list[Loop]  # in requests the other trace lacks
    unknown: list[Loop]  # one-sided, but the partner's output is unknown: a warning


def _split(
    loops: list[Loop], partner: dict, other_looping: set, div: dict, other: TraceData
) -> _SideLoops:
    # The partner looping too (even from another start, after the content diverged)
    # makes it the model's loop; only a loop the partner lacks is one-sided, and only a
    # partner whose output is known can lack it.
    one_sided = [
        lp for lp in loops if lp.request in partner and partner[lp.request] not in other_looping
    ]
    # Unknown also where the partner's sequence ends before the loop starts (a run cut
    # short: requests_incomplete names it), or, its content the same up to its end (a run
    # of a smaller max_tokens), too soon after it to show a loop: nothing says whether it
    # would loop there.
    unknown = [
        lp
        for lp in one_sided
        if other.output_unknown(p := partner[lp.request])
        or other.length[p] <= lp.start
        or (
            div.get(lp.request, NO_DIVERGENCE) == NO_DIVERGENCE
            and other.length[p] - lp.start < max(LOOP_MIN_TOKENS, 3 * lp.period)
        )
    ]
    one_sided = [lp for lp in one_sided if lp not in unknown]
    later = [lp for lp in one_sided if lp.start > div.get(lp.request, NO_DIVERGENCE)]
    return _SideLoops(
        own=[lp for lp in one_sided if lp not in later],
        later=later,
        shared=[lp for lp in loops if lp.request in partner and lp not in one_sided + unknown],
        unmatched=[lp for lp in loops if lp.request not in partner],
        unknown=unknown,
    )


#: What explains one side's loops, in the order tried: (``_SideLoops`` field, severity, the
#: finding's reason). The first non-empty group is the side's finding.
_REASONS: tuple[tuple[str, Severity, str], ...] = (
    (
        "own",
        "error",
        "the other engine's output does not loop there, so acceptance totals compare "
        "different text",
    ),
    (
        "unknown",
        "warning",
        "the other trace's output is unknown there (no output ids and no finish reason, or "
        "it ends before the loop starts or too soon after to show one), so nothing says "
        "whether it loops too",
    ),
    (
        "later",
        "warning",
        "it starts after the content already diverged (see content_divergence); acceptance "
        "on the loop is inflated",
    ),
    (
        "shared",
        "warning",
        "both engines loop identically (the model's doing); acceptance on the loop is inflated",
    ),
    (
        "unmatched",
        "warning",
        "in requests the other trace lacks; acceptance on the loop is inflated",
    ),
)


def _side_findings(
    td: TraceData, s: _SideLoops, dec: Decoder | None, said_shared: bool
) -> tuple[list[Finding], bool]:
    """One side's degenerate_output finding (at most one, from the first non-empty group of
    :data:`_REASONS`; a shared loop the other side already reported is not repeated), and
    whether a shared loop has been reported now."""
    for name, severity, why in _REASONS:
        loops = getattr(s, name)
        if name == "shared" and said_shared:
            if loops:
                return [], said_shared
            continue
        if loops:
            f = degenerate_finding(td, loops, dec, severity, why)
            return ([f] if f is not None else []), said_shared or name == "shared"
    return [], said_shared


def pair_loop_findings(
    al: Alignment,
    oa: TraceData,
    ob: TraceData,
    loops_a: list[Loop],
    loops_b: list[Loop],
    dec: Decoder | None,
) -> list[Finding]:
    """degenerate_output findings of a diff, ours then theirs: one-sided loops (error),
    loops after a content divergence, loops both engines share (one warning for both),
    loops in unmatched requests (warnings)."""
    ra, rb, dv = al.req_a.tolist(), al.req_b.tolist(), al.divergence.tolist()
    sides = (
        (
            oa,
            _split(
                loops_a, dict(zip(ra, rb)), {lp.request for lp in loops_b}, dict(zip(ra, dv)), ob
            ),
        ),
        (
            ob,
            _split(
                loops_b, dict(zip(rb, ra)), {lp.request for lp in loops_a}, dict(zip(rb, dv)), oa
            ),
        ),
    )
    out: list[Finding] = []
    said_shared = False  # a shared loop is one warning, not one per side
    for td, s in sides:
        found, said_shared = _side_findings(td, s, dec, said_shared)
        out += found
    return out
