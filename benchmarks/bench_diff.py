"""Benchmark ``spectrace diff`` on synthetic trace pairs of 1M and 5M blocks (k=8).

Times, in one run on this machine:

* **read floor**: opening both traces and reading every block column the diff uses;
* **full diff**: ``open_pair`` (both traces, block columns read on a background thread) +
  ``align`` + ``diff_traces`` (every finding detector), i.e. ``spectrace diff`` without
  printing;
* **pandas**: a straightforward pandas version of the pairing and per-slot comparison
  (merge on (request, position), compare the k slots), on already loaded columns, plus
  the same read floor.

* **whole process** (``--process``): ``spectrace diff A B --format json`` as its own process,
  and a process that only reads the columns (the read floor), each with its wall time and
  peak RSS (``getrusage`` of the child): the issue-15 row (5M: <= 2x the read floor and
  <= 1 GB; 50M: ``--sizes 50000000``, <= 4 GB).

Usage: ``python benchmarks/bench_diff.py [--sizes 1000000 5000000] [--dir /tmp/specbench]
[--process] [--skip-pandas]``. Needs pandas (``pip install pandas``) unless
``--skip-pandas``. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from synth import make_pair  # noqa: E402

from spectrace.tracer.align import align  # noqa: E402
from spectrace.tracer.diff import diff_traces, open_pair  # noqa: E402
from spectrace.tracer.diff_result import Agreement  # noqa: E402
from spectrace.tracer.findings import TraceData  # noqa: E402
from spectrace.tracer.pages import prefer_small_pages  # noqa: E402
from spectrace.tracer.store import open_trace  # noqa: E402

COLUMNS = TraceData.COLUMNS  # the block columns the diff reads


def read_floor(a: Path, b: Path) -> float:
    t0 = time.perf_counter()
    for p in (a, b):
        t = open_trace(p)
        for c in COLUMNS:
            getattr(t.blocks, c)
    return time.perf_counter() - t0


def full_diff(a: Path, b: Path) -> tuple[float, Agreement]:
    t0 = time.perf_counter()
    r = diff_traces(align(*open_pair(a, b)))  # what `spectrace diff` runs
    return time.perf_counter() - t0, r.agreement


def pandas_diff(a: Path, b: Path) -> tuple[float, float, int]:
    import pandas as pd

    t0 = time.perf_counter()
    frames, traces = [], []
    for p in (a, b):
        t = open_trace(p)
        traces.append(t)
        prompts = {i: t.requests.prompt_ids[i].tobytes() for i in range(len(t.requests))}
        df = pd.DataFrame(
            {
                "request": t.blocks.request,
                "position": t.blocks.position,
                "anchor": t.blocks.anchor,
                "k": t.blocks.k,
            }
        )
        df["prompt"] = df["request"].map(prompts)
        for j in range(t.blocks.proposed.shape[1]):
            df[f"p{j}"] = t.blocks.proposed[:, j]
        frames.append(df)
    t1 = time.perf_counter()
    # Content divergence per prompt: first differing index of prompt + output.
    ta, tb = traces
    full_b = {
        tb.requests.prompt_ids[i].tobytes(): tb.requests.full_sequence(i)
        for i in range(len(tb.requests))
    }
    div = {}
    for i in range(len(ta.requests)):
        key = ta.requests.prompt_ids[i].tobytes()
        x, y = ta.requests.full_sequence(i), full_b.get(key)
        if y is None:
            continue
        n = min(len(x), len(y))
        d = np.flatnonzero(x[:n] != y[:n])
        div[key] = d[0] if len(d) else np.iinfo(np.int64).max
    m = frames[0].merge(frames[1], on=["prompt", "position"], suffixes=("_a", "_b"))
    m = m[m["position"] < m["prompt"].map(div)]
    k = sum(1 for c in frames[0].columns if c[0] == "p" and c[1:].isdigit())
    eq = np.stack([(m[f"p{j}_a"] == m[f"p{j}_b"]).to_numpy() for j in range(k)], axis=1)
    per_slot = eq.mean(axis=0)
    exact = int(eq.all(axis=1).sum())
    _ = per_slot, (m["anchor_a"] == m["anchor_b"]).sum()
    t2 = time.perf_counter()
    return t2 - t0, t2 - t1, exact


_READ_ONLY = (
    "import sys; from spectrace.tracer.store import open_trace; "
    "from spectrace.tracer.findings import TraceData\n"
    "for p in sys.argv[1:]:\n"
    "    t = open_trace(p)\n"
    "    [getattr(t.blocks, c) for c in TraceData.COLUMNS]"
)


def in_process(cmd: list[str]) -> tuple[float, float]:
    """Run ``cmd`` as a child; its wall seconds and peak RSS in MB (the child's own: each
    measure runs in a fresh child of a fresh ``python -c`` wrapper)."""
    wrapper = (
        "import resource, subprocess, sys, time; t0 = time.perf_counter(); "
        "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
        "print(time.perf_counter() - t0, "
        "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)"
    )
    out = subprocess.run([sys.executable, "-c", wrapper, *cmd], capture_output=True, text=True)
    s, mb = out.stdout.split()
    return float(s), float(mb)


def process_rows(a: Path, b: Path) -> list[str]:
    """The whole-process figures of one pair: read floor and ``spectrace diff``."""
    spectrace = str(Path(sys.executable).with_name("spectrace"))
    floor_s, floor_mb = in_process([sys.executable, "-c", _READ_ONLY, str(a), str(b)])
    diff_s, diff_mb = in_process([spectrace, "diff", str(a), str(b), "--format", "json"])
    return [
        f"  read floor process: {floor_s:.2f} s, peak RSS {floor_mb:.0f} MB",
        f"  spectrace diff --format json: {diff_s:.2f} s ({diff_s / floor_s:.2f}x the floor), "
        f"peak RSS {diff_mb:.0f} MB",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=[1_000_000, 5_000_000],
        help="blocks per side (1000 per request)",
    )
    ap.add_argument(
        "--dir",
        type=Path,
        default=Path("/tmp/specbench"),
        help="where the synthetic pairs are built (and reused)",
    )
    ap.add_argument("--k", type=int, default=8, help="drafts per block")
    ap.add_argument("--process", action="store_true", help="also time whole processes + RSS")
    ap.add_argument("--skip-pandas", action="store_true", help="leave out the pandas baseline")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", file=sys.stderr)
    procs = []
    prefer_small_pages()  # as the spectrace command does; the pandas baseline shares it
    rows = []
    for n in args.sizes:
        requests, blocks = n // 1000, 1000
        out = args.dir / f"{n}-k{args.k}-c256"  # the synth parameters are the cache key
        a, b = out / "ours.h5", out / "theirs.h5"
        if not (a.exists() and b.exists()):
            t0 = time.perf_counter()
            make_pair(out, requests=requests, blocks=blocks, k=args.k, concurrency=256)
            print(f"built {n} blocks per side in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        else:
            print(f"reusing {a} and {b} (delete them to rebuild)", file=sys.stderr)
        gc.collect()
        floor = read_floor(a, b)
        gc.collect()
        t_diff, agreement = full_diff(a, b)
        gc.collect()
        t_pd = t_pd_merge = float("nan")
        if not args.skip_pandas:
            t_pd, t_pd_merge, pd_exact = pandas_diff(a, b)
            assert pd_exact == agreement.exact_matches, (pd_exact, agreement)
        rows.append((n, floor, t_diff, t_pd, t_pd_merge, agreement.paired_blocks))
        if args.process:
            procs += [f"{n:,} blocks per side, whole processes:"] + process_rows(a, b)
    print(
        f"{'blocks/side':>12} {'read floor s':>13} {'full diff s':>12} {'x floor':>8} "
        f"{'pandas s':>9} {'(merge+cmp)':>12} {'diff/pandas':>12} {'paired':>9}"
    )
    for n, floor, t_diff, t_pd, t_m, paired in rows:
        print(
            f"{n:>12,} {floor:>13.2f} {t_diff:>12.2f} {t_diff / floor:>8.2f} {t_pd:>9.2f} "
            f"{t_m:>12.2f} {t_diff / t_pd:>12.2f} {paired:>9,}"
        )
    print(
        f"\nk={args.k}, wall seconds, one run each. read floor: open both traces and read "
        f"every block column the diff uses. full diff: what `spectrace diff` runs, without "
        f"printing. x floor: full diff / read floor. pandas: open both traces, read what it "
        f"needs (request, position, anchor, k, proposed, prompt and output ids), merge on "
        f"(prompt, position) and compare per slot; (merge+cmp) is its part after the "
        f"read. diff/pandas < 1: the full diff is faster. paired: blocks paired "
        f"on matched content (both implementations agree on the exact matches)."
    )
    for line in procs:
        print(line)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"this process (in-process measures): peak RSS {peak:.0f} MB")


if __name__ == "__main__":
    main()
