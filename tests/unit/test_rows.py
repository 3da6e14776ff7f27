"""tracer/rows.py: the id matrices read in row chunks give the loaded column's values."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from spectrace.tracer import rows
from spectrace.tracer.parallel import bounds
from spectrace.tracer.store import open_trace

TRACE = Path(__file__).resolve().parents[2] / "traces" / "reference.h5"


def test_row_chunks_cover_the_column_in_order(monkeypatch):
    whole = open_trace(TRACE).blocks.proposed  # 139 blocks x 4 (traces/README.md)
    t = open_trace(TRACE)
    got = [(c.start, c.stop, cols["proposed"]) for c, cols in rows.row_chunks(t, ["proposed"], 50)]
    assert [(a, b) for a, b, _ in got] == [(0, 50), (50, 100), (100, 139)]
    assert np.array_equal(np.concatenate([x for _, _, x in got]), whole)
    assert t.blocks.loaded("proposed") is None  # streamed, never loaded


def test_gather_takes_any_rows_in_the_order_asked(monkeypatch):
    whole = open_trace(TRACE).blocks.proposed
    idx = np.array([138, 0, 7, 7, 64, 3, 100, 0])
    many = np.arange(139)[::-1].repeat(2)  # more rows than rows.FEW: the pass path
    monkeypatch.setattr(rows, "ROWS", 16)  # the pass crosses chunk boundaries
    for want in (idx, many, idx[:0]):
        t = open_trace(TRACE)
        got = rows.gather(t, "proposed", want)
        assert got.shape == (len(want), 4) and got.dtype == whole.dtype
        assert np.array_equal(got, whole[want])
        assert t.blocks.loaded("proposed") is None
    assert rows.width(open_trace(TRACE), "proposed") == 4
    assert np.array_equal(rows.row(open_trace(TRACE), "proposed", 64), whole[64])


def test_row_chunks_read_ahead_give_the_same_chunks():
    whole = open_trace(TRACE).blocks.proposed
    t = open_trace(TRACE)
    got = [
        (c.start, c.stop, cols["proposed"])
        for c, cols in rows.row_chunks(t, ["proposed"], 50, ahead=True)
    ]
    assert [(a, b) for a, b, _ in got] == [(0, 50), (50, 100), (100, 139)]
    assert np.array_equal(np.concatenate([x for _, _, x in got]), whole)
    assert t.blocks.loaded("proposed") is None


def test_gather_takes_rows_of_a_one_d_column(monkeypatch):
    whole = open_trace(TRACE).blocks.position  # 139 blocks (traces/README.md)
    many = np.arange(139)[::-1].repeat(2)  # more rows than rows.FEW: the pass path
    monkeypatch.setattr(rows, "ROWS", 16)
    for want in (np.array([138, 0, 7, 7]), many):
        t = open_trace(TRACE)
        got = rows.gather(t, "position", want)
        assert got.shape == (len(want),) and got.dtype == whole.dtype
        assert np.array_equal(got, whole[want])
        assert t.blocks.loaded("position") is None


def test_chunk_bounds_are_needles_of_the_sorted_rows_dtype():
    # A list of bounds is int64: the search would cast the whole int32 array at each chunk.
    rows = np.array([0, 3, 3, 7, 9], np.int32)
    b = bounds(slice(3, 8), rows)
    assert b.dtype == np.int32 and b.tolist() == [3, 8]
    assert np.searchsorted(rows, b).tolist() == [1, 4]  # rows 3, 3 and 7 lie in [3, 8)
