"""Live files never crash a reader (issue 12, item 4; the protocol is spectrace.tracer.store.live).

One long test tails a real ``spectrace capture`` for more than 60 s with ``view --follow``
(headless, textual's ``run_test``) and ``spectrace info`` in a loop, while the captured command
replays the bundled VT_SPEC_TRACE log step by step (new request ids each round, so the parser
sees one growing run). Its figures (reads, errors, blocks seen) go to the test's stdout.
The fast tests check the writer's announcement and the reader's retry on their own.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import h5py
import pytest

from spectrace.tracer.store import TraceWarning, TraceWriter, open_trace
from spectrace.tracer.store import live as live_mod

REPO = Path(__file__).resolve().parents[1]
LOG = REPO / "traces" / "reference.vt.log"
SPECTRACE = [sys.executable, "-m", "spectrace.tracer.cli.main"]

#: Replays LOG ``ROUNDS`` times, one engine step (from a ``[spec-phase]`` line to the next)
#: every ``PAUSE`` seconds, request ids shifted by 5 per round (the log has requests 0-4).
FEEDER = """
import re, sys, time
rounds, pause = int(sys.argv[2]), float(sys.argv[3])
steps, cur = [], []
for line in open(sys.argv[1]).read().splitlines(True):
    if line.startswith("[spec-phase]") and cur:
        steps.append(cur)
        cur = []
    cur.append(line)
steps.append(cur)
for r in range(rounds):
    for step in steps:
        text = re.sub(r"\\breq=(\\d+)", lambda m: f"req={int(m.group(1)) + 5 * r}", "".join(step))
        sys.stderr.write(text)
        sys.stderr.flush()
        time.sleep(pause)
"""
ROUNDS, PAUSE = 4, 0.45  # 4 x 34 steps x 0.45 s = 61 s; 4 x 139 = 556 blocks, 20 requests


def test_writer_announces_flushed_rows(tmp_path):
    """After each flush /blocks carries the rows written so far; the reader of a live file
    reads no more than that even when the columns are longer."""
    w = TraceWriter(tmp_path / "t.h5", {"k": 2}, flush_interval=0)
    for i in range(3):
        w.add_block("r", i, 5 + i, 7, [1, 2])
    w.flush()
    with h5py.File(w.partial_path, "r", locking=False) as f:
        assert f["blocks"].attrs[live_mod.FLUSHED_ROWS] == 3
    w.add_block("r", 3, 8, 7, [1, 2])
    w.flush()
    with h5py.File(w.partial_path, "r+", locking=False) as f:
        assert f["blocks"].attrs[live_mod.FLUSHED_ROWS] == 4
        f["blocks"].attrs[live_mod.FLUSHED_ROWS] = 2  # as if rows 2-3 were still being written
    with pytest.warns(TraceWarning), open_trace(w.partial_path) as t:
        assert len(t.blocks) == 2 and t.blocks.step.tolist() == [0, 1]
    w.close()


def test_a_read_that_races_the_writer_is_retried_after_a_reopen(tmp_path, monkeypatch):
    """A column read that fails twice (as a torn chunk does) succeeds on the third attempt,
    after two re-opens; a complete file is never retried."""
    w = TraceWriter(tmp_path / "t.h5", {"k": 2}, flush_interval=0)
    w.add_block("r", 0, 5, 7, [1, 2])
    w.flush()
    with pytest.warns(TraceWarning):
        t = open_trace(w.partial_path, lazy_requests=True)
    monkeypatch.setattr(live_mod, "FIRST_DELAY", 0.001)
    calls: dict = {"read": [], "reopen": 0}
    real_read, real_reopen = t._read_block_column_unchecked, t._reopen_live

    def flaky(c):
        calls["read"].append(c.name)
        if len(calls["read"]) <= 2:
            raise OSError("Can't synchronously read data (filter returned failure during read)")
        return real_read(c)

    def reopen():
        calls["reopen"] += 1
        real_reopen()

    t._read_block_column_unchecked, t._reopen_live = flaky, reopen
    assert t.blocks.position.tolist() == [5]
    # position fails twice, then reads; reading it loads the request column once (a live
    # file's placeholder requests), which reads at the first attempt.
    assert calls == {"read": ["position"] * 3 + ["request"], "reopen": 2}
    t.close()
    w.close()
    with open_trace(w.path) as done:
        done._read_block_column_unchecked = lambda c: (_ for _ in ()).throw(OSError("torn"))
        with pytest.raises(Exception, match="damaged column blocks/step"):
            done.blocks.step  # noqa: B018


def _info_loop(out: Path, stop: threading.Event) -> dict:
    """``spectrace info OUT`` every 0.5 s until ``stop`` is set; counts the outcomes."""
    seen: dict = {"runs": 0, "errors": [], "blocks": []}
    while not stop.is_set():
        p = subprocess.run(
            [*SPECTRACE, "info", str(out), "--format", "json"], capture_output=True, text=True
        )
        seen["runs"] += 1
        if p.returncode != 0 or "Traceback" in p.stderr:
            seen["errors"].append(p.stderr.strip().splitlines()[-1:] or [str(p.returncode)])
        else:
            seen["blocks"].append(json.loads(p.stdout)["blocks"])
        time.sleep(0.5)
    return seen


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::spectrace.tracer.store.TraceWarning")
def test_view_follow_and_info_tail_a_live_capture_for_60_s(tmp_path):
    """`view --follow` (headless) and `info` in a loop tail a capture in progress for 61 s:
    zero errors, the view's block count grows, and the LIVE badge goes when the file is
    complete."""
    from spectrace.tui import make_app

    feeder = tmp_path / "feeder.py"
    feeder.write_text(FEEDER)
    out = tmp_path / "live.h5"
    err_path = tmp_path / "capture.err"
    err_file = open(err_path, "w")  # noqa: SIM115 - closed below; a pipe would fill and block
    cap = subprocess.Popen(
        [*SPECTRACE, "capture", "-o", str(out), "--"]
        + [sys.executable, str(feeder), str(LOG), str(ROUNDS), str(PAUSE)],
        stdout=subprocess.DEVNULL,
        stderr=err_file,
    )
    try:
        partial = out.with_name(out.name + ".partial")
        t0 = time.monotonic()
        while not partial.exists() and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        assert partial.exists(), "the capture never opened its trace"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TraceWarning)
            app = make_app(out, follow=True, follow_interval=0.25, analysis="off")
        view, info = asyncio.run(_tail(app, cap, out))
    finally:
        if cap.poll() is None:
            cap.kill()
        cap.wait(timeout=30)
        err_file.close()
    err = err_path.read_text()
    print(
        f"\nlive tail: {view['seconds']:.0f} s; view: {view['reloads']} reloads, "
        f"{len(view['errors'])} errors, {view['retried']} reads retried, blocks seen "
        f"{view['blocks']}; "
        f"info: {info['runs']} runs, {len(info['errors'])} errors, blocks "
        f"{info['blocks'][:1]}..{info['blocks'][-1:]}"
    )
    assert cap.returncode == 0, err[-2000:]
    assert view["seconds"] >= 60
    assert view["errors"] == [] and info["errors"] == []
    assert view["reloads"] >= 20  # the view re-read the growing file all along
    assert view["blocks"] == sorted(view["blocks"]) and view["blocks"][-1] == 4 * 139
    assert info["runs"] >= 10 and info["blocks"] == sorted(info["blocks"])
    assert "LIVE" in view["badge_live"] and "LIVE" not in view["badge_done"]
    assert view["status"] == "complete" and view["name"] == "live.h5"


async def _tail(app, cap: subprocess.Popen, out: Path) -> tuple[dict, dict]:
    """Drive the follow-mode app until the capture ends and the view shows the complete
    file, with the `info` loop on a thread meanwhile."""
    view: dict = {"blocks": [], "badge_live": ""}
    retried0 = live_mod.retried()
    start = time.monotonic()
    async with app.run_test(size=(120, 30)) as pilot:
        loop = asyncio.get_running_loop()
        stop_info = threading.Event()
        info = loop.run_in_executor(None, _info_loop, out, stop_info)
        try:
            await _follow(pilot, cap, view, start)
        finally:
            stop_info.set()
        view["errors"] = app.follow_errors
        view["retried"] = live_mod.retried() - retried0
        return view, await info


async def _follow(pilot, cap: subprocess.Popen, view: dict, start: float) -> None:
    """Sample the view every 0.25 s until the capture ended and the view shows the file
    complete; records the block counts, the LIVE badge and the end state in ``view``."""
    app = pilot.app
    while True:
        await pilot.pause(0.25)
        n = len(app.model.a.blocks)
        if not view["blocks"] or view["blocks"][-1] != n:
            view["blocks"].append(n)
        title = str(app.screen.query_one("#title").text)
        if "LIVE" in title:
            view["badge_live"] = title
        if cap.poll() is not None and app.model.a.status == "complete":
            await pilot.pause(0.5)
            break
        if time.monotonic() - start > 150:
            raise AssertionError("the capture or the view never finished")
    view.update(
        seconds=time.monotonic() - start,
        reloads=app.reloads,
        badge_done=str(app.screen.query_one("#title").text),
        status=app.model.a.status,
        name=app.model.a.paths[0].name,
    )
