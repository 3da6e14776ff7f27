"""tracer/store/vlen.py: runs of rows written to a vlen column read back as written."""

from __future__ import annotations

import h5py
import numpy as np

from spectrace.tracer.store.vlen import row_runs, write_ragged


def test_row_runs():
    assert row_runs([]) == []
    assert row_runs([3]) == [(3, 4)]
    assert row_runs([0, 1, 2, 5, 6, 9]) == [(0, 3), (5, 7), (9, 10)]


def test_equal_length_rows_and_gaps_read_back(tmp_path):
    with h5py.File(tmp_path / "t.h5", "w") as f:
        ds = f.create_dataset("ids", (6,), dtype=h5py.vlen_dtype(np.int32))
        # Rows 0-1 of equal length (a plain slice write would stack them into a matrix), row
        # 2 left untouched (reads empty), rows 3-5 one run with an empty row inside.
        write_ragged(ds, {0: [1, 2], 1: [3, 4], 3: [5], 4: [], 5: [7, 8, 9]})
        got = [ds[i].tolist() for i in range(6)]
    assert got == [[1, 2], [3, 4], [], [5], [], [7, 8, 9]]
