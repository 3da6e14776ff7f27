"""The typed result of ``spectrace diff``: :class:`DiffResult` and its parts.

Each part is a dataclass whose fields, in declaration order, are the keys of the
``spectrace.diff/1`` JSON document (:meth:`DiffResult.to_json`); :meth:`DiffResult.from_json`
rebuilds the typed result from such a document (the TUI's child-process analysis ships the
JSON), and :mod:`spectrace.tracer.diff_schema` generates the document's JSON Schema from these
annotations. Rates are shares in 0..1, null where nothing was counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

import numpy as np

from .compare import PairedComparison
from .findings.model import Finding
from .metrics import CONVENTIONS, Acceptance, Count, Rate
from .typed_json import Constraint, from_json, to_json

SCHEMA: Literal["spectrace.diff/1"] = "spectrace.diff/1"

Position = Annotated[int, Constraint(minimum=0)]
#: Ids of a proposal: ints, or ``"id:text"`` strings when decoded.
Ids = list[int | str]


@dataclass
class SideSummary:
    """One engine's trace as the diff saw it (metadata and sizes).

    Attributes:
        files: the trace's files (one trace may span several).
        engine, engine_version, method: from the trace metadata, null when unknown.
        k: the drafts per block the engine was configured with, null when unknown.
        source: how the trace was recorded (e.g. live capture, log import), null if unknown.
        status: complete, or recording (a writer had not closed the file).
        requests: requests in the trace.
        blocks: draft blocks in the trace.
    """

    files: list[str]
    engine: str | None
    engine_version: str | None
    method: str | None
    k: int | None
    source: str | None
    status: Literal["complete", "recording"]
    requests: Count
    blocks: Count


@dataclass
class MatchedBy:
    """How many request pairs matched by each rule.

    Attributes:
        prompt: by identical prompt ids.
        req_id: by request id (one side lacks its prompt ids).
        order: by order (neither side knows its prompt ids).
    """

    prompt: Count
    req_id: Count
    order: Count


@dataclass
class RequestMatch:
    """The request matching of the two traces.

    Attributes:
        matched: matched request pairs.
        matched_by: how they matched.
        unmatched_ours, unmatched_theirs: request ids without a partner.
        content_diverged: matched pairs whose full sequences differ somewhere.
        content_unknown: matched pairs where either side lacks its output ids.
    """

    matched: Count
    matched_by: MatchedBy
    unmatched_ours: list[str]
    unmatched_theirs: list[str]
    content_diverged: Count
    content_unknown: Count


@dataclass
class Coverage:
    """Which blocks were compared.

    Attributes:
        ours_blocks, theirs_blocks: blocks in each trace.
        ours_on_matched_content, theirs_on_matched_content: blocks that lie on matched
            content (comparable).
        paired: paired blocks (same request pair, same anchor position).
        ours_coverage, theirs_coverage: paired / on matched content, null when none.
    """

    ours_blocks: Count
    theirs_blocks: Count
    ours_on_matched_content: Count
    theirs_on_matched_content: Count
    paired: Count
    ours_coverage: Rate
    theirs_coverage: Rate

    def blocks(self, side: str) -> int:
        """Blocks in ``side``'s trace (``ours`` | ``theirs``)."""
        return self.ours_blocks if side == "ours" else self.theirs_blocks

    def on_matched_content(self, side: str) -> int:
        """``side``'s blocks on matched content (``ours`` | ``theirs``)."""
        return self.ours_on_matched_content if side == "ours" else self.theirs_on_matched_content


@dataclass
class Agreement:
    """How the paired blocks compare (definitions in spectrace.tracer.compare).

    Attributes:
        paired_blocks: paired blocks compared.
        anchor_mismatches: paired blocks whose known anchors differ.
        anchors_unknown: paired blocks with an unknown anchor on either side.
        exact_matches: paired blocks with the same k and every slot equal.
        exact_match_rate: exact_matches / paired_blocks, null when none.
        k_mismatches: paired blocks whose k differs.
        mean_common_prefix: mean leading equal slots (tokens), null when none.
        per_position: per slot j, the share of blocks with slot j on both sides whose
            slot j is equal.
        per_position_blocks: per slot j, the blocks with slot j on both sides.
        shift_plus_one: per slot j, the share of blocks with slots j and j+1 on both sides
            where ours[j] == theirs[j+1].
        shift_minus_one: the same share for ours[j+1] == theirs[j].
    """

    paired_blocks: Count
    anchor_mismatches: Count
    anchors_unknown: Count
    exact_matches: Count
    exact_match_rate: Rate
    k_mismatches: Count
    mean_common_prefix: Annotated[float | None, Constraint(minimum=0)]
    per_position: list[Rate]
    per_position_blocks: list[Count]
    shift_plus_one: list[Rate]
    shift_minus_one: list[Rate]


@dataclass
class CountedAcceptance:
    """Acceptance of one set of blocks, counted two ways.

    Attributes:
        recorded: from the accepted counts the engine recorded.
        recomputed: recomputed from the emitted output.
    """

    recorded: Acceptance
    recomputed: Acceptance


@dataclass
class EngineAcceptance:
    """One engine's acceptance, on matched content and on all its content.

    Attributes:
        matched_content: its blocks on matched content.
        all_content: all its blocks.
    """

    matched_content: CountedAcceptance
    all_content: CountedAcceptance


@dataclass
class AcceptanceBySide:
    """Acceptance per engine (conventions in the top-level key).

    Attributes:
        ours, theirs: each engine's figures.
    """

    ours: EngineAcceptance
    theirs: EngineAcceptance


@dataclass
class ContentDivergence:
    """Where one matched request pair's full sequences first differ.

    Attributes:
        ours_req, theirs_req: the request ids.
        position: the first differing index of prompt + output (tokens).
        prompt_len: our prompt's length (position - prompt_len is the output token).
        ours_token, theirs_token: the differing ids.
    """

    ours_req: str
    theirs_req: str
    position: Position
    prompt_len: Position
    ours_token: int
    theirs_token: int


@dataclass
class Example:
    """One divergent paired block.

    Attributes:
        ours_req, theirs_req: the request ids.
        position: the anchor position (tokens).
        anchor_ours, anchor_theirs: the anchor ids (-1 unknown).
        anchor_equal: anchor equality (equal, or unknown on either side).
        ours, theirs: the proposals.
        first_differing_slot: the first slot up to the longer proposal that is not equal,
            null when only the anchors differ.
    """

    ours_req: str
    theirs_req: str
    position: Position
    anchor_ours: int
    anchor_theirs: int
    anchor_equal: bool
    ours: Ids
    theirs: Ids
    first_differing_slot: int | None


@dataclass
class GateSummary:
    """The thresholds and selection a diff was judged by (``--request``, ``--positions``,
    ``--min-agreement``, ``--max-errors``, ``--ignore``; see spectrace.tracer.gate).

    Attributes:
        passed: the gate passed (then ``diverged`` is false).
        problems: why it failed, one line each (empty when it passed).
        paired_blocks: paired blocks in the selection.
        agreeing_blocks: of those, the blocks with the same anchor, k and every slot.
        agreement: agreeing_blocks / paired_blocks, null when none.
        errors_counted: error findings in the selection, ignored kinds left out.
        min_agreement: the least agreement required (0..1).
        max_errors: the most error findings allowed.
        ignore: the finding kinds not counted.
        requests: the request ids selected (ours or theirs), null: all.
        positions: the anchor positions selected (``A:B``, half-open), null: all.
    """

    passed: bool
    problems: list[str]
    paired_blocks: Count
    agreeing_blocks: Count
    agreement: Rate
    errors_counted: Count
    min_agreement: Annotated[float, Constraint(minimum=0, maximum=1)]
    max_errors: Count
    ignore: list[str]
    requests: list[str] | None
    positions: str | None


@dataclass
class RequestRow:
    """One matched request pair's figures (``spectrace diff --by-request``).

    Attributes:
        ours_req, theirs_req: the request ids.
        paired_blocks: paired blocks of the pair (in the selection).
        exact_matches: of those, the exact matches (same k, every slot equal).
        exact_match_rate: exact_matches / paired_blocks, null when none.
        content_divergence: the first differing position of the full sequences, null when
            they agree.
        first_divergent_position: anchor position of the first divergent paired block,
            null when none.
        first_divergent_slot: its first differing slot, null when only the anchors differ
            or there is none.
        ours, theirs: that block's proposals (``"id:text"`` strings when decoded).
        first_error: the kind of the first error finding located at this request, or null.
        acceptance_ours, acceptance_theirs: recorded acceptance rate (accepted / verified
            drafts) of each side's blocks of this pair on matched content, null when none.
    """

    ours_req: str
    theirs_req: str
    paired_blocks: Count
    exact_matches: Count
    exact_match_rate: Rate
    content_divergence: Position | None
    first_divergent_position: Position | None
    first_divergent_slot: Position | None
    ours: Ids
    theirs: Ids
    first_error: str | None
    acceptance_ours: Rate
    acceptance_theirs: Rate


@dataclass(kw_only=True)
class DiffResult:
    """The spectrace diff report (spectrace.diff/1).

    Attributes:
        schema: the document's schema id.
        diverged: true: exit status 1 (an error finding or a differing paired block, or
            nothing comparable).
        reasons: why it diverged, one line each (empty when it did not).
        findings: most severe first; the first error names the bug.
        ours, theirs: the two traces.
        requests: the request matching.
        coverage: which blocks were compared.
        agreement: how the paired blocks compare.
        acceptance: acceptance per engine.
        content_divergence: every matched request pair whose content differs.
        examples: the first divergent paired blocks (``--examples N``; 0: all).
        conventions: the acceptance conventions, in words.
        gate: present when a selection or thresholds were given: what the verdict was
            judged by (then diverged and reasons are the gate's).
        by_request: present with ``--by-request``: one row per matched request pair.
    """

    schema: Literal["spectrace.diff/1"] = SCHEMA
    diverged: bool
    reasons: list[str]
    findings: list[Finding]
    ours: SideSummary
    theirs: SideSummary
    requests: RequestMatch
    coverage: Coverage
    agreement: Agreement
    acceptance: AcceptanceBySide
    content_divergence: list[ContentDivergence]
    examples: list[Example]
    conventions: str = CONVENTIONS
    gate: GateSummary | None = field(default=None, metadata={"omit_none": True})
    by_request: list[RequestRow] | None = field(default=None, metadata={"omit_none": True})
    #: bool [P]: paired block whose anchor or proposal differs (not in the JSON; None in a
    #: result rebuilt by :meth:`from_json`).
    bad: np.ndarray | None = field(default=None, metadata={"json": False})
    #: The kernel's comparison of the paired blocks (:func:`~.diff.diff_traces`'; not in the
    #: JSON; None in a result rebuilt by :meth:`from_json`): ``--by-request`` reads it.
    paired: PairedComparison | None = field(default=None, metadata={"json": False})

    def to_json(self) -> dict:
        """The ``spectrace.diff/1`` document (JSON-serialisable)."""
        return to_json(self)

    @classmethod
    def from_json(cls, doc: dict) -> DiffResult:
        """Rebuild the typed result from a ``spectrace.diff/1`` document.

        Raises:
            ValueError: another schema id, or a finding of unknown kind/severity/side.
            TypeError: a missing or unknown key.
        """
        if doc.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} document: schema {doc.get('schema')!r}")
        return from_json(cls, doc)


@dataclass
class RunSummary:
    """One run's row of ``spectrace diff GOLDEN RUN [RUN...]``.

    Attributes:
        files: the run's trace files.
        diverged: the run diverges from the golden (exit status 1).
        paired_blocks: paired blocks (golden and run, same request pair and position).
        exact_matches: of those, the exact matches.
        exact_match_rate: exact_matches / paired_blocks, null when none.
        first_error: ``kind: sentence`` of the first error finding, null when none.
        golden_acceptance, run_acceptance: recorded acceptance rate (accepted / verified
            drafts) on matched content, null when nothing was counted.
    """

    files: list[str]
    diverged: bool
    paired_blocks: Count
    exact_matches: Count
    exact_match_rate: Rate
    first_error: str | None
    golden_acceptance: Rate
    run_acceptance: Rate

    @classmethod
    def of(cls, r: DiffResult) -> RunSummary:
        """The row of diff result ``r`` (golden = ours, the run = theirs)."""
        errors = [f for f in r.findings if f.severity == "error"]
        acc = r.acceptance
        return cls(
            files=list(r.theirs.files),
            diverged=r.diverged,
            paired_blocks=r.agreement.paired_blocks,
            exact_matches=r.agreement.exact_matches,
            exact_match_rate=r.agreement.exact_match_rate,
            first_error=f"{errors[0].kind}: {errors[0].message}" if errors else None,
            golden_acceptance=acc.ours.matched_content.recorded.acceptance_rate,
            run_acceptance=acc.theirs.matched_content.recorded.acceptance_rate,
        )


RUNS_SCHEMA: Literal["spectrace.diff-runs/1"] = "spectrace.diff-runs/1"


@dataclass(kw_only=True)
class RunsResult:
    """``spectrace diff GOLDEN RUN RUN...``: each run against one golden (spectrace.diff-runs/1).

    Attributes:
        schema: the document's schema id.
        diverged: true: exit status 1 (at least one run diverges).
        golden: the golden's trace files (ours in each per-run result).
        runs: one summary row per run, in the order given.
        results: each run's full diff result (golden = ours, the run = theirs).
    """

    schema: Literal["spectrace.diff-runs/1"] = RUNS_SCHEMA
    diverged: bool
    golden: list[str]
    runs: list[RunSummary]
    results: list[DiffResult]

    @classmethod
    def of(cls, results: list[DiffResult]) -> RunsResult:
        """The document of per-run results (at least one) against one golden."""
        rows = [RunSummary.of(r) for r in results]
        return cls(
            diverged=any(x.diverged for x in rows),
            golden=list(results[0].ours.files),
            runs=rows,
            results=results,
        )

    def to_json(self) -> dict:
        """The ``spectrace.diff-runs/1`` document (JSON-serialisable)."""
        return to_json(self)
