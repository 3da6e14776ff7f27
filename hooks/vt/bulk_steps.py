"""Engine steps of a lexed log without a Python loop over its lines (for :mod:`.bulk`): the
parser's step rules (``VtTraceParser._new_step_if``) run as a small automaton over the line
codes, many stretches of lines at once.

The rules: a line starts a new step when the ``seen`` bits of the current step meet its
code's ``new`` mask (a ``[SPECTRACE]`` line: any bit but ``sched``), or when a
``[SPECTRACE]`` line repeats a request already verified in the step; a new step clears
``seen``, then the line adds its code's bits. The ``sched`` bit is in no mask, so a split
by a repeated request (which only clears bits within ``sched``) never changes a later
decision of the automaton: the automaton runs first, the request splits are added after.
"""

from __future__ import annotations

import numpy as np

#: Lines per stretch run side by side; stretches start from a guessed state, refined until
#: every stretch starts from its predecessor's end (:data:`MAX_ROUNDS` at most).
STRETCH = 1024
MAX_ROUNDS = 64
WARM = 64


def segment(
    codes: np.ndarray,
    vreq: np.ndarray,
    masks: tuple[np.ndarray, ...],
    v: int,
    sched: int,
    by_req: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, int] | None:
    """Step of every trace line and the ``seen`` bits after it.

    Args:
        codes: line codes of the trace lines in order (int [m], :data:`~.bulk_lex.KEYS`).
        vreq: request index of each ``[SPECTRACE]`` line (code ``v``), in order (int [nv]).
        masks: (new, add) int64 arrays indexed by code: bits that start a step / bits added.
        sched: the ``[spec-sched]`` code (its bit: ``add[sched]``).
        by_req: ``np.argsort(vreq, kind="stable")`` when the caller has it.
    Returns:
        ``(steps, seens, last_step)`` (int64 [m], int64 [m], int), or None when the
        automaton does not settle (the caller loops over the lines then).
    """
    m = len(codes)
    codes = np.asarray(codes, np.int64)
    got = _automaton(codes, *(m.astype(np.int16) for m in masks))
    if got is None:
        return None
    new, seen = got
    is_v = codes == v
    vreq = np.asarray(vreq, np.int64)
    by_req = np.argsort(vreq, kind="stable") if by_req is None else by_req
    split = _request_splits(np.flatnonzero(is_v), vreq, by_req, new)
    steps = np.cumsum(new | split)
    # The runner's first line: a [SPECTRACE] line before any other line but [spec-sched]
    # (an untraced step 0 proposed its drafts) makes it step 1.
    other = np.flatnonzero(codes != sched)
    if len(other) and codes[other[0]] == v:
        steps[other[0] :] += 1
    if split.any():  # after a request split, ``sched`` holds only for [spec-sched] lines since
        sc = int(masks[1][sched])
        ar = np.arange(m)
        start = np.maximum.accumulate(np.where(new | split, ar, 0))
        last = np.maximum.accumulate(np.where(codes == sched, ar, -1))
        seen = (seen & ~sc) | np.where(last >= start, sc, 0)
    return steps.astype(np.int64), seen.astype(np.int64), int(steps[-1]) if m else 0


def _automaton(codes: np.ndarray, new_m: np.ndarray, add_m: np.ndarray):
    """Per line: whether the automaton starts a step there (bool [m]) and ``seen`` after."""
    m = len(codes)
    nb = max(-(-m // STRETCH), 1)
    flat = np.zeros(nb * STRETCH, np.int64)  # code 0 (padding): adds nothing, starts nothing
    flat[:m] = codes
    c = flat.reshape(nb, STRETCH).T  # [STRETCH, nb]: one row per position
    nw, ad = new_m[c], add_m[c]
    # First guess of each stretch's start: the previous stretch's last WARM lines run from
    # an empty state (exact when a step began in them, as it nearly always does).
    warm = min(WARM, STRETCH)
    _, tail = _run(nw[-warm:], ad[-warm:], np.zeros(nb, np.int16))
    start = np.concatenate([[0], tail[-1, :-1]]).astype(np.int16)
    new, seen = _run(nw, ad, start)
    for _ in range(MAX_ROUNDS):
        want = np.concatenate([[0], seen[-1, :-1]]).astype(np.int16)
        rows = np.flatnonzero(want != start)
        if not len(rows):
            return new.T.ravel()[:m], seen.T.ravel()[:m]
        start = want
        new[:, rows], seen[:, rows] = _run(nw[:, rows], ad[:, rows], start[rows])
    return None


def _run(nw: np.ndarray, ad: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The automaton over stretches side by side (``nw``, ``ad``: [STRETCH, r] masks per
    line; ``s``: [r] start states)."""
    new = np.empty(nw.shape, bool)
    seen = np.empty(nw.shape, np.int16)
    for j in range(nw.shape[0]):
        hit = (s & nw[j]) != 0
        s = np.where(hit, 0, s) | ad[j]
        new[j], seen[j] = hit, s
    return new, seen


def _request_splits(
    vlines: np.ndarray, vreq: np.ndarray, by_req: np.ndarray, new: np.ndarray
) -> np.ndarray:
    """Lines where a ``[SPECTRACE]`` line repeats a request verified since the step began
    (``by_req``: the ``[SPECTRACE]`` lines by request, each request's in line order)."""
    split = np.zeros(len(new), bool)
    if not len(vlines):
        return split
    seg = np.cumsum(new)[vlines]
    order = by_req  # a repeat within a stretch: one request twice in a row, same stretch
    dup = (seg[order][1:] == seg[order][:-1]) & (vreq[order][1:] == vreq[order][:-1])
    if not dup.any():
        return split
    for s in np.unique(seg[order][1:][dup]).tolist():  # the stretches with a repeat
        verified: set[int] = set()
        for i in np.flatnonzero(seg == s).tolist():
            r = int(vreq[i])
            if r in verified:
                split[vlines[i]], verified = True, set()
            verified.add(r)
    return split
