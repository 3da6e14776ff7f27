"""The V1 recorder's join, one engine step at a time with numpy (the per-row
:class:`~.joiner.BlockJoiner` rules, without per-row writes on the hot path).

A step's proposals are kept as one :class:`StepProposals` chunk; ``open`` maps a request id
to ``(chunk, row)``. The next verification of those requests closes their blocks as columns
(:meth:`~.session.Session.add_block_columns`, written on the writer thread). When the
recorded batch did not change (most steps), no request is looked up one by one: the chunk
waits beside ``open`` and closes whole as a :class:`ClosedStep` (a few array copies), whose
columns the writer thread makes for all steps handed over together (:meth:`ClosedStep.batch`).
Anything that ends a block outside a step (a request finishing, shutdown, a newer proposal
replacing an unverified one) goes through :meth:`~.joiner.BlockJoiner.drop` as before.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from spectrace.tracer.schema import PAD, PROPOSAL_FROM_DRAFTER, pad_to

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
    #: The drafter's top-1 minus top-2 logit per slot, [n, w] float32 (NaN unknown), or None;
    #: or a function that makes it, called on first read of :attr:`margin` (the usual step's
    #: subtraction then runs on the writer thread, :meth:`~.margins.MarginTap.uniform_later`).
    margin_of: np.ndarray | Callable[[], np.ndarray] | None = None

    @property
    def margin(self) -> np.ndarray | None:
        """:attr:`margin_of`, made on first read."""
        m = self.margin_of
        if callable(m):
            m = self.margin_of = m()
        return m

    def rows(self, js: np.ndarray) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray | None]:
        """Rows ``js`` as block columns: (``_GATHERED`` columns [n] int64, ``k`` [n],
        ``proposed`` [n, w], ``margin`` [n, w] or None)."""
        n = len(js)
        gather = {
            "step": np.full(n, self.step, np.int64),
            "position": self.position[js],
            "anchor": self.anchor[js],
            "t_ns": np.full(n, self.t_ns, np.int64),
            "batch_row": self.batch_row[js],
            "batch_size": np.full(n, self.batch_size, np.int64),
        }
        margin = None if self.margin is None else self.margin[js]
        return gather, self.lens[js], self.proposed[js], margin

    def block(self, row: int) -> OpenBlock:
        """Row ``row`` as the per-row joiner's :class:`OpenBlock`."""
        ids = self.proposed[row, : self.lens[row]].tolist()
        gaps = None if self.margin is None else self.margin[row, : self.lens[row]].tolist()
        return OpenBlock(self.step, int(self.position[row]), int(self.anchor[row]), ids,
                         self.t_ns, int(self.batch_row[row]), self.batch_size,
                         gaps)  # fmt: skip


def ragged(rows: list) -> tuple[np.ndarray, np.ndarray]:
    """Id lists -> ([n, w] int64 padded with -1, lengths [n]); ``w`` is the common length
    when all lists have one (0 included), else the longest (at least 1). A few C calls,
    no per-row Python."""
    n = len(rows)
    lens = np.fromiter(map(len, rows), np.int64, n)
    w = int(lens.max()) if n else 0
    if n and (lens == w).all():
        return np.array(rows, dtype=np.int64).reshape(n, w), lens
    return _fill_rows(np.fromiter(itertools.chain.from_iterable(rows), np.int64), lens), lens


def _fill_rows(flat: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Ids ``flat`` (row after row, ``lens`` [n] each) as the [n, w] int64 matrix
    :func:`ragged` makes of the same lists (``w``: :func:`ragged_width`)."""
    n, w = len(lens), ragged_width(lens)
    if n and w and len(flat) == n * w:  # every row w long
        return flat.reshape(n, w)
    out = np.full((n, max(w, 1)), PAD, dtype=np.int64)
    if len(flat):  # a boolean mask fills row-major: row i's cells, in order
        out[np.arange(out.shape[1])[None, :] < lens[:, None]] = flat
    return out


def ragged_width(lens: np.ndarray) -> int:
    """The width :func:`ragged` gives lists of these lengths."""
    if not len(lens):
        return 0
    w = int(lens.max())
    return w if (lens == w).all() else max(w, 1)


def fit(mat: np.ndarray, w: int, fill=PAD) -> np.ndarray:
    """``mat`` [n, m] cut to or padded with ``fill`` to ``w`` columns (a new array)."""
    if mat.shape[1] >= w:
        return mat[:, :w].copy()
    out = np.full((mat.shape[0], w), fill, dtype=mat.dtype)
    out[:, : mat.shape[1]] = mat
    return out


class StepVerdicts:
    """One engine step's verdicts by batch row: ``verified`` [B, wv] / ``vlen`` [B] (the
    drafts verified now, int64 -1 padded; 0: none) and ``rows``, the B id lists emitted
    (vLLM's ``sampled_token_ids`` in batch order; empty: none), read during the step only
    (vLLM trims them in place later). Their ``emitted`` [B, we] / ``elen`` [B] matrix is
    made on first use: the usual step never needs it (:meth:`flat`)."""

    def __init__(self, verified: np.ndarray, vlen: np.ndarray, rows: list) -> None:
        self.verified, self.vlen, self.rows = verified, vlen, rows

    @functools.cached_property
    def _ragged(self) -> tuple[np.ndarray, np.ndarray]:
        return ragged(self.rows)

    @property
    def emitted(self) -> np.ndarray:
        """[B, we] int64, -1 padded (:func:`ragged`)."""
        return self._ragged[0]

    @property
    def elen(self) -> np.ndarray:
        """[B] int64, tokens emitted per row."""
        return self._ragged[1]

    @functools.cached_property
    def all_emitted(self) -> bool:
        """Every row emitted a token (no prefill chunk in the batch)."""
        return all(self.rows)

    def flat(self, rows: np.ndarray | None = None) -> tuple[list[int], list[int]]:
        """Rows ``rows`` (None: all) as copies: (lengths, their ids one after another)."""
        r = self.rows if rows is None else [self.rows[i] for i in rows.tolist()]
        return list(map(len, r)), list(itertools.chain.from_iterable(r))

    def lists(self, i: int) -> tuple[list[int] | None, list[int]]:
        """Row i as the per-row joiner takes it: (verified or None, emitted)."""
        v = self.verified[i, : self.vlen[i]].tolist() if self.vlen[i] else None
        return v, list(self.rows[i])


@dataclass
class ClosedStep:
    """The blocks one step closed on the joiner's same-batch path, kept as their inputs:
    ``chunk``'s rows 0..n-1 met the verdicts ``vlen`` [n] / ``verified`` [n, *] (int64, -1
    beyond ``vlen``; not vLLM's buffers) and emitted ``elen`` ids each, ``emitted`` (all
    rows' ids one after another, a list: :meth:`StepVerdicts.flat`); ``request``: their
    /requests rows. The writer thread makes many at once into columns (:meth:`batch`):
    the engine thread does a few list and array copies per step instead of some 40 numpy
    calls."""

    request: np.ndarray
    chunk: StepProposals
    vlen: np.ndarray
    elen: list[int]
    verified: np.ndarray
    emitted: list[int]
    count_mismatch: Callable[[int], None]  # the joiner's verified-not-prefix counter

    def __len__(self) -> int:
        return len(self.request)

    @staticmethod
    def batch(steps: list[ClosedStep]) -> dict:
        """``add_blocks`` columns of ``steps`` (in order): one :func:`block_columns` call,
        the same values row by row as one call per step (matrices -1 / NaN padded to the
        widest, as :func:`~.columns.concat_columns` pads parts)."""
        cs = [s.chunk for s in steps]
        ns = [len(s) for s in steps]
        rep = functools.partial(np.repeat, repeats=ns)
        gather = {
            "step": rep([c.step for c in cs]).astype(np.int64),
            "position": np.concatenate([c.position for c in cs]),
            "anchor": np.concatenate([c.anchor for c in cs]),
            "t_ns": rep(np.array([c.t_ns for c in cs], np.int64)),
            "batch_row": np.concatenate([c.batch_row for c in cs]),
            "batch_size": rep([c.batch_size for c in cs]).astype(np.int64),
        }
        margin = None
        if any(c.margin is not None for c in cs):
            margin = _stack([c.margin if c.margin is not None else
                             np.full((n, 1), np.nan, np.float32)
                             for c, n in zip(cs, ns)], np.nan)  # fmt: skip
        gathered = (gather, np.concatenate([c.lens for c in cs]),
                    _stack([c.proposed for c in cs], PAD), margin)  # fmt: skip
        elen = np.fromiter(itertools.chain.from_iterable(s.elen for s in steps), np.int64,
                           sum(ns))  # fmt: skip
        flat = np.fromiter(itertools.chain.from_iterable(s.emitted for s in steps), np.int64)
        cols, mismatch = block_columns(
            np.concatenate([s.request for s in steps]), gathered,
            np.concatenate([s.vlen for s in steps]), elen,
            _stack([s.verified for s in steps], PAD), _fill_rows(flat, elen),
        )  # fmt: skip
        steps[0].count_mismatch(mismatch)
        return cols


def _stack(mats: list[np.ndarray], fill) -> np.ndarray:
    """Matrices stacked row-wise, each padded with ``fill`` to the widest."""
    w = max(m.shape[1] for m in mats)
    return np.concatenate([pad_to(m, w, fill) for m in mats])


class StepJoiner(BlockJoiner):
    """:class:`BlockJoiner` whose ``open`` values are ``(StepProposals, row)`` for blocks
    opened by :meth:`open_step` (per-row :meth:`propose` still works).

    The usual step touches no request one by one: when none of its requests has a block in
    ``open``, a step's proposals wait as one ``(req_ids, chunk)`` pair, and the next step,
    if its recorded batch is the same list of requests, closes them all at once. Anything
    else (a request finishing, a batch change, a per-row call) first spills the pair into
    ``open``. Blocks of requests outside the batch (preempted, or finished without vLLM's
    removal call yet) stay in ``open`` beside the pair.
    """

    def __init__(self, sink) -> None:
        self._deferred_mismatch = 0  # counted by ClosedStep.batch (the writer thread)
        super().__init__(sink)
        self._last: tuple[list[str], StepProposals] | None = None  # not in open
        self._req_rows: tuple[list[str] | None, np.ndarray] = (None, np.zeros(0, np.int64))

    @property
    def verified_mismatch(self) -> int:
        """BlockJoiner's count, with the :class:`ClosedStep` blocks' (read it after the
        writer thread wrote them)."""
        return self._rows_mismatch + self._deferred_mismatch

    @verified_mismatch.setter
    def verified_mismatch(self, n: int) -> None:
        self._rows_mismatch = n - self._deferred_mismatch

    def _count_mismatch(self, n: int) -> None:
        self._deferred_mismatch += n

    def _spill(self) -> None:
        """Move the waiting step's blocks into ``open`` (one entry per request)."""
        last, self._last = self._last, None
        if last is not None:
            self._open_rows(*last)

    def _open_rows(self, req_ids: list[str], chunk: StepProposals) -> None:
        opened = self.open
        for j, rid in enumerate(req_ids):
            if rid in opened:
                self.drop(rid)
            opened[rid] = (chunk, j)  # type: ignore[assignment]

    def open_step(self, req_ids: list[str], chunk: StepProposals) -> None:
        """Open one block per row of ``chunk`` (``req_ids[j]`` is row j); an older open
        block of the same request is written unverified first."""
        self._spill()
        if self._overlaps(req_ids):
            self._open_rows(req_ids, chunk)
        else:  # none of them has an older open block: wait as one pair
            self._last = (req_ids, chunk)

    def _overlaps(self, req_ids: list[str]) -> bool:
        """Some request of ``req_ids`` has a block in ``open`` (one C-level pass)."""
        return bool(self.open) and not self.open.keys().isdisjoint(req_ids)

    def propose(self, req_id: str, *args, **kwargs) -> None:  # noqa: D102 (BlockJoiner's)
        self._spill()
        super().propose(req_id, *args, **kwargs)

    def verdict(self, req_id: str, verified, emitted) -> bool:  # noqa: D102 (BlockJoiner's)
        self._spill()
        return super().verdict(req_id, verified, emitted)

    def verdict_counts(self, req_id: str, *args):  # noqa: D102 (BlockJoiner's)
        self._spill()
        return super().verdict_counts(req_id, *args)

    def drop(self, req_id: str) -> None:
        """Write ``req_id``'s open block (if any) as unverified."""
        self._spill()
        o = self.open.pop(req_id, None)
        if isinstance(o, tuple):
            o = o[0].block(o[1])
        if o is not None:
            self._write(req_id, o)

    def drop_all(self) -> None:
        """Write every open block as unverified (request finish, shutdown)."""
        self._spill()
        super().drop_all()

    def close_step(
        self, req_ids: list[str], rows: np.ndarray, verdicts: StepVerdicts, row_of
    ) -> dict | ClosedStep | None:
        """Close the open blocks of ``req_ids`` (those that have one) with this step's
        verdicts: ``req_ids[i]`` is batch row ``rows[i]`` of ``verdicts`` (no drafts
        verified: written unverified). Returns ``add_blocks`` columns (``request`` from
        ``row_of(rid)``), on the same-batch path a :class:`ClosedStep` (the columns made
        later, with other steps'), or None when no block closed."""
        last = self._last
        if last is not None and last[0] == req_ids and not self._overlaps(req_ids):
            self._last = None  # the same requests in the same order: every row closes
            v = verdicts
            if len(rows) == len(v.vlen):  # rows 0..B-1: StepVerdicts' arrays are copies
                vlen, verified, (elen, flat) = v.vlen, v.verified, v.flat()
            else:
                vlen, verified, (elen, flat) = v.vlen[rows], v.verified[rows], v.flat(rows)
            return ClosedStep(self._request_rows(req_ids, row_of), last[1], vlen, elen,
                              verified, flat, self._count_mismatch)  # fmt: skip
        self._spill()
        opened = self.open
        pop = opened.pop
        hits = []  # (rid, (chunk, j) or OpenBlock, batch row)
        for rid, b in zip(req_ids, rows.tolist()):
            o = pop(rid, None)
            if o is not None:
                hits.append((rid, o, b))
        if not hits:
            return None
        if not all(type(h[1]) is tuple for h in hits):
            for rid, o, b in hits:  # a per-row proposal (propose()): the per-row verdict
                if isinstance(o, OpenBlock):
                    opened[rid] = o
                    self.verdict(rid, *verdicts.lists(b))
            hits = [h for h in hits if isinstance(h[1], tuple)]
            if not hits:
                return None
        rids, opened_at, batch_rows = zip(*hits)
        chunks, js = zip(*opened_at)
        c0 = chunks[0]
        if all(c is c0 for c in chunks):  # the usual case: every block from the previous step
            gathered = c0.rows(np.array(js, np.int64))
        else:
            gathered = _gather_chunks(hits)
        return self._columns(list(rids), gathered, np.array(batch_rows, np.int64), verdicts,
                             row_of)  # fmt: skip

    def _request_rows(self, rids: list[str], row_of) -> np.ndarray:
        """``row_of`` of each id; kept for the same list object (a batch kept from step to
        step is one list, see ``V1Recorder._live``; request rows never change)."""
        if self._req_rows[0] is not rids:
            self._req_rows = (rids, np.array([row_of(r) for r in rids], np.int64))
        return self._req_rows[1]

    def _columns(self, rids: list[str], gathered, b: np.ndarray, verdicts: StepVerdicts,
                 row_of) -> dict:  # fmt: skip
        """The closed blocks' ``add_blocks`` columns: ``rids[i]``'s block (``gathered``: as
        :meth:`StepProposals.rows` gives them) meets batch row ``b[i]`` of ``verdicts``."""
        v = verdicts
        cols, mismatch = block_columns(self._request_rows(rids, row_of), gathered, v.vlen[b],
                                       v.elen[b], v.verified[b], v.emitted[b])  # fmt: skip
        self.verified_mismatch += mismatch
        return cols


def block_columns(request, gathered, vlen, elen, verified, emitted) -> tuple[dict, int]:
    """``add_blocks`` columns of n closed blocks, and how many were verified with ids that
    are not a prefix of their proposal.

    Args:
        request: int [n], /requests rows; gathered: the blocks as
            :meth:`StepProposals.rows` gives them; vlen, elen: int [n], drafts verified and
            tokens emitted (0: none); verified [n, *], emitted [n, *]: int64, -1 beyond
            ``vlen`` / ``elen``.
    """
    n = len(request)
    gather, plen, proposed, margin = gathered
    vmat = fit(verified, ragged_width(vlen))
    emat = fit(emitted, ragged_width(elen))
    ok = (vlen > 0) & (elen > 0)  # else written unverified (BlockJoiner.verdict)
    w = max(proposed.shape[1], vmat.shape[1])
    p_w, v_w = _pad(proposed, w), _pad(vmat, w)
    cells = np.arange(w)[None, :] < vlen[:, None]
    mismatch = int((ok & ((p_w != v_w) & cells).any(axis=1)).sum())
    v_w[~ok] = PAD
    emat[~ok] = PAD
    cols = (
        gather
        | {
            "request": request,
            "k": plen,
            "proposed": p_w,
            "num_verified": np.where(ok, vlen, PAD),
            "verified": v_w,
            "accepted": np.where(ok, elen - 1, PAD),
            "num_emitted": np.where(ok, elen, PAD),
            "emitted": emat,
            "proposal_source": np.full(n, PROPOSAL_FROM_DRAFTER, np.int64),
        }
        | ({} if margin is None else {"draft_margin": pad_to(margin, w, np.nan)})
    )
    return cols, mismatch


def _gather_chunks(hits) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray | None]:
    """:meth:`StepProposals.rows` over blocks from several chunks (in ``hits`` order)."""
    n = len(hits)
    parts: dict[int, tuple[StepProposals, list[int], list[int]]] = {}
    for i, (_, (c, j), _) in enumerate(hits):
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
    return gather, plen, proposed, margin


def _pad(m: np.ndarray, w: int) -> np.ndarray:
    if m.shape[1] >= w:
        return m.copy()
    out = np.full((m.shape[0], w), PAD, dtype=m.dtype)
    out[:, : m.shape[1]] = m
    return out


def new_chunk(step: int, pos, anchor, proposals, rows, batch_size: int,
              margins=None):  # fmt: skip
    """One engine step's proposals as a :class:`StepProposals` (the V1 recorder's
    ``GPUModelRunner.propose_draft_token_ids`` output, ``vllm/v1/worker/gpu_model_runner.py``).

    Args:
        step: the engine step (0-based, per process).
        pos, anchor: int [n]: each row's anchor position (tokens) and anchor token id.
        proposals: n id lists (the drafter's k ids per row; lengths may differ), or an
            int [n, w] array (w ids per row).
        rows: int [n]: the rows' indexes in the step's batch; ``batch_size`` its rows.
        margins: the drafter's top-1 minus top-2 logits: per row a list (None: unknown), or
            a float32 [n, w] array (NaN: unknown; :meth:`~.margins.MarginTap.matrix`), or
            None when margins are not recorded.
    """
    if isinstance(proposals, np.ndarray) and proposals.ndim == 2:
        proposed = proposals.astype(np.int64, copy=False)
        lens = np.full(len(proposed), proposed.shape[1], np.int64)
    else:
        proposed, lens = ragged(proposals)
    margin = None
    if isinstance(margins, np.ndarray):
        margin = fit(margins.astype(np.float32, copy=False), proposed.shape[1], np.nan)
    elif margins is not None and any(m is not None for m in margins):
        margin = np.full(proposed.shape, np.nan, np.float32)
        for i, m in enumerate(margins):
            if m is not None:
                margin[i, : len(m)] = m[: proposed.shape[1]]
    return StepProposals(step, np.asarray(pos, np.int64), np.asarray(anchor, np.int64),
                         proposed, lens, np.asarray(rows, np.int64), batch_size,
                         time.time_ns(), margin)  # fmt: skip
