"""Small exact statistics for the detectors (numpy and the standard library only).

:func:`concentration_p` is the one-sided Fisher exact test that decides whether mismatches
concentrate in a group of blocks (after a given verdict, at a batch change): the
hypergeometric upper tail, summed exactly in log space.
"""

from __future__ import annotations

import math

import numpy as np


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def concentration_p(hits_in: int, n_in: int, hits_out: int, n_out: int) -> float:
    """One-sided Fisher exact p-value that the group holds at least ``hits_in`` of the
    ``hits_in + hits_out`` hits by chance: ``P(X >= hits_in)`` for X hypergeometric (N =
    ``n_in + n_out`` blocks, m hits, ``n_in`` drawn).

    Args:
        hits_in, n_in: hits (e.g. mismatching blocks) and blocks in the group.
        hits_out, n_out: the same outside the group.
    Returns:
        The p-value in [0, 1] (1.0 when the group holds no hit or the counts are empty).
    Raises:
        ValueError: negative counts or more hits than blocks.
    """
    if min(hits_in, n_in, hits_out, n_out) < 0 or hits_in > n_in or hits_out > n_out:
        raise ValueError("counts must satisfy 0 <= hits <= blocks")
    N, m, n = n_in + n_out, hits_in + hits_out, n_in
    if hits_in == 0 or N == 0:
        return 1.0
    hi = min(m, n)
    # log pmf(x) for x = hits_in..hi by the ratio pmf(x+1)/pmf(x), from pmf(hits_in).
    x = np.arange(hits_in, hi, dtype=np.float64)
    ratio = np.log((m - x) * (n - x)) - np.log((x + 1) * (N - m - n + x + 1))
    log0 = _log_comb(m, hits_in) + _log_comb(N - m, n - hits_in) - _log_comb(N, n)
    logs = log0 + np.concatenate([[0.0], np.cumsum(ratio)])
    top = logs.max()
    return float(min(1.0, math.exp(top) * np.exp(logs - top).sum()))
