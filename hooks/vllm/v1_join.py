"""The V1 recorder's join, one engine step at a time with numpy (the per-row
:class:`~.joiner.BlockJoiner` rules, without per-row writes on the hot path).

A step's proposals are kept as one :class:`StepProposals` chunk; ``open`` maps a request id
to ``(chunk, row)``. The next verification of those requests closes their blocks as columns
(:meth:`~.session.Session.add_block_columns`, written on the writer thread). Anything that
ends a block outside a step (a request finishing, shutdown, a newer proposal replacing an
unverified one) goes through :meth:`~.joiner.BlockJoiner.drop` as before.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from spectrace.tracer.schema import PAD, PROPOSAL_FROM_DRAFTER

from .joiner import BlockJoiner, OpenBlock

_GATHERED = ("step", "position", "anchor", "t_ns", "batch_row", "batch_size")


@dataclass
class StepProposals:
    """One step's proposals: ``proposed`` [n, w] int64 (-1 padded, ``lens`` ids per row),
    ``position``/``anchor``/``batch_row`` [n] int64, shared ``step``, ``t_ns`` and
    ``batch_size``."""

    step: int
    position: np.ndarray
    anchor: np.ndarray
    proposed: np.ndarray
    lens: np.ndarray
    batch_row: np.ndarray
    batch_size: int
    t_ns: int
    #: The drafter's top-1 minus top-2 logit per slot, [n, w] float32 (NaN unknown), or None.
    margin: np.ndarray | None = None

    def block(self, row: int) -> OpenBlock:
        """Row ``row`` as the per-row joiner's :class:`OpenBlock`."""
        ids = self.proposed[row, : self.lens[row]].tolist()
        gaps = None if self.margin is None else self.margin[row, : self.lens[row]].tolist()
        return OpenBlock(self.step, int(self.position[row]), int(self.anchor[row]), ids,
                         self.t_ns, int(self.batch_row[row]), self.batch_size,
                         gaps)  # fmt: skip


def ragged(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Id lists -> ([n, w] int64 padded with -1, lengths [n])."""
    lens = np.fromiter(map(len, rows), np.int64, len(rows))
    w = int(lens.max()) if len(rows) else 0
    if len(rows) and (lens == w).all():
        return np.array(rows, dtype=np.int64).reshape(len(rows), w), lens
    out = np.full((len(rows), max(w, 1)), PAD, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out, lens


class StepJoiner(BlockJoiner):
    """:class:`BlockJoiner` whose ``open`` values are ``(StepProposals, row)`` for blocks
    opened by :meth:`open_step` (per-row :meth:`propose` still works)."""

    def open_step(self, req_ids: list[str], chunk: StepProposals) -> None:
        """Open one block per row of ``chunk`` (``req_ids[j]`` is row j); an older open
        block of the same request is written unverified first."""
        opened = self.open
        for j, rid in enumerate(req_ids):
            if rid in opened:
                self.drop(rid)
            opened[rid] = (chunk, j)  # type: ignore[assignment]

    def drop(self, req_id: str) -> None:
        """Write ``req_id``'s open block (if any) as unverified."""
        o = self.open.pop(req_id, None)
        if isinstance(o, tuple):
            o = o[0].block(o[1])
        if o is not None:
            self._write(req_id, o)

    def close_step(self, req_ids: list[str], verified: dict, emitted: dict, row_of) -> dict | None:
        """Close the open blocks of ``req_ids`` (those that have one) with this step's
        verdicts: ``verified[rid]`` the drafts verified (list, absent: unverified) and
        ``emitted[rid]`` the tokens emitted. Returns ``add_blocks`` columns (``request``
        from ``row_of(rid)``), or None when no block closed."""
        hits = [(rid, self.open.pop(rid)) for rid in req_ids if rid in self.open]
        if not hits:
            return None
        for rid, o in hits:  # a per-row proposal (propose()): materialise as a chunk of one
            if isinstance(o, OpenBlock):
                self.open[rid] = o
                self.verdict(rid, verified.get(rid), emitted.get(rid) or [])
        hits = [(rid, o) for rid, o in hits if isinstance(o, tuple)]
        if not hits:
            return None
        return self._columns(hits, verified, emitted, row_of)

    def _columns(self, hits, verified: dict, emitted: dict, row_of) -> dict:
        rids = [rid for rid, _ in hits]
        n = len(hits)
        parts: dict[int, tuple[StepProposals, list[int], list[int]]] = {}
        for i, (_, (c, j)) in enumerate(hits):  # usually one chunk: the previous step's
            part = parts.setdefault(id(c), (c, [], []))
            part[1].append(i)
            part[2].append(j)
        gather = {name: np.empty(n, np.int64) for name in _GATHERED}
        plen = np.empty(n, np.int64)
        wp = max(c.proposed.shape[1] for c, _, _ in parts.values())
        proposed = np.full((n, wp), PAD, np.int64)
        with_margin = any(c.margin is not None for c, _, _ in parts.values())
        margin = np.full((n, wp), np.nan, np.float32) if with_margin else None
        for c, at, js in parts.values():
            if margin is not None and c.margin is not None:
                margin[at, : c.margin.shape[1]] = c.margin[js]
            for name in ("position", "anchor", "batch_row"):
                gather[name][at] = getattr(c, name)[js]
            for name in ("step", "t_ns", "batch_size"):
                gather[name][at] = getattr(c, name)
            plen[at] = c.lens[js]
            proposed[at, : c.proposed.shape[1]] = c.proposed[js]
        ver = [verified.get(r) or [] for r in rids]
        emi = [emitted.get(r) or [] for r in rids]
        vmat, vlen = ragged(ver)
        emat, elen = ragged(emi)
        ok = (vlen > 0) & (elen > 0)  # else written unverified (BlockJoiner.verdict)
        w = max(proposed.shape[1], vmat.shape[1])
        p_w, v_w = _pad(proposed, w), _pad(vmat, w)
        cells = np.arange(w)[None, :] < vlen[:, None]
        self.verified_mismatch += int((ok & ((p_w != v_w) & cells).any(axis=1)).sum())
        v_w[~ok] = PAD
        emat[~ok] = PAD
        return (
            gather
            | {
                "request": np.array([row_of(r) for r in rids], np.int64),
                "k": plen,
                "proposed": p_w,
                "num_verified": np.where(ok, vlen, PAD),
                "verified": v_w,
                "accepted": np.where(ok, elen - 1, PAD),
                "num_emitted": np.where(ok, elen, PAD),
                "emitted": emat,
                "proposal_source": np.full(n, PROPOSAL_FROM_DRAFTER, np.int64),
            }
            | ({} if margin is None else {"draft_margin": _pad_nan(margin, w)})
        )


def _pad_nan(m: np.ndarray, w: int) -> np.ndarray:
    if m.shape[1] >= w:
        return m
    out = np.full((m.shape[0], w), np.nan, dtype=m.dtype)
    out[:, : m.shape[1]] = m
    return out


def _pad(m: np.ndarray, w: int) -> np.ndarray:
    if m.shape[1] >= w:
        return m.copy()
    out = np.full((m.shape[0], w), PAD, dtype=m.dtype)
    out[:, : m.shape[1]] = m
    return out


def new_chunk(step: int, pos, anchor, proposals: list[list[int]], rows, batch_size: int,
              margins: list[list[float] | None] | None = None):  # fmt: skip
    """One engine step's proposals as a :class:`StepProposals` (the V1 recorder's
    ``GPUModelRunner.propose_draft_token_ids`` output, ``vllm/v1/worker/gpu_model_runner.py``).

    Args:
        step: the engine step (0-based, per process).
        pos, anchor: int [n]: each row's anchor position (tokens) and anchor token id.
        proposals: n id lists (the drafter's k ids per row; lengths may differ).
        rows: int [n]: the rows' indexes in the step's batch; ``batch_size`` its rows.
        margins: per row the drafter's top-1 minus top-2 logits (None: unknown), or None
            when margins are not recorded.
    """
    proposed, lens = ragged(proposals)
    margin = None
    if margins is not None and any(m is not None for m in margins):
        margin = np.full(proposed.shape, np.nan, np.float32)
        for i, m in enumerate(margins):
            if m is not None:
                margin[i, : len(m)] = m[: proposed.shape[1]]
    return StepProposals(step, np.asarray(pos, np.int64), np.asarray(anchor, np.int64),
                         proposed, lens, np.asarray(rows, np.int64), batch_size,
                         time.time_ns(), margin)  # fmt: skip
