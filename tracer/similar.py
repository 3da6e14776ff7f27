"""Prompt similarity: requests of two traces whose prompts differ but share most of their
tokens (content drift: the same user text under another chat template or system prompt).

Threshold (:data:`DRIFT_MIN_TOKENS`, :data:`DRIFT_SHARE`): two differing prompts pair up
when their longest run of consecutive common tokens (a shared prefix, a shared suffix, or
the user text inside a template) is at least 8 tokens long and covers at least half of the
shorter prompt. Candidates are found through shared 8-grams; an 8-gram found in more than
:data:`COMMON_GRAM` prompts of theirs (a system prompt every request shares) says nothing
about which request is which and is ignored for candidate search (duplicate prompts count
once: requests of one prompt pair up in order).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .compare import NO_DIVERGENCE, first_difference

DRIFT_MIN_TOKENS = 8
DRIFT_SHARE = 0.5
#: An n-gram in more distinct prompts of theirs than this is not used to find candidates.
COMMON_GRAM = 16
#: Candidates (most shared n-grams first) and diagonals measured per request.
CANDIDATES = 4
DIAGONALS = 64


@dataclass(frozen=True)
class PromptDrift:
    """Two requests whose prompts differ but share most of their tokens.

    Attributes:
        req_a, req_b: request indices (ours, theirs).
        first_difference: first token index where the prompts differ (= common_prefix).
        ours_len, theirs_len: prompt lengths (tokens).
        common_prefix, common_suffix: lengths (tokens) of the shared head and tail; they
            never overlap (prefix + suffix <= the shorter length).
        common_run: length (tokens) of the longest run of consecutive tokens both prompts
            hold; ``run_ours``, ``run_theirs``: where it starts in each prompt.
    """

    req_a: int
    req_b: int
    first_difference: int
    ours_len: int
    theirs_len: int
    common_prefix: int
    common_suffix: int
    common_run: int
    run_ours: int
    run_theirs: int


def match_drift(
    prompts_a: list[np.ndarray],
    prompts_b: list[np.ndarray],
    free_a: np.ndarray,
    free_b: np.ndarray,
) -> list[PromptDrift]:
    """Pair left-over requests whose prompts share most of their tokens (content drift).

    Each of our requests, in order, takes among the free requests of theirs that share an
    8-gram with it (the :data:`CANDIDATES` sharing most) the one with the longest common
    run passing the threshold (ties: the first found). N-grams are compared by a 64-bit
    hash; a collision only adds a candidate, which the exact measure then rejects.

    Args:
        prompts_a, prompts_b: prompt ids per request (int arrays, one per request).
        free_a, free_b: int64 request indices left unmatched by exact matching.
    Returns:
        The drift pairs, sorted by our request.
    """
    by_prompt: dict[bytes, list[int]] = {}  # their free requests per distinct prompt
    for j in free_b.tolist():
        by_prompt.setdefault(np.asarray(prompts_b[j], np.int32).tobytes(), []).append(j)
    keys = list(by_prompt)
    index = _GramIndex([prompts_b[by_prompt[k][0]] for k in keys])
    out: list[PromptDrift] = []
    mine = [np.asarray(prompts_a[i], np.int64) for i in free_a.tolist()]
    for i, x, cands in zip(free_a.tolist(), mine, index.candidates(mine)):
        best: PromptDrift | None = None
        for c in cands:
            if not by_prompt[keys[c]]:
                continue
            j = by_prompt[keys[c]][0]
            d = prompt_drift(i, j, x, np.asarray(prompts_b[j], np.int64))
            if d is not None and (best is None or d.common_run > best.common_run):
                best = d
        if best is not None:
            by_prompt[np.asarray(prompts_b[best.req_b], np.int32).tobytes()].pop(0)
            out.append(best)
    return out


class _GramIndex:
    """Hashed 8-grams of distinct prompts: sorted hashes ``h`` and the prompt of each."""

    def __init__(self, prompts: list[np.ndarray]) -> None:
        per = [np.unique(_hashes(p)) for p in prompts]
        h = np.concatenate(per) if per else np.zeros(0, np.uint64)
        owner = np.repeat(np.arange(len(per)), [len(x) for x in per])
        order = np.argsort(h, kind="stable")
        h, owner = h[order], owner[order]
        # A gram of more than COMMON_GRAM distinct prompts tells no request from another.
        count = np.unique(h, return_counts=True)[1]
        keep = np.repeat(count <= COMMON_GRAM, count)
        self.h, self.owner, self.n = h[keep], owner[keep], len(prompts)

    def candidates(self, xs: list[np.ndarray]) -> list[list[int]]:
        """Per prompt of ``xs``, the indexed prompts sharing most hashed 8-grams with it (at
        most :data:`CANDIDATES`, most shared first, then lowest index), in one pass."""
        per = [np.unique(_hashes(x)) for x in xs]
        hx = np.concatenate(per) if per else np.zeros(0, np.uint64)
        who = np.repeat(np.arange(len(per)), [len(x) for x in per])
        lo, hi = np.searchsorted(self.h, hx, "left"), np.searchsorted(self.h, hx, "right")
        n = hi - lo
        out: list[list[int]] = [[] for _ in xs]
        if not n.sum():
            return out
        at = np.repeat(lo - np.concatenate(([0], np.cumsum(n)[:-1])), n) + np.arange(n.sum())
        pair = np.repeat(who, n).astype(np.int64) * self.n + self.owner[at]
        key, shared = np.unique(pair, return_counts=True)
        a, b = key // self.n, key % self.n
        for r in np.lexsort((b, -shared, a)).tolist():
            if len(out[a[r]]) < CANDIDATES:
                out[a[r]].append(int(b[r]))
        return out


def prompt_drift(i: int, j: int, x: np.ndarray, y: np.ndarray) -> PromptDrift | None:
    """How prompt ``x`` (our request ``i``) differs from ``y`` (their request ``j``), or None
    when they are equal or share too little (the threshold of the module docstring)."""
    n = min(len(x), len(y))
    if n == 0 or (len(x) == len(y) and np.array_equal(x, y)):
        return None
    run, ox, oy = longest_common_run(x, y)
    if run < max(DRIFT_MIN_TOKENS, DRIFT_SHARE * n):
        return None
    prefix = first_difference(x, y)
    prefix = n if prefix == NO_DIVERGENCE else prefix
    tail = first_difference(x[::-1][: n - prefix], y[::-1][: n - prefix])
    suffix = n - prefix if tail == NO_DIVERGENCE else tail
    return PromptDrift(i, j, prefix, len(x), len(y), prefix, suffix, run, ox, oy)


def longest_common_run(x: np.ndarray, y: np.ndarray) -> tuple[int, int, int]:
    """The longest run of at least :data:`DRIFT_MIN_TOKENS` consecutive tokens in both ``x``
    and ``y`` (int arrays): ``(length, start in x, start in y)``, the first in ``x`` on
    ties; (0, 0, 0) when none. Such a run holds a shared 8-gram, so only the diagonals
    (offset y - x) of shared hashed 8-grams are measured, the :data:`DIAGONALS` with most
    first (exactly: a hash collision only measures one more diagonal)."""
    hx, hy = _hashes(x), _hashes(y)
    oy = np.argsort(hy, kind="stable")
    lo = np.searchsorted(hy[oy], hx, "left")
    n = np.searchsorted(hy[oy], hx, "right") - lo
    if not n.sum():
        return 0, 0, 0
    p = np.repeat(np.arange(len(hx)), n)
    q = oy[np.repeat(lo - np.concatenate(([0], np.cumsum(n)[:-1])), n) + np.arange(n.sum())]
    diag, count = np.unique(q - p, return_counts=True)
    best = (0, 0, 0)
    for d in diag[np.argsort(-count, kind="stable")[:DIAGONALS]].tolist():
        length, start = _longest_true(x[max(0, -d) : len(y) - d] == y[max(0, d) : len(x) + d])
        start += max(0, -d)
        if length > best[0] or (length == best[0] and length and start < best[1]):
            best = (length, start, start + d)
    return best if best[0] >= DRIFT_MIN_TOKENS else (0, 0, 0)


def _longest_true(eq: np.ndarray) -> tuple[int, int]:
    """(length, start) of the first longest run of True in a bool array ((0, 0) if none)."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], eq.astype(np.int8), [0]))))
    if not len(edges):
        return 0, 0
    starts, ends = edges[::2], edges[1::2]
    k = int((ends - starts).argmax())
    return int(ends[k] - starts[k]), int(starts[k])


#: Multiplier of the polynomial 8-gram hash (odd, 64-bit; arithmetic wraps modulo 2**64).
_BASE = np.uint64(0x9E3779B97F4A7C15)
_POWERS = np.array([_BASE ** np.uint64(DRIFT_MIN_TOKENS - 1 - t) for t in range(DRIFT_MIN_TOKENS)])


def _hashes(x: np.ndarray) -> np.ndarray:
    """uint64 [len(x) - 7] hashes of the :data:`DRIFT_MIN_TOKENS`-grams of ``x`` (empty when
    shorter), in order."""
    w = DRIFT_MIN_TOKENS
    if len(x) < w:
        return np.zeros(0, np.uint64)
    v = np.lib.stride_tricks.sliding_window_view(np.asarray(x, np.int64).astype(np.uint64), w)
    with np.errstate(over="ignore"):
        return (v * _POWERS).sum(axis=1, dtype=np.uint64)
