"""Checks of the drafter's modules against its config and the target: ``markov``,
``confidence``, ``aux_layers``, ``fc``, ``target_hidden`` and ``attention``.

Against vLLM 0.32 ``model_executor/models/qwen3_dspark.py`` and ``qwen3_dflash.py`` (the DSpark
backbone, Markov head, confidence head) and ``_maybe_add_hidden_state`` (which target layers
the aux hidden states tap).
"""

from __future__ import annotations

from .draft import Draft, Vocab
from .files import TensorInfo, target_layer_types
from .report import Report

#: Layer types that are not (full or sliding-window) softmax attention.
_LINEAR_TYPES = ("linear_attention", "mamba", "ssm", "gated_deltanet", "recurrent", "conv")


def check_markov(rep: Report, dr: Draft, vocab: Vocab) -> None:
    """``markov``: the head type (vLLM's Qwen3 DSpark has only the vanilla head; the gated and
    rnn heads' ``gate_proj``/``joint_proj`` have no module) and the table shapes
    ``markov_w1 [V_in, r]``, ``markov_w2 [V_draft, r]``. DSpark drafts only."""
    head_type = dr.config.get("markov_head_type", "vanilla")
    rank, tensors = dr.markov_rank, dr.tensors
    w1 = tensors.get("markov_head.markov_w1.weight")
    w2 = tensors.get("markov_head.markov_w2.weight")
    extra = sorted(
        n
        for n in tensors
        if n.startswith("markov_head.")
        and not n.startswith(("markov_head.markov_w1.", "markov_head.markov_w2."))
    )
    if head_type != "vanilla" or extra:
        rep.add(
            "markov",
            "error",
            f"markov_head_type {head_type!r}"
            + (f" with {', '.join(extra[:3])}" if extra else "")
            + ": vLLM's Qwen3 DSpark implements only the vanilla head (markov_w1/markov_w2); "
            "gate_proj/joint_proj have no module there, so loading fails",
        )
    if w1 is None or w2 is None:
        rep.add(
            "markov",
            "error",
            "markov_head.markov_w1/markov_w2 missing: vLLM's Qwen3 "
            "DSpark always builds the Markov head; its tables would stay uninitialised",
        )
        return
    r = rank if isinstance(rank, int) else w1.shape[-1]
    problems = []
    if vocab.v_in is not None and w1.shape != (vocab.v_in, r):
        problems.append(f"markov_w1 {list(w1.shape)} != [{vocab.v_in}, {r}] (input vocab, rank)")
    if vocab.v_draft is not None and w2.shape != (vocab.v_draft, r):
        problems.append(f"markov_w2 {list(w2.shape)} != [{vocab.v_draft}, {r}] (draft vocab, rank)")
    if rank is not None and not isinstance(rank, int) or r <= 0:
        problems.append(f"markov_rank {rank!r}")
    if problems:
        rep.add("markov", "error", "; ".join(problems))
    elif head_type == "vanilla" and not extra:
        rep.add(
            "markov",
            "ok",
            f"vanilla head, rank {r}: markov_w1 {list(w1.shape)} over the "
            f"target vocabulary, markov_w2 {list(w2.shape)} over the draft vocabulary",
        )


def check_confidence(rep: Report, dr: Draft) -> None:
    """``confidence``: ``enable_confidence_head`` against the weights and their shape
    ([1, hidden (+ rank with ``confidence_head_with_markov``)] + bias). DSpark drafts only."""
    d, hidden = dr.config, dr.hidden
    cw = dr.tensors.get("confidence_head.proj.weight")
    cb = dr.tensors.get("confidence_head.proj.bias")
    enabled = bool(d.get("enable_confidence_head", False))
    if cw is None:
        rep.add(
            "confidence",
            "info",
            "enabled in config.json but no weights: vLLM drops the head" if enabled else "none",
        )
        return
    with_markov = bool(d.get("confidence_head_with_markov", False))
    r = dr.markov_rank if isinstance(dr.markov_rank, int) else 0
    want = (1, (hidden or 0) + (r if with_markov else 0))
    if not enabled:
        rep.add(
            "confidence",
            "info",
            "weights present but enable_confidence_head is false: vLLM drops them",
        )
    elif cw.shape != want:
        rep.add(
            "confidence",
            "error",
            f"confidence_head.proj.weight {list(cw.shape)} != "
            f"{list(want)} (hidden {hidden}"
            + (f" + rank {r}, confidence_head_with_markov" if with_markov else "")
            + ")",
        )
    elif cb is None:
        rep.add("confidence", "warn", "confidence_head.proj.bias missing: vLLM's head has a bias")
    else:
        rep.add(
            "confidence",
            "ok",
            f"proj {list(cw.shape)} + bias"
            + (" over [hidden, markov embedding]" if with_markov else " over hidden"),
        )


def aux_layer_ids(dr: Draft) -> list | None:
    """The configured aux hidden-state ids (id a taps the output of target layer a - 1), from
    ``aux_hidden_state_layer_ids`` (or eagle's), or a dense config's target layer ids + 1."""
    d = dr.config
    if dr.model_type is not None or "aux_hidden_state_layer_ids" in d:
        return d.get("aux_hidden_state_layer_ids") or d.get("eagle_aux_hidden_state_layer_ids")
    tli = d.get("dspark_target_layer_ids") or d.get("target_layer_ids")
    return [int(i) + 1 for i in tli] if isinstance(tli, list) else None


def check_aux_layers(rep: Report, dr: Draft) -> list[int]:
    """``aux_layers``: the aux ids against the target's layer count (valid 0..L) and, for
    hybrid linear/full-attention targets, the type of each tapped layer.

    Returns:
        The aux ids (ints; empty when none are configured).
    """
    aux = aux_layer_ids(dr)
    t_layers = (dr.target or {}).get("num_hidden_layers")
    if (not isinstance(aux, list) or not aux) and dr.plain:
        rep.add("aux_layers", "ok", "none: a plain draft model reads no target features")
        return []
    if not isinstance(aux, list) or not aux:
        rep.add(
            "aux_layers",
            "error" if dr.is_dspark else "info",
            "no aux_hidden_state_layer_ids: the drafter has no target features to read",
        )
        return []
    aux = [int(a) for a in aux]
    notes, level = [], "ok"
    if len(set(aux)) != len(aux):
        notes.append("duplicate ids")
        level = "warn"
    if aux != sorted(aux):
        notes.append("not ascending")
    if t_layers is None:
        rep.add(
            "aux_layers",
            "info",
            f"ids {aux} (output of target layers "
            f"{[a - 1 for a in aux]}); no target config: layer count unknown",
        )
        return aux
    out_of = [a for a in aux if a < 0 or a > t_layers]
    if out_of:
        rep.add(
            "aux_layers",
            "error",
            f"ids {out_of} outside 0..{t_layers}: the target has "
            f"{t_layers} layers (id a taps the output of layer a - 1)",
        )
        return aux
    if 0 in aux:
        notes.append("id 0 taps the embedding output")
        level = "warn"
    hybrid = _hybrid_note(aux, dr.target, t_layers)
    if hybrid:
        notes.append(hybrid)
        level = "warn"
    rep.add(
        "aux_layers",
        level,
        f"ids {aux} of a {t_layers}-layer target (outputs of "
        f"layers {[a - 1 for a in aux]})" + (f"; {'; '.join(notes)}" if notes else ""),
    )
    return aux


def _hybrid_note(aux: list[int], tcfg: dict | None, t_layers: int) -> str | None:
    """For a hybrid linear/full-attention target: which layer each id taps, and the ids a
    reader counting only full-attention layers would use instead; None for other targets."""
    types = target_layer_types(tcfg) if tcfg is not None else None
    if not (
        types
        and len(types) >= t_layers
        and any(any(x in ty for x in _LINEAR_TYPES) for ty in types)
    ):
        return None
    full = [i for i, ty in enumerate(types[:t_layers]) if not any(x in ty for x in _LINEAR_TYPES)]
    tapped = {a: types[a - 1] for a in aux if a >= 1}
    wrong = [str(full[a - 1] + 1) if 1 <= a <= len(full) else "-" for a in aux]
    taps = ", ".join(f"{a}->{ty}" for a, ty in tapped.items())
    return (
        f"hybrid target ({t_layers - len(full)} linear-attention, {len(full)} "
        f"full-attention layers): ids count every decoder layer (vLLM's "
        f"_maybe_add_hidden_state), tapping {taps}; "
        f"ids resolved against the {len(full)} full-attention layers only "
        f"would read aux ids [{', '.join(wrong)}] instead (-: past them)"
    )


def check_fc(rep: Report, dr: Draft, aux: list[int]) -> None:
    """``fc``: ``fc.weight`` [hidden, taps x target hidden] against the number of aux ids."""
    d, tcfg, hidden = dr.config, dr.target or {}, dr.hidden
    fc = dr.tensors.get("fc.weight")
    t_hidden = d.get("target_hidden_size") or tcfg.get("hidden_size") or hidden
    if fc is None:
        if dr.is_dspark and aux:
            rep.add("fc", "error", "fc.weight missing: the aux hidden states cannot be combined")
    elif aux and t_hidden and hidden and fc.shape != (hidden, len(aux) * t_hidden):
        n_in = fc.shape[1] / t_hidden if len(fc.shape) == 2 else None
        rep.add(
            "fc",
            "error",
            f"fc.weight {list(fc.shape)} != [{hidden}, {len(aux)} x "
            f"{t_hidden}]: {len(aux)} aux ids listed"
            + (f" but fc reads {n_in:g} taps" if n_in else ""),
        )
    elif aux:
        rep.add(
            "fc", "ok", f"{list(fc.shape)} = [hidden, {len(aux)} taps x target hidden {t_hidden}]"
        )


def check_target_hidden(rep: Report, dr: Draft) -> None:
    """``target_hidden``: the config's ``target_hidden_size`` against the target's."""
    d, tcfg = dr.config, dr.target
    if (
        tcfg is not None
        and d.get("target_hidden_size") is not None
        and tcfg.get("hidden_size") is not None
        and d["target_hidden_size"] != tcfg["hidden_size"]
    ):
        rep.add(
            "target_hidden",
            "error",
            f"target_hidden_size {d['target_hidden_size']} != the "
            f"target's hidden_size {tcfg['hidden_size']}",
        )


def check_attention(rep: Report, dr: Draft) -> None:
    """``attention``: each layer's ``q_proj`` rows against heads x head_dim and
    ``attn_output_gate`` (vLLM's DSpark backbone has no output gate), and ``k_proj`` /
    ``v_proj`` / ``o_proj``."""
    lc, hidden = dr.layer, dr.hidden
    heads = lc.get("num_attention_heads")
    hd = lc.get("head_dim") or ((hidden // heads) if hidden and heads else None)
    gate = bool(lc.get("attn_output_gate", False))
    if not (heads and hd and hidden):
        return
    kv_heads = lc.get("num_key_value_heads") or heads
    q_rows = heads * hd * (2 if gate else 1)
    problems: list[str] = []
    found = 0
    for i in range(lc.get("num_hidden_layers") or 0):
        found += _check_attention_layer(problems, dr.tensors, i, heads, kv_heads, hd, hidden, gate)
    if problems:
        rep.add(
            "attention", "error", "; ".join(problems[:3]) + (" ..." if len(problems) > 3 else "")
        )
    elif gate:
        rep.add(
            "attention",
            "error",
            f"attn_output_gate=true ({found} layers with gated "
            "q_proj): vLLM's Qwen3 DSpark/DFlash backbone has no output gate and would "
            "split q_proj wrong",
        )
    elif found:
        rep.add(
            "attention",
            "ok",
            f"{found} layer{'s' * (found != 1)}: q_proj [{q_rows}, "
            f"{hidden}] = {heads} heads x {hd}, k/v {kv_heads} heads, no output gate",
        )


def _check_attention_layer(
    problems: list[str],
    tensors: dict[str, TensorInfo],
    i: int,
    heads: int,
    kv_heads: int,
    hd: int,
    hidden: int,
    gate: bool,
) -> int:
    """Append layer ``i``'s projection shape problems; return 1 if it has a ``q_proj``."""
    pre = f"layers.{i}.self_attn."
    q, kk, vv, o = (
        tensors.get(pre + x + ".weight") for x in ("q_proj", "k_proj", "v_proj", "o_proj")
    )
    if q is None:
        if tensors.get(pre + "qkv_proj.weight") is None:
            problems.append(f"layer {i}: no q_proj")
        return 0
    q_rows = heads * hd * (2 if gate else 1)
    if q.shape != (q_rows, hidden):
        why = ""
        if q.shape == (2 * heads * hd, hidden) and not gate:
            why = " (2x rows: a gated-attention q_proj, but attn_output_gate is false)"
        elif q.shape == (heads * hd, hidden) and gate:
            why = " (attn_output_gate is true but q_proj has no gate rows)"
        problems.append(
            f"layer {i}: q_proj {list(q.shape)} != [{q_rows}, {hidden}]"
            f" = heads {heads} x head_dim {hd}{' x 2 (gate)' if gate else ''}{why}"
        )
    for nm, t, want in (
        ("k_proj", kk, (kv_heads * hd, hidden)),
        ("v_proj", vv, (kv_heads * hd, hidden)),
        ("o_proj", o, (hidden, heads * hd)),
    ):
        if t is not None and t.shape != want:
            problems.append(f"layer {i}: {nm} {list(t.shape)} != {list(want)}")
    return 1
