"""Typed findings: what is wrong, in the field's words, and where it first shows.

A :class:`Finding` names one class of speculative-decoding bug (``KINDS``, the classes of
``shared/reference/spec_decode_bugs.md``), its severity, the first location (request, anchor
position, slot), the evidence (counts, ratios, example ids) and one plain sentence.
Detectors live in :mod:`spectrace.tracer.detect`; this module holds only the vocabulary.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

#: Finding kinds, in the order a report lists them within one severity: content first (it
#: decides what is comparable), then the most specific explanations, generic mismatch last.
KINDS: tuple[str, ...] = (
    "degenerate_output",
    "content_divergence",
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
    "acceptance_bookkeeping",
    "draft_mismatch",
)

SEVERITIES: tuple[str, ...] = ("error", "warning", "info")


@dataclass
class Finding:
    """One typed finding.

    Attributes:
        kind: one of :data:`KINDS`.
        severity: ``error`` (a bug or an invalid comparison), ``warning`` (suspicious, or
            a figure that must not be compared), ``info``.
        message: one plain sentence for people.
        side: ``ours``, ``theirs`` or ``both`` (which trace shows it).
        request: request id of the first location (ours for pairs), or None.
        position: absolute anchor position (tokens) of the first location, or None.
        slot: draft slot (0-based) of the first location, or None.
        evidence: JSON-serialisable counts, ratios and example ids.
    """

    kind: str
    severity: str
    message: str
    side: str = "both"
    request: str | None = None
    position: int | None = None
    slot: int | None = None
    evidence: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown finding kind {self.kind!r}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

    def to_json(self) -> dict:
        """The finding as a JSON object (keys as the attributes)."""
        return asdict(self)


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first; within a severity, by :data:`KINDS` order, then position."""
    return sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), KINDS.index(f.kind),
                                           f.position if f.position is not None else -1))
