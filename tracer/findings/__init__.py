"""Findings: typed verdicts on one trace or a pair, from a declared list of detectors.

Modules, in data-flow order: :mod:`.model` (Finding, KINDS, SEVERITIES, sort_findings,
evidence helpers), :mod:`.thresholds`, :mod:`.data` (TraceData, SideInput, PairData),
:mod:`.loops` (degenerate_output), :mod:`.values` (impossible values, trimmed drafts),
:mod:`.work` (missing work: capture, requests, unverified drafts), :mod:`.single` (the other
single-trace detectors), :mod:`.stats` (the exact concentration test), pair detectors in
:mod:`.pair` (content, anchors, layout, k, generic mismatch), :mod:`.vocab` (vocabulary
mapping: pooled, per slot, id range), :mod:`.depth` (the conditional agreement curve) and
:mod:`.state` (stale state by previous verdict, batch dependence by row/size and their
changes), :mod:`.run` (the registry, :func:`check_trace`, :func:`detect_pair`).
"""

from .data import PairData, SideInput, TraceData, prepare
from .model import KINDS, SEVERITIES, SIDES, Finding, sort_findings
from .run import FALLBACK, PAIR, SINGLE_TRACE, check_trace, detect_pair

__all__ = [
    "FALLBACK",
    "KINDS",
    "PAIR",
    "SEVERITIES",
    "SIDES",
    "SINGLE_TRACE",
    "Finding",
    "PairData",
    "SideInput",
    "TraceData",
    "check_trace",
    "detect_pair",
    "prepare",
    "sort_findings",
]
