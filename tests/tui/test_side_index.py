"""The viewer's request index (:class:`spectrace.tui.model.SideIndex`): each request's first
and last block row, the blocks of one request re-read from its span, chunk by chunk."""

from __future__ import annotations

import numpy as np

from spectrace.tracer.store import TraceWriter, open_trace
from spectrace.tui.model import SideIndex, sides

#: Request of each block row: requests interleaved as an engine batch writes them.
ORDER = ["a", "b", "a", "c", "b", "a", "c", "c"]


def _trace(tmp_path):
    meta = {"k": 2, "method": "draft_model", "engine": "e", "sampling": {"temperature": 0.0}}
    with TraceWriter(tmp_path / "t.h5", meta, flush_interval=0) as w:
        for r in ("a", "b", "c"):
            w.request(r, prompt_ids=[1, 2], output_ids=[3, 4, 5], finish_reason="length")
        for step, r in enumerate(ORDER):
            w.add_block(r, step, 1, 2, [3, 4], verified=[3, 4], accepted=0, emitted=[3])
    return open_trace(tmp_path / "t.h5", lazy_requests=True)


def test_spans_and_blocks_in_small_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(sides, "INDEX_CHUNK", 3)  # spans cross chunk edges
    ix = SideIndex(_trace(tmp_path))
    assert ix.load() and ix.complete
    assert ix.first.dtype == np.int32 and ix.last.dtype == np.int32
    assert ix.first.tolist() == [0, 1, 3]
    assert ix.last.tolist() == [5, 4, 7]
    assert ix.blocks_of(0).tolist() == [0, 2, 5]
    assert ix.blocks_of(1).tolist() == [1, 4]
    assert ix.blocks_of(2).tolist() == [3, 6, 7]
    assert ix.blocks_of(2).dtype == np.int64
    assert ix.blocks_of(3).tolist() == [] and ix.blocks_of(-1).tolist() == []


def test_blocks_of_sees_only_the_scanned_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(sides, "INDEX_CHUNK", 3)
    ix = SideIndex(_trace(tmp_path))
    calls = iter([False, True])  # cancelled after the first chunk (rows 0..2)
    assert not ix.load(lambda: next(calls))
    assert ix.loaded == 3 and not ix.complete
    assert ix.first.tolist() == [0, 1] and ix.last.tolist() == [2, 1]
    assert ix.blocks_of(0).tolist() == [0, 2]
    assert ix.blocks_of(2).tolist() == []  # request c starts at row 3
    assert ix.load()
    assert ix.blocks_of(0).tolist() == [0, 2, 5]
