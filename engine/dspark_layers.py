"""The DSpark draft model's configuration and building blocks (Qwen3-style): RMS norm, rotary
embedding, attention, MLP, decoder layer, and the Markov and confidence heads.

:mod:`spectrace.engine.dspark` assembles them into the draft model and drafter; the layer
shapes follow vLLM's DSpark draft model (``vllm/model_executor/models/``) and the
speculators checkpoint config.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class DSparkConfig:
    """The architecture of a DSpark drafter (a subset of the speculators config, flattened).

    Attributes:
        vocab_size: input vocabulary (the target's): ``embed_tokens`` and ``markov_w1`` rows.
        draft_vocab_size: output vocabulary of ``lm_head`` and ``markov_w2``; smaller than
            ``vocab_size`` means a reduced vocabulary with a ``d2t`` offset table.
        target_hidden_size: hidden size of the target; ``fc`` maps
            ``len(aux_hidden_state_layer_ids) * target_hidden_size`` to ``hidden_size``.
        aux_hidden_state_layer_ids: target taps (id a = output of target layer a - 1).
        mask_token_id: the input id of the mask (noise) query slots.
        block_size: trained query block (k = block_size in the anchor layout, block_size - 1
            in the 1+N layout).
        sample_from_anchor: the layout (see the module doc).
    """

    vocab_size: int
    draft_vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    target_hidden_size: int
    aux_hidden_state_layer_ids: list[int]
    mask_token_id: int
    block_size: int
    sample_from_anchor: bool = True
    markov_rank: int = 32
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool = True
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 512

    def to_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    """``x * rsqrt(mean(x^2) + eps) * weight`` over the last dim, computed in fp32."""

    def __init__(self, n: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style RoPE tables for int positions [..., T]: (cos, sin) fp32 [..., T, head_dim]."""
    inv = 1.0 / (
        theta
        ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    )
    freqs = positions.to(torch.float32)[..., None] * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, heads, d]; cos/sin [B, T, d]."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos[:, :, None, :] + rot * sin[:, :, None, :]


class Attention(nn.Module):
    def __init__(self, cfg: DSparkConfig) -> None:
        super().__init__()
        h, nh, nkv, d = (
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        )
        self.nh, self.nkv, self.d = nh, nkv, d
        self.q_proj = nn.Linear(h, nh * d, bias=False)
        self.k_proj = nn.Linear(h, nkv * d, bias=False)
        self.v_proj = nn.Linear(h, nkv * d, bias=False)
        self.o_proj = nn.Linear(nh * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)


class MLP(nn.Module):
    def __init__(self, cfg: DSparkConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DSparkConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class MarkovHead(nn.Module):
    """Vanilla Markov head: ``markov_w1`` [V_target, r] (embedding), ``markov_w2`` [V_draft, r]."""

    def __init__(self, vocab_size: int, draft_vocab_size: int, rank: int) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, draft_vocab_size, bias=False)


class ConfidenceHead(nn.Module):
    def __init__(self, input_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(input_dim, 1, bias=True)
