"""Where a golden's blocks sit: the walk a parity gate does over one request.

An oracle-capture golden keeps, per request, the blocks in call order with their anchor id
and drafts but no position and no acceptance. The gate places them by walking the request's
prompt + output ids (``full``):

* the first block's anchor is the first output token, at position ``len(prompt)``;
* a block's acceptance is the longest prefix of its drafts equal to ``full[p+1:]``;
* the next block's anchor is at ``p + acc + 1``;
* a block whose position is past the end of ``full``, or whose anchor is not ``full[p]``,
  ends the walk: it and every later block of the request stay unplaced;
* a block whose bonus token would fall past the end (``p + acc + 1 >= len(full)``, the
  output trimmed at ``max_tokens``) keeps the acceptance the output shows;
* a block anchored at the output's last token (``p == len(full) - 1``) is the request's
  final proposal: vLLM's drafter proposes once more after the step that sampled the last
  token (``GPUModelRunner.execute_model`` proposes before ``Scheduler.update_from_output``
  finishes the request), so nothing ever verified it and vLLM's counters leave it out;
* after a block cut at the end, the final proposal was drafted from the sampled bonus that
  the trimming removed: its position is past the end and it is not placed
  (``final_past_end``), but it is no problem; a block past the end anywhere else is one.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

#: Why a block was not placed, in the order a summary names them.
UNPLACED_REASONS = (
    "anchor_mismatch",
    "past_end",
    "final_past_end",
    "invalid_block",
    "after_walk_end",
)


@dataclass
class PlacedBlock:
    """One placed block.

    Attributes:
        index: the block's index in the request's ``blocks`` list.
        position: the anchor's absolute index in prompt + output (tokens).
        anchor: the anchor id; ``drafts``: the proposed ids (len k).
        accepted: drafts equal to the following tokens (the longest prefix).
        past_end: the bonus token falls past the end of the output (``max_tokens``):
            ``accepted`` is what the output shows, the engine may have accepted more.
        final: the anchor is the output's last token: the request's final proposal, never
            verified (``accepted`` 0, not ``past_end``).
    """

    index: int
    position: int
    anchor: int
    drafts: list[int]
    accepted: int
    past_end: bool
    final: bool = False


@dataclass
class Walk:
    """The placement of one request's blocks.

    Attributes:
        placed: the placed blocks, in call order.
        unplaced: reason (one of :data:`UNPLACED_REASONS`) -> blocks not placed.
        ended_at: index of the block that ended the walk and why (``(i, reason)``), or None.
        final: index of the request's final proposal (placed at the last token, or past
            the end right after a block cut there), or None.
    """

    placed: list[PlacedBlock] = field(default_factory=list)
    unplaced: Counter = field(default_factory=Counter)
    ended_at: tuple[int, str] | None = None
    final: int | None = None


def accepted_prefix(drafts: list[int], full: list[int], position: int) -> int:
    """The longest ``m`` with ``drafts[j] == full[position + 1 + j]`` for all ``j < m``."""
    m = 0
    for j, t in enumerate(drafts):
        q = position + 1 + j
        if q >= len(full) or full[q] != t:
            break
        m += 1
    return m


def place(full: list[int], prompt_len: int, blocks: list[tuple[int, list[int]] | None]) -> Walk:
    """Walk one request's blocks (see the module docstring).

    Args:
        full: prompt + output token ids; ``prompt_len``: the prompt's length (tokens).
        blocks: per block in call order, ``(anchor, drafts)``, or None for a block that is
            not readable (it ends the walk as ``invalid_block``).
    Returns:
        The :class:`Walk`.
    """
    walk = Walk()
    p = prompt_len
    for i, blk in enumerate(blocks):
        if walk.ended_at is not None:
            walk.unplaced["after_walk_end"] += 1
            continue
        reason = _stop_reason(full, p, blk)
        if reason is not None:
            last = walk.placed[-1] if walk.placed else None
            if reason == "past_end" and last is not None and last.past_end and last.index == i - 1:
                reason = "final_past_end"  # drafted from the bonus the trimming removed
                walk.final = i
            walk.unplaced[reason] += 1
            walk.ended_at = (i, reason)
            continue
        assert blk is not None
        anchor, drafts = blk
        if p == len(full) - 1:  # the final proposal: nothing after it to verify
            walk.placed.append(PlacedBlock(i, p, anchor, drafts, 0, False, final=True))
            walk.final = i
            p += 1
            continue
        acc = accepted_prefix(drafts, full, p)
        walk.placed.append(PlacedBlock(i, p, anchor, drafts, acc, p + acc + 1 >= len(full)))
        p += acc + 1
    return walk


def _stop_reason(full: list[int], p: int, blk: tuple[int, list[int]] | None) -> str | None:
    if blk is None:
        return "invalid_block"
    if p >= len(full):
        return "past_end"
    if blk[0] != full[p]:
        return "anchor_mismatch"
    return None
