"""Align two traces per anchor on identical content.

1. Requests are matched by identical prompt ids, then by request id, then, where a prompt
   is unknown, in order among those whose blocks hold the same anchors at the same
   positions (``order``: a VT log imported without its requests file). Requests
   left over on both sides with prompts that differ but share most of their tokens (a chat
   template or system prompt wrapped around the same user text) pair up as *prompt drift*
   (:func:`~spectrace.tracer.similar.match_drift`, threshold in :mod:`.similar`): they are
   reported (``prompt_drift``), never compared block by block, since their contexts differ.
2. Per matched pair the *content divergence position* is the first index where the two full
   sequences (prompt + output) differ; a block is comparable only when its anchor position is
   before it (both engines saw the same prefix up to and including the anchor), as defined
   once in :mod:`spectrace.tracer.compare`. At the *final position* (the shorter sequence's
   last token) a block is comparable only when both sides have one there: a request's final
   proposal (drafted after its last token, never verified) that one engine drafts and the
   other does not is left out; one that both drafted, or one that pairs with the longer
   side's block there (one output a prefix of the other), was drafted from the same context.
3. Comparable blocks pair up by (request pair, anchor position): with different acceptance the
   engines draft from different positions, so only positions both drafted from pair up.
4. A replay pair (both traces ``/meta`` ``source: "replay"``, see :mod:`spectrace.hooks.replay`)
   drafted from the same reference prefixes by construction: every position pairs, except
   where the two targets sampled different anchors there (the drafts then follow different
   contexts); those are counted in ``anchor_disagreements``, not paired.

All block work is vectorised: one stable sort of each trace's blocks by (request, position)
(memoised, shared with the detectors), then a binary search of our keys in theirs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .compare import (
    NO_DIVERGENCE,
    at_final,
    comparable,
    comparable_limit,
    final_position,
    first_difference,
)
from .index import block_keys, block_order
from .parallel import chunks, in_parallel
from .schema import SOURCE_REPLAY
from .similar import PromptDrift, match_drift
from .store import Trace


@dataclass
class Alignment:
    """Two traces aligned per anchor.

    Attributes:
        a, b: the traces ("ours" and "theirs").
        req_a, req_b: int64 [m] request indices of the m matched request pairs.
        matched_by: list of m str: ``prompt`` | ``req_id`` | ``order``.
        unmatched_a, unmatched_b: int64 request indices without a partner (exact or drift).
        drift: the request pairs with similar, differing prompts (:class:`PromptDrift`),
            sorted by our request; none of them is in ``req_a``/``req_b``.
        divergence: int64 [m] first differing index of the full sequences (tokens), or
            :data:`NO_DIVERGENCE`; ``content_known``: bool [m], False when either side lacks
            output ids (then only anchors tell whether content matches).
        common_len: int64 [m] length of the shorter full sequence (tokens).
        pair_of_block_a, pair_of_block_b: int32 [blocks] request-pair index per block, -1
            when the request is unmatched (int64 past 2**31 - 1 pairs).
        comparable_a, comparable_b: bool [blocks] block lies on matched content (at the
            final position only where both sides have a block there).
        ia, ib: int [P] indices of the P paired blocks (same pair, same anchor position),
            sorted by (pair, position); int32 (int64 past 2**31 - 1 blocks), as
            :func:`~spectrace.tracer.index.block_order`.
        replay: both traces are replays of the same references; ``disagree_a``,
            ``disagree_b``: int64 block indices of the positions left unpaired because the two
            targets sampled different anchors there (empty otherwise).
        pairs_before_selection: the matched request pairs before a request selection
            (``--request``) narrowed the alignment to ``req_a``/``req_b``; None when not
            narrowed by request.
    """

    a: Trace
    b: Trace
    req_a: np.ndarray
    req_b: np.ndarray
    matched_by: list[str]
    unmatched_a: np.ndarray
    unmatched_b: np.ndarray
    divergence: np.ndarray
    content_known: np.ndarray
    common_len: np.ndarray
    pair_of_block_a: np.ndarray
    pair_of_block_b: np.ndarray
    comparable_a: np.ndarray
    comparable_b: np.ndarray
    ia: np.ndarray
    ib: np.ndarray
    drift: list[PromptDrift] = field(default_factory=list)
    replay: bool = False
    disagree_a: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    disagree_b: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    pairs_before_selection: int | None = None

    @property
    def pairs(self) -> int:
        """Number of matched request pairs."""
        return len(self.req_a)


def match_requests(a: Trace, b: Trace) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Match requests of two traces: identical prompt ids, then request id, then order.

    Duplicate prompts pair up in order of appearance. Returns ``(req_a, req_b, matched_by)``.
    """
    ra, rb = a.requests, b.requests
    pairs: list[tuple[int, int, str]] = []
    free_b = set(range(len(rb)))
    by_prompt: dict[bytes, list[int]] = {}
    for j in range(len(rb)):
        if len(rb.prompt_ids[j]):
            by_prompt.setdefault(rb.prompt_ids[j].astype(np.int32).tobytes(), []).append(j)
    left_a = []
    for i in range(len(ra)):
        cands = (
            by_prompt.get(ra.prompt_ids[i].astype(np.int32).tobytes())
            if len(ra.prompt_ids[i])
            else None
        )
        if cands:
            j = cands.pop(0)
            free_b.discard(j)
            pairs.append((i, j, "prompt"))
        else:
            left_a.append(i)
    by_id = {rb.req_id[j]: j for j in sorted(free_b)}
    left_a2 = []
    for i in left_a:
        jb = by_id.pop(ra.req_id[i], -1)
        if jb >= 0 and not (len(ra.prompt_ids[i]) and len(rb.prompt_ids[jb])):
            free_b.discard(jb)
            pairs.append((i, jb, "req_id"))
        else:
            left_a2.append(i)
    pairs += _pair_by_blocks(a, b, left_a2, sorted(free_b))
    pairs.sort()
    req_a = np.array([p[0] for p in pairs], dtype=np.int64)
    req_b = np.array([p[1] for p in pairs], dtype=np.int64)
    return req_a, req_b, [p[2] for p in pairs]


#: Order pairing compares each request with every candidate up to this many comparisons.
_SCAN = 1_000_000


def _pair_by_blocks(
    a: Trace, b: Trace, left: list[int], free: list[int]
) -> list[tuple[int, int, str]]:
    """Pairs ("order") of requests left unmatched where one side or both do not know the
    prompt (different known prompts never match): each of ours, in order, takes the first
    of theirs left whose blocks agree (:func:`_same_anchors`; past :data:`_SCAN`
    comparisons, the next in order only), as a VT log imported without its requests file
    pairs with the same run's other trace."""
    ra, rb = a.requests, b.requests
    blind_a = any(not len(ra.prompt_ids[i]) for i in left)
    blind_b = any(not len(rb.prompt_ids[j]) for j in free)
    if not left or not free or not (blind_a or blind_b):
        return []
    anchors_a, anchors_b = _anchors_by_request(a, left), _anchors_by_request(b, free)
    scan = len(free) if len(left) * len(free) <= _SCAN else 1
    out = []
    for i in left:
        mine, known = anchors_a.get(i, {}), bool(len(ra.prompt_ids[i]))
        fits = (
            n for n, j in enumerate(free[:scan])
            if not (known and len(rb.prompt_ids[j])) and _same_anchors(mine, anchors_b.get(j, {}))
        )  # fmt: skip
        at = next(fits, -1)
        if at >= 0:
            out.append((i, free.pop(at), "order"))
    return out


#: Blocks per request (its first, by position) that pairing on blocks compares.
_FIRST_BLOCKS = 32


def _anchors_by_request(t: Trace, requests: list[int]) -> dict[int, dict[int, int]]:
    """Request row -> {anchor position: anchor id} of its first :data:`_FIRST_BLOCKS`
    blocks with a known anchor (a VT log imported without its requests file does not know
    its first), ``requests`` only (bounded: a few per request, whatever the trace's size)."""
    want = np.zeros(len(t.requests) + 1, bool)
    want[requests] = True
    b = t.blocks
    rows = block_order(t)
    rows = rows[want[np.clip(b.request[rows], 0, len(want) - 1)] & (b.anchor[rows] >= 0)]
    req = b.request[rows]
    start = np.flatnonzero(np.r_[True, req[1:] != req[:-1]]) if len(req) else req[:0]
    rank = np.arange(len(rows)) - np.repeat(start, np.diff(np.r_[start, len(rows)]))
    rows = rows[rank < _FIRST_BLOCKS]
    out: dict[int, dict[int, int]] = {}
    for r, p, x in zip(
        b.request[rows].tolist(), b.position[rows].tolist(), b.anchor[rows].tolist()
    ):
        out.setdefault(r, {}).setdefault(p, x)
    return out


def _same_anchors(x: dict[int, int], y: dict[int, int]) -> bool:
    """Whether two requests' blocks hold one anchor id at every position both drafted from,
    and share two such positions (one where either has a single block): the same content,
    as far as the blocks show."""
    common = x.keys() & y.keys()
    return len(common) >= min(2, len(x), len(y)) > 0 and all(x[p] == y[p] for p in common)


def _pair_blocks(
    a: Trace, b: Trace, pob_a: np.ndarray, comp_a: np.ndarray, comp_b: np.ndarray, req_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Paired block indices ``(ia, ib)``, sorted by (pair, position).

    Our comparable blocks in (request, position) order are in (pair, position) order (pairs
    are numbered in our request order); each is looked up by (their request, position) in
    their sorted keys. A re-prefill can repeat a position: the first block of each
    (request, position) is used on both sides.
    """
    order_a, order_b = block_order(a), block_order(b)
    ia = order_a[comp_a[order_a]]
    if len(ia):  # the first block of each (request, position): in order, where either changes
        r, p = a.blocks.request[ia], a.blocks.position[ia]
        first = np.empty(len(ia), bool)
        first[0] = True
        np.not_equal(r[1:], r[:-1], out=first[1:])
        first[1:] |= p[1:] != p[:-1]
        del r, p
        ia = ia[first]
    keys_b, stride_b, pmin_b = block_keys(b)
    pos = a.blocks.position[ia].astype(np.int64) - pmin_b
    q = req_b[pob_a[ia]] * stride_b + pos
    x = np.minimum(np.searchsorted(keys_b, q), max(len(keys_b) - 1, 0))
    hit = (pos >= 0) & (pos < stride_b)
    if len(keys_b):
        hit &= keys_b[x] == q
    else:
        hit[:] = False
    ib = order_b[x[hit]]
    ok = comp_b[ib]  # comparability depends on (pair, position) only: a safety net
    return ia[hit][ok], ib[ok]


def align(a: Trace, b: Trace) -> Alignment:
    """Align trace ``a`` (ours) with trace ``b`` (theirs). See the module docstring.

    Returns:
        An :class:`Alignment`. Reads the request tables and the ``request`` and ``position``
        block columns.
    """
    a.blocks.request, b.blocks.request  # noqa: B018 - may add placeholder request rows
    req_a, req_b, matched_by = match_requests(a, b)
    free_a = np.setdiff1d(np.arange(len(a.requests)), req_a)
    free_b = np.setdiff1d(np.arange(len(b.requests)), req_b)
    drift = match_drift(a.requests.prompt_ids, b.requests.prompt_ids, free_a, free_b)
    m = len(req_a)
    divergence = np.full(m, NO_DIVERGENCE, np.int64)
    common_len = np.zeros(m, np.int64)
    known = np.zeros(m, bool)
    for p in range(m):
        ia, ib = req_a[p], req_b[p]
        oa, ob = a.requests.output_ids[ia], b.requests.output_ids[ib]
        known[p] = len(oa) > 0 and len(ob) > 0
        sa, sb = a.requests.full_sequence(ia), b.requests.full_sequence(ib)
        common_len[p] = min(len(sa), len(sb))
        if known[p]:
            divergence[p] = first_difference(sa, sb)

    def side(t: Trace, req: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One trace's (pair of block, comparable, at the final position) columns."""
        block_order(t)  # memoised for _pair_blocks and the detectors
        pob = _pair_of_block(t, req)
        return pob, *_comparable(pob, t.blocks.position, divergence, common_len, known)

    (pob_a, comp_a, fin_a), (pob_b, comp_b, fin_b) = in_parallel(
        [lambda: side(a, req_a), lambda: side(b, req_b)]
    )
    ia, ib = _pair_blocks(a, b, pob_a, comp_a | fin_a, comp_b | fin_b, req_b)
    _final_paired(m, ia, pob_a, fin_a, comp_a)
    _final_paired(m, ib, pob_b, fin_b, comp_b)
    replay = is_replay(a) and is_replay(b)
    dis_a = dis_b = np.zeros(0, np.int64)
    if replay:
        same = a.blocks.anchor[ia] == b.blocks.anchor[ib]
        dis_a, dis_b, ia, ib = ia[~same], ib[~same], ia[same], ib[same]
    return Alignment(
        a=a,
        b=b,
        req_a=req_a,
        req_b=req_b,
        matched_by=matched_by,
        unmatched_a=np.setdiff1d(free_a, [d.req_a for d in drift]),
        unmatched_b=np.setdiff1d(free_b, [d.req_b for d in drift]),
        divergence=divergence,
        content_known=known,
        common_len=common_len,
        pair_of_block_a=pob_a,
        pair_of_block_b=pob_b,
        comparable_a=comp_a,
        comparable_b=comp_b,
        ia=ia,
        ib=ib,
        drift=drift,
        replay=replay,
        disagree_a=dis_a,
        disagree_b=dis_b,
    )


def is_replay(t: Trace) -> bool:
    """Whether ``t`` was written by ``spectrace replay`` (``/meta`` ``source: "replay"``)."""
    return t.meta.get("source") == SOURCE_REPLAY


#: /meta ``method`` values that name no speculative method (a vanilla run).
NO_METHOD = frozenset({"", "none", "null", "off", "vanilla"})


def drafts_configured(t: Trace) -> bool:
    """Whether ``t``'s /meta says the run decoded speculatively: ``method`` names a method
    (vLLM's ``speculative_config.method``, as the vLLM hook and ``--meta method=`` record
    it) and ``k`` (``num_speculative_tokens``) is not 0, or no method is recorded (null or
    absent: unknown) and ``k`` is at least 1 (a VT import takes k from the engine's
    lookahead or its blocks; the vLLM hook writes k 0 without a speculative config). A
    vanilla run records no method (or ``k`` 0), so a trace of such a run without blocks
    compares its outputs alone; a speculative run without blocks lost its drafts."""
    method, k = t.meta.get("method"), t.meta.get("k")
    if method is None:  # unknown (an import without --meta method): a k >= 1 says it drafted
        return isinstance(k, int) and not isinstance(k, bool) and k >= 1
    if not isinstance(method, str) or method.strip().lower() in NO_METHOD:
        return False
    return not (isinstance(k, int) and k <= 0)


def _pair_of_block(t: Trace, req: np.ndarray) -> np.ndarray:
    r = t.blocks.request  # first: may add placeholder request rows
    dtype = np.int32 if len(req) < np.iinfo(np.int32).max else np.int64
    lookup = np.full(len(t.requests) + 1, -1, dtype)
    lookup[req] = np.arange(len(req))
    return lookup[r] if len(r) else np.zeros(0, dtype)


def _comparable(
    pob: np.ndarray,
    pos: np.ndarray,
    divergence: np.ndarray,
    common_len: np.ndarray,
    known: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """bool [blocks] each: comparable before the final position, and at the final position
    (comparable once the other side has a block there: :func:`_final_paired`)."""
    out, fin = np.zeros(len(pob), bool), np.zeros(len(pob), bool)
    limit = comparable_limit(divergence, common_len, known)
    final = final_position(divergence, common_len, known)
    for c in chunks(len(pob)):
        out[c] = comparable(pos[c], pob[c], limit)
        fin[c] = at_final(pos[c], pob[c], final)
    return out, fin


def _final_paired(
    m: int, paired: np.ndarray, pob: np.ndarray, fin: np.ndarray, comp: np.ndarray
) -> None:
    """Mark comparable (``comp``, in place) one side's blocks at the final position (``fin``)
    of the request pairs whose final position paired: both sides drafted there (``paired``:
    that side's paired block indices; ``pob``: its pair of block, of m pairs). Every block
    at such a (pair, position) is, a re-prefill's repeat included, as before it."""
    done = np.zeros(m + 1, bool)  # index -1: the unmatched "pair", never marked
    done[pob[paired[fin[paired]]]] = True
    for c in chunks(len(comp)):
        comp[c] |= fin[c] & done[pob[c]]
