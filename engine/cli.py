"""Command line of the reference engine.

``python -m spectrace.engine --method draft_model|ngram|dspark --k 4 --max-tokens 64 [--target DIR]
[--draft DIR] [--prompts FILE.jsonl] [--requests-out FILE.jsonl] [--batch-size N]
[--draft-vocab N] [--fault NAME ...] [--list-faults]``

stdout: one line per request, ``<req_id>: <completion as a JSON string>``.
stderr: the ``VT_SPEC_TRACE`` lines (when the variable is set), ``--stats`` and errors.
Requests are greedy with ``ignore_eos`` semantics unless ``--stop-on-eos``; every request
gets exactly ``--max-tokens`` output tokens. Exit codes: 0 ok, 2 usage/input error.

``--method dspark`` drafts with the DSpark drafter of :mod:`.dspark` (``--draft`` is its
speculators-layout checkpoint folder, default the bundled ``models/dspark``; it reads the
target's hidden states, recomputed with the target forward).

``--draft-vocab N`` (draft_model, dspark) restricts the draft head to N target ids with a d2t offset
table (see :mod:`.drafters`). ``--fault NAME`` (repeatable) plants one documented bug of
:mod:`.faults` (``--list-faults`` prints them with the finding kind each must produce).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

PROG = "spectrace-engine"


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of `python -m spectrace.engine`."""
    ap = argparse.ArgumentParser(
        prog="python -m spectrace.engine",
        description="Reference greedy speculative-decoding engine.",
    )
    ap.add_argument("--method", choices=["draft_model", "ngram", "dspark"], default="draft_model")
    ap.add_argument(
        "--k", type=int, default=4, help="speculative tokens per step (num_speculative_tokens)"
    )
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument(
        "--target", type=Path, default=None, help="target model folder (default: bundled)"
    )
    ap.add_argument(
        "--draft",
        type=Path,
        default=None,
        help="draft model folder (default: bundled; draft_model, or dspark: a speculators DSpark checkpoint)",
    )
    ap.add_argument(
        "--prompts",
        type=Path,
        default=None,
        help='JSONL of {"id", "text"} or {"id", "prompt_ids"} (default: bundled)',
    )
    ap.add_argument(
        "--requests-out", type=Path, default=None, help="write one JSON line per request here"
    )
    ap.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="max concurrently running requests (default: all)",
    )
    ap.add_argument(
        "--prompt-lookup-min", type=int, default=1, help="ngram: shortest n-gram to match"
    )
    ap.add_argument(
        "--prompt-lookup-max", type=int, default=3, help="ngram: longest n-gram to match"
    )
    ap.add_argument(
        "--stop-on-eos", action="store_true", help="finish a request at EOS (default: ignore_eos)"
    )
    ap.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (results may depend on it)"
    )
    ap.add_argument(
        "--stats", action="store_true", help="print an acceptance summary line to stderr"
    )
    ap.add_argument(
        "--draft-vocab",
        type=int,
        default=None,
        metavar="N",
        help="draft_model/dspark: reduced draft vocabulary of N target ids, mapped with a d2t table",
    )
    ap.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="NAME",
        help="plant a deliberate bug (repeatable; see --list-faults); off by default",
    )
    ap.add_argument(
        "--margins",
        action="store_true",
        help="print the drafter's top-1 minus top-2 logit per draft on [spec-propose] lines "
        "(margin=[ 0.523 0.010 ]; needs a VT parser that knows the field)",
    )
    ap.add_argument("--list-faults", action="store_true", help="list the faults and exit")
    return ap


def read_prompts(path: Path, tokenizer) -> list[list[int]]:
    """Prompt token ids, one list per JSONL line (`prompt_ids` used as is, `text` tokenized)."""
    from .loader import encode_prompt

    prompts = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        obj = json.loads(line)
        if "prompt_ids" in obj:
            prompts.append([int(t) for t in obj["prompt_ids"]])
        elif "text" in obj:
            prompts.append(encode_prompt(tokenizer, obj["text"]))
        else:
            raise ValueError(f"{path}:{n}: needs 'text' or 'prompt_ids'")
    return prompts


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m spectrace.engine`: returns the exit status (0 ok, 2 bad arguments)."""
    args = build_parser().parse_args(argv)
    if args.list_faults:
        from .faults import describe

        print(describe())
        return 0
    if args.k < 1 or args.max_tokens < 1 or (args.batch_size is not None and args.batch_size < 1):
        print(f"{PROG}: error: --k, --max-tokens and --batch-size must be >= 1", file=sys.stderr)
        return 2
    try:
        from . import faults

        faults.enable(args.fault)
        faults.check(args.method, args.draft_vocab)
        if args.draft_vocab is not None and args.method not in ("draft_model", "dspark"):
            raise ValueError("--draft-vocab needs --method draft_model or dspark")
        return run(args)
    except (OSError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    """Run the engine for parsed arguments: decoded outputs on stdout, VT_SPEC_TRACE lines on stderr, the requests JSONL if asked."""
    from .core import Engine
    from .drafters import Drafter, DraftModelDrafter, NgramDrafter
    from .loader import (
        bundled_model_dir,
        bundled_prompts_path,
        configure_torch,
        load_model,
        load_tokenizer,
    )

    configure_torch(args.threads)
    target_dir = args.target or bundled_model_dir("target")
    target = load_model(target_dir)
    tokenizer = load_tokenizer(target_dir)
    drafter: Drafter
    if args.method == "draft_model":
        drafter = DraftModelDrafter(
            load_model(args.draft or bundled_model_dir("draft")), args.k, args.draft_vocab
        )
    elif args.method == "dspark":
        from .dspark import DSparkDrafter, reduce_vocab
        from .dspark_ckpt import load_dspark

        dmodel = load_dspark(args.draft or bundled_model_dir("dspark"), target.model)
        if args.draft_vocab is not None:
            dmodel = reduce_vocab(dmodel, args.draft_vocab)
        drafter = DSparkDrafter(dmodel, target, args.k)
    else:
        drafter = NgramDrafter(
            args.k, args.prompt_lookup_min, args.prompt_lookup_max, target.max_model_len
        )

    from .vt_trace import VtTrace

    engine = Engine(
        target,
        drafter,
        batch_size=args.batch_size,
        ignore_eos=not args.stop_on_eos,
        trace=VtTrace(margins=args.margins),
    )
    prompts = read_prompts(args.prompts or bundled_prompts_path(), tokenizer)
    for i, ids in enumerate(prompts):
        engine.add_request(str(i), ids, args.max_tokens)
    requests = engine.run()

    for req in requests:
        print(f"{req.req_id}: {json.dumps(tokenizer.decode(req.output_ids))}")
    if args.requests_out:
        with open(args.requests_out, "w") as f:
            for req in requests:
                rec = {
                    "req_id": req.req_id,
                    "prompt_ids": req.prompt_ids,
                    "output_ids": req.output_ids,
                    "finish_reason": req.finish_reason,
                }
                f.write(json.dumps(rec) + "\n")
    if args.stats:
        s = engine.stats
        print(
            f"{PROG}: method={args.method} k={args.k} steps={s.num_steps} spec_drafts_proposed={s.num_draft_tokens} "
            f"spec_drafts_accepted={s.num_accepted_tokens} spec_drafted_request_steps={s.num_drafts}",
            file=sys.stderr,
        )
    return 0
