"""The viewer's model (``spectrace.tui.model``) on the standard pair of small traces from an
independent simulator (``conftest.make_pair``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from spectrace.tracer import analysis
from spectrace.tracer.align import align
from spectrace.tracer.compare import NO_DIVERGENCE
from spectrace.tracer.diff import diff_traces
from spectrace.tracer.errors import InputError
from spectrace.tracer.store import TraceWriter, open_trace
from spectrace.tracer.tokens import Decoder, decoder_for
from spectrace.tui.model import (
    S_DIFF,
    S_EQUAL,
    S_PAST,
    S_SHIFT,
    S_SOLO,
    Analysis,
    QueryError,
    analyse,
    analyse_in_child,
    query_ids,
)


@pytest.fixture
def vm(pair, load_model):
    return load_model(*pair)


def test_pairs_rows_and_states(vm, sim):
    K = sim.K
    assert [(p.label, p.matched_by) for p in vm.pairs] == [
        ("r0/q0", "prompt"),
        ("r1/q1", "prompt"),
        ("r2/q2", "prompt"),
        ("solo", "ours only"),
    ]
    assert [p.divergence for p in vm.pairs] == [NO_DIVERGENCE, NO_DIVERGENCE, 12, NO_DIVERGENCE]
    rows = vm.rows(0)
    t = vm.a
    mine = set(t.blocks.position[t.blocks.request == 0].tolist())
    theirs = set(vm.b.blocks.position[vm.b.blocks.request == 0].tolist())
    assert rows.pos.tolist() == sorted(mine | theirs)
    only_a = [r for r in range(len(rows)) if rows.ib[r] < 0]
    assert {int(rows.pos[r]) for r in only_a} == mine - theirs
    win = vm.window(rows, 0)
    i = int(np.searchsorted(win.pos, 2))  # first anchor: identical
    assert win.paired[i] and not win.bad[i]
    assert win.a["state"][i].tolist() == [S_EQUAL] * K
    bad = np.flatnonzero(win.bad)
    assert len(bad) and all(win.pos[bad] >= 20)
    j = bad[0]
    assert win.first_diff[j] == 1 and win.a["state"][j, 1] in (S_DIFF, S_SHIFT)
    assert win.a["acc"][j, 0] and win.a["vdiff"][j].sum() == 0
    if only_a:
        r = only_a[0]
        w2 = vm.window(rows, r)
        assert w2.a["state"][r - w2.start, 0] == S_SOLO
    # Past the content divergence of r2 every slot is greyed.
    r2 = vm.rows(2)
    w3 = vm.window(r2, len(r2) - 1)
    assert (w3.a["state"][-1][w3.a["in_k"][-1]] == S_PAST).all()


def test_bad_rows_match_the_diff(vm, pair):
    an = analyse(vm.a, vm.b)
    total = sum(int(vm.bad_mask(vm.rows(p.index)).sum()) for p in vm.pairs)
    res = diff_traces(align(open_trace(pair[0]), open_trace(pair[1])))
    assert total == res.agreement.paired_blocks - res.agreement.exact_matches
    assert [d["bad"] for d in an.per_pair] == [int(vm.bad_mask(vm.rows(p)).sum()) for p in range(3)]
    first = an.per_pair[0]["first_bad"]
    assert vm.next_divergent(0, -1) == (0, vm.rows(0).row_of_position(first))
    # Filtered rows hold exactly the divergent ones, with their unfiltered row numbers.
    f = vm.rows(0, divergent_only=True)
    assert f.base.tolist() == np.flatnonzero(vm.bad_mask(vm.rows(0))).tolist()
    assert vm.next_divergent(1, -1) is None


def test_per_pair_counts_streamed_in_chunks_of_two_blocks(vm, pair, monkeypatch):
    al = align(open_trace(pair[0]), open_trace(pair[1]))
    bad = diff_traces(al).bad
    whole = analysis.differing_per_pair(al, bad)
    monkeypatch.setattr(analysis, "CHUNK", 2)  # a pair's blocks cross many chunk edges
    assert analysis.differing_per_pair(al, bad) == whole
    # The viewer's own rows (the kernel per window) count the same divergent blocks.
    masks = [vm.bad_mask(vm.rows(p)) for p in range(3)]
    assert [d["bad"] for d in whole] == [int(m.sum()) for m in masks]
    assert whole[0]["first_bad"] == int(vm.rows(0).pos[masks[0]][0])
    assert [(d["bad"], d["first_bad"]) for d in whole[1:]] == [(0, None), (0, None)]


def test_search_and_block_detail(vm, sim):
    hit = vm.search(0, -1, np.array([1001]))  # a wrong id of slot 1
    assert hit is not None
    rows = vm.rows(hit[0])
    ids = []
    for side, idx in (("ours", rows.ia[hit[1]]), ("theirs", rows.ib[hit[1]])):
        if idx >= 0:
            blk = vm.block(side, int(idx))
            ids += blk["proposed"] + blk["verified"] + blk["emitted"] + [blk["anchor"]]
    assert 1001 in ids
    # Nothing before the hit (in this pair) contains the id.
    earlier = vm.search(hit[0], hit[1], np.array([1001]), forward=False)
    assert earlier is None or earlier != hit
    b0 = vm.block("ours", 0)
    assert b0["position"] == 2 and b0["anchor"] == 3 and b0["k"] == sim.K
    assert vm.context("ours", 0, 5).tolist() == sim.TRUTH[:6]
    assert vm.phases_of("ours", b0["step"], b0["file"]) == [("draft", 1.5, 1)]


def test_single_trace_rows(single_trace, load_model):
    vm = load_model(single_trace)
    assert [p.matched_by for p in vm.pairs] == ["single"] * 4
    rows = vm.rows(0)
    assert (rows.ib == -1).all()
    win = vm.window(rows, 0)
    assert win.b is None and not win.bad.any()
    an = analyse(vm.a)
    assert an.diff is None and an.summary["requests"] == 4 and an.along["ours"]["rate"]


def test_read_rows_matches_columns_across_files(tmp_path, pair):
    a, _ = pair
    # A second file of the same run (same engine, method, k) whose matrices are wider
    # (5 proposals against the first file's 3).
    with open_trace(a) as t:
        meta = t.meta
    with TraceWriter(tmp_path / "x.h5", meta, flush_interval=0) as w:
        w.add_block("z", 0, 4, 7, [1, 2, 3, 4, 5], accepted=2)
    lazy = open_trace([a, tmp_path / "x.h5"], lazy_requests=True)
    full = open_trace([a, tmp_path / "x.h5"])
    n = len(full.blocks)
    for name in ("request", "position", "proposed", "emitted", "accepted"):
        col = getattr(full.blocks, name)
        assert np.array_equal(lazy.read_rows(name, 0, n), col), name
        assert np.array_equal(lazy.read_rows(name, n - 3, n + 5), col[n - 3 :]), name
    assert lazy.requests.req_id == full.requests.req_id
    for i in range(len(full.requests)):
        assert lazy.requests.output_ids[i].tolist() == full.requests.output_ids[i].tolist()


def test_analysis_child_process_round_trip(pair):
    a, b = pair
    ta, tb = open_trace(a), open_trace(b)
    inproc = analyse(ta, tb, decoder_for(None, ta.meta, tb.meta))  # the child's decoder
    child = analyse_in_child([str(a)], [str(b)])
    assert child.per_pair == inproc.per_pair
    assert [f.kind for f in child.findings] == [f.kind for f in inproc.findings]
    assert json.loads(json.dumps(child.to_json())) == child.to_json()
    assert Analysis.from_json(child.to_json()).per_pair == child.per_pair
    # The typed diff survives the trip (all but the per-block column, which stays behind).
    assert child.diff is not None and child.diff.bad is None
    assert child.diff.to_json() == inproc.diff.to_json()


@pytest.mark.parametrize("bad_spec", ["missing.h5"])
def test_view_model_inputs(tmp_path, bad_spec):
    with pytest.raises(InputError):
        open_trace(tmp_path / bad_spec, lazy_requests=True)


def test_search_query_ids(pair):
    dec = Decoder(pair[0].parent / "tokenizer.json")  # token i decodes to "t<i>", 0..1199
    assert query_ids("#42", None).tolist() == [42]
    assert query_ids(" 7 ", dec).tolist() == [7]
    # "T119" (case-folded): t119 and t1190..t1199.
    assert query_ids("T119", dec).tolist() == [119] + list(range(1190, 1200))
    with pytest.raises(QueryError, match="no tokenizer"):
        query_ids("t1", None)
    with pytest.raises(QueryError, match="no token contains 'zz'"):
        query_ids("zz", dec)
