"""The comparison fed by both sides' streams (compare_stream.PairedStreams) gives the
kernel's hand-derived values whatever the rows' order and the chunks' interleaving, and
holds only the rows whose partner has not gone by."""

from __future__ import annotations

import numpy as np
import pytest
from test_compare import KA, KB, PA, PB, _assert_hand_values

from spectrace.tracer.compare_stream import PairedStreams

# Ours' row r holds pair STORE_A[r], theirs' row r pair STORE_B[r]; row 4 of each side is
# unpaired (its id 7 matches nothing it could be compared with).
STORE_A, STORE_B = np.array([1, 3, 0, 2]), np.array([2, 0, 3, 1])
PROP_A = np.vstack([PA[STORE_A], [[7, 7, 7, 7]]]).astype(np.int32)
PROP_B = np.vstack([PB[STORE_B], [[7, 7, 7]]]).astype(np.int32)
ANCHOR_A = np.append(np.array([10, -1, 7, 3])[STORE_A], 0)
ANCHOR_B = np.append(np.array([10, 5, 8, 3])[STORE_B], 0)
IA, IB = np.argsort(STORE_A), np.argsort(STORE_B)  # pair x lies at row IA[x] / IB[x]


def _streams() -> PairedStreams:
    return PairedStreams(IA, IB, KA, KB, (ANCHOR_A, ANCHOR_B), (4, 3))


def _chunks(prop: np.ndarray, rows: int):
    return [
        (slice(lo, min(lo + rows, len(prop))), prop[lo : lo + rows]) for lo in range(0, 5, rows)
    ]


def _check(got) -> None:
    _assert_hand_values(got)
    assert got.ka.dtype == np.int16 and got.ka.tolist() == [3, 4, 2, 2]
    assert got.kb.tolist() == [3, 3, 1, 2]
    assert got.counts.shift_plus.tolist() == [1, 0, 0]
    assert got.counts.shift_minus.tolist() == [1, 0, 0]


def test_alternating_chunks_give_the_hand_values():
    s = _streams()
    for (ca, pa), (cb, pb) in zip(_chunks(PROP_A, 2), _chunks(PROP_B, 2)):
        s.take(0, ca, pa)
        s.take(1, cb, pb)
    assert s.held() == 0
    _check(s.result())


def test_one_side_first_holds_every_paired_row_then_gives_the_same_values():
    s = _streams()
    for c, p in _chunks(PROP_B, 2):  # theirs all first: each of its 4 paired rows waits
        s.side(1).take(c, p)
    assert s.held() == 4
    for c, p in _chunks(PROP_A, 3):
        s.side(0).take(c, p)
    assert s.held() == 0
    _check(s.result())


def test_partners_at_the_same_rows_are_never_held():
    # Clean twin of the above: both sides store the pairs in one order, so every chunk
    # completes its own pairs once the other side's chunk of those rows went by.
    p = np.arange(4)
    s = PairedStreams(p, p, KA, KB, (np.zeros(4, int), np.zeros(4, int)), (4, 3))
    for lo in (0, 2):
        s.take(0, slice(lo, lo + 2), PA[lo : lo + 2])
        assert s.held() == 2
        s.take(1, slice(lo, lo + 2), PB[lo : lo + 2])
        assert s.held() == 0
    assert s.result().blocks.prefix.tolist() == [2, 3, 1, 2]


def test_a_skipped_chunk_or_a_side_never_swept_is_refused():
    s = _streams()
    with pytest.raises(ValueError, match="rows from 2, expected 0"):
        s.take(0, slice(2, 4), PROP_A[2:4])
    s = _streams()
    for c, p in _chunks(PROP_A, 5):
        s.take(0, c, p)
    with pytest.raises(ValueError, match="without their partner"):
        s.result()
