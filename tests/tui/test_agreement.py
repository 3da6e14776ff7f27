"""The viewer and ``spectrace diff`` agree on every divergent block, row by row.

For each pair of traces: the TUI model's divergent rows (``bad_mask``, every pair, every row)
are exactly ``spectrace diff``'s differing paired blocks (``diff_traces(align(a, b)).bad`` over
``al.ia``/``al.ib``), its paired comparable rows exactly the diff's paired blocks, its
divergent-row counts the analysis's per-pair counts, and the rows ``n`` / ``N``
(``next_divergent``) visit the differing blocks in order. Pairs: (a) a hand-built pair whose
final, never-verified proposals differ (the diff never compares them; the viewer once marked
them), (b) the bundled pair, (c) reference-engine runs with ``--fault``s against a clean run.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from spectrace.tracer.align import align
from spectrace.tracer.diff import diff_traces
from spectrace.tracer.store import TraceWriter, open_trace
from spectrace.tui.fmt import row_note
from spectrace.tui.model import analyse, compute_window

ROOT = Path(__file__).resolve().parents[2]


def _diff_blocks(a: Path, b: Path):
    """Per matched pair: the diff's paired blocks and its differing ones, as (ia, ib) lists."""
    al = align(open_trace(a), open_trace(b))
    res = diff_traces(al)
    pair_of = al.pair_of_block_a[al.ia]
    blocks = list(zip(al.ia.tolist(), al.ib.tolist()))
    paired = {p: [] for p in range(al.pairs)}
    bad = {p: [] for p in range(al.pairs)}
    for x, (p, blk) in enumerate(zip(pair_of.tolist(), blocks)):
        paired[p].append(blk)
        if res.bad[x]:
            bad[p].append(blk)
    return al, paired, bad, [blk for x, blk in enumerate(blocks) if res.bad[x]]


def _walk(vm, forward: bool) -> list[tuple[int, int]]:
    """Every stop of n (forward) or N (backward) from the first / last row, as (ia, ib)."""
    stops = []
    at = (0, -1) if forward else (len(vm.pairs) - 1, 1 << 62)
    while (hit := vm.next_divergent(*at, forward=forward)) is not None:
        rows = vm.rows(hit[0])
        stops.append((int(rows.ia[hit[1]]), int(rows.ib[hit[1]])))
        at = hit
    return stops


def assert_agree(a: Path, b: Path, load_model) -> tuple[int, int]:
    """Assert the viewer agrees with the diff on pair (a, b). Returns (differing blocks,
    rows where both sides drafted but the row is not comparable)."""
    al, paired, bad, all_bad = _diff_blocks(a, b)
    vm = load_model(a, b)
    an = analyse(open_trace(a), open_trace(b))
    past = 0
    for p in vm.pairs:
        rows = vm.rows(p.index)
        mask = vm.bad_mask(rows)
        win = compute_window(vm.a, vm.b, rows, 0, len(rows))
        got = list(zip(rows.ia.tolist(), rows.ib.tolist()))
        if not p.matched:
            assert not mask.any(), p.label
            continue
        assert (p.req_a, p.req_b) == (al.req_a[p.index], al.req_b[p.index])
        assert [g for g, m in zip(got, win.paired & win.comparable) if m] == paired[p.index]
        past += int((win.paired & ~win.comparable).sum())
        assert [g for g, m in zip(got, mask) if m] == bad[p.index], p.label
        assert an.per_pair[p.index]["bad"] == int(mask.sum()) == len(bad[p.index])
        assert vm.rows(p.index, divergent_only=True).base.tolist() == np.flatnonzero(mask).tolist()
    assert _walk(vm, forward=True) == all_bad
    assert _walk(vm, forward=False) == all_bad[::-1]
    return len(all_bad), past


# --------------------------------------------------------------------------------------------
# (a) final, never-verified proposals that differ
# --------------------------------------------------------------------------------------------


def _write(path: Path, engine: str, r_slot1: int, finals: tuple[list[int], list[int]]) -> None:
    """Requests ``r`` (prompt 1 2 3, output 10 11 12 13: 7 tokens) and ``s`` (prompt 4 5 6,
    output 20 21: 5 tokens), k=2. ``r`` drafts at 2 (both right), at 5 (slot 1 is
    ``r_slot1``) and, after its last token, at 6; ``s`` drafts at 2 and at 4 (its last token).
    The drafts after the last token (``finals``) are never verified."""
    with TraceWriter(path, {"k": 2, "engine": engine}, flush_interval=0) as w:
        w.request("r", prompt_ids=[1, 2, 3], output_ids=[10, 11, 12, 13], finish_reason="length")
        w.add_block("r", 0, 2, 3, [10, 11], verified=[10, 11], accepted=2, emitted=[10, 11, 12])
        w.add_block("r", 1, 5, 12, [13, r_slot1], verified=[13, r_slot1], accepted=1, emitted=[13])
        w.add_block("r", 2, 6, 13, finals[0])
        w.request("s", prompt_ids=[4, 5, 6], output_ids=[20, 21], finish_reason="length")
        w.add_block("s", 0, 2, 6, [20, 21], verified=[20, 21], accepted=2, emitted=[20, 21])
        w.add_block("s", 1, 4, 21, finals[1])


@pytest.fixture
def final_pair(tmp_path):
    a, b = tmp_path / "ours.h5", tmp_path / "theirs.h5"
    _write(a, "ours", 40, ([50, 51], [70, 71]))
    _write(b, "theirs", 41, ([60, 61], [80, 81]))
    return a, b


def test_final_proposals_by_hand(final_pair, load_model):
    a, b = final_pair
    # The diff pairs r@2, r@5, r@6, s@2 and s@4: r@6 and s@4 are at each request's last
    # token (final proposals, never verified), drafted by both sides from the same context,
    # so they compare; r@5 differs (slot 1: 40 vs 41), and so do both finals (50 51 vs 60
    # 61, 70 71 vs 80 81).
    al, paired, bad, all_bad = _diff_blocks(a, b)
    assert paired == {0: [(0, 0), (1, 1), (2, 2)], 1: [(3, 3), (4, 4)]}
    assert bad == {0: [(1, 1), (2, 2)], 1: [(4, 4)]}
    vm = load_model(a, b)
    r, s = vm.rows(0), vm.rows(1)
    assert r.pos.tolist() == [2, 5, 6] and s.pos.tolist() == [2, 4]
    assert vm.bad_mask(r).tolist() == [False, True, True]
    assert vm.bad_mask(s).tolist() == [False, True]
    assert vm.next_divergent(0, -1) == (0, 1)
    assert vm.next_divergent(0, 1) == (0, 2)
    win = vm.window(r, 0)
    assert win.comparable.tolist() == [True, True, True]
    assert row_note(win, 1, True) == "≠ slot 1"
    assert assert_agree(a, b, load_model) == (3, 0)  # every row both drafted compares


# --------------------------------------------------------------------------------------------
# (b) the bundled pair
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["reference-vllm", "vllm-reference"])
def test_bundled_pair(order, load_model):
    names = order.split("-")
    a, b = (ROOT / "traces" / f"{n}.h5" for n in names)
    assert assert_agree(a, b, load_model)[0] == 0  # `spectrace diff`: no differing block


# --------------------------------------------------------------------------------------------
# (c) faulty runs of the reference engine
# --------------------------------------------------------------------------------------------

#: Faults whose blocks exercise shifted slots and differing anchors (a shifted position
#: chain): differing blocks; and comparability (a content divergence: blocks past it are
#: paired by position but never compared, the ones before it agree).
FAULTS = {"layout_shift": "differ", "anchor_shift": "differ", "content": "past"}


@pytest.fixture(scope="module")
def fault_runs(tmp_path_factory, capture_reference) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    tmp = tmp_path_factory.mktemp("agreement")
    runs = {"clean": [], **{f: ["--fault", f] for f in FAULTS}}
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = dict(zip(runs, pool.map(lambda kv: capture_reference(tmp, *kv), runs.items())))
    for name, proc in done.items():
        assert proc.returncode == 0, f"{name}: {proc.stderr[-2000:]}"
    return tmp


@pytest.mark.slow
@pytest.mark.parametrize("fault", FAULTS)
def test_fault_pairs(fault, fault_runs, load_model):
    a, b = fault_runs / f"{fault}.h5", fault_runs / "clean.h5"
    for ours, theirs in ((a, b), (b, a)):
        differ, past = assert_agree(ours, theirs, load_model)
        assert (differ if FAULTS[fault] == "differ" else past) > 0
