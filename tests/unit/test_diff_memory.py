"""What the diff drops or builds in place to bound its memory gives the same values: the
paired rows after the comparison, and the request table's ids shared with the flat index."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np

from spectrace.tracer.align import align
from spectrace.tracer.diff import diff_traces, open_pair
from spectrace.tracer.findings.data import TraceData, paired_row
from spectrace.tracer.findings.sweep import sweep
from spectrace.tracer.index import sequence_index
from spectrace.tracer.store import open_trace

TRACES = Path(__file__).resolve().parents[2] / "traces"


def test_paired_rows_kept_or_read_from_the_store_have_the_same_values():
    whole = open_trace(TRACES / "reference.h5").blocks.proposed  # 139 x 4 (traces/README.md)
    t = open_trace(TRACES / "reference.h5")
    rows = np.array([5, 0, 138, 5, 71])
    kept = sweep(t, rows).paired.copy()
    td = TraceData.build(t, "ours", rows)
    assert paired_row(td, rows, 2).tolist() == whole[138].tolist()  # from the kept rows
    assert np.array_equal(kept, whole[rows])
    bare = open_trace(TRACES / "reference.h5")
    assert sweep(bare).paired is None  # no rows asked for: none kept
    assert paired_row(TraceData.build(bare, "ours"), rows, 3).tolist() == whole[5].tolist()
    assert bare.blocks.loaded("proposed") is None  # one row from the store, never the whole


def _mismatching_copy(tmp_path: Path) -> Path:
    """reference.h5 with slot 1 of every third proposal changed (a draft mismatch)."""
    out = tmp_path / "ours.h5"
    shutil.copyfile(TRACES / "reference.h5", out)
    with h5py.File(out, "r+") as f:
        p = f["blocks/proposed"][...]
        p[::3, 1] += 1
        f["blocks/proposed"][...] = p
    return out


def test_diff_drops_the_paired_rows_and_keeps_its_examples(tmp_path):
    a, b = open_pair(_mismatching_copy(tmp_path), TRACES / "reference.h5")
    al = align(a, b)
    r = diff_traces(al, examples=None)
    assert sweep(a).paired is None and sweep(b).paired is None
    assert len(r.examples) == 47  # ceil(139 / 3) blocks changed, every block paired
    pa, pb = a.blocks.proposed, b.blocks.proposed
    assert len(r.examples) == int(r.bad.sum())
    for x, ex in zip(np.flatnonzero(r.bad), r.examples):
        i, j = int(al.ia[x]), int(al.ib[x])
        assert ex.ours == pa[i, : a.blocks.k[i]].tolist()
        assert ex.theirs == pb[j, : b.blocks.k[j]].tolist()


def test_flat_index_holds_the_request_ids_once_read_only():
    t = open_trace(TRACES / "reference.h5")
    ref = open_trace(TRACES / "reference.h5").requests
    flat, start, length = sequence_index(t)
    r = t.requests
    assert not flat.flags.writeable
    want = [np.concatenate([p, o]) for p, o in zip(ref.prompt_ids, ref.output_ids) if len(o)]
    assert np.array_equal(flat, np.concatenate(want))
    for i in range(len(r)):
        assert np.array_equal(r.prompt_ids[i], ref.prompt_ids[i])
        assert np.array_equal(r.output_ids[i], ref.output_ids[i])
        if length[i]:
            assert r.prompt_ids[i].base is flat and not r.output_ids[i].flags.writeable
            assert length[i] == len(ref.prompt_ids[i]) + len(ref.output_ids[i])
            s = int(start[i])
            assert np.array_equal(flat[s : s + length[i]], ref.full_sequence(i))


def test_a_trace_diffed_twice_streams_its_memoised_sweep_with_the_same_result(tmp_path):
    # One golden against several runs is opened once: its second diff finds its sweep
    # memoised and only streams its proposals to the comparison.
    run = _mismatching_copy(tmp_path)
    golden = open_trace(TRACES / "reference.h5")
    first = diff_traces(align(*open_pair(golden, run)), examples=None)
    assert "sweep" in golden.cache
    again = diff_traces(align(*open_pair(golden, run)), examples=None)
    want = diff_traces(align(*open_pair(TRACES / "reference.h5", run)), examples=None)
    assert first.to_json() == again.to_json() == want.to_json()
    assert first.agreement.exact_matches == 139 - 47  # every third block changed
