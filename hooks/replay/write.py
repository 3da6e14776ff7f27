"""Teacher-forced acceptance and the replay trace.

A replay block at position p holds the engine's anchor (what its target sampled after the
reference prefix ``sequence[:p]``) and its k proposals, checked against the reference
continuation (teacher-forced): ``verified`` = the drafts that have a reference token to check
against (all k but near the end), ``accepted`` = their longest prefix equal to the
reference, ``emitted`` = the reference tokens that acceptance produces (accepted + 1).
Where the engine's target sampled another token than the reference, the block keeps that
anchor (its drafts follow from it, so they rarely match the reference): the disagreement
itself is the evidence, counted in ``meta["replay"]["anchor_mismatches"]``, and a replay
diff leaves such positions unpaired.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from spectrace.tracer import schema
from spectrace.tracer.store import TraceWriter

from .positions import Reference, Site

#: /meta ``source`` of a replay trace.
SOURCE = schema.SOURCE_REPLAY


@dataclass
class Draft:
    """One engine's answer at one site.

    Attributes:
        site: where; ``anchor``: the token the engine's target sampled at ``site.position``;
        proposed: the k ids drafted after it (int); ``draft_margin``: the drafter's top-1 minus
        top-2 logit per slot (None: unknown); ``target_margin``: the target's top-1 minus top-2
        logit where it sampled the anchor (NaN: unknown).
    """

    site: Site
    anchor: int
    proposed: list[int]
    draft_margin: list[float] | None = None
    target_margin: float = math.nan


@dataclass(frozen=True)
class Verdict:
    """Teacher-forced verdict of one block (None / -1 past the reference's end)."""

    verified: list[int] | None
    accepted: int
    emitted: list[int] | None


def teacher_forced(sequence: Sequence[int], position: int, proposed: Sequence[int]) -> Verdict:
    """The :class:`Verdict` of ``proposed`` drafted after ``anchor`` at ``position``.

    With ``nxt = sequence[position+1 : position+1+k+1]`` (up to k+1 reference tokens):
    verified = ``proposed[:min(k, len(nxt) - 1)]``, accepted = the longest verified prefix
    equal to ``nxt``, emitted = ``nxt[:accepted + 1]``. No token after the anchor gives
    (None, -1, None). The anchor itself is not checked (see the module docstring).
    """
    k = len(proposed)
    nxt = [int(t) for t in sequence[position + 1 : position + 2 + k]]
    if not nxt:
        return Verdict(None, schema.PAD, None)
    verified = [int(t) for t in proposed[: min(k, len(nxt) - 1)]]
    acc = 0
    while acc < len(verified) and verified[acc] == nxt[acc]:
        acc += 1
    return Verdict(verified, acc, nxt[: acc + 1])


def write_replay(
    out: str | os.PathLike,
    refs: list[Reference],
    drafts: list[Draft],
    meta: dict,
) -> Path:
    """Write the replay trace: the reference requests (their full sequences are what every
    block's position indexes) and one block per draft, in site order.

    Args:
        out: the trace file (``.h5``; no-clobber is the caller's business).
        meta: /meta items (engine, method, k, models); ``source`` and ``replay`` are set here.
    Returns:
        The path of the closed trace.
    """
    mismatches = [d for d in drafts if refs[d.site.request].sequence[d.site.position] != d.anchor]
    replay = dict(meta.pop("replay", {}))
    replay.update(
        {
            "sites": len(drafts),
            "anchor_mismatches": len(mismatches),
            "first_anchor_mismatch": None
            if not mismatches
            else {
                "request": refs[mismatches[0].site.request].req_id,
                "position": mismatches[0].site.position,
            },
        }
    )
    w = TraceWriter(out, {**meta, "source": SOURCE, "replay": replay})
    for ref in refs:
        w.request(ref.req_id, ref.prompt_ids, ref.output_ids, ref.finish_reason)
    for step, d in enumerate(drafts):
        ref = refs[d.site.request]
        v = teacher_forced(ref.sequence, d.site.position, d.proposed)
        w.add_block(
            ref.req_id,
            step,
            d.site.position,
            d.anchor,
            d.proposed,
            verified=v.verified,
            accepted=v.accepted,
            emitted=v.emitted,
            proposal_source=schema.PROPOSAL_FROM_DRAFTER,
            draft_margin=d.draft_margin,
            target_margin=d.target_margin,
        )
    return w.close()
