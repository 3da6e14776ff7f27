"""The block detail shows the recorded margins (top-1 minus top-2 logit) of a replay pair,
near-ties marked, and shows nothing extra for traces without margins."""

from __future__ import annotations

from rich.console import Console

from spectrace.tracer.store import TraceWriter, open_trace
from spectrace.tui.screens.detail import _margins


def _trace(path, margins, target):
    w = TraceWriter(path, {"source": "replay", "k": 2})
    w.request("r", [1, 2], [3, 4, 5, 6])
    w.add_block("r", 0, 2, 3, [4, 5], draft_margin=margins, target_margin=target)
    w.close()
    return open_trace(path)


def _text(renderables) -> str:
    con = Console(record=True, width=100)
    for r in renderables:
        con.print(r)
    return con.export_text()


def test_detail_margins_table(tmp_path):
    a = _trace(tmp_path / "a.h5", [0.004, 1.25], 2.5)
    b = _trace(tmp_path / "b.h5", None, float("nan"))
    text = _text(_margins([("ours", a, 0, 0), ("theirs", b, 0, 0)]))
    assert "margins (top-1 minus top-2 logit)" in text
    assert "target at anchor" in text and "2.5000" in text
    assert "draft slot 0" in text and "0.0040" in text and "1.2500" in text


def test_detail_without_margins_adds_nothing(tmp_path):
    b = _trace(tmp_path / "b.h5", None, float("nan"))
    assert _margins([("ours", b, 0, 0)]) == []


def test_view_opens_a_replay_pair_and_its_detail_shows_margins(tmp_path):
    """`spectrace view A B` on two replay traces: the block view opens, and the detail of
    the first row holds the margins table."""
    import asyncio

    from spectrace.tui import make_app
    from spectrace.tui.screens.detail import BlockDetail

    _trace(tmp_path / "a.h5", [0.004, 1.25], 2.5)
    _trace(tmp_path / "b.h5", [0.5, 0.75], 2.5)
    app = make_app(str(tmp_path / "a.h5"), str(tmp_path / "b.h5"), analysis="inline")

    async def go():
        async with app.run_test(size=(140, 40)) as pilot:
            for key in ("", "2", "enter"):
                if key:
                    await pilot.press(key)
                await app.workers.wait_for_complete()
                await pilot.pause()
            assert isinstance(app.screen, BlockDetail)
            return _text([app.screen.body])

    text = asyncio.run(go())
    assert "margins (top-1 minus top-2 logit)" in text and "0.7500" in text
