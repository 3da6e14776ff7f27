"""DSpark checkpoints in the speculators layout: ``config.json`` + flat ``model.safetensors``.

Layout (``vllm-project/speculators`` ``save_pretrained``; read by vLLM's
``transformers_utils/configs/speculators`` and ``Qwen3DSparkForCausalLM.load_weights``):

``config.json``::

    speculators_model_type "dspark", architectures ["Qwen3DSparkModel"],
    sample_from_anchor, block_size, draft_vocab_size, target_hidden_size,
    aux_hidden_state_layer_ids, mask_token_id, markov_rank, markov_head_type,
    enable_confidence_head, confidence_head_with_markov,
    transformer_layer_config {model_type "qwen3", hidden_size, intermediate_size,
        num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim, rms_norm_eps,
        rope_theta, max_position_embeddings, vocab_size},
    speculators_config {algorithm, proposal_methods [{proposal_type "greedy",
        speculative_tokens k}], default_proposal_method, verifier {name_or_path, architectures}}

``model.safetensors`` (flat keys, no ``model.`` prefix): ``embed_tokens.weight [V, H]``,
``fc.weight [H, n_aux * H_t]``, ``hidden_norm.weight``, ``layers.{i}.self_attn.{q,k,v,o}_proj
.weight``, ``layers.{i}.self_attn.{q,k}_norm.weight``, ``layers.{i}.{input,post_attention}
_layernorm.weight``, ``layers.{i}.mlp.{gate,up,down}_proj.weight``, ``norm.weight``,
``lm_head.weight [V_draft, H]``, ``markov_head.markov_w1.weight [V, r]``,
``markov_head.markov_w2.weight [V_draft, r]``, ``confidence_head.proj.{weight,bias}``, and for a
reduced vocabulary ``d2t`` (int64 offsets [V_draft]) and ``t2d`` (bool [V]).

``embed_tokens``/``lm_head`` may be absent: they are then shared from the target (vLLM does the
same; a reduced vocabulary must ship its own ``lm_head``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from .dspark import DSparkConfig, DSparkDraftModel

#: speculators version string written into new checkpoints.
SPECULATORS_VERSION = "0.3.0"


def config_dict(
    cfg: DSparkConfig,
    k: int | None = None,
    verifier: str | None = None,
    verifier_arch: str = "LlamaForCausalLM",
    write_sample_from_anchor: bool = True,
) -> dict:
    """The speculators ``config.json`` of a DSpark drafter.

    Args:
        k: ``speculative_tokens`` of the greedy proposal method (default: the layout's k for
            ``block_size``).
        write_sample_from_anchor: False leaves the key out (an old checkpoint: vLLM 0.32 then
            loads it in the 1+N layout).
    """
    if k is None:
        k = cfg.block_size if cfg.sample_from_anchor else cfg.block_size - 1
    out = {
        "architectures": ["Qwen3DSparkModel"],
        "speculators_model_type": "dspark",
        "speculators_version": SPECULATORS_VERSION,
        "block_size": cfg.block_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "aux_hidden_state_layer_ids": list(cfg.aux_hidden_state_layer_ids),
        "mask_token_id": cfg.mask_token_id,
        "markov_rank": cfg.markov_rank,
        "markov_head_type": cfg.markov_head_type,
        "enable_confidence_head": cfg.enable_confidence_head,
        "confidence_head_with_markov": cfg.confidence_head_with_markov,
        "transformer_layer_config": {
            "model_type": "qwen3",
            "architectures": ["Qwen3ForCausalLM"],
            "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.num_hidden_layers,
            "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim,
            "rms_norm_eps": cfg.rms_norm_eps,
            "rope_theta": cfg.rope_theta,
            "max_position_embeddings": cfg.max_position_embeddings,
            "vocab_size": cfg.vocab_size,
            "hidden_act": "silu",
            "attention_bias": False,
            "tie_word_embeddings": False,
        },
        "speculators_config": {
            "algorithm": "dspark",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": int(k),
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": [verifier_arch]},
        },
        "torch_dtype": "float32",
    }
    if write_sample_from_anchor:
        out["sample_from_anchor"] = bool(cfg.sample_from_anchor)
    return dict(sorted(out.items()))


def config_from_dict(d: dict) -> DSparkConfig:
    """A :class:`DSparkConfig` from a speculators ``config.json`` dict.

    A missing ``sample_from_anchor`` takes speculators' default (true); vLLM 0.32 reads it as
    false (see ``spectrace inspect-draft``).
    Raises:
        ValueError: not a speculators DSpark config, or a head type this reference lacks.
    """
    if d.get("speculators_model_type") != "dspark":
        raise ValueError(
            f"not a speculators DSpark config (speculators_model_type="
            f"{d.get('speculators_model_type')!r})"
        )
    t = d.get("transformer_layer_config") or {}
    head_type = d.get("markov_head_type", "vanilla")
    if head_type != "vanilla":
        raise ValueError(
            f"markov_head_type {head_type!r}: the reference drafter implements "
            "only the vanilla head"
        )
    vocab = int(t["vocab_size"])
    return DSparkConfig(
        vocab_size=vocab,
        draft_vocab_size=int(d.get("draft_vocab_size") or vocab),
        hidden_size=int(t["hidden_size"]),
        intermediate_size=int(t["intermediate_size"]),
        num_hidden_layers=int(t["num_hidden_layers"]),
        num_attention_heads=int(t["num_attention_heads"]),
        num_key_value_heads=int(t.get("num_key_value_heads") or t["num_attention_heads"]),
        head_dim=int(t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"]),
        target_hidden_size=int(d.get("target_hidden_size") or t["hidden_size"]),
        aux_hidden_state_layer_ids=[int(a) for a in d["aux_hidden_state_layer_ids"]],
        mask_token_id=int(d["mask_token_id"]),
        block_size=int(d.get("block_size") or 8),
        sample_from_anchor=bool(d.get("sample_from_anchor", True)),
        markov_rank=int(d.get("markov_rank", 256)),
        markov_head_type=head_type,
        enable_confidence_head=bool(d.get("enable_confidence_head", True)),
        confidence_head_with_markov=bool(d.get("confidence_head_with_markov", True)),
        rms_norm_eps=float(t.get("rms_norm_eps", 1e-6)),
        rope_theta=float(
            t.get("rope_theta", (t.get("rope_parameters") or {}).get("rope_theta", 10000.0))
        ),
        max_position_embeddings=int(t.get("max_position_embeddings", 4096)),
    )


def save_dspark(
    model: DSparkDraftModel,
    out: str | os.PathLike,
    *,
    k: int | None = None,
    verifier: str | None = None,
    include_embed: bool = True,
    include_lm_head: bool = True,
    write_sample_from_anchor: bool = True,
    extra_config: dict | None = None,
) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (fp32, flat speculators keys).

    ``include_embed``/``include_lm_head`` False leave those weights out (shared from the
    target when loaded). ``extra_config`` is merged into ``config.json`` last.
    """
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = {}
    for name, t in model.state_dict().items():
        if name == "embed_tokens.weight" and not include_embed:
            continue
        if name == "lm_head.weight" and not include_lm_head:
            continue
        state[name] = t.detach().contiguous().clone()
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    os.chmod(out / "model.safetensors", 0o644)  # safetensors writes through a 0600 temp file
    cfg = config_dict(
        model.cfg, k=k, verifier=verifier, write_sample_from_anchor=write_sample_from_anchor
    )
    cfg.update(extra_config or {})
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return out


def load_dspark(path: str | os.PathLike, target: torch.nn.Module | None = None) -> DSparkDraftModel:
    """Load a speculators-layout DSpark checkpoint (fp32, eval mode).

    Args:
        target: the target LM (``LlamaForCausalLM``-like): supplies ``embed_tokens`` and
            ``lm_head`` when the checkpoint omits them.
    Raises:
        ValueError: missing weights that cannot be shared, or shape mismatches.
    """
    from safetensors.torch import load_file

    path = Path(path)
    d = json.loads((path / "config.json").read_text())
    cfg = config_from_dict(d)
    model = DSparkDraftModel(cfg)
    state = load_file(str(path / "model.safetensors"))
    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}
    if "embed_tokens.weight" not in state:
        if target is None:
            raise ValueError(f"{path}: no embed_tokens.weight and no target to share it from")
        state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().float().clone()
    if "lm_head.weight" not in state:
        if target is None or cfg.draft_vocab_size != cfg.vocab_size:
            raise ValueError(f"{path}: no lm_head.weight (a reduced vocabulary must ship one)")
        state["lm_head.weight"] = target.get_output_embeddings().weight.detach().float().clone()
    if model.confidence_head is not None and "confidence_head.proj.weight" not in state:
        model.confidence_head = None  # like vLLM: an absent head is dropped
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{path}: missing weights {missing}, unexpected {unexpected}")
    return model.eval()
