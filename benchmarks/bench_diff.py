"""Benchmark ``spectrace diff`` on synthetic trace pairs of 1M and 5M blocks (k=8).

Times, in one run on this machine:

* **read floor**: opening both traces and reading every block column the diff uses;
* **full diff**: ``open_pair`` (both traces, block columns read on a background thread) +
  ``align`` + ``diff_traces`` (every finding detector), i.e. ``spectrace diff`` without
  printing;
* **pandas**: a straightforward pandas version of the pairing and per-slot comparison
  (merge on (request, position), compare the k slots), on already loaded columns, plus
  the same read floor.

Usage: ``python benchmarks/bench_diff.py [--sizes 1000000 5000000] [--dir /tmp/specbench]``.
Needs pandas (``pip install pandas``). Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
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
    args = ap.parse_args()
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
        t_pd, t_pd_merge, pd_exact = pandas_diff(a, b)
        assert pd_exact == agreement.exact_matches, (pd_exact, agreement)
        rows.append((n, floor, t_diff, t_pd, t_pd_merge, agreement.paired_blocks))
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


if __name__ == "__main__":
    main()
