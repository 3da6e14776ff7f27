"""The propose tap's joins (a mixin of :class:`~.tap.ProposeTap`): a run of staged steps and
deferred request events joined against the carried proposals, blocks to the session."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..joiner import OpenBlock
from .join import Proposals, concat_proposals, join_chunk
from .stage import META_COLS
from .stream import StepRec, assemble

if TYPE_CHECKING:
    from ..session import Session
    from .outputs import EmittedIds


class TapJoin:
    """:class:`~.tap.ProposeTap`'s joining methods (they use its attributes: ``_ids``,
    ``_names``, ``_wrows``, ``_carry_req``, ``_carry``, ``_ring_key``, ``step_observers``,
    ``session``, ``_out``)."""

    session: Session
    step_observers: list
    _ids: dict[str, int]
    _names: list[str]
    _wrows: np.ndarray | None
    _carry_req: np.ndarray
    _carry: Proposals | None
    _ring_key: tuple | None
    _out: EmittedIds

    if TYPE_CHECKING:  # ProposeTap's request methods

        def _register(self, req_id: str, prompt_ids, sampling_params) -> None: ...

        def finish(self, req_id: str, final: bool = True) -> None: ...

    def _join(self, items: list) -> None:
        """Join a run of stream items (steps and deferred finishes/drops) in order."""
        pieces: list[StepRec | int] = []
        finishes: list[tuple] = []
        for item in items:
            if isinstance(item, StepRec):
                if self.step_observers:
                    rows = item.seg.host_np[item.row0 : item.row0 + item.n]
                    for fn in self.step_observers:
                        fn(rows, item.req_ids, item.step)
                pieces.append(item)
            elif item[0] == "add":  # queued by add_request while the drainer runs
                self._register(*item[1:])
            else:
                if item[1] in self._ids:
                    pieces.append(self._ids[item[1]])  # a synthetic drop row
                if item[0] == "finish":
                    finishes.append(item)
        chunk = assemble(pieces, self._ring_key[0] if self._ring_key else META_COLS)
        for item in items:  # rows are copied out: segments whose steps are all joined are free
            if isinstance(item, StepRec):
                seg = item.seg
                seg.pending -= 1
                if seg.pending == 0 and seg.state == "flight":
                    seg.state = "free"
        if chunk is not None:
            self._join_chunk(*chunk)
        for _, rid, final in finishes:
            self.finish(rid, final)

    def _join_chunk(self, rows, req, step, brow, bsize, t_ns) -> None:
        """Join assembled rows against the carry; blocks to the session, outputs, new carry."""
        if not len(req):
            return
        k_all = rows.shape[1] - META_COLS
        carry_req, carry = self._carry_req, self._carry
        if carry is None or carry.drafts.shape[1] != k_all:
            carry = Proposals.empty(k_all) if carry is None else carry.widen(k_all)
        res = join_chunk(req, rows, step, brow, bsize, t_ns, carry_req, carry)
        if len(res.blocks["request"]):
            cols = dict(res.blocks)
            cols["request"] = self._writer_rows(cols["request"])
            cols["proposal_source"] = np.ones(len(cols["request"]), dtype=np.int8)
            self.session.add_block_columns(cols)
        self._out.add(req[res.out_rows], res.out_tokens, res.out_len)
        kept = ~np.isin(carry_req, res.seen)  # requests absent from the chunk keep theirs
        self._carry_req = np.concatenate([carry_req[kept], req[res.open_rows]])
        self._carry = concat_proposals(carry.take(np.flatnonzero(kept)), res.open)

    def _hand_over(self, req_id: str) -> None:
        """Move ``req_id``'s carried proposal (if any) to ``session.joiner.open``, where the
        session's finish/drop paths write it."""
        i = self._ids.get(req_id)
        if i is None or self._carry is None or not len(self._carry_req):
            return
        hit = np.flatnonzero(self._carry_req == i)
        if not len(hit):
            return
        j = int(hit[0])
        c = self._carry
        self.session.joiner.open[req_id] = OpenBlock(
            int(c.step[j]),
            int(c.position[j]),
            int(c.anchor[j]),
            c.drafts[j, : int(c.k[j])].tolist(),
            int(c.t_ns[j]),
            int(c.batch_row[j]),
            int(c.batch_size[j]),
        )
        keep = np.ones(len(self._carry_req), dtype=bool)
        keep[j] = False
        self._carry_req = self._carry_req[keep]
        self._carry = c.take(np.flatnonzero(keep))

    def _writer_rows(self, ids):
        """/requests rows of tap-local int ids (registering unknown requests)."""
        if self._wrows is None or len(self._wrows) < len(self._names):
            grown = np.full(len(self._names), -1, dtype=np.int64)
            if self._wrows is not None:
                grown[: len(self._wrows)] = self._wrows
            self._wrows = grown
        rows = self._wrows[ids]
        for i in np.unique(ids[rows < 0]).tolist():
            self._wrows[i] = self.session.request_row(self._names[i])
        return self._wrows[ids] if (rows < 0).any() else rows
