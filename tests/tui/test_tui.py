"""The viewer (``spectrace view``) driven headless with Textual's Pilot: keys, jumps, filters,
dialogs, follow mode, one-trace mode, text/SVG snapshots, and the real CLI in tmux.

Data: ``conftest.make_pair`` (r0 has divergent blocks from position 20, r1 is identical,
r2's text diverges at 12, ``solo`` exists only in ours). Update the snapshots with
``SPECTRACE_UPDATE_GOLDENS=1 pytest tests/tui/test_tui.py`` after looking at them.
"""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from rich.console import Console

from spectrace.tui import make_app
from spectrace.tui.keymap import all_keys
from spectrace.tui.screens.detail import BlockDetail
from spectrace.tui.screens.help import HelpScreen, help_renderable
from spectrace.tui.widgets.block_view import BlockView

GOLDENS = Path(__file__).parent / "snapshots"
SPECTRACE = os.path.join(os.path.dirname(sys.executable), "spectrace")
SIZE = (140, 40)


def screen_text(app) -> str:
    """The screen as plain text (what a person reads)."""
    w, h = app.size
    con = Console(
        width=w,
        height=h,
        file=io.StringIO(),
        record=True,
        force_terminal=True,
        color_system="truecolor",
        legacy_windows=False,
    )
    con.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return con.export_text()


def render_text(renderable, width: int = 140) -> str:
    con = Console(width=width, file=io.StringIO(), record=True)
    con.print(renderable)
    return con.export_text()


async def settle(pilot) -> None:
    """Wait for the background work (loading, analysis) and the messages it sent."""
    app = pilot.app
    for _ in range(100):
        await app.workers.wait_for_complete()
        await pilot.pause()
        if not any(w.is_running for w in app.workers):
            await pilot.pause()
            return
    raise AssertionError("workers did not finish")


async def keys(pilot, *names: str) -> None:
    for k in names:
        await pilot.press(k)
        await settle(pilot)


def drive(app, script, size=SIZE):
    """Run ``script(pilot)`` against ``app`` headless; returns its result."""

    async def go():
        async with app.run_test(size=size) as pilot:
            await settle(pilot)
            return await script(pilot)

    return asyncio.run(go())


def cursor(app) -> tuple[str, int]:
    """(request label, anchor position) under the block view's cursor."""
    v = app.screen.query_one(BlockView)
    return v.rows.pair.label, int(v.rows.pos[v.cursor])


def explain_text(app) -> str:
    return str(app.screen.query_one("#explain").text)


# --------------------------------------------------------------------------------------------
# Overview
# --------------------------------------------------------------------------------------------


def test_overview_shows_engines_verdict_findings_acceptance(pair):
    async def script(pilot):
        return screen_text(pilot.app)

    text = drive(make_app(*pair), script)
    assert "ours-engine" in text and "theirs-engine" in text and "engine ≠" in text
    assert "DIVERGED" in text and "First divergent block: request r0/q0, position 20" in text
    assert "draft_mismatch" in text and "content_divergence" in text
    assert "ours matched" in text and "theirs all" in text and "acceptance rate" in text


def test_selecting_a_finding_jumps_to_it(pair):
    async def script(pilot):
        app = pilot.app
        screen = app.screen
        fs = screen.findings
        i = next(i for i, f in enumerate(fs) if f.kind == "draft_mismatch")
        opts = screen.query_one("#ov-findings")
        opts.focus()
        opts.highlighted = i
        await keys(pilot, "enter")
        return fs[i], cursor(app), screen.query_one("#tabs").active

    f, (label, pos), tab = drive(make_app(*pair), script)
    assert tab == "blocks" and label == "r0/q0" and pos == f.position == 20


# --------------------------------------------------------------------------------------------
# Block view navigation
# --------------------------------------------------------------------------------------------


def test_next_and_previous_divergence(pair):
    async def script(pilot):
        app = pilot.app
        seen = []
        await keys(pilot, "2", "n")
        seen.append(cursor(app))
        text = explain_text(app)
        await keys(pilot, "n")
        seen.append(cursor(app))
        await keys(pilot, "N")
        seen.append(cursor(app))
        await keys(pilot, "G", "n")  # past the last divergent block: stays
        seen.append(cursor(app))
        return seen, text

    seen, text = drive(make_app(*pair), script)
    assert seen[:3] == [("r0/q0", 20), ("r0/q0", 26), ("r0/q0", 20)]
    assert seen[3] == ("r0/q0", 41)
    assert "DRAFTS DIFFER from slot 1: ours 't29' (29), theirs 't1001' (1001)" in text


def test_filter_divergent_only_keeps_the_place(pair):
    async def script(pilot):
        app = pilot.app
        v = app.screen.query_one(BlockView)
        await keys(pilot, "2", "n", "n", "d")
        rows = v.rows
        bad = app.model.bad_mask(app.model.rows(0))
        filtered = (len(rows), cursor(app), bool(bad[rows.base].all()))
        await keys(pilot, "d")
        return filtered, cursor(app), len(v.rows)

    (n, at, all_bad), back, total = drive(make_app(*pair), script)
    assert n == 4 and all_bad and at == ("r0/q0", 26)
    assert back == ("r0/q0", 26) and total == 21


def test_goto_position_and_content_divergence(pair):
    async def script(pilot):
        app = pilot.app
        await keys(pilot, "2", "colon", "3", "0", "enter")
        first = cursor(app)
        await keys(pilot, "right_square_bracket", "right_square_bracket", "c")
        second = cursor(app), explain_text(app)
        return first, second

    first, (second, text) = drive(make_app(*pair), script)
    assert first == ("r0/q0", 30)
    assert second[0] == "r2/q2" and second[1] >= 12
    assert "Past the content divergence at 12" in text


def test_paging_is_immediate(pair):
    async def script(pilot):
        app = pilot.app
        v = app.screen.query_one(BlockView)
        await keys(pilot, "2", "pagedown")
        after_page = v.cursor, v.scroll_offset.y
        await keys(pilot, "end")
        end = v.cursor
        await keys(pilot, "home")
        return after_page, end, v.cursor, v.scroll_offset.y

    (c1, y1), end, home, y0 = drive(make_app(*pair), script, size=(140, 20))
    assert c1 > 0 and end == 20 and home == 0 and y0 == 0


def test_toggle_ids_and_text(pair):
    async def script(pilot):
        app = pilot.app
        await keys(pilot, "2")
        text_mode = screen_text(app)
        await keys(pilot, "t")
        return text_mode, screen_text(app)

    text_mode, ids_mode = drive(make_app(*pair), script)
    assert "t1002" in text_mode
    assert "t1002" not in ids_mode and " 1002 " in ids_mode


def test_search_token_id_and_text(pair):
    async def script(pilot):
        app = pilot.app
        await keys(pilot, "2", "slash", *"1001", "enter")
        v = app.screen.query_one(BlockView)
        first = cursor(app), 1001 in v.hits
        await keys(pilot, "full_stop")
        second = cursor(app)
        await keys(pilot, "slash", "ctrl+a", "ctrl+k", *"t48", "enter")
        return first, second, cursor(app)

    (first, hl), second, third = drive(make_app(*pair), script)
    assert first == ("r0/q0", 20) and hl  # theirs proposes 1001 first at 20
    assert second[1] > first[1]
    assert 38 <= third[1] < 48  # a row holding t48 (drafted or emitted)


def test_requests_pane_selects_a_request(pair):
    async def script(pilot):
        app = pilot.app
        await keys(pilot, "2")
        app.screen.query_one("#requests").focus()
        await keys(pilot, "down", "down", "down", "down", "enter")
        return cursor(app), screen_text(app)

    (label, _), text = drive(make_app(*pair), script)
    assert label == "solo"
    assert "only ours" in text and "unmatched requests" in text and "div@12" in text


def test_next_finding(pair):
    async def script(pilot):
        app = pilot.app
        await keys(pilot, "2", "f")
        a = cursor(app)
        await keys(pilot, "f")
        return a, cursor(app), [(f.request, f.position) for f in app.screen.findings]

    a, b, located = drive(make_app(*pair), script)
    # `f` walks the findings in report order (most severe first): the first press shows the
    # first finding, not the one after the cursor. It is requests_incomplete: ``solo`` is
    # absent from theirs; with no position, the view opens solo's first block (its prompt
    # has 3 tokens: anchor position 2).
    assert located[0] == ("solo", None)
    assert a[0].split("/")[0] == "solo" and a[1] == 2
    assert b[0].split("/")[0] == located[1][0] and b[1] == located[1][1]
    assert ("r0", 20) in located


# --------------------------------------------------------------------------------------------
# Dialogs, help, palette, charts
# --------------------------------------------------------------------------------------------


def test_block_detail_modal(pair):
    async def script(pilot):
        app = pilot.app
        await keys(pilot, "2", "n", "enter")
        assert isinstance(app.screen, BlockDetail)
        body = render_text(app.screen.body)
        await keys(pilot, "escape")
        return body, type(app.screen).__name__

    body, after = drive(make_app(*pair), script)
    assert "Request r0/q0   anchor position 20" in body
    assert "DRAFTS DIFFER from slot 1" in body
    for head in ("ours proposed", "ours verified", "ours emitted", "theirs proposed"):
        assert head in body
    assert "1001 't1001'" in body and "29 't29'" in body
    assert "t26⟦t27⟧" in body  # the context, anchor marked
    assert "draft 1.500 ms (level 1)" in body
    assert after == "MainScreen"


def test_help_lists_every_key(pair):
    async def script(pilot):
        await keys(pilot, "question_mark")
        shown = isinstance(pilot.app.screen, HelpScreen)
        await keys(pilot, "escape")
        return shown

    assert drive(make_app(*pair), script)
    text = render_text(help_renderable(), width=200)
    for k in all_keys():
        assert k.description in text and k.label in text, k.id


def test_command_palette_runs_actions(pair):
    async def script(pilot):
        app = pilot.app
        await keys(pilot, "ctrl+p", *"next divergent")
        await pilot.pause(0.3)
        await keys(pilot, "enter")
        return cursor(app)

    assert drive(make_app(*pair), script) == ("r0/q0", 20)


def test_charts_tab(pair):
    async def script(pilot):
        await keys(pilot, "3")
        return render_text(pilot.app.screen.query_one("#charts-body").content)

    text = drive(make_app(*pair), script)
    assert "Acceptance per slot" in text and "Agreement per slot" in text
    assert "Acceptance along the sequence of request r0/q0" in text and "█" in text


# --------------------------------------------------------------------------------------------
# One trace, follow mode
# --------------------------------------------------------------------------------------------


def test_single_trace_views(single_trace):
    a = single_trace

    async def script(pilot):
        app = pilot.app
        over = screen_text(app)
        await keys(pilot, "2")
        blocks = screen_text(app)
        await keys(pilot, "n")
        return over, blocks

    over, blocks = drive(make_app(a), script)
    assert "ours-engine" in over and "theirs" not in over and "4 requests" in over
    assert "drafts: ours-engine" in blocks and "acc o|t" not in blocks
    assert "request r0" in blocks


WRITER = textwrap.dedent("""
    import importlib.util, time
    from pathlib import Path
    from spectrace.tracer.store import TraceWriter
    spec = importlib.util.spec_from_file_location("tui_builders", {builders!r})
    sim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sim)
    OUTPUT, PROMPT, oracle, good_ours, simulate = (sim.OUTPUT, sim.PROMPT, sim.oracle,
                                                   sim.good_ours, sim.simulate)
    d = Path({dir!r})
    w = TraceWriter(d / "live.h5", {{"k": 3, "engine": "live"}}, flush_interval=0)
    simulate(w, "first", PROMPT, OUTPUT[:9], oracle(good_ours))
    w.flush()
    (d / "ready1").touch()
    while not (d / "go").exists():
        time.sleep(0.02)
    simulate(w, "second", [4, 5, 6], OUTPUT, oracle(good_ours), step0=50)
    w.flush()
    (d / "ready2").touch()
    while not (d / "close").exists():
        time.sleep(0.02)
    w.close()
    (d / "closed").touch()
""")


def _wait_file(p: Path, timeout: float = 20) -> None:
    t0 = time.time()
    while not p.exists():
        if time.time() - t0 > timeout:
            raise AssertionError(f"{p.name} never appeared")
        time.sleep(0.02)


@pytest.mark.filterwarnings("ignore:.*not closed cleanly")
def test_follow_mode_tails_a_growing_trace(tmp_path, sim):
    script_path = tmp_path / "writer.py"
    script_path.write_text(WRITER.format(builders=str(sim.here), dir=str(tmp_path)))
    proc = subprocess.Popen([sys.executable, str(script_path)])
    try:
        _wait_file(tmp_path / "ready1")
        app = make_app(
            tmp_path / "live.h5",
            follow=True,
            follow_interval=0.05,
            analysis="off",
            start_tab="blocks",
        )

        async def wait_for(pilot, cond, what):
            for _ in range(400):
                await pilot.pause(0.02)
                await settle(pilot)
                if cond():
                    return
            raise AssertionError(f"follow: {what}")

        async def script(pilot):
            app = pilot.app
            n0 = len(app.model.pairs), len(app.model.a.blocks)
            (tmp_path / "go").touch()
            _wait_file(tmp_path / "ready2")
            await wait_for(pilot, lambda: len(app.model.pairs) == 2, "second request")
            n1 = len(app.model.pairs), len(app.model.a.blocks)
            live = str(app.screen.query_one("#title").text)
            (tmp_path / "close").touch()
            _wait_file(tmp_path / "closed")
            await wait_for(pilot, lambda: app.model.a.status == "complete", "clean close")
            await keys(pilot, "right_square_bracket")
            return n0, n1, live, cursor(app), app.model.a.paths[0].name

        n0, n1, live, cur, name = drive(app, script)
    finally:
        proc.kill()
        proc.wait()
    assert n0[0] == 1 and n1[0] == 2 and n1[1] > n0[1]
    assert "LIVE" in live
    assert cur[0] == "second" and name == "live.h5"


# --------------------------------------------------------------------------------------------
# Snapshots (fixed size; text goldens plus one SVG for looks)
# --------------------------------------------------------------------------------------------


def _golden(name: str, actual: str) -> None:
    path = GOLDENS / name
    if os.environ.get("SPECTRACE_UPDATE_GOLDENS") or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
        if not os.environ.get("SPECTRACE_UPDATE_GOLDENS"):
            pytest.fail(f"golden {name} was missing and has been written: review it")
    assert actual == path.read_text(), f"{name} differs from the golden (see module doc)"


def _stable(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


def test_snapshot_overview_and_blocks(pair):
    async def script(pilot):
        app = pilot.app
        over = screen_text(app)
        await keys(pilot, "2", "n")
        blocks = screen_text(app)
        svg = app.export_screenshot(title="spectrace view")
        return over, blocks, svg

    over, blocks, svg = drive(make_app(*pair), script, size=(120, 36))
    _golden("overview.txt", _stable(over))
    _golden("blocks.txt", _stable(blocks))
    _golden("blocks.svg", svg)


# --------------------------------------------------------------------------------------------
# The real CLI in a real terminal (tmux)
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_cli_in_tmux(pair):
    a, b = pair
    session = f"spectrace-test-{os.getpid()}"
    tmux = ["tmux", "-L", session]

    def capture() -> str:
        return subprocess.run(
            [*tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True
        ).stdout

    def wait(*needles: str, timeout: float = 30) -> str:
        """The screen once every needle is on it (a screen may paint in several frames)."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            screen = capture()
            if all(n in screen for n in needles):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{needles!r} not on screen:\n{capture()}")

    # pytest-xdist workers run with COLUMNS=80 LINES=24, which Textual takes over the pane's
    # 140x40 size: the viewer must see the terminal it runs in.
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env["TERM"] = "xterm-256color"
    subprocess.run(
        [
            *tmux,
            "new-session",
            "-d",
            "-s",
            session,
            "-x",
            "140",
            "-y",
            "40",
            f"{SPECTRACE} view {a} {b}",
        ],
        check=True,
        env=env,
    )
    try:
        wait("First divergent block")
        subprocess.run([*tmux, "send-keys", "-t", session, "2"], check=True)
        wait("r0/q0")
        subprocess.run([*tmux, "send-keys", "-t", session, "n"], check=True)
        wait("DRAFTS DIFFER", "≠ slot 1", "t1001")
        subprocess.run([*tmux, "send-keys", "-t", session, "q"], check=True)
        t0 = time.time()
        while time.time() - t0 < 10:
            r = subprocess.run([*tmux, "has-session", "-t", session], capture_output=True)
            if r.returncode != 0:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("q did not quit")
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)


def test_view_refuses_without_a_terminal(pair):
    r = subprocess.run(
        [SPECTRACE, "view", str(pair[0])], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    assert r.returncode == 2 and r.stderr.startswith("spectrace: error: view needs a terminal")
    r = subprocess.run([SPECTRACE, "view", "/nonexistent.h5"], capture_output=True, text=True)
    assert r.returncode == 2 and "no such file" in r.stderr
