"""Per-anchor comparison of two aligned traces: ``spectrace diff``'s computation.

Input: an :class:`~spectrace.tracer.align.Alignment`. Output: a typed
:class:`~spectrace.tracer.diff_result.DiffResult` with coverage, anchor equality, exact
proposal matches, common-prefix lengths, per-position agreement, shift agreement, acceptance
per engine (recorded and recomputed, on matched content and on all content), content
divergence per request, example divergent blocks and the findings. Every comparison of
paired blocks is the kernel's (:mod:`spectrace.tracer.compare`), computed once, in chunks.
"""

from __future__ import annotations

import numpy as np

from .align import Alignment
from .compare import NO_DIVERGENCE, PairedComparison, count_anchors_known
from .compare_stream import PairedStreams
from .diff_result import (
    SCHEMA,
    AcceptanceBySide,
    Agreement,
    ContentDivergence,
    CountedAcceptance,
    Coverage,
    DiffResult,
    EngineAcceptance,
    Example,
    MatchedBy,
    RequestMatch,
    SideSummary,
)
from .findings import Finding, TraceData, detect_pair
from .findings.pair import content_only, drafted_before_end
from .findings.sweep import sweep_pair
from .findings.values import impossible_rows
from .index import checked_counts, sequence_index
from .metrics import Acceptance, acceptance_counts, recompute_accepted
from .pages import trim_heap
from .parallel import in_parallel
from .rows import gather, width
from .store import Trace, open_trace, prefetch
from .tokens import Decoder

__all__ = ["SCHEMA", "DiffResult", "diff_traces", "nothing_compared", "open_pair"]


def open_pair(ours, theirs) -> tuple[Trace, Trace]:
    """Open two traces for :func:`diff_traces` (``spectrace diff``'s first step).

    The block columns alignment and the sweeps read (``TraceData.SWEPT``; ``position``
    first, ours then theirs) start reading on a background thread, so that alignment
    overlaps the reads; the diff's other narrow columns load on first use, after the
    comparison (not in memory beside its paired rows).

    Args:
        ours, theirs: trace specs as :func:`~spectrace.tracer.store.open_trace` takes them,
            or open traces (one golden against several runs is opened once).
    Raises:
        InputError, TraceFormatError: as ``open_trace``.
    """
    a = ours if isinstance(ours, Trace) else open_trace(ours)
    b = theirs if isinstance(theirs, Trace) else open_trace(theirs)
    first = ("position", "k", "anchor")
    cols = first + tuple(c for c in TraceData.SWEPT if c not in first)
    prefetch([a.blocks, b.blocks], cols)
    return a, b


def nothing_compared(al: Alignment) -> str:
    """Why an alignment paired no block (one line): no blocks, only prompts that drifted
    (similar, not equal), no matching request (then the target models, when they differ),
    content diverging first, or no common anchor."""
    a, b = al.a, al.b
    empty = [side for side, t in (("ours", a), ("theirs", b)) if len(t.blocks) == 0]
    if empty:
        return (
            f"{' and '.join(empty)} {'has' if len(empty) == 1 else 'have'} no draft "
            f"blocks: nothing to compare"
        )
    finals = [side for side, t in (("ours", a), ("theirs", b)) if not drafted_before_end(t)]
    if finals:
        return (
            f"{' and '.join(finals)} {'has' if len(finals) == 1 else 'have'} only final "
            f"proposals (drafted after each request's last token, never verified): nothing "
            f"to compare"
        )
    if al.pairs == 0 and al.drift:
        n = len(al.drift)
        return (
            f"no request of ours matches one of theirs exactly; {n} pair{'s' if n > 1 else ''} "
            f"of similar prompts differ (prompt_drift): their drafts are not compared, the "
            f"contexts differ"
        )
    blind = [
        side for side, t in (("ours", a), ("theirs", b)) if not any(map(len, t.requests.prompt_ids))
    ]
    if al.pairs == 0 and blind:
        return (
            f"no request of ours matches one of theirs: {' and '.join(blind)} "
            f"{'has' if len(blind) == 1 else 'have'} no prompt ids (a VT log imported without "
            f"--requests?), and neither request ids nor the blocks' anchors pair them: import "
            f"with the requests file"
        )
    if al.pairs == 0:
        ta, tb = a.meta.get("target_model"), b.meta.get("target_model")
        models = f"; target models {ta} vs {tb}" if ta and tb and ta != tb else ""
        return (
            f"no request of ours matches one of theirs (compare the prompts): the traces "
            f"are of different jobs{models}"
        )
    div = al.divergence[al.divergence != NO_DIVERGENCE]
    if len(div):
        return (
            f"no comparable blocks: the content diverged at position {int(div.min())} "
            f"before any block both engines drafted from"
        )
    return "no comparable blocks: the engines never drafted from the same anchor position"


def compare_alignment(al: Alignment) -> PairedComparison:
    """The kernel's comparison of ``al``'s paired blocks (see
    :func:`~spectrace.tracer.compare.compare_paired`), both sides' proposal matrices
    streamed (:class:`~spectrace.tracer.compare_stream.PairedStreams`; a side swept before
    is streamed for it alone). A diff's own comparison is :attr:`DiffResult.paired`; this
    is for an alignment diffed elsewhere."""
    a, b = al.a, al.b
    ka, kb = a.blocks.k[al.ia], b.blocks.k[al.ib]
    widths = (width(a, "proposed"), width(b, "proposed"))
    streams = PairedStreams(al.ia, al.ib, ka, kb, (a.blocks.anchor, b.blocks.anchor), widths)
    del ka, kb
    sweep_pair(a, b, (streams.side(0), streams.side(1)))
    return streams.result()


def _prepare(al: Alignment) -> tuple[TraceData, TraceData, PairedComparison]:
    """Both sides' :class:`~spectrace.tracer.findings.TraceData` and the comparison, in one
    sweep of each side's id matrices, the two alternating chunk by chunk
    (:func:`~spectrace.tracer.findings.sweep.sweep_pair`): each paired block is compared
    once both its rows went by (:class:`~spectrace.tracer.compare_stream.PairedStreams`), so
    that neither side's paired rows are held ([P, w] int32 each)."""
    a, b = al.a, al.b
    in_parallel([lambda: sequence_index(a), lambda: sequence_index(b)])
    pc = compare_alignment(al)
    return TraceData.build(a, "ours"), TraceData.build(b, "theirs"), pc


def diff_traces(
    al: Alignment, examples: int | None = 5, decoder: Decoder | None = None
) -> DiffResult:
    """Compare the paired blocks of an alignment. See the module docstring.

    Args:
        al: the alignment of ours (``al.a``) and theirs (``al.b``).
        examples: how many divergent blocks to include as examples (None: every one).
        decoder: a :class:`~spectrace.tracer.tokens.Decoder` for the findings' examples, or
            None (the result's examples keep ids).
    Returns:
        A :class:`DiffResult`. ``diverged`` is True when a finding of severity ``error``
        exists, a paired block's anchor or proposal differs, or nothing is comparable
        although both traces have blocks.
    """
    a, b = al.a, al.b
    # The sweeps of the id matrices and derived columns, with the comparison.
    td_a, td_b, pc = _prepare(al)
    trim_heap()  # the sweeps' temporaries are gone: hand their pages back
    later = [c for c in TraceData.COLUMNS if c not in TraceData.SWEPT]
    prefetch([a.blocks, b.blocks], later)  # read while the acceptance figures compute
    ex = _examples(al, pc, examples)
    bad = pc.blocks.divergent
    kmax = int(max(a.blocks.k.max(initial=0), b.blocks.k.max(initial=0)))
    acc_a, acc_b = in_parallel(
        [
            lambda: _acceptance(a, al.comparable_a, kmax, impossible_rows(td_a)),
            lambda: _acceptance(b, al.comparable_b, kmax, impossible_rows(td_b)),
        ]
    )
    found = detect_pair(al, pc, decoder)
    reasons = _reasons(al, bad, found)
    return DiffResult(
        diverged=bool(reasons),
        reasons=reasons,
        findings=found,
        ours=_side(a),
        theirs=_side(b),
        requests=_requests(al),
        coverage=_coverage(al),
        agreement=_agreement(al, pc),
        acceptance=AcceptanceBySide(ours=acc_a, theirs=acc_b),
        content_divergence=_content(al),
        examples=ex,
        bad=bad,
        paired=pc,
    )


def _reasons(al: Alignment, bad: np.ndarray, found: list[Finding]) -> list[str]:
    """Why the diff diverged, one line each: error findings, differing blocks, nothing
    compared (empty: no divergence)."""
    P = len(bad)
    reasons = []
    if bad.any():
        reasons.append(f"{int(bad.sum())} of {P} paired blocks differ")
    if P == 0 and not content_only(al):  # a vanilla side: content_only says so
        reasons.append(nothing_compared(al))
    errors = [f for f in found if f.severity == "error"]
    if errors:
        reasons.insert(
            0,
            f"{len(errors)} error finding{'s' if len(errors) > 1 else ''}, first: {errors[0].kind}",
        )
    return reasons


def _share(num: np.ndarray, den: np.ndarray) -> list[float | None]:
    return [float(n / d) if d else None for n, d in zip(num, den)]


def _agreement(al: Alignment, pc: PairedComparison) -> Agreement:
    c, n = pc.blocks, pc.counts
    P = len(c.exact)
    known = count_anchors_known(al.a.blocks.anchor, al.b.blocks.anchor, al.ia, al.ib)
    return Agreement(
        paired_blocks=P,
        anchor_mismatches=int((~c.anchor_eq).sum()),
        anchors_unknown=P - known,
        exact_matches=int(c.exact.sum()),
        exact_match_rate=float(c.exact.mean()) if P else None,
        k_mismatches=int((pc.ka != pc.kb).sum()),
        mean_common_prefix=float(c.prefix.mean()) if P else None,
        per_position=_share(n.equal, n.present),
        per_position_blocks=n.present.tolist(),
        # Shift s = ±1 among the blocks with slots j and j+1 on both sides.
        shift_plus_one=_share(n.shift_plus, n.present[1:]),
        shift_minus_one=_share(n.shift_minus, n.present[1:]),
    )


def _coverage(al: Alignment) -> Coverage:
    P = len(al.ia)
    ca, cb = int(al.comparable_a.sum()), int(al.comparable_b.sum())
    return Coverage(
        ours_blocks=len(al.a.blocks),
        theirs_blocks=len(al.b.blocks),
        ours_on_matched_content=ca,
        theirs_on_matched_content=cb,
        paired=P,
        ours_coverage=P / ca if ca else None,
        theirs_coverage=P / cb if cb else None,
    )


def _side(t: Trace) -> SideSummary:
    m = t.meta
    return SideSummary(
        files=[str(p) for p in t.paths],
        engine=m.get("engine"),
        engine_version=m.get("engine_version"),
        method=m.get("method"),
        k=m.get("k"),
        source=m.get("source"),
        status=t.status,
        requests=len(t.requests),
        blocks=len(t.blocks),
    )


def _acceptance(
    t: Trace, comparable: np.ndarray, kmax: int, impossible: np.ndarray
) -> EngineAcceptance:
    """One engine's acceptance, recorded and recomputed, on matched and on all content;
    blocks with ``impossible`` values (bool [n]; an impossible_values finding names them)
    are left out, as unknown."""
    checked = checked_counts(t)
    matched, every = {}, {}
    for name, acc in (("recorded", t.blocks.accepted), ("recomputed", recompute_accepted(t))):
        if impossible.any():
            acc = np.where(impossible, -1, acc)
        by_acc, ver = acceptance_counts(acc, checked, comparable, 2)  # 1: matched content
        matched[name] = Acceptance.from_counts(by_acc[1], ver[1], kmax)
        every[name] = Acceptance.from_counts(by_acc.sum(axis=0), ver.sum(), kmax)
    return EngineAcceptance(
        matched_content=CountedAcceptance(**matched), all_content=CountedAcceptance(**every)
    )


def _requests(al: Alignment) -> RequestMatch:
    return RequestMatch(
        matched=al.pairs,
        matched_by=MatchedBy(**{k: al.matched_by.count(k) for k in ("prompt", "req_id", "order")}),
        unmatched_ours=[al.a.requests.req_id[i] for i in al.unmatched_a],
        unmatched_theirs=[al.b.requests.req_id[i] for i in al.unmatched_b],
        content_diverged=int((al.divergence != NO_DIVERGENCE).sum()),
        content_unknown=int((~al.content_known).sum()),
    )


def _content(al: Alignment) -> list[ContentDivergence]:
    out = []
    for p in np.flatnonzero(al.divergence != NO_DIVERGENCE):
        i, j, d = int(al.req_a[p]), int(al.req_b[p]), int(al.divergence[p])
        sa, sb = al.a.requests.full_sequence(i), al.b.requests.full_sequence(j)
        out.append(
            ContentDivergence(
                ours_req=al.a.requests.req_id[i],
                theirs_req=al.b.requests.req_id[j],
                position=d,
                prompt_len=len(al.a.requests.prompt_ids[i]),
                ours_token=int(sa[d]),
                theirs_token=int(sb[d]),
            )
        )
    return out


def _examples(al: Alignment, pc: PairedComparison, n: int | None) -> list[Example]:
    """The first ``n`` divergent paired blocks, all with None (kernel: divergent, anchor_eq,
    first_slot); their proposals read from the store (a few rows: a chunk each)."""
    a, b = al.a.blocks, al.b.blocks
    xs = np.flatnonzero(pc.blocks.divergent)[:n]
    pa, pb = gather(al.a, "proposed", al.ia[xs]), gather(al.b, "proposed", al.ib[xs])
    out = []
    for e, x in enumerate(xs.tolist()):
        i, j = int(al.ia[x]), int(al.ib[x])
        first = int(pc.blocks.first_slot[x])
        out.append(
            Example(
                ours_req=al.a.requests.req_id[a.request[i]],
                theirs_req=al.b.requests.req_id[b.request[j]],
                position=int(a.position[i]),
                anchor_ours=int(a.anchor[i]),
                anchor_theirs=int(b.anchor[j]),
                anchor_equal=bool(pc.blocks.anchor_eq[x]),
                ours=pa[e, : pc.ka[x]].tolist(),
                theirs=pb[e, : pc.kb[x]].tolist(),
                first_differing_slot=first if first >= 0 else None,
            )
        )
    return out
