"""Benchmark ``spectrace diff`` on synthetic trace pairs (k=8): time and peak memory.

Measured in one run on this machine, each part in a fresh child process (so that every peak
RSS is that part's alone, read from the child's ``VmHWM``):

* **read floor**: opening both traces and reading every block column the diff uses;
* **full diff**: ``open_pair`` + ``align`` + ``diff_traces`` (every finding detector) + the
  JSON document, i.e. ``spectrace diff --format json`` without printing;
* **pandas**: a straightforward pandas version of the pairing and per-slot comparison
  (merge on (prompt, position), compare the k slots), including its own read.

Usage: ``python benchmarks/bench_diff.py [--sizes 1000000 5000000 50000000]
[--dir /tmp/specbench]``. Pairs are built once per size (1000 blocks per request) and reused;
50M blocks per side take minutes and about 4.4 GB of disk. ``--no-pandas`` skips the pandas
baseline (it needs ``pip install pandas`` and, at 50M, more memory than the diff).
Prints a table with ratios (diff / floor, diff / pandas); asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
if os.environ.get(TREE_ENV := "SPECTRACE_BENCH_TREE"):  # a --base child: that checkout's code
    import __editable___spectrace_0_1_0_finder as _finder  # the editable install's mapping

    for _name, _path in list(_finder.MAPPING.items()):
        _finder.MAPPING[_name] = os.environ[TREE_ENV] + "/" + Path(_path).name
from synth import make_pair  # noqa: E402

from spectrace.tracer.findings import TraceData  # noqa: E402
from spectrace.tracer.pages import prefer_small_pages  # noqa: E402
from spectrace.tracer.store import open_trace  # noqa: E402

# The block columns the diff reads: the narrow ones whole, the id matrices streamed (and
# ``step``, which the sweep reads for its value check).
COLUMNS = TraceData.COLUMNS + TraceData.WIDE + ("step",)
PARTS = ("floor", "diff", "pandas")


def read_floor(a: Path, b: Path) -> dict:
    """Open both traces and read every block column the diff uses."""
    traces = [open_trace(p) for p in (a, b)]
    for t in traces:
        for c in COLUMNS:
            getattr(t.blocks, c)
    return {}


def full_diff(a: Path, b: Path) -> dict:
    """What ``spectrace diff --format json`` runs, without printing."""
    from spectrace.tracer.align import align
    from spectrace.tracer.diff import diff_traces, open_pair

    r = diff_traces(align(*open_pair(a, b)))
    text = json.dumps(r.to_json(), indent=2)
    return {
        "exact": r.agreement.exact_matches,
        "paired": r.agreement.paired_blocks,
        "json_bytes": len(text),
    }


def pandas_diff(a: Path, b: Path) -> dict:
    """The pairing and per-slot comparison in pandas (read included)."""
    import pandas as pd

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
    _ = eq.mean(axis=0), (m["anchor_a"] == m["anchor_b"]).sum()
    return {"exact": int(eq.all(axis=1).sum())}


def _peak_mb() -> float:
    """This process's peak resident set (VmHWM), MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(part: str, a: Path, b: Path) -> None:
    """Run one part in this (fresh) process; print its figures as one JSON line."""
    prefer_small_pages()  # as the spectrace command does; the pandas baseline shares it
    fn = {"floor": read_floor, "diff": full_diff, "pandas": pandas_diff}[part]
    t0 = time.perf_counter()
    out = fn(a, b)
    use = resource.getrusage(resource.RUSAGE_SELF)  # CPU seconds: steadier than wall on a busy host
    s = time.perf_counter() - t0
    print(json.dumps({"s": s, "cpu_s": use.ru_utime + use.ru_stime, "peak_mb": _peak_mb(), **out}))


def measure(part: str, a: Path, b: Path, base: Path | None = None) -> dict:
    """One part in a child process: its figures (``s``, ``peak_mb``, ...). Part ``base``
    is the full diff run by the checkout at ``base`` (the code before a change)."""
    env = dict(os.environ)
    if part == "base":
        env[TREE_ENV], part = str(base), "diff"
    cmd = [sys.executable, __file__, "--child", part, str(a), str(b)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if res.returncode != 0:
        tail = (res.stderr.strip().splitlines() or ["?"])[-1]
        return {"s": float("nan"), "peak_mb": float("nan"), "error": tail}
    return json.loads(res.stdout.strip().splitlines()[-1])


def pair_for(n: int, k: int, root: Path) -> tuple[Path, Path]:
    """The synthetic pair of ``n`` blocks per side (built on first use, then reused)."""
    out = root / f"{n}-k{k}-c256"  # the synth parameters are the cache key
    a, b = out / "ours.h5", out / "theirs.h5"
    if a.exists() and b.exists():
        print(f"reusing {a} and {b} (delete them to rebuild)", file=sys.stderr)
        return a, b
    t0 = time.perf_counter()
    make_pair(out, requests=n // 1000, blocks=1000, k=k, concurrency=256)
    print(f"built {n} blocks per side in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return a, b


def _row(n: int, r: dict) -> str:
    fl, df, pd_ = r["floor"], r["diff"], r.get("pandas")
    pd_s = f"{pd_['s']:>9.2f} {pd_['peak_mb']:>9.0f}" if pd_ else f"{'-':>9} {'-':>9}"
    ratio = f"{df['s'] / pd_['s']:>9.2f}" if pd_ else f"{'-':>9}"
    bs = r.get("base")
    base = (
        f" {bs['s']:>8.2f} {bs['peak_mb']:>8.0f} {bs['s'] / fl['s']:>7.2f} "
        f"{df['s'] / bs['s']:>7.2f} {df['peak_mb'] / bs['peak_mb']:>7.2f} "
        f"{df['cpu_s'] / bs['cpu_s']:>7.2f}"
        if bs and "error" not in bs
        else ""
    )
    return (
        f"{n:>12,} {fl['s']:>8.2f} {fl['peak_mb']:>8.0f} {df['s']:>8.2f} {df['peak_mb']:>8.0f} "
        f"{df['s'] / fl['s']:>7.2f} {df['peak_mb'] / fl['peak_mb']:>7.2f} {pd_s} {ratio} "
        f"{df.get('paired', 0):>10,}{base}"
    )


def main() -> None:
    """Command line (see the module docstring)."""
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
        return
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
    ap.add_argument("--no-pandas", action="store_true", help="skip the pandas baseline")
    ap.add_argument(
        "--base",
        type=Path,
        help="also run the full diff with the checkout at this path (e.g. a git worktree "
        "of main): the before of a before/after table, measured in the same run",
    )
    args = ap.parse_args()
    rows = []
    parts = ("floor", "base", *PARTS[1:]) if args.base else PARTS
    for n in args.sizes:
        a, b = pair_for(n, args.k, args.dir)
        r = {
            p: measure(p, a, b, args.base) for p in parts if not (p == "pandas" and args.no_pandas)
        }
        if "base" in r and r["base"].get("json_bytes") != r["diff"].get("json_bytes"):
            print(f"{n}: base and diff JSON differ in length", file=sys.stderr)
        if "error" in r["diff"]:
            print(f"{n}: diff failed: {r['diff']['error']}", file=sys.stderr)
            continue
        if "pandas" in r and "error" in r["pandas"]:
            print(f"{n}: pandas failed: {r['pandas']['error']}", file=sys.stderr)
            r.pop("pandas")
        if "pandas" in r and r["pandas"]["exact"] != r["diff"]["exact"]:
            print(f"{n}: pandas and diff disagree on exact matches", file=sys.stderr)
        rows.append((n, r))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"{'blocks/side':>12} {'floor s':>8} {'floor MB':>8} {'diff s':>8} {'diff MB':>8} "
        f"{'x floor':>7} {'x MB':>7} {'pandas s':>9} {'pandas MB':>9} {'/pandas':>9} "
        f"{'paired':>10}"
        + (
            f" {'base s':>8} {'base MB':>8} {'b/floor':>7} {'s/base':>7} {'MB/base':>7} "
            f"{'cpu/base':>7}"
            if args.base
            else ""
        )
    )
    for n, r in rows:
        print(_row(n, r))
    print(
        f"\nk={args.k}, one run each, each part in a fresh process; load average {load} "
        f"(1, 5, 15 min) at the end, on {os.cpu_count()} cores. s: wall seconds. MB: peak "
        f"resident set of that process (VmHWM, interpreter and imports included). floor: "
        f"open both traces and read every block column the diff uses. diff: what "
        f"`spectrace diff --format json` runs, without printing. x floor / x MB: diff over "
        f"floor. pandas: its own read, a merge on (prompt, position) and the per-slot "
        f"comparison; /pandas: diff time over pandas time (< 1: the diff is faster). paired: "
        f"blocks paired on matched content. base: the full diff by the --base checkout "
        f"(before); s/base, MB/base, cpu/base: diff's wall time, peak and "
        f"CPU seconds (user + system) over base's (< 1: better; CPU is the steadier on a busy "
        f"host)."
    )


if __name__ == "__main__":
    main()
