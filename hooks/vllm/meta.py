"""The /meta document of a vLLM runner's trace (:data:`spectrace.tracer.schema.META_KEYS`)."""

from __future__ import annotations

import json
import os
import shlex
import sys

from .common import vllm_version
from .paths import ENV_DRIVER_ARGV

#: Drafting methods without a draft model (their speculative config repeats the target).
MODEL_FREE_METHODS = ("ngram", "ngram_gpu", "suffix")


def base_meta(runner, runner_kind: str, dp_rank: int) -> dict:
    """The /meta document of a runner's trace (see :data:`spectrace.tracer.schema.META_KEYS`)."""
    mc = getattr(runner, "model_config", None)
    sc = runner.speculative_config
    draft_cfg = getattr(sc, "draft_model_config", None)
    backends = {}
    try:
        import torch

        backends["torch"] = torch.__version__
    except Exception:
        pass
    try:
        argv = json.loads(os.environ.get(ENV_DRIVER_ARGV, "null")) or list(sys.argv)
    except ValueError:
        argv = list(sys.argv)
    k = int(getattr(sc, "num_speculative_tokens", 0) or 0)
    pc = getattr(runner, "parallel_config", None)
    meta = {
        "engine": "vllm",
        "engine_version": vllm_version(),
        "backends": backends,
        "method": getattr(sc, "method", None),
        "k": k,
        "layout": {
            "runner": f"{runner_kind} {type(runner).__name__}",
            "query_slots_per_request": 1 + k,
        },
        "target_model": getattr(mc, "model", None),
        "draft_model": (
            None
            if getattr(sc, "method", None) in MODEL_FREE_METHODS
            else getattr(draft_cfg, "model", None) or getattr(sc, "model", None)
        ),
        "tokenizer": getattr(mc, "tokenizer", None),
        "max_num_seqs": getattr(getattr(runner, "scheduler_config", None), "max_num_seqs", None),
        "enforce_eager": getattr(mc, "enforce_eager", None),
        "dtype": str(getattr(mc, "dtype", "")).replace("torch.", ""),
        "engine_seed": getattr(mc, "seed", None),
        "tp_rank": 0,  # the TP group's drafts are recorded on its rank 0 (vLLM's output rank)
        "tp_size": getattr(pc, "tensor_parallel_size", None),
        "dp_rank": dp_rank,
        "pp_size": getattr(pc, "pipeline_parallel_size", None),
        "pid": os.getpid(),
        "device": str(getattr(runner, "device", "")),
        "source": "vllm-hook",
        "trace_level": f"vllm-{runner_kind}",
        "command": shlex.join(str(a) for a in argv),
        "argv": argv,
        "req_id_format": "vLLM internal request id: '<external id>-<8 random chars>'",
        "checks": {
            "status": "pending",
            "note": "replaced by the cross-check against vLLM's counters when the trace closes",
        },
    }
    if runner_kind == "v1" and getattr(sc, "method", None) == "ngram":
        meta["ngram"] = {
            "prompt_lookup_min": getattr(sc, "prompt_lookup_min", None),
            "prompt_lookup_max": getattr(sc, "prompt_lookup_max", None),
        }
    return meta
