"""The comparison kernel, on blocks whose expected comparisons are worked out by hand."""

import numpy as np

from spectrace.tracer.compare import (
    NO_DIVERGENCE,
    anchors_known,
    comparable,
    comparable_limit,
    compare_blocks,
    compare_paired,
    count_anchors_known,
    first_difference,
    first_slot_from_prefix,
    present_counts,
    shift_equal,
    shift_present,
    slot_equal,
    slots_present,
)

# Row 0: slot 2 differs. Row 1: theirs is shorter (k 4 vs 3), slots 0-2 equal.
# Row 2: theirs has k=1. Row 3: identical, k=2.
PA = np.array([[5, 6, 7, -1], [1, 2, 3, 4], [9, 9, -1, -1], [4, 4, -1, -1]], np.int32)
PB = np.array([[5, 6, 8], [1, 2, 3], [9, -1, -1], [4, 4, -1]], np.int32)
KA, KB = np.array([3, 4, 2, 2]), np.array([3, 3, 1, 2])


def test_compare_blocks_by_hand():
    c = compare_blocks(PA, PB, KA, KB, np.array([10, -1, 7, 3]), np.array([10, 5, 8, 3]))
    assert c.eq.tolist() == [
        [True, True, False, False],
        [True, True, True, False],
        [True, False, False, False],
        [True, True, False, False],
    ]
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
    limit = comparable_limit(
        np.array([NO_DIVERGENCE, 5, NO_DIVERGENCE]),
        np.array([10, 8, 6]),
        np.array([True, True, False]),
    )
    # Known content: stop before the last common token (the final, never-verified proposal).
    assert limit.tolist() == [9, 5, NO_DIVERGENCE]
    got = comparable(np.array([8, 9, 4, 5, 100, 3]), np.array([0, 0, 1, 1, 2, -1]), limit)
    assert got.tolist() == [True, False, True, False, True, False]


EQ = [
    [True, True, False, False],
    [True, True, True, False],
    [True, False, False, False],
    [True, True, False, False],
]


def test_presence_by_hand():
    # min(KA, KB) = [3, 3, 1, 2]: slot j is on both sides where it is below that.
    assert slots_present(KA, KB, 4).tolist() == [[True, True, True, False]] * 2 + [
        [True, False, False, False],
        [True, True, False, False],
    ]
    assert present_counts(KA, KB, 4).tolist() == [4, 3, 2, 0]
    assert anchors_known(np.array([10, -1, 7, 3]), np.array([10, 5, 8, 3])).tolist() == [
        True,
        False,
        True,
        True,
    ]
    # s = +1: ours' slot j (KA > j) and theirs' slot j + 1 (KB > j + 1).
    assert shift_present(KA, KB, 4, 1).tolist() == [
        [True, True, False],
        [True, True, False],
        [False, False, False],
        [True, False, False],
    ]
    # s = -1: theirs' slot j (KB > j) and ours' slot j + 1 (KA > j + 1).
    assert shift_present(KA, KB, 4, -1).tolist() == [
        [True, True, False],
        [True, True, True],
        [True, False, False],
        [True, False, False],
    ]


def test_slot_equal_fills_a_row_slice():
    big = np.zeros((6, 4), bool, order="F")
    slot_equal(PA, PB, KA, KB, out=big[1:5])
    assert big[1:5].tolist() == EQ
    assert not big[0].any() and not big[5].any()


def test_first_slot_from_prefix():
    # Prefixes [2, 3, 1, 2]; the longer proposals [3, 4, 2, 2]: row 3 has no differing slot.
    assert first_slot_from_prefix(np.array([2, 3, 1, 2], np.int16), KA, KB).tolist() == [
        2,
        3,
        1,
        -1,
    ]


def test_compare_paired_gathers_rows_and_counts_slots():
    # Ours stored in another order: prop_a[ia] is PA. Theirs has an extra, unpaired row.
    store_a = np.array([1, 3, 0, 2])
    prop_a, k_a = PA[store_a], KA[store_a]
    ia = np.array([2, 0, 3, 1])
    prop_b = np.vstack([PB, [[7, 7, 7]]]).astype(np.int32)
    k_b = np.append(KB, 3)
    anchor_a = np.array([10, -1, 7, 3])[store_a]
    anchor_b = np.array([10, 5, 8, 3, 0])
    got = compare_paired(prop_a, prop_b, ia, np.arange(4), k_a, k_b, anchor_a, anchor_b)
    n = got.counts
    assert got.ka.tolist() == [3, 4, 2, 2] and got.kb.tolist() == [3, 3, 1, 2]
    _assert_hand_values(got)
    # ours[j] == theirs[j+1] among blocks with slots j, j+1 on both sides: row 3 (4 == 4).
    assert n.shift_plus.tolist() == [1, 0, 0]
    # ours[j+1] == theirs[j]: rows 2 (9 == 9) and 3 (4 == 4) hold at j = 0, but row 2's
    # theirs has k = 1 (its slot 1 is not on both sides): only row 3 counts.
    assert shift_equal(PA, PB, KA, KB, -1)[:, 0].tolist() == [False, False, True, True]
    assert n.shift_minus.tolist() == [1, 0, 0]


def _assert_hand_values(got) -> None:
    """The per-block values and per-slot counts derived by hand for PA/PB (KA/KB) with
    anchors equal except in row 2."""
    c, n = got.blocks, got.counts
    assert c.eq.tolist() == EQ and c.eq.flags.f_contiguous
    assert c.prefix.tolist() == [2, 3, 1, 2]
    assert c.exact.tolist() == [False, False, False, True]
    assert c.anchor_eq.tolist() == [True, True, False, True]
    assert c.divergent.tolist() == [True, True, True, False]
    assert c.first_slot.tolist() == [2, 3, 1, -1]
    assert n.equal.tolist() == [4, 3, 1, 0] and n.present.tolist() == [4, 3, 2, 0]


def test_compare_paired_of_nothing():
    empty = np.zeros((0, 4), np.int32)
    none = np.zeros(0, np.int64)
    got = compare_paired(empty, empty, none, none, none, none, none, none)
    assert got.blocks.eq.shape == (0, 4) and got.counts.present.tolist() == [0, 0, 0, 0]
    assert got.counts.shift_plus.tolist() == [0, 0, 0]


def test_count_anchors_known_counts_rows_with_both_anchors():
    anchor_a, anchor_b = np.array([-1, 4, 5, 6]), np.array([3, -1, 9, 2])
    # Pairs (a row, b row): (0, 0) ours unknown; (1, 3) known; (2, 1) theirs unknown;
    # (3, 2) known; (1, 0) known.
    ia, ib = np.array([0, 1, 2, 3, 1]), np.array([0, 3, 1, 2, 0])
    assert count_anchors_known(anchor_a, anchor_b, ia, ib) == 3
