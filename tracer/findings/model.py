"""Typed findings: what is wrong, in the field's words, and where it first shows.

A :class:`Finding` names one class of speculative-decoding bug (``KINDS``, the classes of
``shared/reference/spec_decode_bugs.md``), its severity, the first location (request, anchor
position, slot), the evidence (counts, ratios, example ids) and one plain sentence. This
module holds the vocabulary and the evidence helpers; detectors live in the package's other
modules (see its docstring), their declared list in :mod:`.run`.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from ..tokens import Decoder, show
from ..typed_json import Constraint, from_json, json_schema, to_json
from .evidence import EVIDENCE

#: Finding kinds, in the order a report lists them within one severity: values no engine can
#: produce and missing work first (no comparison of what exists can be trusted past them),
#: then content (it decides what is comparable), then the most specific explanations,
#: generic mismatch last.
Kind = Literal[
    "impossible_values",
    "capture_incomplete",
    "requests_incomplete",
    # Content: prompts that differ (nothing of those pairs is comparable), then outputs.
    "prompt_drift",
    "degenerate_output",
    "content_divergence",
    "content_only",
    "anchor_shift",
    "layout_shift",
    "vocab_mapping",
    "k_mismatch",
    # Within one trace and direct: where verified ids differ from proposed ones, cross-engine
    # mismatches of blocks whose proposal only the verified ids reveal follow from it.
    "verified_differs",
    "constant_drafts",
    "depth_divergence",
    "stale_state",
    "batch_dependence",
    "unverified_drafts",
    "trimmed_drafts",
    "acceptance_bookkeeping",
    # How much of the differences above are numerical near-ties (a warning beside them).
    "near_ties",
    "draft_mismatch",
]
KINDS: tuple[Kind, ...] = typing.get_args(Kind)

#: Missing work (a dead engine, lost trace lines, requests cut short or absent, drafts never
#: verified or blocks skipped where the other side drafted): a count of tolerated errors never
#: covers it (that is for what was recorded), nor does a window of positions; naming it in
#: ``ignore`` does.
MISSING_WORK: frozenset[Kind] = frozenset(
    {"capture_incomplete", "requests_incomplete", "unverified_drafts"}
)

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = typing.get_args(Severity)

#: Which trace shows a finding: in a diff ours, theirs or both; ``trace`` is the one trace of
#: ``spectrace check`` (there is no other side to call it "ours").
Side = Literal["ours", "theirs", "both", "trace"]
SIDES: tuple[Side, ...] = typing.get_args(Side)

#: Evidence of a finding: counts, ratios and example ids, JSON-serialisable; its keys per
#: kind are the TypedDicts of :mod:`.evidence` (checked by the generated JSON Schema).
Evidence = Mapping[str, Any]


@dataclass
class Finding:
    """One typed finding.

    Attributes:
        kind: one of KINDS (the bug class).
        severity: error (a bug or an invalid comparison), warning (suspicious, or a figure
            that must not be compared), info.
        message: one plain sentence for people.
        side: which trace shows it: ours, theirs or both (a diff), trace (a check).
        request: request id of the first location (ours for pairs), or null.
        position: absolute anchor position (tokens) of the first location, or null.
        slot: draft slot (0-based) of the first location, or null.
        evidence: JSON-serialisable counts, ratios and example ids (keys per kind).
    """

    kind: Kind
    severity: Severity
    message: Annotated[str, Constraint(min_length=1)]
    side: Side = "both"
    request: str | None = None
    position: Annotated[int | None, Constraint(minimum=0)] = None
    slot: Annotated[int | None, Constraint(minimum=0)] = None
    evidence: Evidence = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown finding kind {self.kind!r}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")
        if self.side not in SIDES:
            raise ValueError(f"unknown side {self.side!r}")

    def to_json(self) -> dict:
        """The finding as a JSON object (keys as the attributes; evidence copied)."""
        return to_json(self)

    @classmethod
    def __json_schema_extra__(cls) -> dict:
        """JSON Schema keywords: the evidence of each kind has that kind's type."""
        return {
            "allOf": [
                {
                    "if": {"properties": {"kind": {"const": kind}}},
                    "then": {"properties": {"evidence": json_schema(EVIDENCE[kind])}},
                }
                for kind in KINDS
            ]
        }

    @classmethod
    def from_json(cls, doc: dict) -> Finding:
        """Inverse of :meth:`to_json`. Raises ValueError on an unknown kind, severity or
        side, TypeError on an unknown key."""
        return from_json(cls, doc)


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first; within a severity, by :data:`KINDS` order, then position (a
    stable sort: ties keep the detectors' order)."""
    return sorted(
        findings,
        key=lambda f: (
            SEVERITIES.index(f.severity),
            KINDS.index(f.kind),
            f.position if f.position is not None else -1,
        ),
    )


def tok(dec: Decoder | None, ids) -> list:
    """Example ids for evidence: ints, or ``"id:text"`` strings when a tokenizer is known."""
    ids = [int(i) for i in ids]
    return ids if dec is None else [f"{i}:{show(dec.token(i))}" for i in ids]
