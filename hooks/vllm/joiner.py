"""The block joiner shared by the V1 and V2 paths: each proposal is joined with the next
verification of the same request, by request id (vLLM re-sorts its batch every step, so
nothing is keyed by row)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class BlockSink(Protocol):
    """Where joined blocks go: :class:`~spectrace.hooks.vllm.session.Session` (or a
    :class:`~spectrace.tracer.store.TraceWriter`)."""

    def add_block(
        self, req_id: str, step: int, position: int, anchor: int, proposed: Sequence[int], **kw
    ) -> None: ...


@dataclass
class OpenBlock:
    """A proposal waiting for its verdict."""

    step: int
    position: int
    anchor: int
    proposed: list[int]
    t_ns: int
    batch_row: int = -1
    batch_size: int = -1
    draft_margin: list[float] | None = None


class BlockJoiner:
    """Joins each proposal with the next verification of the same request, by request id.

    The batch order changes from step to step, so nothing is keyed by row. ``sink`` is an
    object with ``add_block(req_id, step, position, anchor, proposed, *, verified, accepted,
    emitted, t_ns)`` (a :class:`~spectrace.tracer.store.TraceWriter` or a :class:`Session`).

    Attributes:
        open: request id -> the :class:`OpenBlock` proposed for it and not yet verified.
        verified_mismatch: verifications whose ids were not a prefix of the proposal (vLLM's
            scheduler hands the drafts back; a difference is a finding, recorded as is).
    """

    def __init__(self, sink: BlockSink) -> None:
        self.sink = sink
        self.open: dict[str, OpenBlock] = {}
        self.verified_mismatch = 0

    def propose(
        self,
        req_id: str,
        step: int,
        position: int,
        anchor: int,
        proposed: Sequence[int],
        t_ns: int | None = None,
        batch_row: int = -1,
        batch_size: int = -1,
        draft_margin: Sequence[float] | None = None,
    ) -> None:
        """Open a block; a still-open older proposal of ``req_id`` is written unverified.

        ``batch_row``/``batch_size``: the request's row and the rows of the proposing step;
        ``draft_margin``: the drafter's top-1 minus top-2 logit per slot (None: unknown).
        """
        if req_id in self.open:
            self.drop(req_id)
        self.open[req_id] = OpenBlock(
            int(step),
            int(position),
            int(anchor),
            [int(t) for t in proposed],
            time.time_ns() if t_ns is None else int(t_ns),
            int(batch_row),
            int(batch_size),
            None if draft_margin is None else [float(m) for m in draft_margin],
        )

    def verdict(self, req_id: str, verified: Sequence[int] | None, emitted: Sequence[int]) -> bool:
        """Close ``req_id``'s open block with the ids the target verified and the tokens it
        emitted (accepted = len(emitted) - 1). Without verified ids the block is written
        unverified. Returns False when no block was open."""
        o = self.open.pop(req_id, None)
        if o is None:
            return False
        if not verified or not emitted:
            self._write(req_id, o)
            return True
        verified = [int(t) for t in verified]
        if verified != o.proposed[: len(verified)]:
            self.verified_mismatch += 1
        self._write(
            req_id,
            o,
            verified=verified,
            accepted=len(emitted) - 1,
            emitted=[int(t) for t in emitted],
        )
        return True

    def verdict_counts(
        self, req_id: str, num_verified: int, accepted: int, bonus: int
    ) -> list[int] | None:
        """Close ``req_id``'s block from counts (the V2 ``propose`` arguments): verified =
        the first ``num_verified`` proposed ids, emitted = the first ``accepted`` proposed
        ids + ``bonus``. Returns the emitted ids, or None when no block was open."""
        o = self.open.pop(req_id, None)
        if o is None:
            return None
        if num_verified <= 0:
            self._write(req_id, o)
            return None
        emitted = o.proposed[:accepted] + [int(bonus)]
        self._write(
            req_id, o, verified=o.proposed[:num_verified], accepted=int(accepted), emitted=emitted
        )
        return emitted

    def drop(self, req_id: str) -> None:
        """Write ``req_id``'s open block (if any) as unverified."""
        o = self.open.pop(req_id, None)
        if o is not None:
            self._write(req_id, o)

    def drop_all(self) -> None:
        """Write every open block as unverified (request finish, shutdown)."""
        for req_id in list(self.open):
            self.drop(req_id)

    def _write(
        self, req_id: str, o: OpenBlock, verified=None, accepted: int = -1, emitted=None
    ) -> None:
        self.sink.add_block(
            req_id,
            o.step,
            o.position,
            o.anchor,
            o.proposed,
            verified=verified,
            accepted=accepted,
            emitted=emitted,
            t_ns=o.t_ns,
            batch_row=o.batch_row,
            batch_size=o.batch_size,
            proposal_source=1,
            draft_margin=o.draft_margin,
        )  # the drafter's own output, read in the worker
