"""The viewer's model (``tracer.view_model``) on small traces from an independent simulator,
and the shared test data of the TUI tests (:func:`make_pair`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from spectrace.tracer.align import NO_DIVERGENCE, align
from spectrace.tracer.diff import diff_traces
from spectrace.tracer.store import TraceWriter, open_trace
from spectrace.tracer.view_model import (S_DIFF, S_EQUAL, S_PAST, S_SHIFT, S_SOLO, Analysis,
                                         ViewModel, analyse, analyse_in_child)

K = 3
PROMPT = [1, 2, 3]
OUTPUT = list(range(10, 50))                       # 40 output tokens
TRUTH = PROMPT + OUTPUT
R2_OUTPUT = OUTPUT[:9] + [99] + OUTPUT[10:]         # content diverges at position 12


def simulate(writer, req_id, prompt, output, drafter, step0=0):
    """Greedy speculative decoding over a known output (records verified = proposed)."""
    seq = list(prompt) + list(output)
    writer.request(req_id, prompt_ids=prompt, output_ids=output, finish_reason="length")
    pos, step, positions = len(prompt) - 1, step0, []
    while pos + 1 < len(seq):
        drafts = drafter(seq, pos)
        acc = 0
        while acc < len(drafts) and pos + 1 + acc < len(seq) and \
                drafts[acc] == seq[pos + 1 + acc]:
            acc += 1
        writer.add_block(req_id, step, pos, seq[pos], drafts, verified=drafts, accepted=acc,
                         emitted=seq[pos + 1: pos + 2 + acc], t_ns=step)
        writer.add_phase(step, "draft", 1.5)
        positions.append(pos)
        pos, step = pos + acc + 1, step + 1
    return positions


def oracle(good, wrong=lambda pos, j: 1000 + j, truth=TRUTH):
    """Drafts equal to ``truth`` in the slots ``good(pos)``, ``wrong(pos, j)`` elsewhere."""
    def drafter(seq, pos):
        return [truth[pos + 1 + j] if pos + 1 + j < len(truth) and j in good(pos)
                else wrong(pos, j) for j in range(K)]
    return drafter


def good_ours(pos):
    return {0, 1} if pos % 3 else {0}


def good_theirs(pos):
    # From position 20 on, theirs gets slot 1 wrong where ours got it right: a draft bug.
    return {0} if pos >= 20 else good_ours(pos)


def make_tokenizer(path):
    """A word-level tokenizer.json whose token i decodes to ``t<i>`` (ids 0..1199)."""
    from tokenizers import Tokenizer, models

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(1200)}, unk_token="t0"))
    tok.save(str(path))
    return path


def make_pair(tmp, *, single=False):
    """Write ``ours.h5`` and ``theirs.h5`` (and ``tokenizer.json``) under ``tmp``.

    Requests: ``r0`` (theirs' slot 1 wrong from position 20: divergent blocks), ``r1``
    (identical), ``r2`` (theirs' text differs at position 12), ``solo`` (ours only).
    """
    tokp = make_tokenizer(tmp / "tokenizer.json")
    meta = {"k": K, "method": "draft_model", "engine_version": "1", "tokenizer": str(tokp),
            "sampling": {"temperature": 0.0}}
    with TraceWriter(tmp / "ours.h5", {**meta, "engine": "ours-engine"},
                     flush_interval=0) as w:
        simulate(w, "r0", PROMPT, OUTPUT, oracle(good_ours))
        simulate(w, "r1", [4, 5, 6], OUTPUT, oracle(good_ours), step0=100)
        simulate(w, "r2", [7, 8, 9], OUTPUT, oracle(good_ours), step0=200)
        simulate(w, "solo", [9, 9, 9], OUTPUT[:6], oracle(good_ours), step0=300)
    if single:
        return tmp / "ours.h5", None
    with TraceWriter(tmp / "theirs.h5", {**meta, "engine": "theirs-engine",
                                         "engine_version": "2"}, flush_interval=0) as w:
        simulate(w, "q0", PROMPT, OUTPUT, oracle(good_theirs))
        simulate(w, "q1", [4, 5, 6], OUTPUT, oracle(good_ours), step0=100)
        simulate(w, "q2", [7, 8, 9], R2_OUTPUT, oracle(good_ours), step0=200)
    return tmp / "ours.h5", tmp / "theirs.h5"


def _model(tmp_path, **kw):
    a, b = make_pair(tmp_path, **kw)
    vm = ViewModel(open_trace(a, lazy_requests=True),
                   open_trace(b, lazy_requests=True) if b else None)
    vm.load_requests()
    vm.load_index()
    vm.load_divergence()
    return vm


def test_pairs_rows_and_states(tmp_path):
    vm = _model(tmp_path)
    assert [(p.label, p.matched_by) for p in vm.pairs] == [
        ("r0/q0", "prompt"), ("r1/q1", "prompt"), ("r2/q2", "prompt"), ("solo", "ours only")]
    assert [p.divergence for p in vm.pairs] == [NO_DIVERGENCE, NO_DIVERGENCE, 12,
                                                NO_DIVERGENCE]
    rows = vm.rows(0)
    t = vm.a
    mine = set(t.blocks.position[t.blocks.request == 0].tolist())
    theirs = set(vm.b.blocks.position[vm.b.blocks.request == 0].tolist())
    assert rows.pos.tolist() == sorted(mine | theirs)
    only_a = [r for r in range(len(rows)) if rows.ib[r] < 0]
    assert {int(rows.pos[r]) for r in only_a} == mine - theirs
    win = vm.window(rows, 0)
    i = int(np.searchsorted(win.pos, 2))                 # first anchor: identical
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


def test_bad_rows_match_the_diff(tmp_path):
    vm = _model(tmp_path)
    an = analyse(vm.a, vm.b)
    total = sum(int(vm.bad_mask(vm.rows(p.index)).sum()) for p in vm.pairs)
    res = diff_traces(align(open_trace(tmp_path / "ours.h5"), open_trace(tmp_path /
                                                                         "theirs.h5")))
    assert total == res.agreement["paired_blocks"] - res.agreement["exact_matches"]
    assert [d["bad"] for d in an.per_pair] == [int(vm.bad_mask(vm.rows(p)).sum())
                                               for p in range(3)]
    first = an.per_pair[0]["first_bad"]
    assert vm.next_divergent(0, -1) == (0, vm.rows(0).row_of_position(first))
    # Filtered rows hold exactly the divergent ones, with their unfiltered row numbers.
    f = vm.rows(0, divergent_only=True)
    assert f.base.tolist() == np.flatnonzero(vm.bad_mask(vm.rows(0))).tolist()
    assert vm.next_divergent(1, -1) is None


def test_search_and_block_detail(tmp_path):
    vm = _model(tmp_path)
    hit = vm.search(0, -1, np.array([1001]))              # a wrong id of slot 1
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
    assert b0["position"] == 2 and b0["anchor"] == 3 and b0["k"] == K
    assert vm.context("ours", 0, 5).tolist() == TRUTH[:6]
    assert vm.phases_of("ours", b0["step"], b0["file"]) == [("draft", 1.5, 1)]


def test_single_trace_rows(tmp_path):
    vm = _model(tmp_path, single=True)
    assert [p.matched_by for p in vm.pairs] == ["single"] * 4
    rows = vm.rows(0)
    assert (rows.ib == -1).all()
    win = vm.window(rows, 0)
    assert win.b is None and not win.bad.any()
    an = analyse(vm.a)
    assert "summary" in an.doc and an.along["ours"]["rate"]


def test_read_rows_matches_columns_across_files(tmp_path):
    a, _ = make_pair(tmp_path)
    with TraceWriter(tmp_path / "x.h5", {"k": 5}, flush_interval=0) as w:
        w.add_block("z", 0, 4, 7, [1, 2, 3, 4, 5], accepted=2)
    lazy = open_trace([a, tmp_path / "x.h5"], lazy_requests=True)
    full = open_trace([a, tmp_path / "x.h5"])
    n = len(full.blocks)
    for name in ("request", "position", "proposed", "emitted", "accepted"):
        col = getattr(full.blocks, name)
        assert np.array_equal(lazy.read_rows(name, 0, n), col), name
        assert np.array_equal(lazy.read_rows(name, n - 3, n + 5), col[n - 3:]), name
    assert lazy.requests.req_id == full.requests.req_id
    for i in range(len(full.requests)):
        assert lazy.requests.output_ids[i].tolist() == full.requests.output_ids[i].tolist()


def test_analysis_child_process_round_trip(tmp_path):
    a, b = make_pair(tmp_path)
    inproc = analyse(open_trace(a), open_trace(b))
    child = analyse_in_child([str(a)], [str(b)])
    assert child.per_pair == inproc.per_pair
    assert [f.kind for f in child.findings] == [f.kind for f in inproc.findings]
    assert json.loads(json.dumps(child.to_json())) == child.to_json()
    assert Analysis.from_json(child.to_json()).per_pair == child.per_pair


@pytest.mark.parametrize("bad_spec", ["missing.h5"])
def test_view_model_inputs(tmp_path, bad_spec):
    from spectrace.tracer.errors import InputError

    with pytest.raises(InputError):
        open_trace(tmp_path / bad_spec, lazy_requests=True)
