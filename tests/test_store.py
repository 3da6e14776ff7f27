"""Trace store: round trip, partial files, SIGKILL recovery, refusal of foreign files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest

from spectrace.tracer import schema
from spectrace.tracer.errors import InputError, TraceFormatError
from spectrace.tracer.store import TraceWarning, TraceWriter, open_trace

ROOT = Path(__file__).resolve().parent.parent
SPECTRACE = os.path.join(os.path.dirname(sys.executable), "spectrace")


def test_round_trip(tmp_path):
    path = tmp_path / "t.h5"
    with TraceWriter(path, {"k": 3, "engine": "e"}, flush_interval=0) as w:
        w.request("r0", prompt_ids=[5, 6])
        w.add_block("r0", 0, 1, 6, [7, 8, 9], verified=[7, 8, 9], accepted=1, emitted=[7, 3])
        w.add_block("r1", 1, 4, 2, [1, 2, 3, 4, 5])  # wider than k: the matrix grows
        w.add_phase(1, "backbone", 2.5, level=1)
        w.request("r0", output_ids=[7, 3], finish_reason="length")
    assert not (tmp_path / "t.h5.partial").exists()
    t = open_trace(path)
    assert t.status == "complete" and t.warnings == []
    assert t.meta == {"k": 3, "engine": "e"}
    assert t.requests.req_id == ["r0", "r1"]
    assert t.requests.full_sequence(0).tolist() == [5, 6, 7, 3]
    assert t.requests.finish_reason == ["length", ""]
    b = t.blocks
    assert len(b) == 2
    assert b.proposed.tolist() == [[7, 8, 9, -1, -1], [1, 2, 3, 4, 5]]
    assert b.verified[:, :3].tolist() == [[7, 8, 9], [-1, -1, -1]]
    assert b.num_verified.tolist() == [3, -1]
    assert b.accepted.tolist() == [1, -1]
    assert b.emitted[0, :3].tolist() == [7, 3, -1]
    assert b.k.tolist() == [3, 5] and b.request.tolist() == [0, 1]
    ph = t.phases()
    assert ph["name"].tolist() == ["backbone"] and ph["ms"].tolist() == [2.5]


def test_exception_leaves_partial(tmp_path):
    path = tmp_path / "t.h5"
    with pytest.raises(RuntimeError):
        with TraceWriter(path, {"k": 2}, flush_interval=0) as w:
            w.add_block("r", 0, 3, 1, [1, 2], accepted=0)
            raise RuntimeError("engine crashed")
    assert (tmp_path / "t.h5.partial").exists() and not path.exists()
    with pytest.warns(TraceWarning, match="not closed cleanly"):
        t = open_trace(path)  # NAME.h5 resolves to NAME.h5.partial
    assert len(t.blocks) == 1 and t.status == "recording"


def test_partial_renamed_between_check_and_open_opens_the_final_name(tmp_path, monkeypatch):
    """The writer closes (renames NAME.h5.partial to NAME.h5) after the reader saw the
    .partial but before it opened it: the reader opens NAME.h5, with no error."""
    from spectrace.tracer.store import h5file, reader

    partial = tmp_path / "t.h5.partial"
    with TraceWriter(tmp_path / "t.h5", {"k": 2}, flush_interval=0) as w:
        w.add_block("r", 0, 3, 1, [1, 2], accepted=0)
    (tmp_path / "t.h5").rename(partial)  # the closed file, under its recording name
    real_open, calls = h5file.open_h5, []

    def racing_open(path):
        calls.append(Path(path).name)
        if len(calls) == 1:
            partial.rename(tmp_path / "t.h5")  # the close lands here
        return real_open(path)

    monkeypatch.setattr(reader, "open_h5", racing_open)
    t = open_trace(partial)
    assert calls == ["t.h5.partial", "t.h5"]
    assert t.paths == [tmp_path / "t.h5"] and t.status == "complete" and t.warnings == []
    assert t.blocks.proposed.tolist() == [[1, 2]]


def test_several_files_are_one_trace(tmp_path):
    for r in range(2):
        with TraceWriter(tmp_path / f"run.dp{r}.h5", {"k": 2}, flush_interval=0) as w:
            w.request(f"q{r}", prompt_ids=[r], output_ids=[9])
            w.add_block(f"q{r}", 0, 0, r, [r, r + 1], accepted=0)
    t = open_trace(str(tmp_path / "run.dp*.h5"))
    assert t.requests.req_id == ["q0", "q1"]
    assert t.blocks.request.tolist() == [0, 1]  # re-based per file
    assert t.blocks.anchor.tolist() == [0, 1]


def test_refuses_foreign_and_future_files(tmp_path):
    text = tmp_path / "x.h5"
    text.write_text("hello")
    with pytest.raises(TraceFormatError, match=r"x\.h5: not a readable HDF5 file"):
        open_trace(text)
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["data"] = [1, 2]
    with pytest.raises(TraceFormatError, match=r"other\.h5: not a spectrace trace"):
        open_trace(other)
    future = tmp_path / "future.h5"
    TraceWriter(future, {}, flush_interval=0).close()
    with h5py.File(future, "a") as f:
        f.attrs["format_version"] = "2.0"
    with pytest.raises(TraceFormatError, match=r"version 2\.0 is not supported"):
        open_trace(future)
    with pytest.raises(InputError, match=r"missing\.h5: no such file"):
        open_trace(tmp_path / "missing.h5")


def test_cli_refusal_is_one_line(tmp_path):
    bad = tmp_path / "bad.h5"
    bad.write_text("not hdf5")
    r = subprocess.run([SPECTRACE, "info", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("spectrace: error: ")
    assert "bad.h5" in r.stderr


_SLOW_WRITER = """
import sys, time
from spectrace.tracer.store import TraceWriter
w = TraceWriter(sys.argv[1], {"k": 2}, flush_interval=0.2)
for i in range(100000):
    w.add_block("r", i, i, i % 7, [i, i + 1], accepted=i % 3)
    print(i, flush=True)
    time.sleep(0.01)
"""


_SLOW_BULK_WRITER = """
import sys, time
import numpy as np
from spectrace.tracer.store import TraceWriter
w = TraceWriter(sys.argv[1], {"k": 2}, flush_interval=0.2)
w.request("r")
for i in range(100000):
    w.add_blocks({"request": np.zeros(1, np.int32), "step": [i], "position": [i],
                  "anchor": [i % 7], "k": [2], "proposed": [[i, i + 1]], "accepted": [i % 3]})
    print(i, flush=True)
    time.sleep(0.01)
"""


@pytest.mark.parametrize("script", [_SLOW_WRITER, _SLOW_BULK_WRITER], ids=["row", "bulk"])
def test_sigkill_keeps_every_flushed_block(tmp_path, script):
    """A writer killed with SIGKILL leaves a .partial that opens with all flushed rows, rows
    added one by one or as columns (kept until the flush thread's next flush)."""
    path = tmp_path / "k.h5"
    p = subprocess.Popen(
        [sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE, text=True
    )
    written = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < 1.5:  # several flush intervals
        line = p.stdout.readline()
        written = int(line) + 1
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    with pytest.warns(TraceWarning):
        t = open_trace(path)
    n = len(t.blocks)
    # Rows recorded in the last flush interval may be lost, never more.
    assert 0 < n <= written and written - n < 60
    assert t.blocks.position.tolist() == list(range(n))
    assert t.blocks.anchor.tolist() == [i % 7 for i in range(n)]
    r = subprocess.run(
        [SPECTRACE, "info", "--format", "json", str(path) + ".partial"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["blocks"] == n
    assert "not closed cleanly" in r.stderr


def test_bulk_append_matches_row_append(tmp_path):
    rng = np.random.default_rng(0)
    prop = rng.integers(0, 100, (50, 4)).astype(np.int32)
    with TraceWriter(tmp_path / "a.h5", {"k": 4}, flush_interval=0) as w:
        w.request("r")
        w.add_blocks(
            {
                "request": np.zeros(50, np.int32),
                "position": np.arange(50),
                "anchor": np.arange(50),
                "k": np.full(50, 4),
                "proposed": prop,
                "accepted": np.ones(50),
            }
        )
    t = open_trace(tmp_path / "a.h5")
    assert (t.blocks.proposed == prop).all()
    assert t.blocks.num_verified.tolist() == [-1] * 50
    assert t.blocks.accepted.tolist() == [1] * 50


def _bulk(positions: list[int]) -> dict:
    n = len(positions)
    return {"request": np.zeros(n, np.int32), "position": positions, "k": np.full(n, 1),
            "proposed": np.array(positions).reshape(n, 1)}  # fmt: skip


def _on_disk(path: Path) -> tuple[int | None, list[int]]:
    """(the announced rows, the position column) as another process reads the file now."""
    with h5py.File(path, "r", locking=False) as f:
        return f["blocks"].attrs.get("flushed_rows"), f["blocks/position"][:].tolist()


def test_bulk_rows_wait_for_the_flush_thread_and_keep_their_order(tmp_path):
    """With the flush thread running (its interval an hour here), add_blocks keeps the rows
    (a copy: the caller's arrays may change) until the next flush, which appends them in
    call order; rows added one by one in between write what is kept first, then
    themselves and the new columns."""
    w = TraceWriter(tmp_path / "b.h5", {"k": 1}, flush_interval=3600)
    w.request("r")
    first = _bulk([0, 1])
    w.add_blocks(first)
    first["position"][:] = [7, 7]  # reused by the caller after the call
    w.add_blocks(_bulk([2]))
    assert w.rows_written == 0
    assert _on_disk(w.partial_path) == (None, [])
    w.flush()
    assert _on_disk(w.partial_path) == (3, [0, 1, 2])
    w.add_blocks(_bulk([3]))
    w.add_block("r", 0, 4, -1, [4])
    w.add_blocks(_bulk([5]))  # after a row-wise one: everything written at once, in order
    assert _on_disk(w.partial_path) == (6, [0, 1, 2, 3, 4, 5])
    w.add_blocks(_bulk([6]))
    w.close()
    assert open_trace(tmp_path / "b.h5").blocks.position.tolist() == list(range(7))


def test_bulk_rows_of_different_widths_kept_together_read_back_padded(tmp_path):
    """Kept rows of a 1-slot and a 3-slot call are appended in one go: the narrow row reads
    back -1 padded (margins NaN), as when each call was appended to a widened dataset."""
    w = TraceWriter(tmp_path / "w.h5", {"k": 3}, flush_interval=3600)
    w.request("r")
    w.add_blocks({"request": np.zeros(1, np.int32), "position": [0], "k": [1],
                  "proposed": [[5]], "draft_margin": [[0.5]]})  # fmt: skip
    w.add_blocks({"request": np.zeros(1, np.int32), "position": [2], "k": [3],
                  "proposed": [[6, 7, 8]], "draft_margin": [[1.0, 2.0, 3.0]]})  # fmt: skip
    w.close()
    b = open_trace(tmp_path / "w.h5").blocks
    assert b.proposed.tolist() == [[5, -1, -1], [6, 7, 8]]
    assert b.draft_margin[0, 0] == 0.5 and np.isnan(b.draft_margin[0, 1:]).all()
    assert b.draft_margin[1].tolist() == [1.0, 2.0, 3.0]
    assert b.verified.tolist() == [[-1, -1, -1], [-1, -1, -1]]


def test_bulk_rows_without_a_flush_thread_are_written_at_once(tmp_path):
    """The twin: flush_interval=0 (no thread to flush later) appends and syncs per call."""
    w = TraceWriter(tmp_path / "b.h5", {"k": 1}, flush_interval=0)
    w.request("r")
    w.add_blocks(_bulk([0, 1]))
    assert w.rows_written == 2
    assert _on_disk(w.partial_path) == (2, [0, 1])
    w.close()


def test_schema_is_the_one_definition():
    text = schema.describe()
    for table, cols in schema.TABLES.items():
        assert f"/{table}" in text
        for c in cols:
            assert c.name in text


def test_torn_last_chunk_is_cut_off(tmp_path):
    """A kill during a flush can tear the last compressed chunk: the reader steps back."""
    path = tmp_path / "torn.h5"
    w = TraceWriter(path, {"k": 2}, flush_interval=0, flush_rows=10**9)
    w.request("r")
    n = 20000  # two 16384-row chunks in the 1-D columns
    w.add_blocks(
        {
            "request": np.zeros(n, np.int32),
            "position": np.arange(n),
            "anchor": np.arange(n) % 97,
            "k": np.full(n, 2),
            "proposed": np.arange(2 * n).reshape(n, 2) % 89,
        }
    )
    w.close(complete=False)
    partial = tmp_path / "torn.h5.partial"
    with h5py.File(partial, "r") as f:
        info = f["blocks/position"].id.get_chunk_info(1)  # the second (last) chunk
    with open(partial, "r+b") as fh:  # overwrite the compressed bytes with garbage
        fh.seek(info.byte_offset)
        fh.write(b"\xff" * info.size)
    with pytest.warns(TraceWarning, match="recovered 16384 flushed blocks"):
        t = open_trace(partial)
    assert len(t.blocks) == 16384
    assert t.blocks.position.tolist() == list(range(16384))


def test_known_requests_are_not_rewritten_per_block(tmp_path):
    w = TraceWriter(tmp_path / "r.h5", {"k": 1}, flush_interval=0)
    w.request("r", prompt_ids=[1, 2])
    w.flush()
    for i in range(50):
        w.add_block("r", i, i, 0, [1])
    assert w._dirty_requests == set()  # ragged rows are rewritten only when they change
    w.close()


def _verified_trace(path, rows, **kw):
    """Write blocks (proposed, verified-or-None) one by one; returns the path."""
    with TraceWriter(path, {"k": 3}, flush_interval=0, **kw) as w:
        for i, (prop, ver) in enumerate(rows):
            w.add_block("r", i, i, 0, prop, verified=ver, accepted=0)
    return path


def test_verified_same_lets_the_reader_skip_verified(tmp_path):
    # All rows equal, with a narrower block padded by -1 on both sides: one read, no copy.
    path = _verified_trace(tmp_path / "same.h5", [([1, 2, 3], [1, 2, 3]), ([4, 5], [4, 5])])
    with h5py.File(path, "r") as f:
        assert f["blocks/verified_same"][:].tolist() == [1, 1]
        assert f.attrs["format_version"] == "1.2"
    t = open_trace(path)
    assert t.blocks.verified is t.blocks.proposed
    assert t.blocks.verified.tolist() == [[1, 2, 3], [4, 5, -1]]


def test_patch_blocks_writes_flushed_rows_before_close(tmp_path):
    w = TraceWriter(tmp_path / "p.h5", {}, flush_interval=0, flush_rows=1)
    for i in range(3):
        w.add_block("r", i, i, -1, [1, 2])
    assert w.rows_written == 3  # all flushed
    # Row 1 twice: the last patch wins; row 7 is not there yet.
    assert w.patch_blocks("anchor", [2, 1, 1, 7], [30, 10, 11, 70]) == 2
    with pytest.raises(InputError, match="verified_same: computed by the writer"):
        w.patch_blocks("verified_same", [0], [0])  # derived: only the writer sets it
    with pytest.raises(InputError, match="proposed: not a 1-D block column"):
        w.patch_blocks("proposed", [0], [0])
    path = w.close()
    assert open_trace(path).blocks.anchor.tolist() == [-1, 11, 30]
    with pytest.raises(InputError, match="writer closed"):
        w.patch_blocks("anchor", [0], [5])


def test_verified_differs_in_one_row_reads_the_column(tmp_path):
    # Row 1 verified other ids, row 2 was never verified (all -1): both differ.
    rows = [([1, 2, 3], [1, 2, 3]), ([4, 5, 6], [4, 9, 6]), ([7, 8, 9], None)]
    for comp in ("gzip", "lzf", None):
        path = _verified_trace(tmp_path / f"d-{comp}.h5", rows, compression=comp)
        with h5py.File(path, "r") as f:
            assert f["blocks/verified_same"][:].tolist() == [1, 0, 0]
            assert f["blocks/proposed"].compression == comp
        t = open_trace(path)
        assert t.blocks.verified is not t.blocks.proposed
        assert t.blocks.verified.tolist() == [[1, 2, 3], [4, 9, 6], [-1, -1, -1]]


def test_verified_same_across_flushes_of_growing_width(tmp_path):
    # The matrices widen between flushes: earlier rows compare padded, as they read back.
    with TraceWriter(tmp_path / "w.h5", {"k": 2}, flush_interval=0) as w:
        w.add_block("r", 0, 0, 0, [1, 2], verified=[1, 2], accepted=0)
        w.flush()
        w.add_block("r", 1, 1, 0, [3, 4, 5, 6], verified=[3, 4, 5, 6], accepted=0)
        w.flush()
        w.add_block("r", 2, 2, 0, [7], verified=[7, 8], accepted=0)
    t = open_trace(tmp_path / "w.h5")
    assert t.blocks.verified_same.tolist() == [1, 1, 0]
    assert t.blocks.verified.tolist() == [[1, 2, -1, -1], [3, 4, 5, 6], [7, 8, -1, -1]]


def test_files_without_verified_same_still_read(tmp_path):
    # A format 1.0 file (no verified_same column) reads its verified column as before.
    path = _verified_trace(tmp_path / "old.h5", [([1, 2, 3], [1, 2, 3])])
    with h5py.File(path, "r+") as f:
        del f["blocks/verified_same"]
        f.attrs["format_version"] = "1.0"
    t = open_trace(path)
    assert t.blocks.verified is not t.blocks.proposed
    assert t.blocks.verified.tolist() == [[1, 2, 3]]
    assert t.blocks.verified_same.tolist() == [0]  # absent optional column: its fill value


def _big_trace(path, n=40000):
    with TraceWriter(path, {"k": 3}, flush_interval=0) as w:
        w.request("r")
        w.add_blocks(
            {
                "request": np.zeros(n, np.int32),
                "position": np.arange(n),
                "anchor": np.arange(n) % 101,
                "k": np.full(n, 3),
                "proposed": (np.arange(3 * n).reshape(n, 3) % 97).astype(np.int32),
                "accepted": np.arange(n) % 4,
            }
        )
    return path


def test_prefetch_reads_each_column_once_and_agrees(tmp_path):
    from spectrace.tracer.store import prefetch

    path = _big_trace(tmp_path / "p.h5")
    ref = open_trace(path).blocks.columns()
    t = open_trace(path)
    calls = []
    orig = t._read_block_column
    t._read_block_column = lambda c: calls.append(c.name) or orig(c)
    names = ["position", "anchor", "proposed", "accepted", "verified"]
    th = prefetch([t.blocks], names)
    got = {n: getattr(t.blocks, n) for n in reversed(names)}  # races the prefetch thread
    th.join()
    for n in names:
        assert np.array_equal(got[n], ref[n]), n
    assert sorted(calls) == sorted(set(calls))  # no column read twice
    # No verified ids were recorded (all -1): verified_same is 0, so verified was read.
    assert "verified" in calls and not t.blocks.verified_same.any()


def test_prefetch_failure_raises_on_the_reading_thread(tmp_path):
    from spectrace.tracer.store import prefetch

    path = _big_trace(tmp_path / "d.h5")
    with h5py.File(path, "r") as f:
        info = f["blocks/anchor"].id.get_chunk_info(0)
    with open(path, "r+b") as fh:  # a damaged chunk in a file closed cleanly
        fh.seek(info.byte_offset)
        fh.write(b"\xff" * info.size)
    t = open_trace(path)
    prefetch([t.blocks], ["anchor", "position"]).join()
    assert t.blocks.position.tolist()[:3] == [0, 1, 2]
    with pytest.raises(TraceFormatError, match=r"d\.h5: damaged column blocks/anchor"):
        _ = t.blocks.anchor


def test_unreadable_files_say_what_they_are(tmp_path):
    # A copy cut short and an engine log given where a trace belongs: one line each.
    ref = ROOT / "traces" / "reference.h5"
    cut = tmp_path / "cut.h5"
    cut.write_bytes(ref.read_bytes()[:100000])
    with pytest.raises(
        TraceFormatError,
        match=rf"cut\.h5: truncated HDF5 file \(100000 of "
        rf"{ref.stat().st_size} bytes",
    ):
        open_trace(cut)
    with pytest.raises(
        TraceFormatError,
        match="a VT_SPEC_TRACE log, not a trace file: convert it with `spectrace import vt",
    ):
        open_trace(ROOT / "traces" / "reference.vt.log")


def test_files_of_two_runs_are_an_input_error(tmp_path):
    for name, rank in (("a.dp0.h5", 0), ("b.dp0.h5", 0), ("c.dp1.h5", 1)):
        with TraceWriter(tmp_path / name, {"k": 2, "dp_rank": rank}, flush_interval=0) as w:
            w.add_block("r", 0, 0, 1, [1, 2], accepted=0)
    with pytest.raises(InputError, match=r"data-parallel ranks \[0, 0\]: a rank appears"):
        open_trace([tmp_path / "a.dp0.h5", tmp_path / "b.dp0.h5"])
    with TraceWriter(tmp_path / "d.dp1.h5", {"k": 3, "dp_rank": 1}, flush_interval=0) as w:
        w.add_block("r", 0, 0, 1, [1, 2, 3], accepted=0)
    with pytest.raises(InputError, match=r"engine, engine_version, method, k, .*one run"):
        open_trace([tmp_path / "a.dp0.h5", tmp_path / "d.dp1.h5"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ranks 0 and 1: one run, no warning
        assert len(open_trace([tmp_path / "a.dp0.h5", tmp_path / "c.dp1.h5"]).blocks) == 2


_PREFETCH_THEN_RAISE = """
import sys
from spectrace.tracer.store import open_trace, prefetch
traces = [open_trace(sys.argv[1]) for _ in range(4)]
prefetch([t.blocks for t in traces], ["proposed", "verified", "emitted", "anchor", "position"])
raise SystemExit("input error while the columns are read")
"""


def test_prefetch_threads_stop_at_exit(tmp_path):
    # An error on the main thread while a prefetch thread is inside an h5py read: the exit
    # handler stops and joins the thread before h5py's own handler runs (it once hung).
    path = _big_trace(tmp_path / "x.h5", n=200000)
    r = subprocess.run(
        [sys.executable, "-c", _PREFETCH_THEN_RAISE, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1, r.stderr
    assert r.stderr == "input error while the columns are read\n"


def test_trace_file_names(tmp_path):
    from spectrace.tracer.store import final_path, partial_path, resolve_paths

    assert final_path("runs/a.h5.partial") == Path("runs/a.h5")
    assert final_path("runs/a.h5") == Path("runs/a.h5")
    assert partial_path("runs/a.h5") == Path("runs/a.h5.partial")
    (tmp_path / "b.h5.partial").write_bytes(b"")  # a dead writer's file stands in for b.h5
    (tmp_path / "c.h5").write_bytes(b"")
    with pytest.warns(TraceWarning, match=r"b\.h5: no such file; reading .*b\.h5\.partial"):
        assert resolve_paths(tmp_path / "b.h5") == [tmp_path / "b.h5.partial"]
    assert resolve_paths([str(tmp_path / "c.h5"), tmp_path / "*.partial"]) == [
        tmp_path / "c.h5",
        tmp_path / "b.h5.partial",
    ]
    with pytest.raises(InputError, match=r"d\.h5: no such file"):
        resolve_paths(tmp_path / "d.h5")


def test_capture_end_reads_new_and_older_meta():
    from spectrace.tracer.schema import capture_end

    assert capture_end({"engine": "vllm"}) is None  # not captured (an import, the plugin)
    assert capture_end({"exit_status": 0, "interrupted": False}) == {
        "ended": "clean",
        "exit_status": 0,
        "signal": None,
    }
    assert capture_end({"exit_status": 137, "killed_by_signal": 9}) == {
        "ended": "engine-signal",
        "exit_status": 137,
        "signal": 9,
    }
    assert capture_end({"exit_status": 1, "interrupted": True})["ended"] == "interrupted"
    assert capture_end({"exit_status": 3})["ended"] == "engine-exit"
    live = {"capture": {"ended": None, "exit_status": None, "signal": None}}
    assert capture_end(live, "recording")["ended"] == "capture-killed"
    assert capture_end(live, "complete")["ended"] is None


def test_amend_meta_merges_into_a_closed_trace(tmp_path):
    from spectrace.tracer.store.writer import amend_meta

    with TraceWriter(tmp_path / "t.h5", {"k": 2, "engine": "x"}, flush_interval=0) as w:
        w.add_block("r", 0, 5, 1, [2, 3])
    amend_meta(tmp_path / "t.h5", capture={"ended": "clean"})
    t = open_trace(tmp_path / "t.h5")
    assert t.meta["capture"] == {"ended": "clean"} and t.meta["engine"] == "x"
    assert len(t.blocks) == 1
    (tmp_path / "bad.h5").write_bytes(b"not hdf5")
    with pytest.raises(InputError, match=r"bad\.h5: cannot update the trace metadata"):
        amend_meta(tmp_path / "bad.h5", capture={})


def _indexed_trace(path, cells):
    """A closed trace of 3 requests whose blocks/request cells are then set to ``cells``."""
    with TraceWriter(path, {"k": 2, "engine": "e"}, flush_interval=0) as w:
        for r in ("a", "b", "c"):
            w.request(r, prompt_ids=[1])
        for step in range(len(cells)):
            w.add_block("abc"[step % 3], step, 1, 2, [3, 4])
    with h5py.File(path, "r+", locking=False) as f:
        f["blocks"]["request"][:] = cells
    return path


def test_request_index_is_scanned_in_chunks(tmp_path):
    from spectrace.tracer.store.structure import scanned_request_index_problems

    cells = [0, 1, 2, 0, 1, 3, 2, 3, 0]  # rows 5 and 7 index a 4th request of 3
    with h5py.File(_indexed_trace(tmp_path / "t.h5", cells), "r", locking=False) as f:
        ds = f["blocks"]["request"]
        # Chunks of 2 rows: the problem is found in the third chunk and described whole.
        [p] = scanned_request_index_problems("t.h5", ds, 9, 3, chunk=2)
        assert (p.field, p.value, p.row, p.count) == ("blocks/request", 3, 5, 2)
        assert p.what == "request index out of range (the file has 3 requests)"
        # The first 5 rows index only known requests.
        assert scanned_request_index_problems("t.h5", ds, 5, 3, chunk=2) == []
    with pytest.raises(TraceFormatError, match="at row 5"):
        open_trace(tmp_path / "t.h5")


def test_twin_a_clean_request_index_opens(tmp_path):
    t = open_trace(_indexed_trace(tmp_path / "t.h5", [0, 1, 2, 0, 1, 2, 2, 1, 0]))
    assert t.blocks.request.tolist() == [0, 1, 2, 0, 1, 2, 2, 1, 0]
