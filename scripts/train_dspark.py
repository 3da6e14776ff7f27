"""Train the tiny bundled DSpark drafter of `spectrace.engine`, deterministically, on a CPU.

What it makes: ``engine/models/dspark/`` (``config.json`` + ``model.safetensors`` in the
speculators layout, see ``engine/dspark_ckpt.py``): a 1-layer Qwen3-style DSpark backbone
(hidden 128, 4 heads of 32, MLP 384) over the bundled target's hidden states at aux layers
``[1, 2]`` (the outputs of both target layers), block size 4 in the anchor layout
(``sample_from_anchor=true``), a vanilla Markov head of rank 32 and a confidence head.
``embed_tokens`` and ``lm_head`` start as copies of the target's and stay frozen (they are
saved, so the checkpoint is self-contained).

Data (self-distillation, as EAGLE/DFlash drafters are trained on regenerated data):
``GEN_SEQS`` random corpus windows of 4 to ``GEN_PROMPT`` tokens, each continued by the
target's greedy tokens to ``WINDOW`` tokens, which is what the drafter meets at inference.

Training (teacher-forced and parallel, like speculators' ``DSparkDraftModel.forward``): random
sequences go through the frozen target once (aux hidden states and logits); in each, ``ANCHORS``
anchor positions p in the generated part are drawn, each with its own query block
``[token p, mask * (k-1)]`` at positions ``p .. p+k-1`` that attends the context ``< p`` and its
own block. Slot j predicts position ``p + 1 + j`` with the Markov bias of the true token at
``p + j`` (slot 0: the anchor). The loss is the cross-entropy against the target's softmax at
that position (distillation: acceptance is measured against the target's greedy tokens), with
depth weights ``DEPTH_DECAY ** j``; on a random half of the slots (``MARKOV_DROPOUT``) the
Markov bias is left out, so the backbone's base logits learn to predict on their own; the
confidence head learns (binary cross-entropy, inputs
detached) whether the slot's argmax equals the target's.

Corpus: the same standard-library sources as ``scripts/train_models.py`` (its ``read_corpus``),
tokenized with the bundled tokenizer.

Determinism: fixed seed ``SEED``, ``torch.set_num_threads(2)``,
``torch.use_deterministic_algorithms(True)``; the script prints the weight file's SHA-256.

Usage: ``.venv/bin/python scripts/train_dspark.py [--out DIR] [--steps N]``.
Budget on 2 cores: about 4 minutes on an idle machine (40 s of greedy data, then training).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent

SEED = 4321
WINDOW = 192  # tokens per training window
BATCH = 16  # windows per step
ANCHORS = 16  # anchor positions per window
K = 4  # block size = drafts per step (anchor layout)
RANK = 32
AUX_IDS = [1, 2]
MASK_TOKEN_ID = 2047
DEPTH_DECAY = 0.8
#: Share of slots trained without the Markov bias, so the backbone's base logits predict on
#: their own and the Markov head stays a correction (as in DSpark). Without it the tiny
#: backbone leans on the Markov bigram, and a layout flip barely changes the drafts.
MARKOV_DROPOUT = 0.5
LR = 3e-3
#: Self-distillation data: GEN_SEQS corpus windows of 4 to GEN_PROMPT tokens (one length per
#: generation batch), each continued by greedy target tokens to WINDOW tokens (what the drafter
#: meets at inference: a prompt, often short, then greedy output).
GEN_SEQS = 4096
GEN_PROMPT = 64
GEN_BATCH = 256


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def engine_modules():
    """``spectrace.engine.dspark`` and ``.dspark_ckpt`` (installed, else by file path)."""
    try:
        from spectrace.engine import dspark, dspark_ckpt, loader

        return dspark, dspark_ckpt, loader
    except ImportError:  # a bare checkout: map the namespace by hand
        import types

        for pkg, folder in (("spectrace", None), ("spectrace.engine", ROOT / "engine")):
            if pkg not in sys.modules:
                m = types.ModuleType(pkg)
                m.__path__ = [str(folder)] if folder else []
                sys.modules[pkg] = m
        from spectrace.engine import dspark, dspark_ckpt, loader

        return dspark, dspark_ckpt, loader


def greedy_data(
    target, data: torch.Tensor, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Corpus prompts continued greedily by the target.

    Returns:
        seqs int64 [GEN_SEQS, WINDOW]; plen int64 [GEN_SEQS] prompt tokens of each.
    """
    out, plens = [], []
    starts = torch.randint(0, data.numel() - GEN_PROMPT - 1, (GEN_SEQS,), generator=gen)
    n_batches = (GEN_SEQS + GEN_BATCH - 1) // GEN_BATCH
    lengths = torch.linspace(4, GEN_PROMPT, n_batches).round().long()
    with torch.no_grad():
        for b, b0 in enumerate(range(0, GEN_SEQS, GEN_BATCH)):
            n = int(lengths[b])
            prompts = torch.stack([data[s : s + n] for s in starts[b0 : b0 + GEN_BATCH].tolist()])
            out.append(
                target.generate(
                    prompts,
                    max_new_tokens=WINDOW - n,
                    min_new_tokens=WINDOW - n,
                    do_sample=False,
                    pad_token_id=0,
                    eos_token_id=None,
                )
            )
            plens.append(torch.full((prompts.shape[0],), n, dtype=torch.int64))
    return torch.cat(out), torch.cat(plens)


def make_batch(
    seqs: torch.Tensor, plen: torch.Tensor, gen: torch.Generator, dspark, cfg, mask_id: int
):
    """One training batch from the greedy sequences; anchors lie in the generated part.

    Returns:
        win int64 [B, W]; p int64 [B, A] anchor positions; q_ids/q_pos int64 [B, A*Q];
        mask bool [B, A*Q, W + A*Q]; Q the query slots per block.
    """
    rows = torch.randint(0, seqs.shape[0], (BATCH,), generator=gen)
    win, lo = seqs[rows], plen[rows]
    q = dspark.num_query_slots(K, cfg.sample_from_anchor)
    span = (WINDOW - K - lo)[:, None].float()  # anchors p in [prompt length, WINDOW - K)
    p = lo[:, None] + (torch.rand((BATCH, ANCHORS), generator=gen) * span).long()
    j = torch.arange(q)
    q_pos = (p[:, :, None] + j).reshape(BATCH, ANCHORS * q)
    q_ids = torch.full((BATCH, ANCHORS, q), mask_id, dtype=torch.int64)
    q_ids[:, :, 0] = torch.gather(win, 1, p)
    q_ids = q_ids.reshape(BATCH, ANCHORS * q)
    ctx_ok = torch.arange(WINDOW)[None, None, :] < p[:, :, None]  # [B, A, W]
    ctx_ok = (
        ctx_ok[:, :, None, :].expand(BATCH, ANCHORS, q, WINDOW).reshape(BATCH, ANCHORS * q, WINDOW)
    )
    blk = torch.arange(ANCHORS * q) // q
    own = (blk[:, None] == blk[None, :])[None].expand(BATCH, -1, -1)
    return win, p, q_ids, q_pos, torch.cat([ctx_ok, own], dim=2), q


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "engine" / "models" / "dspark")
    ap.add_argument("--steps", type=int, default=2400)
    args = ap.parse_args()

    torch.set_num_threads(2)
    torch.use_deterministic_algorithms(True)
    t_all = time.perf_counter()
    dspark, dspark_ckpt, loader = engine_modules()
    train_models = _load("train_models", ROOT / "scripts" / "train_models.py")
    from tokenizers import Tokenizer

    target_dir = loader.bundled_model_dir("target")
    target = loader.load_model(target_dir).model
    for prm in target.parameters():
        prm.requires_grad_(False)
    tok = Tokenizer.from_file(str(target_dir / "tokenizer.json"))
    texts = train_models.read_corpus()
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(0)
    data = torch.tensor(ids, dtype=torch.int64)
    tcfg = target.config
    print(f"corpus: {len(texts)} files, {data.numel()} tokens", flush=True)

    cfg = dspark.DSparkConfig(
        vocab_size=tcfg.vocab_size,
        draft_vocab_size=tcfg.vocab_size,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=32,
        target_hidden_size=tcfg.hidden_size,
        aux_hidden_state_layer_ids=AUX_IDS,
        mask_token_id=MASK_TOKEN_ID,
        block_size=K,
        sample_from_anchor=True,
        markov_rank=RANK,
        enable_confidence_head=True,
        confidence_head_with_markov=True,
        rms_norm_eps=tcfg.rms_norm_eps,
        rope_theta=10000.0,
        max_position_embeddings=tcfg.max_position_embeddings,
    )
    torch.manual_seed(SEED)
    model = dspark.DSparkDraftModel(cfg)
    with torch.no_grad():
        model.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
        model.lm_head.weight.copy_(target.get_output_embeddings().weight)
        model.markov_head.markov_w1.weight.normal_(0.0, 0.02)
        model.markov_head.markov_w2.weight.zero_()
    model.embed_tokens.weight.requires_grad_(False)
    model.lm_head.weight.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    print(
        f"dspark: {sum(p.numel() for p in params)} trainable params "
        f"({sum(p.numel() for p in model.parameters())} total)",
        flush=True,
    )

    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), weight_decay=0.01)
    gen = torch.Generator().manual_seed(SEED)
    t = time.perf_counter()
    seqs, plen = greedy_data(target, data, gen)
    print(
        f"greedy data: {seqs.shape[0]} x {seqs.shape[1]} tokens (prompts of 4..{GEN_PROMPT}, "
        f"the rest greedy), {time.perf_counter() - t:.1f}s",
        flush=True,
    )
    weights = DEPTH_DECAY ** torch.arange(K, dtype=torch.float32)
    weights = weights / weights.sum()
    off = dspark.sample_slot_offset(cfg.sample_from_anchor)
    warmup = max(1, args.steps // 20)
    t0 = time.perf_counter()
    model.train()
    for step in range(args.steps):
        frac = (
            (step + 1) / warmup
            if step < warmup
            else 0.1
            + 0.45 * (1 + math.cos(math.pi * (step - warmup) / max(1, args.steps - warmup)))
        )
        for g in opt.param_groups:
            g["lr"] = LR * frac
        win, p, q_ids, q_pos, mask, q = make_batch(seqs, plen, gen, dspark, cfg, MASK_TOKEN_ID)
        with torch.no_grad():
            aux = dspark.target_aux_hidden(target, win, AUX_IDS)  # [B, W, 2H]
            last = aux[..., -tcfg.hidden_size :]
            t_logits = target.lm_head(target.model.norm(last))  # [B, W, V]: predicts pos + 1
        kv = model.context_kv(aux, torch.arange(WINDOW)[None].expand(BATCH, -1))
        hidden = model.query_forward(kv, q_ids, q_pos, mask).view(BATCH, ANCHORS, q, -1)
        hidden = hidden[:, :, off : off + K]  # [B, A, K, H]
        at = p[:, :, None] + torch.arange(K)  # slot j predicts at + 1, conditioned on token at
        prev = torch.gather(win, 1, at.reshape(BATCH, -1)).view(BATCH, ANCHORS, K)
        emb = model.markov_embed(prev)
        keep = (torch.rand(prev.shape, generator=gen) >= MARKOV_DROPOUT).float()[..., None]
        logits = model.compute_draft_logits(hidden) + keep * model.markov_bias(emb)
        teacher = torch.gather(
            t_logits, 1, at.reshape(BATCH, -1, 1).expand(-1, -1, t_logits.shape[-1])
        )
        teacher = teacher.view(BATCH, ANCHORS, K, -1).softmax(-1)
        ce = -(teacher * logits.log_softmax(-1)).sum(-1)  # [B, A, K]
        loss = (ce.mean(dim=(0, 1)) * weights).sum()
        with torch.no_grad():  # what inference does: base + bias on every slot
            full = model.compute_draft_logits(hidden) + model.markov_bias(emb)
        hit = (full.argmax(-1) == teacher.argmax(-1)).float()
        conf_logit = model.confidence_head.proj(torch.cat([hidden, emb], -1).detach()).squeeze(-1)
        loss_conf = F.binary_cross_entropy_with_logits(conf_logit, hit)
        opt.zero_grad(set_to_none=True)
        (loss + 0.1 * loss_conf).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 100 == 0 or step == args.steps - 1:
            acc = " ".join(f"{a:.2f}" for a in hit.mean(dim=(0, 1)).tolist())
            print(
                f"[dspark] step {step:4d}/{args.steps} loss {loss.item():.3f} conf {loss_conf.item():.3f} "
                f"top1-vs-target per depth [{acc}] {time.perf_counter() - t0:6.1f}s",
                flush=True,
            )
    model.eval()
    out = dspark_ckpt.save_dspark(
        model, args.out, k=K, verifier="../target"
    )  # relative to the checkpoint
    sha = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()[:16]
    size = (out / "model.safetensors").stat().st_size
    print(
        f"wrote {out}: {size / 1e6:.2f} MB, model.safetensors sha256 {sha}; "
        f"total {time.perf_counter() - t_all:.1f}s",
        flush=True,
    )


if __name__ == "__main__":
    main()
