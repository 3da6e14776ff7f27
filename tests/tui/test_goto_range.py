"""``:`` (go to a position) never jumps silently: a position past the request's anchors
keeps the cursor and says so; a position between anchors names the anchor shown (issue 12)."""

from __future__ import annotations

import asyncio

import numpy as np

from spectrace.tui import make_app
from spectrace.tui.model.rows import Rows
from spectrace.tui.widgets.block_view import BlockView


def rows(pos):
    n = len(pos)
    z = np.zeros(n, np.int64)
    return Rows(None, -1, 0, np.array(pos, np.int64), z, z, np.arange(n), False, ())  # type: ignore[arg-type]


def test_goto_targets_by_hand():
    r = rows([2, 5, 9])
    assert r.goto(5) == (1, None)
    assert r.goto(2) == (0, None)
    assert r.goto(6) == (2, "no block at position 6: showing the next anchor, 9")
    assert r.goto(0) == (0, "no block at position 0: showing the next anchor, 2")
    out = "outside this request's rows (anchor positions 2..9): the cursor stays"
    assert r.goto(10) == (None, f"position 10 is {out}")
    assert r.goto(99999) == (None, f"position 99999 is {out}")
    assert r.goto(-3) == (None, f"position -3 is {out}")
    assert rows([]).goto(4) == (None, "this request has no rows")


def test_goto_past_the_end_keeps_the_cursor(pair):
    async def go():
        app = make_app(*pair)
        async with app.run_test(size=(140, 40)) as pilot:
            for _ in range(100):
                await pilot.pause(0.05)
                if app.screen.query(BlockView) and app.screen.model.index_ready:
                    break
            for k in ("2", "colon", "3", "0", "enter"):
                await pilot.press(k)
                await pilot.pause()
            v = app.screen.query_one(BlockView)
            first = int(v.rows.pos[v.cursor])
            last = int(v.rows.pos[-1])
            for k in ("colon", "9", "9", "9", "9", "9", "enter"):
                await pilot.press(k)
                await pilot.pause()
            after = int(v.rows.pos[v.cursor])
            notes = [n.message for n in app._notifications]
            return first, last, after, notes

    first, last, after, notes = asyncio.run(go())
    assert first == 30 and after == 30 and last < 99999  # the cursor stayed
    assert any(m.startswith("position 99999 is outside this request's rows") for m in notes)
