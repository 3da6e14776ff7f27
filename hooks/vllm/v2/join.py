"""The vectorised join of staged V2 ``propose`` rows into draft blocks (numpy).

A chunk is the rows of several consecutive steps in stream order (step by step, row by row
within a step), each row one request's verdict on its previous proposal and its new
proposal. The semantics are those of the sequential join that it replaces (one Python call
chain per row: ``BlockJoiner.verdict_counts`` / ``propose`` / ``drop``), row by row:

* ``num_sampled <= 0`` (a prefill chunk, or a synthetic row standing for a finished or
  preempted request): the request's open proposal, if any, is written unverified
  (``num_verified = accepted = num_emitted = -1``); the row opens nothing.
* otherwise the open proposal ``P`` (if any) is closed: with ``nv = num_sampled +
  num_rejected - 1 > 0`` it is written with ``verified = P[:nv]``, ``accepted =
  num_sampled - 1`` and ``emitted = P[:accepted] + [anchor]``; with ``nv <= 0`` it is written
  unverified. The request's output grows by that ``emitted``, or by ``[anchor]`` alone when no
  verified block was closed. The row's drafts, trailing ``-1`` removed, open the request's next
  proposal (none when empty).

A proposal still open at the end of a chunk is the carry: it comes in with the next chunk
(``carry_*`` arguments) and is closed by the request's first row there. Blocks come out in the
order the sequential join wrote them: by the row that closed them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .stage import META_COLS


@dataclass
class Proposals:
    """Open proposals, one per entry (int64 arrays; ``drafts`` ``[m, K]`` with ``-1`` past
    ``k``; ``k`` = proposed ids after trimming trailing ``-1``)."""

    step: np.ndarray
    position: np.ndarray
    anchor: np.ndarray
    drafts: np.ndarray
    k: np.ndarray
    t_ns: np.ndarray
    batch_row: np.ndarray
    batch_size: np.ndarray

    @classmethod
    def empty(cls, width: int) -> Proposals:
        """No proposals, drafts of ``width`` columns."""
        z = np.zeros(0, dtype=np.int64)
        return cls(z, z, z, np.zeros((0, width), dtype=np.int64), z, z, z, z)

    def take(self, idx: np.ndarray) -> Proposals:
        """The entries ``idx`` (fancy index)."""
        return Proposals(*(getattr(self, f)[idx] for f in _PROP_FIELDS))

    def widen(self, width: int) -> Proposals:
        """The same proposals with drafts re-padded (or cut) to ``width`` columns (after a
        change of K); ``k`` is capped at ``width``."""
        d = np.full((len(self.drafts), width), -1, dtype=np.int64)
        w = min(width, self.drafts.shape[1])
        d[:, :w] = self.drafts[:, :w]
        return Proposals(
            self.step,
            self.position,
            self.anchor,
            d,
            np.minimum(self.k, width),
            self.t_ns,
            self.batch_row,
            self.batch_size,
        )


_PROP_FIELDS = ("step", "position", "anchor", "drafts", "k", "t_ns", "batch_row", "batch_size")


@dataclass
class JoinResult:
    """What one chunk produced.

    Attributes:
        blocks: block columns in write order (``request`` holds the caller's request ids;
            ``proposed``/``verified`` ``[b, <= K]`` and ``emitted`` ``[b, <= K + 1]``, ``-1``
            padded, trimmed to the widest row, at least one column).
        out_rows: chunk rows that emitted tokens (verdict rows), ascending.
        out_tokens: ``[len(out_rows), K + 1]`` emitted ids per such row, ``out_len`` valid.
        out_len: emitted ids per such row.
        open_rows: chunk rows whose proposal is still open at the end (one per request).
        open: those proposals.
        seen: the distinct requests of the chunk (their carry was consumed).
    """

    blocks: dict[str, np.ndarray]
    out_rows: np.ndarray
    out_tokens: np.ndarray
    out_len: np.ndarray
    open_rows: np.ndarray
    open: Proposals
    seen: np.ndarray


def trimmed_len(drafts: np.ndarray) -> np.ndarray:
    """Per row, the length after removing trailing negative ids (``[R, K]`` -> ``[R]``)."""
    if drafts.shape[1] == 0:
        return np.zeros(len(drafts), dtype=np.int64)
    valid = drafts >= 0
    last = drafts.shape[1] - np.argmax(valid[:, ::-1], axis=1)
    return np.where(valid.any(axis=1), last, 0).astype(np.int64)


def join_chunk(
    req: np.ndarray,
    rows: np.ndarray,
    step: np.ndarray,
    batch_row: np.ndarray,
    batch_size: np.ndarray,
    t_ns: np.ndarray,
    carry_req: np.ndarray,
    carry: Proposals,
) -> JoinResult:
    """Join one chunk.

    Args:
        req: int ``[R]`` request id per row (any integers; a request has at most one row per
            step).
        rows: int ``[R, 4 + K]``: num_sampled, num_rejected, anchor, anchor position, K
            drafts (columns past the step's k already ``-1``).
        step, batch_row, batch_size, t_ns: int ``[R]``, the proposing step's values per row.
        carry_req: int ``[C]`` distinct requests with an open proposal from earlier chunks
            (requests absent from the chunk may be included: they are left alone).
        carry: their proposals (same order, drafts ``[C, K]``).
    Returns:
        :class:`JoinResult`.
    """
    r_n = len(req)
    k_all = rows.shape[1] - META_COLS
    ns = rows[:, 0].astype(np.int64)
    nr = rows[:, 1].astype(np.int64)
    anchor = rows[:, 2].astype(np.int64)
    drafts = rows[:, META_COLS:].astype(np.int64)
    lens = trimmed_len(drafts)
    verdict = ns > 0
    opens = verdict & (lens > 0)

    # The previous row of the same request (-1 for its first row in the chunk).
    order = np.argsort(req, kind="stable")
    sreq = req[order]
    first_s = np.ones(r_n, dtype=bool)
    first_s[1:] = sreq[1:] != sreq[:-1]
    prev = np.full(r_n, -1, dtype=np.int64)
    prev[order[1:]] = np.where(first_s[1:], -1, order[:-1])
    seen = sreq[first_s]

    # Proposal table: the chunk's rows, then the carry; src = the proposal a row closes.
    src = np.where((prev >= 0) & ~opens[np.maximum(prev, 0)], -1, prev)
    firsts = order[first_s]
    c_pos = _positions_in(carry_req, req[firsts])
    has_carry = c_pos >= 0
    src[firsts[has_carry]] = r_n + c_pos[has_carry]
    table = Proposals(
        step.astype(np.int64),
        (rows[:, 3]).astype(np.int64),
        anchor,
        drafts,
        lens,
        t_ns.astype(np.int64),
        batch_row.astype(np.int64),
        batch_size.astype(np.int64),
    )
    table = concat_proposals(table, carry)

    closing = np.flatnonzero(src >= 0)
    blocks = _blocks(req, ns, nr, anchor, table, closing, src[closing], verdict, k_all)
    out_rows, out_tokens, out_len = _emitted(anchor, table, src, verdict, ns, nr, k_all)

    lasts = np.empty(r_n, dtype=bool)  # each request's last row in the chunk
    last_s = np.ones(r_n, dtype=bool)
    last_s[:-1] = sreq[:-1] != sreq[1:]
    lasts[order] = last_s
    open_rows = np.flatnonzero(lasts & opens)
    return JoinResult(blocks, out_rows, out_tokens, out_len, open_rows, table.take(open_rows), seen)


def _positions_in(keys: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Index of each ``q`` in ``keys`` (distinct), -1 when absent."""
    if len(keys) == 0:
        return np.full(len(q), -1, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    at = np.searchsorted(keys[order], q)
    at = np.minimum(at, len(keys) - 1)
    hit = keys[order][at] == q
    return np.where(hit, order[at], -1)


def concat_proposals(a: Proposals, b: Proposals) -> Proposals:
    """``a`` then ``b`` (drafts of the same width)."""
    return Proposals(*(np.concatenate([getattr(a, f), getattr(b, f)]) for f in _PROP_FIELDS))


def _blocks(req, ns, nr, anchor, t: Proposals, rows, src, verdict, k_all) -> dict:
    """Block columns for the proposals ``src`` closed by ``rows`` (ascending)."""
    cols = np.arange(k_all)
    k = t.k[src]
    nv = ns[rows] + nr[rows] - 1
    ver = verdict[rows] & (nv > 0)
    n_ver = np.where(ver, np.minimum(nv, k), -1)
    acc = np.where(ver, ns[rows] - 1, -1)
    d = t.drafts[src]
    proposed = np.where(cols < k[:, None], d, -1)
    verified = np.where(cols < n_ver[:, None], d, -1)
    n_em = np.where(ver, np.minimum(acc, k) + 1, -1)
    emitted = np.full((len(rows), k_all + 1), -1, dtype=np.int64)
    emitted[:, :k_all] = np.where(cols < (n_em - 1)[:, None], d, -1)
    vr = np.flatnonzero(ver)
    emitted[vr, n_em[vr] - 1] = anchor[rows[vr]]
    return {
        "request": req[rows],
        "step": t.step[src],
        "position": t.position[src],
        "anchor": t.anchor[src],
        "k": k,
        "proposed": _trim(proposed, k),
        "num_verified": n_ver,
        "verified": _trim(verified, n_ver),
        "accepted": acc,
        "num_emitted": n_em,
        "emitted": _trim(emitted, n_em),
        "t_ns": t.t_ns[src],
        "batch_row": t.batch_row[src],
        "batch_size": t.batch_size[src],
    }


def _trim(m: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """``m`` cut to its widest row's length (at least one column), like a row-wise writer."""
    w = max(int(lens.max(initial=0)), 1)
    return np.ascontiguousarray(m[:, :w])


def _emitted(anchor, t: Proposals, src, verdict, ns, nr, k_all):
    """Per verdict row: the closed block's emitted ids, or ``[anchor]`` without one."""
    rows = np.flatnonzero(verdict)
    s = src[rows]
    nv = ns[rows] + nr[rows] - 1
    ver = (s >= 0) & (nv > 0)
    s0 = np.maximum(s, 0)
    k = t.k[s0]
    acc = np.where(ver, np.minimum(ns[rows] - 1, k), 0)
    cols = np.arange(k_all)
    out = np.full((len(rows), k_all + 1), -1, dtype=np.int64)
    out[:, :k_all] = np.where(cols < acc[:, None], t.drafts[s0], -1)
    out[np.arange(len(rows)), acc] = anchor[rows]
    return rows, out, acc + 1
