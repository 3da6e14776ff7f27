"""Benchmark of ``spectrace view`` on a big synthetic trace pair (default 10M blocks a side).

Measures, headless (Textual ``run_test``, in a fresh process so RSS is the viewer's own):

* first paint: from ``make_app`` to the first refresh of the screen;
* blocks ready: until the block view shows the first request's rows (request tables read,
  request columns indexed);
* page down: key press to repaint, and the view's own work (page + render every line);
* jump to the next finding / next divergence (after the background analysis, which runs in
  a child process for traces this size and is timed separately);
* RSS: the viewer's (current and peak), the analysis child's peak, and the peak of the whole
  process tree (viewer + children, sampled every 10 ms) in each stage: open and first paint,
  indexing, browsing while the analysis runs, browsing after it.

``--analysis`` picks the viewer's analysis mode (``auto``: a child process at this size);
``--compare-off`` runs the same pair again with ``--analysis off`` (the viewer alone) and
prints the ratios of the two runs (tree peak, first paint, page down). ``--phases`` runs the
analysis child's own work once more in a fresh process and prints its peak RSS step by step
(open, align, diff, per pair, acceptance, json): what the diff costs and what the rest does.

With ``--tmux`` it also runs the real CLI in a tmux terminal: launch to first rows on screen,
PageDown to repaint (screen polling), and the process RSS.

Usage: ``python benchmarks/bench_tui.py [--dir /tmp/spectrace-bench] [--requests 10000
--blocks 1000] [--analysis auto|thread|process|off] [--compare-off] [--phases] [--tmux]``.
Traces are generated once (``synth.py``, a few minutes at 10M blocks a side).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _ms(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"median {1000 * statistics.median(xs):.1f} ms, max {1000 * max(xs):.1f} ms"


class TreeRSS:
    """Samples the RSS of this process and of its children (the analysis child) every 10 ms
    in a thread, keeping the peaks of each stage: ``stage`` names the current one."""

    def __init__(self) -> None:
        import psutil

        self.proc = psutil.Process()
        self.stage = "open + first paint"
        self.peaks: dict[str, list[float]] = {}  # stage -> [viewer, children, tree] MB
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            own = self.proc.memory_info().rss
            kids = 0
            for c in self.proc.children(recursive=True):
                try:
                    kids += c.memory_info().rss
                except psutil.Error:  # ended between the listing and the read
                    pass
            p = self.peaks.setdefault(self.stage, [0.0, 0.0, 0.0])
            for i, v in enumerate((own, kids, own + kids)):
                p[i] = max(p[i], v / 2**20)
            self._stop.wait(0.01)

    def stop(self) -> dict[str, list[float]]:
        """Stop sampling; returns the peaks per stage (in stage order)."""
        self._stop.set()
        self._thread.join()
        return self.peaks


def ensure_traces(d: Path, requests: int, blocks: int) -> tuple[Path, Path]:
    """Generate the pair once."""
    a, b = d / "ours.h5", d / "theirs.h5"
    if not (a.exists() and b.exists()):
        sys.path.insert(0, str(HERE))
        from synth import make_pair

        t0 = time.perf_counter()
        make_pair(d, requests=requests, blocks=blocks)
        print(
            f"generated {requests * blocks:,} blocks a side in {time.perf_counter() - t0:.0f} s",
            file=sys.stderr,
        )
    return a, b


async def _headless(a: Path, b: Path, analysis_timeout: float, analysis: str) -> dict:
    import psutil

    from spectrace.tui import make_app
    from spectrace.tui.widgets.block_view import BlockView

    out: dict = {}
    mem = TreeRSS()
    t0 = time.perf_counter()
    app = make_app(a, b, start_tab="blocks", analysis=analysis)
    async with app.run_test(size=(160, 50)) as pilot:
        while app.first_paint is None:
            await asyncio.sleep(0.002)
        out["first_paint_s"] = app.first_paint - t0
        mem.stage = "indexing (to block view ready)"
        view = app.main.query_one(BlockView)
        while view.rows is None:
            await asyncio.sleep(0.005)
        await pilot.pause()
        out["blocks_ready_s"] = time.perf_counter() - t0
        out["rows_first_request"] = len(view.rows)
        view.focus()
        await pilot.pause()
        screen = app.main
        rendered = {"t": 0.0}
        orig = view.render_line
        last_y = view.size.height - 1

        def spy(y):
            strip = orig(y)
            if y == last_y:
                rendered["t"] = time.perf_counter()
            return strip

        view.render_line = spy
        mem.stage = "browsing while analysing"

        async def repaint(action) -> tuple[float, float]:
            """Wall time from the action to the last line of the view repainted, and the
            process CPU time spent meanwhile."""
            rendered["t"] = 0.0
            c0, t0_ = time.process_time(), time.perf_counter()
            action()
            while rendered["t"] == 0.0:
                if time.perf_counter() - t0_ > 5:  # nothing to repaint (no finding to jump to)
                    return float("nan"), time.process_time() - c0
                await asyncio.sleep(0.0005)
            return rendered["t"] - t0_, time.process_time() - c0

        busy = [await repaint(lambda: view.action_page(1)) for _ in range(20)]
        out["page_busy"] = [x for x, _ in busy]
        t = time.perf_counter()
        while screen.analysis is None and screen.analysis_error is None and analysis != "off":
            if time.perf_counter() - t > analysis_timeout:
                break
            await asyncio.sleep(0.1)
        out["analysis_s"] = time.perf_counter() - t
        mem.stage = "browsing after the analysis"
        await pilot.pause()
        page = [await repaint(lambda: view.action_page(1)) for _ in range(40)]
        out["page_key"] = [x for x, _ in page]
        out["page_cpu"] = [c for _, c in page]
        out["analysis_error"] = screen.analysis_error
        out["findings"] = len(screen.findings)
        await pilot.pause()
        jf, jn = [], []
        if analysis != "off":  # both jumps follow the analysis's findings and counts
            jf = [await repaint(lambda: screen.action_finding(1)) for _ in range(8)]
            view.action_edge(-1)
            await pilot.pause()
            jn = [await repaint(lambda: screen.action_divergence(1)) for _ in range(8)]
        out["jump_finding"] = [x for x, _ in jf if x == x]
        out["jump_divergence"] = [x for x, _ in jn if x == x]
        proc = psutil.Process()
        out["rss_mb"] = proc.memory_info().rss / 2**20
        out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        # The largest ended child: the analysis child (exact, where sampling may miss a spike).
        out["child_peak_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    out["stages"] = mem.stop()
    return out


def headless(a: Path, b: Path, analysis_timeout: float, analysis: str) -> dict:
    """Run the headless measurement in a child process; returns its figures."""
    r = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            str(a),
            str(b),
            "--analysis-timeout",
            str(analysis_timeout),
            "--analysis",
            analysis,
        ],
        capture_output=True,
        text=True,
    )
    if r.returncode:
        raise SystemExit(f"headless run failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _phases_here(a: Path, b: Path) -> dict:
    """The analysis child's own work (``worker.child_main``) in this fresh process, step by
    step: the peak RSS (MB) of each step (sampled) and of the whole run (exact)."""
    from spectrace.tracer.pages import prefer_small_pages
    from spectrace.tui.model import worker

    prefer_small_pages()  # as the child does
    mem = TreeRSS()
    mem.stage = "start"
    starts: dict[str, float] = {}

    def phase(name: str) -> None:
        starts[name] = mem.proc.memory_info().rss / 2**20
        mem.stage = name

    arg = json.dumps({"a": [str(a)], "b": [str(b)], "tokenizer": None})
    with open(os.devnull, "w") as out:
        worker.child_main(arg, phase, out)
    peaks = mem.stop()
    steps = {s: [starts[s], max(starts[s], peaks.get(s, [0.0])[0])] for s in starts}
    return {"steps": steps, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def phases(a: Path, b: Path) -> dict:
    """:func:`_phases_here` in a child process; returns its figures."""
    r = subprocess.run(
        [sys.executable, __file__, "--child-phases", str(a), str(b)],
        capture_output=True,
        text=True,
    )
    if r.returncode:
        raise SystemExit(f"phases run failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def tmux_run(a: Path, b: Path) -> dict:
    """The real CLI in tmux: launch to rows on screen, PageDown latency, RSS."""
    import psutil

    spectrace = os.path.join(os.path.dirname(sys.executable), "spectrace")
    sock = f"spectrace-bench-{os.getpid()}"
    tm = ["tmux", "-L", sock]

    def cap() -> str:
        return subprocess.run(
            [*tm, "capture-pane", "-p", "-t", "b"], capture_output=True, text=True
        ).stdout

    out: dict = {}
    t0 = time.perf_counter()
    subprocess.run(
        [
            *tm,
            "new-session",
            "-d",
            "-s",
            "b",
            "-x",
            "160",
            "-y",
            "50",
            f"{spectrace} view {a} {b} --tab blocks",
        ],
        check=True,
        env={**os.environ, "TERM": "xterm-256color"},
    )
    try:
        while "Overview" not in cap():
            time.sleep(0.005)
        out["first_paint_s"] = time.perf_counter() - t0
        while "same" not in cap() and "≠" not in cap():
            time.sleep(0.005)
        out["blocks_ready_s"] = time.perf_counter() - t0
        t = time.perf_counter()
        while "✓" not in cap() and "●" not in cap() and time.perf_counter() - t < 300:
            time.sleep(0.2)  # badges appear when the background analysis is done
        out["analysis_s"] = time.perf_counter() - t0
        time.sleep(0.5)
        lat = []
        for _ in range(15):
            before = cap()
            t = time.perf_counter()
            subprocess.run([*tm, "send-keys", "-t", "b", "PageDown"], check=True)
            while cap() == before and time.perf_counter() - t < 2:
                time.sleep(0.002)
            lat.append(time.perf_counter() - t)
        out["page_key"] = lat
        pid = int(
            subprocess.run(
                [*tm, "list-panes", "-t", "b", "-F", "#{pane_pid}"], capture_output=True, text=True
            ).stdout.split()[0]
        )
        procs = [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)
        viewer = next(p for p in procs if "view" in p.cmdline())  # not the analysis child
        out["rss_mb"] = viewer.memory_info().rss / 2**20
        subprocess.run([*tm, "send-keys", "-t", "b", "q"], check=True)
    finally:
        subprocess.run([*tm, "kill-server"], capture_output=True)
    return out


def _rows(h: dict) -> list[tuple[str, str]]:
    """The headless run's table rows."""
    return [
        ("first paint (headless)", f"{h['first_paint_s'] * 1000:.0f} ms"),
        ("block view ready (headless)", f"{h['blocks_ready_s'] * 1000:.0f} ms"),
        ("page down while indexing/analysing (headless)", _ms(h["page_busy"])),
        ("page down, action to view repainted (headless)", _ms(h["page_key"])),
        ("page down, CPU time of the process", _ms(h["page_cpu"])),
        (
            "analysis",
            f"{h['analysis_s']:.1f} s, {h['findings']} findings"
            + (f" ({h['analysis_error']})" if h["analysis_error"] else ""),
        ),
        ("jump to next finding (action to repaint)", _ms(h["jump_finding"])),
        ("jump to next divergence (action to repaint)", _ms(h["jump_divergence"])),
        (
            "viewer RSS after browsing / viewer peak",
            f"{h['rss_mb']:.0f} MB / {h['peak_rss_mb']:.0f} MB",
        ),
        ("largest child process peak (exact: the analysis child)", f"{h['child_peak_mb']:.0f} MB"),
    ] + [
        (
            f"peak during {stage}: viewer / child / tree",
            f"{v:.0f} / {c:.0f} / {t:.0f} MB",
        )
        for stage, (v, c, t) in h["stages"].items()
    ]


def _tree_peak(h: dict) -> float:
    """Peak RSS of the process tree: sampled sums, or the larger exact single peak."""
    return max([t for _, _, t in h["stages"].values()] + [h["peak_rss_mb"], h["child_peak_mb"]])


def _print(title: str, rows: list[tuple[str, str]]) -> None:
    print(title)
    w = max(len(r[0]) for r in rows)
    for name, val in rows:
        print(f"  {name:<{w}}  {val}")


def main() -> None:
    """Command line (see the module docstring)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=Path("/tmp/spectrace-bench"))
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--blocks", type=int, default=1000)
    ap.add_argument("--tmux", action="store_true")
    ap.add_argument("--analysis", default="auto", choices=("auto", "thread", "process", "off"))
    ap.add_argument(
        "--compare-off", action="store_true", help="also run with --analysis off (ratios)"
    )
    ap.add_argument("--analysis-timeout", type=float, default=600)
    ap.add_argument(
        "--phases", action="store_true", help="also the analysis child's peak RSS step by step"
    )
    ap.add_argument("--child", nargs=2, type=Path)
    ap.add_argument("--child-phases", nargs=2, type=Path)
    args = ap.parse_args()
    if args.child_phases:
        print(json.dumps(_phases_here(*args.child_phases)))
        return
    if args.child:
        res = asyncio.run(_headless(*args.child, args.analysis_timeout, args.analysis))
        print(json.dumps(res))
        return
    a, b = ensure_traces(args.dir, args.requests, args.blocks)
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    h = headless(a, b, args.analysis_timeout, args.analysis)
    n = h["rows_first_request"]
    _print(
        f"spectrace view --analysis {args.analysis}: {a} vs {b} (first request: {n} rows)",
        _rows(h),
    )
    print(f"  peak RSS of the process tree  {_tree_peak(h):.0f} MB")
    if args.compare_off:
        off = headless(a, b, args.analysis_timeout, "off")
        _print("spectrace view --analysis off (same pair, the viewer alone)", _rows(off))
        print(
            f"  ratios, {args.analysis} / off: tree peak {_tree_peak(h) / _tree_peak(off):.2f}x,"
            f" first paint {h['first_paint_s'] / off['first_paint_s']:.2f}x, page down"
            f" {statistics.median(h['page_key']) / statistics.median(off['page_key']):.2f}x"
        )
    if args.phases:
        ph = phases(a, b)
        rows = [
            (f"{k}: RSS at start, peak (growth)", f"{s0:.0f} MB, {p:.0f} MB (+{p - s0:.0f} MB)")
            for k, (s0, p) in ph["steps"].items()
        ]
        rest = [p - s0 for k, (s0, p) in ph["steps"].items() if k not in ("align", "diff")]
        rows += [
            ("peak of the run (exact)", f"{ph['peak']:.0f} MB"),
            ("largest growth of a step other than align and diff", f"{max(rest):.0f} MB"),
        ]
        _print("analysis child's work step by step (a fresh process, as the viewer's child)", rows)
    if args.tmux and shutil.which("tmux"):
        t = tmux_run(a, b)
        _print(
            "tmux",
            [
                ("first paint (tmux, from launch)", f"{t['first_paint_s'] * 1000:.0f} ms"),
                ("block view ready (tmux, from launch)", f"{t['blocks_ready_s'] * 1000:.0f} ms"),
                ("analysis done (tmux, from launch)", f"{t['analysis_s']:.1f} s"),
                ("page down (tmux, send-keys to screen change)", _ms(t["page_key"])),
                ("RSS (tmux)", f"{t['rss_mb']:.0f} MB"),
            ],
        )
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
