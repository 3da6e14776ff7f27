"""Checks of what the draft is and how vLLM loads it: ``format``, ``method``, ``layout``,
``block_size`` and ``mask_token``.

Against vLLM 0.32 ``transformers_utils/configs/speculators/algos.py:update_dspark`` and
speculators ``src/speculators/models/dspark``. Each check appends its verdicts to the report.
"""

from __future__ import annotations

import numpy as np

from .draft import Draft, Vocab
from .report import Report


def check_format(rep: Report, dr: Draft) -> None:
    """``format``: config.json and the weight files; tensor count, values and dtypes."""
    tensors = dr.tensors
    dtypes = sorted({t.dtype for t in tensors.values()})
    n_params = sum(int(np.prod(t.shape)) if t.shape else 1 for t in tensors.values())
    rep.add(
        "format",
        "ok",
        f"config.json + {', '.join(dr.files)} ({len(tensors)} tensors, "
        f"{n_params / 1e6:.2f} M values, {'/'.join(dtypes)}); headers only"
        + (f"; target {dr.target_path} ({dr.target_note})" if dr.target_note else ""),
    )


def check_method(rep: Report, dr: Draft) -> None:
    """``method``: the speculators model type (or a dense DSpark config, or a plain draft
    model) and the architecture vLLM loads it as."""
    d, smt, archs = dr.config, dr.model_type, dr.architectures
    if smt == "dspark":
        vllm_arch = [a for a in archs if a in ("Qwen3DSparkModel", "Qwen3OmniDSparkModel")] or [
            "Qwen3DSparkModel"
        ]
        rep.add(
            "method",
            "ok",
            f"dspark (speculators {d.get('speculators_version', '?')}), "
            f"architectures {archs or 'none'} -> vLLM loads {vllm_arch[0]}",
        )
        if dr.transformer_layer_config is None:
            rep.add(
                "method",
                "error",
                "speculators config without transformer_layer_config: "
                "vLLM's SpeculatorsConfig refuses it",
            )
    elif dr.dense:
        rep.add(
            "method",
            "ok",
            f"dspark (dense config, model_type {d.get('model_type')!r}), "
            f"architectures {archs or 'none'} -> vLLM loads Qwen3DSparkModel",
        )
    elif dr.plain:
        rep.add(
            "method",
            "ok",
            f"plain draft model (model_type {d.get('model_type')!r}, architectures {archs}): "
            f"a standalone causal LM that vLLM runs with method 'draft_model', reading no "
            f"target features; checked for it: vocabulary and tokenizer equal to the "
            f"target's, no d2t, context length, attention, embed_tokens, lm_head",
        )
    elif smt is not None:
        rep.add(
            "method",
            "warn",
            f"speculators_model_type {smt!r}: not DSpark; only the generic "
            "checks (vocabulary, d2t, aux layers, attention, embeddings) apply",
        )
    else:
        rep.add(
            "method",
            "error",
            "neither a speculators config (speculators_model_type), a dense DSpark config "
            "(dspark_* keys) nor a plain causal LM (architectures *ForCausalLM): unknown "
            "draft format",
        )


def check_layout(rep: Report, dr: Draft) -> bool:
    """``layout``: ``sample_from_anchor``. A speculators checkpoint without it is drafted in the
    anchor layout by speculators (default true) but loaded in the 1+N layout by vLLM
    (``config_dict.get("sample_from_anchor", False)``): every draft shifts one slot.

    Returns:
        sample_from_anchor as the draft was trained (True: N query slots, the anchor predicts
        draft 0; False: the 1+N fill-in block).
    """
    d = dr.config
    if dr.model_type == "dspark":
        if "sample_from_anchor" not in d:
            rep.add(
                "layout",
                "warn",
                "sample_from_anchor missing: speculators drafts such a "
                "checkpoint in the anchor layout (default true), but vLLM 0.32 loads a "
                "speculators checkpoint without it in the 1+N layout "
                "(sample_from_anchor=false): every draft shifts one slot; write it explicitly",
            )
            return True
        sfa = bool(d["sample_from_anchor"])
        rep.add(
            "layout",
            "ok",
            "sample_from_anchor=true: N query slots, the anchor predicts draft 0"
            if sfa
            else "sample_from_anchor=false: the 1+N fill-in block, the "
            "anchor is the bonus slot and mask j predicts draft j",
        )
        return sfa
    if dr.dense:
        bonus = d.get("dspark_bonus_anchor")
        sfa = not bool(bonus) if bonus is not None else bool(d.get("sample_from_anchor", True))
        how = (
            "(dspark_bonus_anchor)"
            if bonus is not None
            else "(explicit)"
            if "sample_from_anchor" in d
            else "(vLLM's default for dense configs)"
        )
        rep.add(
            "layout",
            "ok" if bonus is not None or "sample_from_anchor" in d else "info",
            f"sample_from_anchor={str(sfa).lower()} " + how,
        )
        return sfa
    return bool(d.get("sample_from_anchor", False))


def check_block_size(rep: Report, dr: Draft, k: int | None, sfa: bool) -> None:
    """``block_size`` against k (``--k``, else ``speculative_tokens``): k = block_size in the
    anchor layout (``sfa``), block_size - 1 in the 1+N layout. DSpark drafts only."""
    d = dr.config
    bs = d.get("block_size") or d.get("dspark_block_size")
    methods = (d.get("speculators_config") or {}).get("proposal_methods") or [{}]
    k_cfg = methods[0].get("speculative_tokens") if isinstance(methods[0], dict) else None
    k_eff, k_src = (
        (k, "--k") if k is not None else (k_cfg, "speculative_tokens") if k_cfg else (None, None)
    )
    if not isinstance(bs, int) or bs <= 0:
        rep.add(
            "block_size",
            "warn",
            "no block_size: speculators' default is 8; vLLM takes k from the serving config",
        )
        return
    trained = bs if sfa else bs - 1
    shape = f"block_size {bs} ({'N slots' if sfa else '1+N: anchor + ' + str(bs - 1) + ' masks'})"
    if k_eff is None:
        rep.add("block_size", "info", f"{shape}: k = {trained} expected; no k given")
    elif k_eff > trained:
        rep.add(
            "block_size",
            "error",
            f"k {k_eff} ({k_src}) > {trained} drafts the {shape} was trained for",
        )
    elif k_eff < trained:
        rep.add(
            "block_size",
            "warn",
            f"k {k_eff} ({k_src}) < {trained} of the trained "
            f"{shape}: the non-causal query block is narrower than in training",
        )
    else:
        rep.add("block_size", "ok", f"k {k_eff} ({k_src}) = the {trained} drafts of {shape}")


def check_mask_token(rep: Report, dr: Draft, vocab: Vocab) -> None:
    """``mask_token``: the id of the mask query slots, inside the input vocabulary. DSpark
    drafts only."""
    d, v_in = dr.config, vocab.v_in
    mask = d.get("mask_token_id", d.get("dspark_noise_token_id"))
    if mask is None:
        rep.add("mask_token", "error", "no mask_token_id: vLLM has no id for the mask query slots")
    elif isinstance(mask, int) and not isinstance(mask, bool) and mask >= 0 and v_in is None:
        rep.add("mask_token", "info", f"mask_token_id {mask}; input vocabulary unknown (see vocab)")
    elif not isinstance(mask, int) or v_in is None or not 0 <= mask < v_in:
        rep.add(
            "mask_token",
            "error",
            f"mask_token_id {mask!r} outside the input vocabulary [0, {v_in})",
        )
    else:
        rep.add("mask_token", "ok", f"mask_token_id {mask}")
