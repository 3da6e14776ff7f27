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


def test_a_finished_request_rewrites_only_its_output_and_finish_reason(tmp_path, monkeypatch):
    """A new request's flush writes all four /requests columns; its finish then writes the
    output ids and finish reason only (the prompt and id stay as first written)."""
    import spectrace.tracer.store.writer as writer
    from spectrace.tracer.store import TraceWriter, open_trace, vlen

    writes = []
    orig = vlen.write_request_rows
    monkeypatch.setattr(writer, "write_request_rows",
                        lambda g, reqs, lo, hi, old, f: writes.append((lo, hi, tuple(f)))
                        or orig(g, reqs, lo, hi, old, f))  # fmt: skip
    w = TraceWriter(tmp_path / "t.h5", {"k": 2}, flush_interval=0)
    for r in ("a", "b", "c"):
        w.request(r, prompt_ids=[1, 2], finish_reason="")
    w.flush()
    w.request("b", output_ids=[7, 8, 9], finish_reason="length")
    w.request("c", output_ids=[5], finish_reason="stop")
    w.flush()
    w.request("a", prompt_ids=[3])  # a new prompt: the whole row again
    w.flush()
    w.close()
    everything = ("req_id", "prompt_ids", "output_ids", "finish_reason")
    assert writes == [(0, 3, everything), (1, 3, ("output_ids", "finish_reason")),
                      (0, 1, everything)]  # fmt: skip
    q = open_trace(tmp_path / "t.h5").requests
    assert list(q.req_id) == ["a", "b", "c"]
    assert [list(p) for p in q.prompt_ids] == [[3], [1, 2], [1, 2]]
    assert [list(o) for o in q.output_ids] == [[], [7, 8, 9], [5]]
    assert list(q.finish_reason) == ["", "length", "stop"]


def test_finished_runs_bridge_only_rows_still_empty():
    from spectrace.tracer.store.vlen import finished_runs

    reqs = [["a", [1], [], ""], ["b", [1], [], ""], ["c", [1], [4], "stop"],
            ["d", [1], [], ""], ["e", [1], [], ""]]  # fmt: skip
    # rows 0 and 4 finish: row 1 and 3 are still empty, row 2 was written with its output
    assert finished_runs(reqs, {0, 4}) == [(0, 1), (4, 5)]
    assert finished_runs(reqs, {0, 1, 3, 4}) == [(0, 2), (3, 5)]
    reqs[2] = ["c", [1], [], ""]  # the clean twin: row 2 unfinished too, one run
    assert finished_runs(reqs, {0, 4}) == [(0, 5)]
    assert finished_runs(reqs, set()) == []
