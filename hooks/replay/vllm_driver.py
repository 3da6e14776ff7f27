"""The vLLM script of ``spectrace replay --engine vllm`` (run under ``spectrace capture vllm``).

Reads a JSONL of ``{"id", "prompt_ids"}`` (one replayed prefix per line) and runs them through
real vLLM (``LLM``, V1 engine, prefix caching on, greedy, fp32, eager) as ``TokensPrompt``
with ``max_tokens=1``: the target samples the anchor after each prefix and the drafter
proposes once after it; that proposal is never verified, and the spectrace plugin records it
as the request's one block::

    python -m spectrace.hooks.replay.vllm_driver [--target DIR] [--draft DIR] \\
        --method draft_model --k 4 --prefixes FILE.jsonl

Guarded by ``if __name__ == "__main__"`` (vLLM's spawned processes re-import it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m spectrace.hooks.replay.vllm_driver")
    p.add_argument("--target", required=True, help="target model folder")
    p.add_argument("--draft", help="draft model folder (method draft_model)")
    p.add_argument("--method", choices=("draft_model", "ngram"), default="draft_model")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--prefixes", required=True, help='JSONL, one {"id", "prompt_ids"} per line')
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--dtype", default="float32")
    args = p.parse_args(argv)
    if args.draft is None and args.method == "draft_model":
        p.error("--draft is required with --method draft_model")
    return args


def speculative_config(args: argparse.Namespace) -> dict:
    """The ``speculative_config`` of ``vllm.LLM`` (ngram: prompt lookup 1..3, as the demo)."""
    if args.method == "ngram":
        return {
            "method": "ngram",
            "num_speculative_tokens": args.k,
            "prompt_lookup_max": 3,
            "prompt_lookup_min": 1,
        }
    return {"method": "draft_model", "model": args.draft, "num_speculative_tokens": args.k}


def main(argv: list[str] | None = None) -> int:
    """Run every prefix for one token; the plugin (``SPECTRACE_OUT``) records the blocks."""
    args = parse_args(argv)
    with open(args.prefixes, encoding="utf-8") as f:
        prefixes = [json.loads(line) for line in f if line.strip()]
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=args.target,
        tokenizer=args.target,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        enforce_eager=True,
        seed=0,
        enable_prefix_caching=True,
        speculative_config=speculative_config(args),
    )
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in p["prompt_ids"]]) for p in prefixes]
    llm.generate(prompts, params, use_tqdm=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
