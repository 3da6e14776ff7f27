"""Benchmark ``spectrace import vt`` on a big ``VT_SPEC_TRACE`` log (default ~1.05M lines:
the bundled log repeated with new request ids, ``make_big_vt_log.py``).

Times, in one run, interleaved and repeated (each measure in a fresh process, so its peak RSS
is its own):

* **plain read**: ``for line in open(LOG, newline="")`` (the floor: Python reading the lines);
* **new**: ``import_log`` as shipped (the bulk path for a saved file);
* **old**: ``import_log`` with the bulk path switched off (line-by-line ``feed_line``, the
  pre-change code path, still what stdin, live capture and unusual logs use);
* **base** (with ``--base DIR``): ``import_log`` as shipped by another source tree, e.g. a
  checkout of the previous commit (DIR holds a ``spectrace`` package, put first on
  ``PYTHONPATH``): before/after in one run.

Prints the median, min and max of each, lines/s, the ratios new/plain, base/plain,
old/plain, base/new and old/new (per round, then their median) of wall time and of CPU time
(``time.process_time``: on a loaded machine the wall ratio mostly measures the load), and
peak RSS. Asserts nothing. With ``--requests`` the
import also reads the log's requests JSONL (anchors from the requests file; the store then
writes one /requests row per request, which costs as much as the parse on a big log).

Usage: ``python benchmarks/bench_import_vt.py [--log /tmp/spectrace-vt/big.vt.log]
[--lines 1050000] [--rounds 3] [--requests] [--skip-old] [--base DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _one(mode: str, log: Path, requests: Path | None) -> dict:
    """One measure in this process: seconds and peak RSS (MB)."""
    expect = os.environ.get("BENCH_EXPECT_SPECTRACE")
    if expect:  # --base must measure that tree, never the installed one
        import spectrace

        got = str(Path(spectrace.__path__[0]).resolve())
        if got != expect:
            raise SystemExit(f"--base: imported spectrace from {got}, not {expect}")
    if mode == "plain":
        t0, c0 = time.perf_counter(), time.process_time()
        n = 0
        with open(log, encoding="utf-8", errors="replace", newline="") as fh:
            for _ in fh:
                n += 1
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    else:
        from spectrace.hooks.vt import importer

        if mode == "old":
            importer._feed_bulk = lambda parser, log, progress: None  # the line-by-line path
        with tempfile.TemporaryDirectory() as d:
            t0, c0 = time.perf_counter(), time.process_time()
            stats = importer.import_log(log, Path(d) / "t.h5", requests_path=requests)
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        n = stats.lines
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"s": dt, "cpu": cpu, "lines": n, "rss_mb": rss}


def _spawn(mode: str, log: Path, requests: Path | None, base: Path | None = None) -> dict:
    cmd = [sys.executable, __file__, "--one", "new" if mode == "base" else mode, "--log", str(log)]
    if requests is not None:
        cmd += ["--requests-file", str(requests)]
    env = dict(os.environ)
    if mode == "base" and base is not None:  # the other tree's spectrace comes first
        env["PYTHONPATH"] = os.pathsep.join([str(base), env.get("PYTHONPATH", "")])
        env["BENCH_EXPECT_SPECTRACE"] = str((base / "spectrace").resolve())
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def base_package(base: Path) -> Path:
    """A folder whose ``spectrace`` is the ``--base`` source tree: ``base`` itself when it
    holds a ``spectrace`` package, else a temporary folder with a link to the tree (a
    checkout is the package's own folder, which ``PYTHONPATH`` cannot name)."""
    if (base / "spectrace").is_dir():
        return base
    if not (base / "tracer").is_dir():
        raise SystemExit(f"--base {base}: neither a spectrace checkout nor a folder holding one")
    parent = Path(tempfile.mkdtemp(prefix="bench-base-"))
    (parent / "spectrace").symlink_to(base.resolve(), target_is_directory=True)
    return parent


def _fmt(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.3f}  min {min(xs):.3f}  max {max(xs):.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", type=Path, default=Path("/tmp/spectrace-vt/big.vt.log"))
    ap.add_argument("--lines", type=int, default=1_050_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", action="store_true", help="import with the requests JSONL")
    ap.add_argument("--skip-old", action="store_true", help="leave out the line-by-line path")
    ap.add_argument("--base", type=Path, help="a source tree to compare with (mode base)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--requests-file", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(_one(a.one, a.log, a.requests_file)))
        return
    if not a.log.exists():
        from make_big_vt_log import ROOT, make_log

        a.log.parent.mkdir(parents=True, exist_ok=True)
        make_log(a.log, a.lines, ROOT / "traces" / "reference.vt.log",
                 ROOT / "traces" / "reference.requests.jsonl")  # fmt: skip
    requests = a.log.with_name(a.log.name.removesuffix(".vt.log") + ".requests.jsonl")
    req = requests if a.requests else None
    if a.base:
        a.base = base_package(a.base)
    modes = ["plain", "new"] + (["base"] if a.base else []) + ([] if a.skip_old else ["old"])
    got: dict[str, list[dict]] = {m: [] for m in modes}
    print(f"log {a.log} ({os.path.getsize(a.log) / 1e6:.0f} MB), requests: {bool(req)}, "
          f"load average {os.getloadavg()[0]:.2f} at start on {os.cpu_count()} cores")  # fmt: skip
    for r in range(a.rounds):
        for m in modes:  # interleaved: a load change hits every measure of a round
            got[m].append(_spawn(m, a.log, req, a.base))
        print(f"round {r + 1}: " + "  ".join(f"{m} {got[m][-1]['s']:.2f}s" for m in modes))
    n = got["plain"][0]["lines"]
    for m in modes:
        s = [x["s"] for x in got[m]]
        rate = n / statistics.median(s)
        rss = max(x["rss_mb"] for x in got[m])
        cpu = statistics.median(x["cpu"] for x in got[m])
        print(f"{m:9s} {_fmt(s)} s   {rate / 1e3:8.0f}K lines/s   CPU median {cpu:.3f} s   "
              f"peak RSS {rss:.0f} MB")  # fmt: skip
    pairs = [("new", "plain"), ("base", "plain"), ("old", "plain"), ("base", "new"), ("old", "new")]
    for key, what in (("s", "wall"), ("cpu", "CPU")):
        for num, den in pairs:
            if num in got and den in got:
                ratios = [x[key] / y[key] for x, y in zip(got[num], got[den])]
                print(f"{num}/{den} ({what}): {_fmt(ratios)} (per round)")
    print(f"load average {os.getloadavg()[0]:.2f} at the end; {n} lines")


if __name__ == "__main__":
    main()
