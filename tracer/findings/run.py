"""The declared detectors and the two runs over them: :func:`check_trace` (one trace) and
:func:`detect_pair` (a diff: both traces' single-trace detectors and the pair detectors).

The lists below are the whole registry; a run iterates them in order (the order breaks ties
between findings of one severity, kind and position). Each side's own checks run on a
thread of their own (numpy releases the GIL), as do the two groups of pair detectors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# Module imports, not ``from . import``: the package's __init__ imports this module.
import spectrace.tracer.findings.capture as capture
import spectrace.tracer.findings.depth as depth
import spectrace.tracer.findings.drift as drift
import spectrace.tracer.findings.ksize as ksize
import spectrace.tracer.findings.margins as margins
import spectrace.tracer.findings.pair as pair
import spectrace.tracer.findings.single as single
import spectrace.tracer.findings.state as state
import spectrace.tracer.findings.values as values
import spectrace.tracer.findings.vocab as vocab
import spectrace.tracer.findings.work as work

from .. import schema
from ..align import Alignment
from ..compare import PairedComparison
from ..pages import trim_heap
from ..parallel import in_parallel
from ..store import Trace
from ..tokens import Decoder
from .data import PairData, SideInput, TraceData, prepare
from .loops import degenerate, pair_loop_findings, single_loop_finding
from .model import Finding, Side, sort_findings


@dataclass(frozen=True)
class SingleDetector:
    """A single-trace detector.

    Attributes:
        kind: the finding kind it reports.
        run: the detector (:class:`~.data.SideInput` -> Finding or None).
        reads_other_side: it reads the other side's memos (in a diff it runs after both
            sides' own checks, so the two threads never build one memo twice).
    """

    kind: str
    run: Callable[[SideInput], Finding | None]
    reads_other_side: bool = False


@dataclass(frozen=True)
class PairDetector:
    """A pair detector.

    Attributes:
        kind: the finding kind it reports.
        run: the detector (:class:`~.data.PairData` -> Finding or None).
        thread: which of the two pair threads runs it: ``slots`` (the only group that builds
            the lazy per-slot matrices of PairData) or ``blocks``.
    """

    kind: str
    run: Callable[[PairData], Finding | None]
    thread: str = "slots"


#: Single-trace detectors, in report order (the loop detector runs first, see ``loops``).
SINGLE_TRACE: tuple[SingleDetector, ...] = (
    SingleDetector("impossible_values", values.impossible),
    SingleDetector("capture_incomplete", capture.capture),
    SingleDetector("requests_incomplete", work.requests),
    SingleDetector("anchor_shift", single.anchor_consistency),
    SingleDetector("verified_differs", single.verified_vs_proposed),
    SingleDetector("constant_drafts", single.constant_drafts, reads_other_side=True),
    SingleDetector("unverified_drafts", work.unverified),
    SingleDetector("k_mismatch", ksize.k_configured),
    SingleDetector("trimmed_drafts", values.trimmed),
    SingleDetector("acceptance_bookkeeping", single.bookkeeping),
    SingleDetector("vocab_mapping", single.vocab_range),
)

#: Pair detectors, in report order.
PAIR: tuple[PairDetector, ...] = (
    PairDetector("anchor_shift", pair.anchor_pairs),
    PairDetector("layout_shift", pair.layout_shift),
    PairDetector("vocab_mapping", vocab.vocab_pairs),
    PairDetector("k_mismatch", ksize.k_pairs),
    PairDetector("depth_divergence", depth.depth),
    PairDetector("stale_state", state.stale, thread="blocks"),
    PairDetector("batch_dependence", state.batch, thread="blocks"),
)

#: Runs when no pair detector found a more specific pattern.
FALLBACK = PairDetector("draft_mismatch", pair.mismatch)


def check_trace(t: Trace, decoder: Decoder | None = None, side: Side = "trace") -> list[Finding]:
    """Single-trace findings (``spectrace check``): degenerate output, then
    :data:`SINGLE_TRACE` (impossible values, how the capture ended, requests not completed,
    anchors, verified vs proposed, constant, unverified or trimmed drafts, bookkeeping,
    vocabulary range).

    Args:
        side: the findings' side and the name their messages use: ``trace`` (the one trace
            of ``spectrace check``), or ours/theirs where a caller shows it beside another.
    Returns:
        Findings, most severe first.
    """
    td = TraceData.build(t, side)
    s = SideInput(td=td, decoder=decoder)
    found = [single_loop_finding(td, decoder)] + [d.run(s) for d in SINGLE_TRACE]
    return sort_findings([f for f in found if f is not None])


@dataclass
class _SideRun:
    """One side of :func:`detect_pair`: its input, loops and per-detector results (None
    where a detector found nothing or has not run yet), in :data:`SINGLE_TRACE` order."""

    input: SideInput
    loops: list
    results: list[Finding | None]


def _own_checks(
    td: TraceData, ref: TraceData, al: Alignment, side_a: bool, dec: Decoder | None
) -> _SideRun:
    """One side's work (it reads ``ref`` and ``al``, writes only ``td``'s memos): its loops,
    the detectors that read only this side, and the :func:`~.single.constant_rate` memo the
    cross-side constant_drafts check reads."""
    single.constant_rate(td)
    s = SideInput(
        td=td,
        ref=ref,
        skipped=work.skipped_anchors(td, ref, al, side_a),
        decoder=dec,
        al=al,
        side_a=side_a,
    )
    return _SideRun(
        input=s,
        loops=degenerate(td),
        results=[None if d.reads_other_side else d.run(s) for d in SINGLE_TRACE],
    )


def _pair_findings(pd: PairData) -> list[Finding]:
    """:data:`PAIR` on two threads (by ``thread``), then :data:`FALLBACK` when none fired."""
    groups = [[d for d in PAIR if d.thread == g] for g in ("slots", "blocks")]
    done = in_parallel([lambda g=g: [d.run(pd) for d in g] for g in groups])
    by_detector = {d: f for g, res in zip(groups, done) for d, f in zip(g, res)}
    found = [by_detector[d] for d in PAIR]
    if not any(found):
        found.append(FALLBACK.run(pd))
    return [f for f in found if f is not None]


def detect_pair(
    al: Alignment, paired: PairedComparison, decoder: Decoder | None = None
) -> list[Finding]:
    """All findings of a diff: loops, prompt drift, content divergence, both traces' single-trace
    detectors (ours, then theirs) and the pair detectors.

    Args:
        al: the alignment (ours = ``al.a``).
        paired: the kernel's comparison of ``al``'s paired blocks
            (:func:`~spectrace.tracer.compare.compare_paired`).
        decoder: decodes example ids, or None.
    Returns:
        Findings, most severe first (see :func:`~.model.sort_findings`).
    """
    oa, ob = prepare([(al.a, "ours"), (al.b, "theirs")])
    trim_heap()  # the detectors' peak comes next: no freed pages of the passes before it
    pd = PairData(al=al, oa=oa, ob=ob, paired=paired, decoder=decoder)
    # Each side's own checks, both sides at once (they write nothing shared).
    run_a, run_b = in_parallel(
        [
            lambda: _own_checks(oa, ob, al, True, decoder),
            lambda: _own_checks(ob, oa, al, False, decoder),
        ]
    )
    trim_heap()  # the own checks' temporaries, freed on two threads: before the pair peak
    verified = [i for i, d in enumerate(SINGLE_TRACE) if d.kind == "verified_differs"]
    if any(run_a.results[i] is not None for i in verified):
        # Corrupted verified ids explain mismatches of blocks whose proposal is their copy.
        src = al.a.blocks.proposal_source[al.ia]
        pd.trusted = np.asarray(src != schema.PROPOSAL_COPIED_FROM_VERIFIED)
    found: list[Finding | None] = []
    found += pair_loop_findings(al, oa, ob, run_a.loops, run_b.loops, decoder)
    found.append(drift.prompts(al, decoder))
    found.append(pair.content(al, oa, decoder))
    found.append(pair.vanilla(al))
    for r in (run_a, run_b):
        found += [
            d.run(r.input) if d.reads_other_side else res for d, res in zip(SINGLE_TRACE, r.results)
        ]
    found += _pair_findings(pd)
    trim_heap()  # near_ties reads two margin matrices next: no freed pages beside them
    found.append(margins.near_ties(pd))  # beside the others: it changes none of them
    return sort_findings([f for f in found if f is not None])
