"""The evidence of each finding kind, typed: one ``TypedDict`` per kind (plain dicts at run
time, so the JSON is the dict itself). :data:`EVIDENCE` maps each kind to its type; the
generated JSON Schema checks a finding's evidence against the type of its kind.

Ids in examples are ints, or ``"id:text"`` strings when a tokenizer is known.
"""

from __future__ import annotations

from typing import TypedDict

Ids = list[int | str]


class ProposalPair(TypedDict):
    """Both proposals of one paired block."""

    ours: Ids
    theirs: Ids


class LoopRef(TypedDict):
    """One looping request: its id, the loop's start position and period (tokens)."""

    request: str
    start: int
    period: int


class DegenerateEvidence(TypedDict):
    """degenerate_output: loops in the output."""

    requests: int
    looped_tokens: int
    period: int
    loop_start: int
    unit: Ids
    loops: list[LoopRef]


class DivergenceRef(TypedDict):
    """One diverging request pair: our request id and the position (tokens)."""

    request: str
    position: int


class ContentEvidence(TypedDict):
    """content_divergence: where the outputs first differ."""

    requests: int
    position: int
    ours_token: Ids
    theirs_token: Ids
    blocks_not_compared_ours: int
    divergences: list[DivergenceRef]


class ContentOnlyEvidence(TypedDict):
    """content_only: a side without draft blocks (a run without speculative decoding):
    only the outputs of the matched requests were compared."""

    without_drafts: list[str]
    requests: int
    identical: int


class AnchorPair(TypedDict):
    """Both anchors of one paired block."""

    ours_anchor: Ids
    theirs_anchor: Ids


class _AnchorBase(TypedDict):
    blocks: int


class AnchorEvidence(_AnchorBase, total=False):
    """anchor_shift: within a trace (checked, shift, shift_rates) or across a pair (paired,
    example)."""

    checked: int
    shift: int | None
    shift_rates: dict[str, float]
    paired: int
    example: AnchorPair


class LayoutEvidence(TypedDict):
    """layout_shift: the best shift and its agreement."""

    shift: int
    rate: float
    slot_pairs: int
    same_slot_rate: float
    paired_blocks: int
    rates: dict[str, float]
    example: ProposalPair


class VocabEvidence(TypedDict, total=False):
    """vocab_mapping: across a pair (decided_by ``pooled`` | ``slot`` | ``id_range``;
    consistency, slots, offset or factor, max ids, example; per_slot_consistency for a slot;
    range_bound, theirs_at_or_above, theirs_ids, ours_ids for the id range) or within a trace
    (ids, vocab_size / draft_vocab_size, max_id)."""

    consistency: float
    slots: int
    offset: int
    factor: float
    ours_max_id: int
    theirs_max_id: int
    example: ProposalPair
    ids: int
    vocab_size: int
    draft_vocab_size: int
    max_id: int
    decided_by: str
    per_slot_consistency: list[float | None]
    range_bound: int
    theirs_at_or_above: int
    theirs_ids: int
    ours_ids: int


class KEvidence(TypedDict):
    """k_mismatch: how the proposal lengths differ. Between two runs: ``ours_k`` and
    ``theirs_k`` are each side's k values; of one trace (a model drafter proposing other
    than its /meta k): ``ours_k`` the trace's k values, ``theirs_k`` ``[configured k]``,
    ``typical_difference`` the trace's k minus the configured one."""

    blocks: int
    typical_difference: int
    ours_k: list[int]
    theirs_k: list[int]


class VerifiedExample(TypedDict):
    """One block's proposed and verified ids."""

    proposed: Ids
    verified: Ids


class VerifiedEvidence(TypedDict):
    """verified_differs: verified ids that are not the proposal."""

    blocks: int
    per_slot: list[int]
    equals_anchor: float
    placeholders: float
    trimmed_blocks: int
    example: VerifiedExample


class ConstantEvidence(TypedDict):
    """constant_drafts: blocks holding one id in every slot."""

    blocks: int
    eligible: int
    rate: float
    reference_rate: float | None
    example: Ids


class DepthEvidence(TypedDict):
    """depth_divergence: agreement per slot (unconditional), the conditional curve (slot j
    agreeing given slots < j agree; null without support) with its blocks, the slot where it
    breaks, and slot 1 given slot 0 (the curve at slot 1)."""

    per_position: list[float]
    conditional: list[float | None]
    conditional_blocks: list[int]
    break_slot: int
    slot1_given_slot0: float | None


class GroupCount(TypedDict):
    """Paired blocks of one group and how many of them mismatch."""

    blocks: int
    mismatches: int


class StaleEvidence(TypedDict):
    """stale_state: the verdict of the previous block the mismatches follow (``rejection``,
    ``acceptance``, ``partial``, ``rejected``), the group's and the other blocks' counts and
    rates, the one-sided Fisher p-value, the counts by previous verdict (``first``,
    ``accepted``, ``partial``, ``rejected``), and the after-rejection figures."""

    verdict: str
    mismatch_rate: float
    otherwise: float
    blocks_after: int
    mismatches_after: int
    blocks_otherwise: int
    mismatches_otherwise: int
    p_value: float
    by_verdict: dict[str, GroupCount]
    after_rejection: float
    blocks_after_rejection: int


class BatchChange(TypedDict):
    """A request's batch change: the block's position (tokens) and its batch row and size
    against the request's previous block (null for the first block)."""

    position: int
    from_row: int | None
    to_row: int
    from_size: int | None
    to_size: int


class BatchEvidence(TypedDict):
    """batch_dependence: the deciding group (``by``: ``batch_row``/``batch_size`` for rows >
    0 / sizes > 1, ``*_change`` for a change since the previous block, ``*_moved`` for at or
    after the request's first change), mismatch rates and counts outside (low) and inside
    (high) it, the one-sided Fisher p-value, and the change at the first location."""

    by: str
    mismatch_rate_low: float
    mismatch_rate_high: float
    blocks_low: int
    blocks_high: int
    mismatches_low: int
    mismatches_high: int
    p_value: float
    change: BatchChange | None


class UnverifiedEvidence(TypedDict):
    """unverified_drafts: unverified blocks, requests that stop drafting or never draft
    where the other engine drafts (ids of this side), skipped anchors."""

    unverified_blocks: int
    requests_stopping: list[str]
    requests_never_drafting: list[str]
    skipped_anchors: int


class ImpossibleEvidence(TypedDict):
    """impossible_values: block values no engine can produce, by rule; the first one."""

    blocks: int
    rules: dict[str, int]
    rule: str
    column: str
    value: int
    limit: int | None
    row: int


class CaptureEvidence(TypedDict):
    """capture_incomplete: how the capture ended (/meta ``capture`` or the older
    ``exit_status`` / ``killed_by_signal`` / ``interrupted`` / ``aborted`` items)."""

    ended: str | None
    exit_status: int | None
    signal: int | None
    interrupted: bool
    aborted: str | None
    #: Counters on which the trace disagrees with the engine's own (/meta ``checks``: vLLM's
    #: spec-decode counters, per-request metrics); empty when they agree or nothing says.
    counters_mismatch: list[str]
    #: /meta ``checks`` says ``pending`` in a closed file: the vLLM hook writes that when
    #: recording starts and replaces it when its close has flushed every block and
    #: cross-checked them, so its close stopped before that (blocks may be missing).
    checks_pending: bool
    #: The capture recorded nothing at all: no draft block and no request.
    empty: bool
    #: Trace lines an import dropped (/meta ``import``: malformed lines, out-of-range values
    #: included, and chain gaps of a drafter that drafts every step); 0 when none or no import.
    dropped_lines: int
    #: The first dropped line, ``FILE:LINE: what``; null when none.
    first_dropped: str | None
    #: Blocks an import found at a position their request had already passed (/meta
    #: ``import`` chain breaks: a repeated or reordered trace line, or a reused request id):
    #: the trace is not one run's record; 0 when none or no import.
    chain_breaks: int
    #: The first chain break, ``FILE:LINE: what``; null when none.
    first_chain_break: str | None
    #: Other invariants the import found broken, by kind (/meta ``import`` violations that
    #: no other finding names: ``len(emit) != ns``, ``len(draft) != k``, ``drafts/row``,
    #: ``anchor mismatch`` with the requests file); empty when none or no import.
    violations: dict[str, int]
    #: The first of them, ``FILE:LINE: what``; null when none.
    first_violation: str | None
    #: Blocks the recorder counted when it closed the file (/meta ``checks`` ``trace``
    #: ``blocks``, summed over the files of a trace); null when it says nothing.
    recorded_blocks: int | None
    #: Gaps in the anchor chain of a model drafter's requests (a block at a position past
    #: the previous verified block's anchor + accepted + 1: steps drafted without a block
    #: in the trace; a VT import counts its own, in ``dropped_lines``); 0 when none.
    chain_gaps: int
    #: The first gap, ``request R: ...``; null when none.
    first_chain_gap: str | None
    #: Requests whose first block drafts past their first output token (at ``len(prompt)``)
    #: although a model drafter drafts at every step: the blocks at the request's start are
    #: missing; 0 when none (or the prompt is unknown).
    head_gaps: int
    #: The first such request, ``request R: ...``; null when none.
    first_head_gap: str | None
    #: Requests whose output goes on past what their last block reaches (its anchor
    #: position + accepted + 1; its position when never verified) although a model drafter
    #: drafts at every step: the blocks at the request's end are missing; 0 when none.
    tail_gaps: int
    #: The first such request, ``request R: ...``; null when none.
    first_tail_gap: str | None
    #: Requests a model drafter served with at least 2 output tokens that hold no block
    #: (each such request drafted at least once); 0 when none.
    undrafted_requests: int
    #: The first of them, by request id; null when none.
    first_undrafted: str | None
    #: Data-parallel ranks below the highest one read that no file of the trace holds
    #: (files ranked 0 and 2: rank 1's file is missing); empty for one file.
    missing_ranks: list[int]


class IncompleteRef(TypedDict):
    """One request whose work is missing: its finish reason and output length (tokens),
    and the other side's (null in ``spectrace check``)."""

    request: str
    finish_reason: str
    output_tokens: int
    other_finish_reason: str | None
    other_output_tokens: int | None


class RequestsEvidence(TypedDict):
    """requests_incomplete: request ids (of this side) aborted or unfinished, with an empty
    output, or cut short where the other side went on; the other side's requests this side
    lacks (their ids)."""

    requests: int
    aborted: list[str]
    empty_output: list[str]
    cut_short: list[str]
    missing: list[str]
    first: IncompleteRef | None


class TrimmedEvidence(TypedDict):
    """trimmed_drafts: blocks whose target verified fewer drafts than were proposed."""

    blocks: int
    verified_blocks: int
    proposed_tokens: int
    verified_tokens: int
    first_k: int
    first_num_verified: int


class AcceptedPair(TypedDict):
    """One block's recorded and recomputed accepted counts."""

    recorded: int
    recomputed: int


class _BookkeepingBase(TypedDict):
    blocks: int
    recorded_total: int
    recomputed_total: int
    recorded_disagreeing: int
    recomputed_disagreeing: int
    emitted_count_mismatch: int


class BookkeepingEvidence(_BookkeepingBase, total=False):
    """acceptance_bookkeeping: recorded vs recomputed accepted counts (``recorded_total``,
    ``recomputed_total``: summed over every block with both counts known, legitimate
    end-of-output trimming included; ``recorded_disagreeing``, ``recomputed_disagreeing``:
    over the disagreeing blocks with both counts known, the ones the message names;
    ``first``: the first such block's, absent when only the import's lines say it), and the
    VT import's lines
    whose accepted count disagrees with their own emitted ids (``import_lines``: kind ->
    lines; ``first_line``: FILE:LINE: what), and the blocks whose emitted ids the output
    contradicts at their positions (``emitted_ids_mismatch``, present when any), and the
    blocks whose correction is the rejected draft itself (``rejected_draft_emitted``,
    present when any: the sampler, not the count, is then the likely defect)."""

    first: AcceptedPair
    import_lines: dict[str, int]
    first_line: str
    emitted_ids_mismatch: int
    rejected_draft_emitted: int


class MismatchEvidence(TypedDict):
    """draft_mismatch: proposals differing with no specific pattern."""

    blocks: int
    paired: int
    rate: float
    from_slot0: float
    example: ProposalPair


class DriftRef(TypedDict):
    """One pair of requests whose prompts differ but share most tokens (lengths in tokens;
    ``run_ours``/``run_theirs``: where the common run starts in each prompt)."""

    ours_request: str
    theirs_request: str
    first_difference: int
    ours_len: int
    theirs_len: int
    common_prefix: int
    common_suffix: int
    common_run: int
    run_ours: int
    run_theirs: int


class PromptDriftEvidence(TypedDict):
    """prompt_drift: request pairs paired by prompt similarity (the threshold: a common run
    of at least ``min_common_run`` tokens and ``min_share`` of the shorter prompt); the first
    pair's tokens outside the common run (the last 16 before it, the first 16 after it)."""

    requests: int
    min_common_run: int
    min_share: float
    first: DriftRef
    ours_before: Ids
    ours_after: Ids
    theirs_before: Ids
    theirs_after: Ids
    pairs: list[DriftRef]


#: The evidence type of each finding kind.
class TargetTie(TypedDict):
    """One position where the targets disagree, with each side's top-2 margin there
    (None: not recorded)."""

    request: str
    position: int
    ours: float | None
    theirs: float | None


class NearTieEvidence(TypedDict):
    """near_ties: differing paired blocks (and target disagreements) at near-tie margins."""

    threshold: float
    differing: int
    near_ties: int
    margin_known: int
    target_disagreements: int
    target_near_ties: int
    targets: list[TargetTie]


EVIDENCE: dict[str, type] = {
    "impossible_values": ImpossibleEvidence,
    "capture_incomplete": CaptureEvidence,
    "requests_incomplete": RequestsEvidence,
    "prompt_drift": PromptDriftEvidence,
    "degenerate_output": DegenerateEvidence,
    "content_divergence": ContentEvidence,
    "content_only": ContentOnlyEvidence,
    "anchor_shift": AnchorEvidence,
    "layout_shift": LayoutEvidence,
    "vocab_mapping": VocabEvidence,
    "k_mismatch": KEvidence,
    "verified_differs": VerifiedEvidence,
    "constant_drafts": ConstantEvidence,
    "depth_divergence": DepthEvidence,
    "stale_state": StaleEvidence,
    "batch_dependence": BatchEvidence,
    "unverified_drafts": UnverifiedEvidence,
    "trimmed_drafts": TrimmedEvidence,
    "acceptance_bookkeeping": BookkeepingEvidence,
    "near_ties": NearTieEvidence,
    "draft_mismatch": MismatchEvidence,
}
