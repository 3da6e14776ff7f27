"""Locate and load the HF-format models the reference engine runs (bundled or user-given).

Everything is fp32 on the CPU, in eval mode: the point of this engine is numerics that match a
straightforward transformers computation (and vLLM's fp32 CPU run), not speed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

BUNDLED_MODELS = ("target", "draft", "dspark")
DEFAULT_NUM_THREADS = 1  # tiny models: one thread is fastest, and immune to oversubscription


def bundled_model_dir(name: str) -> Path:
    """Path of a bundled model folder inside the installed package (`engine/models/<name>`)."""
    if name not in BUNDLED_MODELS:
        raise ValueError(f"unknown bundled model {name!r}; expected one of {BUNDLED_MODELS}")
    return Path(__file__).resolve().parent / "models" / name


def bundled_prompts_path() -> Path:
    """Path of the bundled prompt file (`engine/prompts.jsonl`)."""
    return Path(__file__).resolve().parent / "prompts.jsonl"


def configure_torch(num_threads: int = DEFAULT_NUM_THREADS) -> None:
    """Fix the intra-op thread count: GEMM results can depend on it, so every run (and the
    tests' independent greedy loop) uses the same value."""
    torch.set_num_threads(max(1, min(num_threads, os.cpu_count() or 1)))


@dataclass
class LoadedModel:
    """A causal LM plus the facts the engine needs about it."""

    path: Path
    model: torch.nn.Module  # LlamaForCausalLM, fp32, eval
    vocab_size: int
    eos_token_id: int | None
    max_model_len: int  # max_position_embeddings


def load_model(path: str | os.PathLike) -> LoadedModel:
    """Load an HF-format causal LM folder in fp32, eval mode (transformers' default attention)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # keep stderr for the trace lines
    path = Path(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    cfg = model.config
    eos = cfg.eos_token_id[0] if isinstance(cfg.eos_token_id, list) else cfg.eos_token_id
    return LoadedModel(path, model, cfg.vocab_size, eos, cfg.max_position_embeddings)


def load_tokenizer(path: str | os.PathLike):
    """Load the tokenizer of a model folder (the same class vLLM's HF path resolves to)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(Path(path))


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Token ids of a raw text prompt, as vLLM's `LLM.generate(text)` computes them
    (`add_special_tokens=True`; the bundled tokenizer adds no BOS)."""
    return list(tokenizer(text, add_special_tokens=True).input_ids)
