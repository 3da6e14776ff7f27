"""Train the tiny bundled models of `spectrace.engine`, deterministically, on a CPU.

What it makes (all under ``engine/`` unless overridden):

* ``models/target/``: a 2-layer Llama (hidden 128, 4 heads of 32, MLP 384, ~0.95 M params).
* ``models/draft/``:  a 1-layer Llama (hidden 64, 2 heads of 32, MLP 192, ~0.32 M params).
* ``prompts.jsonl``: a few short Python-code prompts, ``{"id": "p0", "text": "..."}`` per line.

Both model folders are HF-format (``config.json``, ``generation_config.json``,
``model.safetensors`` in fp32) and carry the same byte-level BPE tokenizer (vocab 2048,
``<|endoftext|>`` = id 0 = bos = eos), so vLLM can load either with
``LLM(model=dir, dtype="float32")``. The tokenizer adds no special tokens on encode, so a raw
text prompt tokenizes to the same ids in vLLM and in the reference engine.

Corpus: the top-level ``*.py`` files of the running Python's standard library, sorted by
name, files over ``MAX_FILE_BYTES`` skipped, stopping at ``MAX_CORPUS_BYTES``. The corpus
(and so the weights) therefore depends on the Python patch version; the script prints the
corpus size and a SHA-256 of it.

Determinism: seeds are fixed (``SEED_TARGET`` = 1234 for the target's init and batches,
``SEED_DRAFT`` = 5678 for the draft), ``torch.set_num_threads(2)``,
``torch.use_deterministic_algorithms(True)``, and the tokenizer trainer runs with one Rayon
thread. Re-running on the same Python, torch and CPU ISA gives byte-identical files (the
script prints each weight file's SHA-256 to check).

Usage: ``.venv/bin/python scripts/train_models.py [--out-dir engine] [--target-steps N]
[--draft-steps N]``. Budget on 2 cores: about 4 min target + 2 min draft.
"""

from __future__ import annotations

import os

# The tokenizers trainer parallelises with Rayon; one thread keeps merge order reproducible.
os.environ.setdefault("RAYON_RS_NUM_CPUS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import glob
import hashlib
import json
import math
import sysconfig
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils import logging as hf_logging

VOCAB_SIZE = 2048
EOS_TOKEN = "<|endoftext|>"  # id 0: bos, eos and the document separator
MAX_POSITIONS = 512
MAX_FILE_BYTES = 200_000  # skip the few huge modules (they dominate the corpus otherwise)
MAX_CORPUS_BYTES = 4_000_000
SEQ_LEN = 256  # training window, tokens; covers prompt + 64 generated tokens comfortably
BATCH = 32  # windows per step
SEED_TARGET = 1234
SEED_DRAFT = 5678

TARGET_SHAPE = dict(
    hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4
)
DRAFT_SHAPE = dict(
    hidden_size=64, intermediate_size=192, num_hidden_layers=1, num_attention_heads=2
)

PROMPTS = [
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\ndef main(argv):\n",
    "class Stack:\n    def __init__(self):\n",
    "    def __repr__(self):\n        return ",
    "for i in range(len(items)):\n    if ",
]


def read_corpus() -> list[str]:
    """Return the stdlib source texts used for both tokenizer and model training.

    Returns: list of file contents (str), in sorted file-name order; total <= MAX_CORPUS_BYTES bytes.
    """
    stdlib = sysconfig.get_paths()["stdlib"]
    texts, total = [], 0
    for path in sorted(glob.glob(os.path.join(stdlib, "*.py"))):
        size = os.path.getsize(path)
        if size > MAX_FILE_BYTES:
            continue
        if total + size > MAX_CORPUS_BYTES:
            break
        with open(path, encoding="utf-8", errors="replace") as f:
            texts.append(f.read())
        total += size
    return texts


def train_tokenizer(texts: list[str]) -> Tokenizer:
    """Train a GPT-2-style byte-level BPE with VOCAB_SIZE entries; id 0 is EOS_TOKEN."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # ByteLevel post-processing only fixes offsets: no BOS/EOS is added on encode, so vLLM's
    # `encode(text)` and ours give the same prompt ids.
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    assert tok.token_to_id(EOS_TOKEN) == 0
    return tok


def encode_corpus(tok: Tokenizer, texts: list[str]) -> torch.Tensor:
    """Tokenize every file and join them with EOS. Returns int64 tensor [num_tokens]."""
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(0)
    return torch.tensor(ids, dtype=torch.int64)


def make_config(shape: dict) -> LlamaConfig:
    """Llama config for one of the bundled shapes (head_dim 32: vLLM CPU attention supports it)."""
    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        head_dim=32,
        num_key_value_heads=shape["num_attention_heads"],
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=None,
        **shape,
    )


def train_model(cfg: LlamaConfig, data: torch.Tensor, steps: int, seed: int, lr: float, label: str):
    """Train a fresh LlamaForCausalLM on random SEQ_LEN windows of `data`.

    Args: data: int64 [num_tokens]; steps: optimizer steps of BATCH x SEQ_LEN tokens;
    seed: seeds both the init and the window sampler. Returns the model (fp32, eval mode).
    """
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).float()
    model.train()
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    warmup = max(1, steps // 20)
    t0 = time.perf_counter()
    for step in range(steps):
        # Linear warmup then cosine decay to 10% of lr.
        frac = (
            (step + 1) / warmup
            if step < warmup
            else 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))
        )
        for group in opt.param_groups:
            group["lr"] = lr * frac
        starts = torch.randint(0, data.numel() - SEQ_LEN - 1, (BATCH,), generator=gen)
        batch = torch.stack([data[s : s + SEQ_LEN] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            print(
                f"[{label}] step {step:4d}/{steps} loss {loss.item():.3f} {time.perf_counter() - t0:6.1f}s",
                flush=True,
            )
    model.eval()
    return model


def write_tokenizer_files(tok: Tokenizer, out: Path) -> None:
    """Write tokenizer.json + tokenizer_config.json + special_tokens_map.json into `out`."""
    tok.save(str(out / "tokenizer.json"))
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITIONS,
    }
    special = {"bos_token": EOS_TOKEN, "eos_token": EOS_TOKEN}
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def write_model_dir(model: LlamaForCausalLM, tok: Tokenizer, out: Path) -> None:
    """Save an HF-format, vLLM-loadable fp32 model folder (config, generation config, weights, tokenizer)."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    os.chmod(out / "model.safetensors", 0o644)  # written via a private temp file (0600)
    cfg = json.loads((out / "config.json").read_text())
    cfg["torch_dtype"] = "float32"  # older readers look for torch_dtype, newer ones for dtype
    cfg["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    gen_cfg = {"bos_token_id": 0, "eos_token_id": 0, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")
    write_tokenizer_files(tok, out)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out-dir", type=Path, default=Path(__file__).resolve().parent.parent / "engine"
    )
    ap.add_argument("--target-steps", type=int, default=700)
    ap.add_argument("--draft-steps", type=int, default=700)
    args = ap.parse_args()

    hf_logging.disable_progress_bar()
    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    t_all = time.perf_counter()

    t = time.perf_counter()
    texts = read_corpus()
    corpus_sha = hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16]
    tok = train_tokenizer(texts)
    data = encode_corpus(tok, texts)
    print(
        f"tokenizer: {len(texts)} files, {sum(map(len, texts))} chars (sha256 {corpus_sha}), "
        f"{data.numel()} tokens, {time.perf_counter() - t:.1f}s",
        flush=True,
    )

    timings = {}
    for name, shape, steps, seed, lr in [
        ("target", TARGET_SHAPE, args.target_steps, SEED_TARGET, 3e-3),
        ("draft", DRAFT_SHAPE, args.draft_steps, SEED_DRAFT, 4e-3),
    ]:
        t = time.perf_counter()
        model = train_model(make_config(shape), data, steps, seed, lr, name)
        timings[name] = time.perf_counter() - t
        out = args.out_dir / "models" / name
        write_model_dir(model, tok, out)
        n_params = sum(p.numel() for p in model.parameters())
        size = (out / "model.safetensors").stat().st_size
        print(
            f"{name}: {n_params} params, {size / 1e6:.2f} MB, trained in {timings[name]:.1f}s, "
            f"model.safetensors sha256 {sha256(out / 'model.safetensors')[:16]}",
            flush=True,
        )

    prompts_path = args.out_dir / "prompts.jsonl"
    prompts_path.write_text(
        "".join(json.dumps({"id": f"p{i}", "text": p}) + "\n" for i, p in enumerate(PROMPTS))
    )
    print(
        f"wrote {prompts_path} ({len(PROMPTS)} prompts); total {time.perf_counter() - t_all:.1f}s"
    )


if __name__ == "__main__":
    main()
