"""Value detectors of one trace: values no engine can produce, and drafts the target verified
only in part. Both read one side (:class:`~.data.SideInput`) and return at most one error
finding at the first offending block (block row order).

``-1`` is the store's "unknown" for counts (``num_verified``, ``accepted``, ``num_emitted``,
``batch_row``, ``batch_size``) and the pad of ids (``proposed``, ``anchor``); anything below
it, or above what the block holds, is an impossible value: reported, never clamped (an
acceptance rate above 100% follows from ``accepted > num_verified`` and is explained by this
finding).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..index import memo
from ..parallel import chunks
from ..rows import row as read_row
from ..store import Blocks
from .data import SideInput, TraceData
from .evidence import ImpossibleEvidence, TrimmedEvidence
from .ksize import meta_k_limit
from .model import Finding
from .sweep import Sweep, sweep
from .thresholds import MIN_BLOCKS

#: A rule's test: (blocks, int [n] one past the largest possible position per block (0
#: unknown), the trace's :class:`~.sweep.Sweep`) -> bool [n] broken, of some rows (a chunk:
#: ``_rule_hits`` gives their columns' rows). Comparisons stay in the columns' own dtypes:
#: no int64 copy per rule.
Test = Callable[[Any, np.ndarray, Any], np.ndarray]  # Blocks and Sweep, or rows of them
#: The limit a broken block exceeds: (blocks, the block's :class:`_Bounds`, sweep, block
#: row) -> int.
Limit = Callable[[Blocks, Any, Sweep, int], int]
Rule = tuple[str, str, Test, Limit | None]

#: The rules, in report order: ``(name, column, test, limit or None)``.
RULES: tuple[Rule, ...] = (
    ("k < 0", "k", lambda b, n, sw: b.k < 0, None),
    ("k > proposed width", "k", lambda b, n, sw: b.k > sw.width, lambda b, n, sw, i: sw.width),
    # vLLM never drafts past num_speculative_tokens; an engine's k is its drafts' bound
    ("k > /meta k", "k", lambda b, n, sw: b.k > b.kcfg, lambda b, n, sw, i: n.kcfg),
    ("proposed id < -1", "proposed", lambda b, n, sw: sw.below_pad, None),
    ("anchor < -1", "anchor", lambda b, n, sw: b.anchor < -1, None),
    ("num_verified < -1", "num_verified", lambda b, n, sw: b.num_verified < -1, None),
    (
        "num_verified > k",
        "num_verified",
        lambda b, n, sw: b.num_verified > b.k,
        lambda b, n, sw, i: int(b.k[i]),
    ),
    ("accepted < -1", "accepted", lambda b, n, sw: b.accepted < -1, None),
    (
        "accepted > k",
        "accepted",
        lambda b, n, sw: b.accepted > b.k,
        lambda b, n, sw, i: int(b.k[i]),
    ),
    (
        "accepted > num_verified",
        "accepted",
        lambda b, n, sw: (b.num_verified >= 0) & (b.accepted > b.num_verified),
        lambda b, n, sw, i: int(b.num_verified[i]),
    ),
    ("num_emitted < -1", "num_emitted", lambda b, n, sw: b.num_emitted < -1, None),
    (
        "num_emitted > k + 1",
        "num_emitted",
        lambda b, n, sw: b.num_emitted > b.k + 1,
        lambda b, n, sw, i: int(b.k[i]) + 1,
    ),
    ("position < 0", "position", lambda b, n, sw: b.position < 0, None),
    (
        "position outside the sequence",
        "position",
        lambda b, n, sw: (n > 0) & (b.position >= n),
        lambda b, n, sw, i: n.room - 1,
    ),
    (
        "position inside the prompt",
        "position",
        lambda b, n, sw: b.position < b.prompt_floor,
        lambda b, n, sw, i: n.floor,
    ),
    # The target verifies from an anchor once: the request then moves past it (a block at
    # a position its request passed is a record written twice, or two runs in one file).
    ("verified twice at one position", "position", lambda b, n, sw: b.verified_again, None),
    ("batch_row < -1", "batch_row", lambda b, n, sw: b.batch_row < -1, None),
    ("batch_size < -1", "batch_size", lambda b, n, sw: b.batch_size < -1, None),
    (
        "batch_row >= batch_size",
        "batch_row",
        lambda b, n, sw: (b.batch_row >= 0) & (b.batch_size >= 0) & (b.batch_row >= b.batch_size),
        lambda b, n, sw, i: int(b.batch_size[i]) - 1,
    ),
)


def _lengths(td: TraceData, c: slice) -> np.ndarray:
    """[rows] the full sequence length of the request of each block of rows ``c`` (0
    unknown; computed per chunk, not kept): int32 where every length plus the room of
    :func:`_position_room` fits, else int64; the values are the same either way."""
    req = td.t.blocks.request[c]
    length = td.length
    if _small(td):
        length = length.astype(np.int32)
    ok = (req >= 0) & (req < len(length))
    return np.where(ok, length[np.where(ok, req, 0)], length.dtype.type(0))


def _small(td: TraceData) -> bool:
    """Every sequence length plus a block's position room fits int32."""
    return int(td.length.max(initial=0)) + max(_kmax(td), 0) + 1 < np.iinfo(np.int32).max


def _kmax(td: TraceData) -> int:
    """The largest k of the trace (memoised: the chunked rules read it per chunk)."""
    return memo(td.t, "kmax", lambda: int(td.t.blocks.k.max(initial=0)))


def _position_room(td: TraceData, c: slice) -> np.ndarray:
    """[rows] (the dtype of :func:`_lengths`) one past the largest possible anchor position
    per block of rows ``c`` (0 unknown): the sequence length, plus k + 1 for a request's last
    block (the output is trimmed at max_tokens or a stop after the engine emitted and
    drafted past it)."""
    n = _lengths(td, c)
    return np.where((n > 0) & td.last[c], n + (_kmax(td) + 1), n)


def _prompt_floor(td: TraceData, c: slice) -> np.ndarray:
    """int64 [rows] the smallest possible anchor position per block of rows ``c``: its
    prompt's last token, ``len(prompt) - 1`` (a block drafts from the last verified token;
    every engine and importer anchors a request's first block on its first output token,
    at ``len(prompt)``); -1 where the prompt is unknown (empty) or the request out of range.
    Mirrors :mod:`spectrace.tracer.validate` (``_position_problems``)."""
    floor = memo(td.t, "prompt_floor", lambda: td.prompt_lengths - 1)
    req = td.t.blocks.request[c]
    ok = (req >= 0) & (req < len(floor))
    return np.where(ok, floor[np.where(ok, req, 0)], -1)


def verified_again(
    request: np.ndarray,
    position: np.ndarray,
    num_verified: np.ndarray,
    accepted: np.ndarray,
    order: np.ndarray | None = None,
) -> np.ndarray:
    """bool [n]: verified blocks (``num_verified`` or ``accepted`` known) at a (request,
    position) an earlier verified block holds (block row order: the first stays), from the
    /blocks columns of that name (int [n] each). An engine verifies from one anchor
    position once per request: vLLM's scheduler advances ``num_computed_tokens`` past it
    (``Scheduler.update_from_output``); an unverified proposal, re-drafted after a
    preemption, is no repeat. ``validate`` (``_position_problems``) reports the same rows.

    Args:
        order: int [n] the rows stably sorted by (request, position)
            (:func:`~spectrace.tracer.index.block_order`, memoised by a diff), or None (sorted
            here).
    """
    out = np.zeros(len(request), bool)
    if order is None:
        order = np.lexsort((position, request))  # stable: ties stay in row order
    last: tuple[int, int] | None = None  # the previous chunk's last verified (request, position)
    for c in chunks(len(order)):  # in chunks of the order: no whole-trace temporaries
        rows = order[c]
        rows = rows[(num_verified[rows] >= 0) | (accepted[rows] >= 0)]
        if not len(rows):
            continue
        r, p = request[rows], position[rows]
        again = np.empty(len(rows), bool)
        again[0] = last is not None and last == (int(r[0]), int(p[0]))
        np.logical_and(r[1:] == r[:-1], p[1:] == p[:-1], out=again[1:])
        out[rows[again]] = True
        last = int(r[-1]), int(p[-1])
    return out


@dataclass(frozen=True)
class _Bounds:
    """One block's position bounds, for a rule's limit: ``room`` (one past the largest
    possible position, 0 unknown) and ``floor`` (the smallest, -1 unknown); ``kcfg`` the
    trace's configured k."""

    room: int
    floor: int
    kcfg: int


@dataclass
class _Hits:
    """Every rule's result: ``bad`` bool [n] (any rule), ``counts`` (rule -> blocks) and the
    first broken block ``(row, rule, column, limit)`` in block row order (None: none)."""

    bad: np.ndarray
    counts: dict
    first: tuple | None


class _Rows:
    """Block columns (``b.<name>``) and the sweep's per-block reductions, rows ``c`` of
    each: what a rule's test reads, one chunk at a time."""

    #: int64 [rows] of blocks: :func:`_prompt_floor` (set by the caller; no column holds it).
    prompt_floor: np.ndarray
    #: bool [rows] of blocks: :func:`verified_again` (set by the caller).
    verified_again: np.ndarray
    #: The trace's configured k (/meta ``k``; no bound when unknown; set by the caller).
    kcfg: int

    def __init__(self, whole, c: slice) -> None:
        self._whole, self._c = whole, c

    def __getattr__(self, name: str):
        v = getattr(self._whole, name)
        return v[self._c] if isinstance(v, np.ndarray) else v


def _hits(td: TraceData) -> _Hits:
    return memo(td.t, "impossible_hits", lambda: _rule_hits(td))


def _rule_hits(td: TraceData) -> _Hits:
    """Every rule over the blocks, chunk by chunk (the rules' temporaries stay small)."""
    b, sw = td.t.blocks, sweep(td.t)
    again = verified_again(b.request, b.position, b.num_verified, b.accepted, td.order)
    kcfg = meta_k_limit(td.t.meta)
    kcfg = np.iinfo(np.int16).max if kcfg is None else kcfg  # unknown: any k (int16)
    bad = np.zeros(len(b), bool)
    counts: dict[str, int] = {}
    firsts: dict[str, int] = {}
    for c in chunks(len(b)):
        room, bc, swc = _position_room(td, c), _Rows(b, c), _Rows(sw, c)
        bc.prompt_floor, bc.verified_again, bc.kcfg = _prompt_floor(td, c), again[c], kcfg
        for name, _, test, _ in RULES:
            broken = test(bc, room, swc)
            if broken.any():
                bad[c] |= broken
                counts[name] = counts.get(name, 0) + int(np.count_nonzero(broken))
                firsts.setdefault(name, c.start + int(np.argmax(broken)))
    first = None
    for name, col, _, limit in RULES:  # the first broken block; ties: the earlier rule
        row = firsts.get(name)
        if row is not None and (first is None or row < first[0]):
            one = slice(row, row + 1)
            at = _Bounds(int(_position_room(td, one)[0]), int(_prompt_floor(td, one)[0]), kcfg)
            first = (row, name, col, None if limit is None else limit(b, at, sw, row))
    return _Hits(bad=bad, counts={r[0]: counts[r[0]] for r in RULES if r[0] in counts}, first=first)


def impossible_rows(td: TraceData) -> np.ndarray:
    """bool [n]: blocks breaking any of :data:`RULES` (memoised in the trace's cache)."""
    return _hits(td).bad


def _value(v: np.ndarray) -> int:
    """The offending value of one block's cell: the scalar, or for a row of ids the first
    id below -1 (the matrix rule that breaks)."""
    if np.ndim(v) == 0:
        return int(v)
    low = np.flatnonzero(v < -1)
    return int(v[low[0]]) if len(low) else int(v.min(initial=-1))


def impossible(s: SideInput) -> Finding | None:
    """impossible_values: accepted > k or > num_verified, counts below -1 (unknown), k < 0,
    above /meta k or wider than the stored proposals, proposed ids or anchors below -1,
    num_emitted > k + 1, positions outside the sequence or inside the prompt, a position
    verified twice in one request, batch rows outside the batch."""
    td = s.td
    b = td.t.blocks
    if not len(b):
        return None
    hits = _hits(td)
    counts, first = hits.counts, hits.first
    if first is None:
        return None
    row, rule, col, lim = first
    value = _value(read_row(td.t, col, row) if col == "proposed" else getattr(b, col)[row])
    pos = int(b.position[row])
    bad = impossible_rows(td)
    lim_txt = "" if lim is None else f", limit {lim}"
    return Finding(
        "impossible_values",
        "error",
        side=td.side,
        request=td.req_id(row),
        position=pos if pos >= 0 else None,
        message=(
            f"{td.side}: {int(bad.sum())} blocks hold values no engine can produce (first: "
            f"block {row}, request {td.req_id(row)} at position {pos}: {rule}, {col}={value}"
            f"{lim_txt}); the diff leaves them out of its acceptance figures, which they would "
            f"push past 100%"
        ),
        evidence=ImpossibleEvidence(
            blocks=int(bad.sum()),
            rules=counts,
            rule=rule,
            column=col,
            value=value,
            limit=lim,
            row=row,
        ),
    )


def _trimmed_rows(td: TraceData) -> np.ndarray:
    """bool [n]: ``0 <= num_verified < k`` in a block whose k drafts fit inside the output,
    or, the output unknown, that is not its request's last verified block (int64
    arithmetic, in row chunks: no whole-column int64 copies)."""
    b = td.t.blocks
    trim = np.empty(len(b), bool)
    last = np.zeros(len(b), bool)  # each request's last verified block
    last[td.last_verified[td.last_verified >= 0]] = True
    for c in chunks(len(b)):
        n = _lengths(td, c)
        nv, k = b.num_verified[c].astype(np.int64), b.k[c].astype(np.int64)
        # output unknown: a request's last verified block may be the one trimmed at its end
        at_end = np.where(n > 0, b.position[c].astype(np.int64) + 1 + k >= n, last[c])
        trim[c] = (nv >= 0) & (nv < k) & ~at_end
    return trim


def _trimmed_beside(s: SideInput, trim: np.ndarray) -> int:
    """In a diff, this side's trimmed blocks (``trim``, bool [n]) paired with one whose
    target verified more drafts (at the same anchor on matched content): one is enough, the
    other engine shows the drafts were verifiable there. 0 in a check."""
    al, ref = s.al, s.ref
    if al is None or ref is None:
        return 0
    mine, other = (al.ia, al.ib) if s.side_a else (al.ib, al.ia)
    nv_here, nv_there = s.td.t.blocks.num_verified[mine], ref.t.blocks.num_verified[other]
    return int((trim[mine] & (nv_there > nv_here)).sum())


def trimmed(s: SideInput) -> Finding | None:
    """trimmed_drafts: the target verified fewer drafts than the drafter proposed
    (``0 <= num_verified < k``) in at least :data:`~.thresholds.MIN_BLOCKS` blocks whose k
    drafts fit inside the output (near the output's end the engine may trim legitimately),
    or, in a diff, in one block whose paired block's target verified more
    (:func:`_trimmed_beside`).
    The verified slots may agree with the reference while the acceptance per verified slot
    looks better than it is."""
    td = s.td
    b = td.t.blocks
    nv, k = b.num_verified, b.k
    trim = _trimmed_rows(td)
    beside = _trimmed_beside(s, trim)
    if trim.sum() < MIN_BLOCKS and not beside:
        return None
    first = int(np.flatnonzero(trim)[0])
    ntrim, nver = int(trim.sum()), int((nv >= 0).sum())
    more = (
        f"; at {beside} of these anchors the other engine's target verified more drafts"
        if beside
        else ""
    )
    return Finding(
        "trimmed_drafts",
        "error",
        side=td.side,
        slot=int(nv[first]),
        **td.at(first),
        message=(
            f"{td.side}: the target verified fewer drafts than were proposed in {ntrim} of "
            f"{nver} verified blocks (first: k={int(k[first])}, verified {int(nv[first])}; "
            f"{int(nv[trim].sum())} of {int(k[trim].sum())} proposed drafts verified): the "
            f"drafts are cut before verification, and acceptance per verified slot overstates"
            f"{more}"
        ),
        evidence=TrimmedEvidence(
            blocks=ntrim,
            verified_blocks=nver,
            proposed_tokens=int(k[trim].sum()),
            verified_tokens=int(nv[trim].sum()),
            first_k=int(k[first]),
            first_num_verified=int(nv[first]),
        ),
    )
