"""The comparison kernel, on blocks whose expected comparisons are worked out by hand."""

import numpy as np

from spectrace.tracer.compare import (NO_DIVERGENCE, comparable, comparable_limit,
                                      compare_blocks, first_difference, shift_equal)

# Row 0: slot 2 differs. Row 1: theirs is shorter (k 4 vs 3), slots 0-2 equal.
# Row 2: theirs has k=1. Row 3: identical, k=2.
PA = np.array([[5, 6, 7, -1], [1, 2, 3, 4], [9, 9, -1, -1], [4, 4, -1, -1]], np.int32)
PB = np.array([[5, 6, 8], [1, 2, 3], [9, -1, -1], [4, 4, -1]], np.int32)
KA, KB = np.array([3, 4, 2, 2]), np.array([3, 3, 1, 2])


def test_compare_blocks_by_hand():
    c = compare_blocks(PA, PB, KA, KB, np.array([10, -1, 7, 3]), np.array([10, 5, 8, 3]))
    assert c.eq.tolist() == [[True, True, False, False], [True, True, True, False],
                             [True, False, False, False], [True, True, False, False]]
    assert c.prefix.tolist() == [2, 3, 1, 2]
    assert c.exact.tolist() == [False, False, False, True]
    assert c.anchor_eq.tolist() == [True, True, False, True]  # row 1: ours unknown
    assert c.divergent.tolist() == [True, True, True, False]
    assert c.first_slot.tolist() == [2, 3, 1, -1]


def test_identical_blocks_twin():
    c = compare_blocks(PA, PA, KA, KA, np.array([1, 2, 3, 4]), np.array([1, 2, 3, 4]))
    assert c.exact.all() and not c.divergent.any()
    assert c.first_slot.tolist() == [-1, -1, -1, -1]
    assert c.prefix.tolist() == [3, 4, 2, 2]


def test_shift_equal_both_directions():
    pa, pb = np.array([[1, 2, 3]], np.int32), np.array([[0, 1, 2]], np.int32)
    k3 = np.array([3])
    assert shift_equal(pa, pb, k3, k3, 1).tolist() == [[True, True]]  # ours[j] == theirs[j+1]
    assert shift_equal(pa, pb, k3, k3, -1).tolist() == [[False, False]]
    assert shift_equal(pb, pa, k3, k3, -1).tolist() == [[True, True]]  # the mirror
    # theirs has only 2 slots: ours[1] == theirs[2] needs theirs' slot 2
    assert shift_equal(pa, pb, k3, np.array([2]), 1).tolist() == [[True, False]]


def test_comparability_and_first_difference():
    assert first_difference(np.array([1, 2, 3]), np.array([1, 2, 4])) == 2
    assert first_difference(np.array([1, 2]), np.array([1, 2, 3])) == NO_DIVERGENCE
    limit = comparable_limit(np.array([NO_DIVERGENCE, 5, NO_DIVERGENCE]),
                             np.array([10, 8, 6]), np.array([True, True, False]))
    # Known content: stop before the last common token (the final, never-verified proposal).
    assert limit.tolist() == [9, 5, NO_DIVERGENCE]
    got = comparable(np.array([8, 9, 4, 5, 100, 3]), np.array([0, 0, 1, 1, 2, -1]), limit)
    assert got.tolist() == [True, False, True, False, True, False]
