"""The reference-engine faults of issue 11 item 2, captured and diffed against a clean run:
``broken_depth_late`` (depth_divergence at slot 3), ``stale_after_accept`` (stale_state after a
full acceptance), ``row_keyed`` (batch_dependence from a change of batch row, also at row 0
with ``--batch-size 2``) and ``mapped_feedback`` (vocab_mapping at slot 0 alone).

Expected figures come from the raw ``VT_SPEC_TRACE`` logs (tests/test_faults.py's own regexes:
``parse_blocks`` gives each block's batch row and previous block), never from the detectors.
Positions: the log prints pos = anchor + 1. The clean runs' twins (clean vs clean) are in
tests/test_faults.py.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_detectors_general import _consistency  # noqa: E402
from test_faults import (  # noqa: E402
    DRAFT_VOCAB,
    VOCAB,
    _draft_vocab,
    common,
    first_error,
    parse_blocks,
    spectrace_diff,
)

from spectrace.engine.faults import BROKEN_FROM  # noqa: E402
from spectrace.tracer.store import open_trace  # noqa: E402

K = 4
VOCAB_ARGS = ["--draft-vocab", str(DRAFT_VOCAB)]
#: The engine drafts each row from its own sequence, so a clean run's blocks do not depend on
#: --batch-size: row_keyed_b2 is diffed against the plain clean run.
RUNS = {
    "clean": [],
    "clean_vocab": VOCAB_ARGS,
    "broken_depth_late": ["--fault", "broken_depth_late"],
    "stale_after_accept": ["--fault", "stale_after_accept"],
    "row_keyed_b2": ["--fault", "row_keyed", "--batch-size", "2"],
    "mapped_feedback": ["--fault", "mapped_feedback", *VOCAB_ARGS],
}
REFERENCE = {"mapped_feedback": "clean_vocab"}


class Run:
    """One capture: its trace, its raw log's blocks and the trace's request order."""

    def __init__(self, tmp, name):
        self.h5 = tmp / f"{name}.h5"
        self.blocks = parse_blocks((tmp / f"{name}.log").read_text().splitlines())
        self.order = list(open_trace(self.h5).requests.req_id)  # the diff's pair order

    def by_key(self):
        return {(b.req, b.pos): b for b in self.blocks}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, capture_reference):
    tmp = tmp_path_factory.mktemp("faults_general")

    def one(item):
        name, args = item
        proc = capture_reference(tmp, name, args, K, 64)
        assert proc.returncode == 0, f"{name}: {proc.stderr[-2000:]}"
        return name, Run(tmp, name)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, RUNS.items()))


def diff_of(runs, name):
    ours, theirs = runs[name], runs[REFERENCE.get(name, "clean")]
    return common(ours, theirs), spectrace_diff(ours.h5, theirs.h5)


def earliest(run, blocks):
    """The first of ``blocks`` in the diff's order (our request order, then position)."""
    return min(blocks, key=lambda b: (run.order.index(b.req), b.pos))


def test_broken_depth_late(runs):
    pairs, doc = diff_of(runs, "broken_depth_late")
    f = first_error(doc, "depth_divergence")
    assert all(o.draft[:BROKEN_FROM] == t.draft[:BROKEN_FROM] for o, t in pairs)
    differ = [o for o, t in pairs if o.draft[BROKEN_FROM] != t.draft[BROKEN_FROM]]
    first = earliest(runs["broken_depth_late"], differ)
    assert (f["request"], f["position"], f["slot"]) == (first.req, first.pos - 1, 3)
    ev = f["evidence"]
    assert ev["break_slot"] == 3
    assert ev["conditional"][:3] == [1.0, 1.0, 1.0]
    assert ev["conditional"][3] == pytest.approx(1 - len(differ) / len(pairs))
    assert ev["conditional_blocks"] == [len(pairs)] * 4


def test_stale_after_accept(runs):
    pairs, doc = diff_of(runs, "stale_after_accept")
    f = first_error(doc, "stale_state")
    after = [(o, t) for o, t in pairs if o.prev is not None and o.prev.acc == o.prev.k]
    other = [(o, t) for o, t in pairs if (o, t) not in after]
    assert all(o.draft == t.draft for o, t in other)
    bad = [o for o, t in after if o.draft != t.draft]
    first = earliest(runs["stale_after_accept"], bad)
    assert (f["request"], f["position"]) == (first.req, first.pos - 1)
    ev = f["evidence"]
    assert ev["verdict"] == "acceptance"
    assert (ev["blocks_after"], ev["mismatches_after"]) == (len(after), len(bad))
    assert (ev["blocks_otherwise"], ev["mismatches_otherwise"]) == (len(other), 0)


def _moved(b):
    """Whether the request's batch row changed at or before block ``b`` (its chain)."""
    while b.prev is not None:
        if b.row != b.prev.row:
            return True
        b = b.prev
    return False


def test_row_keyed(runs):
    name = "row_keyed_b2"
    pairs, doc = diff_of(runs, name)
    f = first_error(doc, "batch_dependence")
    elig = [(o, t) for o, t in pairs if o.prev is not None]
    moved = [(o, t) for o, t in elig if _moved(o)]
    bad = [o for o, t in moved if o.draft != t.draft]
    assert all(o.draft == t.draft for o, t in pairs if (o, t) not in moved)
    first = earliest(runs[name], bad)
    assert (f["request"], f["position"]) == (first.req, first.pos - 1)
    ev = f["evidence"]
    assert ev["by"] == "batch_row_moved"
    assert (ev["blocks_high"], ev["mismatches_high"]) == (len(moved), len(bad))
    assert (ev["blocks_low"], ev["mismatches_low"]) == (len(elig) - len(moved), 0)
    # Two rows: a request only ever moves from row 1 to row 0 (row 0 finished).
    assert {o.row for o in bad} == {0}
    assert (ev["change"]["from_row"], ev["change"]["to_row"]) == (1, 0)


def test_mapped_feedback(runs):
    pairs, doc = diff_of(runs, "mapped_feedback")
    f = first_error(doc, "vocab_mapping")
    index = {t: i for i, t in enumerate(_draft_vocab())}
    # Slot 0 is handed out as i + 2 * d2t[i] = 2t - i (mod vocab) for the right target id t.
    assert all(o.draft[0] == (2 * t.draft[0] - index[t.draft[0]]) % VOCAB for o, t in pairs)
    slot0 = [(t.draft[0], o.draft[0]) for o, t in pairs if o.draft[0] != t.draft[0]]
    first = earliest(runs["mapped_feedback"], [o for o, t in pairs if o.draft[0] != t.draft[0]])
    assert (f["request"], f["position"], f["slot"]) == (first.req, first.pos - 1, 0)
    ev = f["evidence"]
    assert ev["decided_by"] == "slot" and ev["slots"] == len(slot0)
    assert ev["consistency"] == pytest.approx(_consistency(slot0))
