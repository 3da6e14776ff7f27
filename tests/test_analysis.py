"""The streamed whole-trace figures of :mod:`spectrace.tracer.analysis` (the viewer's
background analysis): exact values on a hand-made trace, whatever the chunk size, and no
block column loaded whole."""

from __future__ import annotations

import pytest

from spectrace.tracer import analysis, schema
from spectrace.tracer.store import TraceWriter, open_trace

#: (request, position, proposed, verified or None, accepted): k is len(proposed),
#: num_verified len(verified) (-1 when None), accepted -1 unknown.
BLOCKS = [
    ("a", 2, [5, 6, 7], [5, 6, 7], 1),
    ("b", 4, [5, 6, 7], [5, 6, 7], 2),
    ("a", 4, [5, 6, 7], None, -1),  # acceptance unknown: counts as a block only
    ("b", 7, [5, 6, 7], [5, 6], 0),  # checked: num_verified 2
    ("a", 6, [5, 6], None, 2),  # checked: k 2 (no verify record)
]


@pytest.fixture
def trace(tmp_path):
    meta = {"k": 3, "method": "draft_model", "engine": "e", "sampling": {"temperature": 0.0}}
    with TraceWriter(tmp_path / "t.h5", meta, flush_interval=0) as w:
        for r in ("a", "b", "c"):  # c has no blocks
            w.request(r, prompt_ids=[1, 2], output_ids=[3, 4, 5, 6, 7, 8], finish_reason="length")
        for step, (r, pos, prop, ver, acc) in enumerate(BLOCKS):
            w.add_block(r, step, pos, 9, prop, verified=ver, accepted=acc)
    return open_trace(tmp_path / "t.h5")


@pytest.mark.parametrize("chunk", [2, 1 << 20])  # chunks of 2, 2 and 1 rows; one chunk
def test_per_request_acceptance_streamed(trace, monkeypatch, chunk):
    monkeypatch.setattr(analysis, "CHUNK", chunk)
    assert analysis.per_request_acceptance(trace) == {
        "blocks": [3, 2, 0],
        "accepted": [1 + 2, 2 + 0, 0],
        "checked": [3 + 2, 3 + 2, 0],
    }
    assert all(trace.blocks.loaded(c.name) is None for c in schema.BLOCK_COLUMNS)


@pytest.mark.parametrize("chunk", [2, 1 << 20])
def test_acceptance_along_streamed(trace, monkeypatch, chunk):
    monkeypatch.setattr(analysis, "CHUNK", chunk)
    # Top position 7: 2 buckets of 4 tokens; known blocks at 2 | 4, 7, 6.
    assert analysis.acceptance_along(trace, buckets=2) == {
        "width": 4,
        "rate": [1 / 3, (2 + 0 + 2) / (3 + 2 + 2)],
        "blocks": [1, 3],
    }
    # One token a bucket: a bucket whose blocks accepted nothing has rate 0.0, an empty one
    # None; buckets run to the last one holding a known block (7).
    assert analysis.acceptance_along(trace, buckets=8) == {
        "width": 1,
        "rate": [None, None, 1 / 3, None, 2 / 3, None, 2 / 2, 0 / 2],
        "blocks": [0, 0, 1, 0, 1, 0, 1, 1],
    }
    assert all(trace.blocks.loaded(c.name) is None for c in schema.BLOCK_COLUMNS)
