"""``spectrace inspect-draft``: check a DSpark draft checkpoint before vLLM loads it.

Reads ``config.json`` and the safetensors headers only (the 8-byte length + JSON header of each
``*.safetensors`` file, or the shards named by ``model.safetensors.index.json``); the only
tensor data read are the small index tables ``d2t`` and ``t2d``. No torch, no weights.

Each check yields one :class:`Verdict` (``ok``, ``info``, ``warn`` or ``error``). What is
checked, against vLLM 0.32 (``transformers_utils/configs/speculators/algos.py:update_dspark``,
``model_executor/models/qwen3_dspark.py``, ``qwen3_dflash.py``) and speculators
(``src/speculators/models/dspark``):

* ``format``: config.json and the weight files; tensor count and dtypes.
* ``method``: ``speculators_model_type`` (or a dense DSpark config) and the architecture vLLM
  loads it as.
* ``layout``: ``sample_from_anchor``. A speculators checkpoint without it is drafted in the
  anchor layout by speculators (default true) but loaded in the 1+N layout by vLLM
  (``config_dict.get("sample_from_anchor", False)``): every draft shifts one slot.
* ``vocab``: input vocabulary (``transformer_layer_config.vocab_size``) and draft vocabulary
  against the target's.
* ``d2t`` / ``t2d``: present when the draft vocabulary is reduced; ``target = i + d2t[i]`` in
  range and without duplicates; ``t2d`` marks exactly those targets. A ``d2t`` in a
  full-vocabulary checkpoint has no parameter in vLLM (the load fails).
* ``markov``: head type (vLLM's Qwen3 DSpark has only the vanilla head; ``gate_proj`` /
  ``joint_proj`` weights of the gated and rnn heads have no module) and the table shapes
  ``markov_w1 [V_in, r]``, ``markov_w2 [V_draft, r]``.
* ``confidence``: ``enable_confidence_head`` against the weights and their shape.
* ``aux_layers``: ``aux_hidden_state_layer_ids`` against the target's layer count (id a taps
  the output of target layer a - 1; valid 0..L) and, for hybrid linear/full-attention
  targets, the type of each tapped layer; ``fc.weight`` against the number of taps.
* ``attention``: ``q_proj`` rows against heads x head_dim and ``attn_output_gate`` (vLLM's
  DSpark backbone has no output gate), ``k_proj``/``v_proj``/``o_proj``.
* ``block_size``: against k (``speculative_tokens``, or ``--k``): k = block_size in the
  anchor layout, block_size - 1 in the 1+N layout.
* ``embed_tokens`` / ``lm_head``: own or shared from the target, and their shapes.
* ``mask_token``, ``target_hidden``: the mask token id and the target's hidden size.

Exit status of the command: 0 without an error verdict, 1 with one, 2 on unreadable input.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .errors import InputError

SCHEMA = "spectrace.inspect-draft/1"
LEVELS = ("ok", "info", "warn", "error")

_NP_DTYPES = {"I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?",
              "F64": "<f8", "F32": "<f4", "F16": "<f2"}
_INT_DTYPES = ("I64", "I32", "I16", "I8", "U8")
#: Layer types that are not (full or sliding-window) softmax attention.
_LINEAR_TYPES = ("linear_attention", "mamba", "ssm", "gated_deltanet", "recurrent", "conv")


@dataclass
class Verdict:
    """One line of the report: a check name, a level and a plain sentence."""

    check: str
    level: str
    message: str

    def to_json(self) -> dict:
        return {"check": self.check, "level": self.level, "message": self.message}


@dataclass
class Report:
    """All verdicts for one checkpoint."""

    checkpoint: str
    target: str | None
    verdicts: list[Verdict] = field(default_factory=list)

    def add(self, check: str, level: str, message: str) -> None:
        assert level in LEVELS, level
        self.verdicts.append(Verdict(check, level, message))

    @property
    def errors(self) -> int:
        return sum(v.level == "error" for v in self.verdicts)

    @property
    def warnings(self) -> int:
        return sum(v.level == "warn" for v in self.verdicts)

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "checkpoint": self.checkpoint, "target": self.target,
                "errors": self.errors, "warnings": self.warnings,
                "verdicts": [v.to_json() for v in self.verdicts]}

    def text(self) -> str:
        lines = [f"checkpoint {self.checkpoint}" + (f"  (target {self.target})" if self.target else "")]
        for v in self.verdicts:
            lines.append(f"  {v.level.upper() if v.level == 'error' else v.level:<5}  {v.check:<13} {v.message}")
        lines.append(f"verdict: {self.errors} error{'s' * (self.errors != 1)}, "
                     f"{self.warnings} warning{'s' * (self.warnings != 1)}")
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# safetensors headers
# --------------------------------------------------------------------------------------------


@dataclass
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]
    file: Path
    begin: int  # absolute byte offset of the data in the file
    end: int


def read_header(path: Path) -> dict[str, TensorInfo]:
    """The tensors of one ``.safetensors`` file, from its header only.

    Raises:
        InputError: not a safetensors file.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise InputError(f"{path}: not a safetensors file (too short)")
            (n,) = struct.unpack("<Q", raw)
            if n > 100_000_000:
                raise InputError(f"{path}: not a safetensors file (header length {n})")
            header = json.loads(f.read(n))
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: cannot read the safetensors header ({exc})") from None
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        b, e = v["data_offsets"]
        out[name] = TensorInfo(v["dtype"], tuple(int(x) for x in v["shape"]), path, 8 + n + b, 8 + n + e)
    return out


def read_small(t: TensorInfo) -> np.ndarray:
    """The data of one small tensor (d2t, t2d): reads only its byte range."""
    dt = _NP_DTYPES.get(t.dtype)
    if dt is None:
        raise InputError(f"{t.file}: cannot read a {t.dtype} tensor")
    with open(t.file, "rb") as f:
        f.seek(t.begin)
        buf = f.read(t.end - t.begin)
    return np.frombuffer(buf, dtype=dt).reshape(t.shape)


def read_tensors(ckpt: Path) -> tuple[dict[str, TensorInfo], list[str]]:
    """All tensors of a checkpoint folder (single file, shards, or every ``*.safetensors``).

    Returns:
        (name -> info with a leading ``model.`` stripped, the weight file names).
    """
    index = ckpt / "model.safetensors.index.json"
    if index.exists():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError) as exc:
            raise InputError(f"{index}: unreadable index ({exc})") from None
    else:
        files = sorted(p.name for p in ckpt.glob("*.safetensors"))
    tensors: dict[str, TensorInfo] = {}
    for name in files:
        for k, v in read_header(ckpt / name).items():
            tensors[k[len("model."):] if k.startswith("model.") else k] = v
    return tensors, files


def _load_config(path: Path) -> dict:
    try:
        d = json.loads(path.read_text())
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise InputError(f"{path}: not JSON ({exc})") from None
    if not isinstance(d, dict):
        raise InputError(f"{path}: not a JSON object")
    return d


def _text_config(d: dict) -> dict:
    """The language-model part of an HF config (``text_config`` of multimodal models)."""
    for key in ("text_config", "thinker_config"):
        sub = d.get(key)
        if isinstance(sub, dict):
            return _text_config(sub) if "text_config" in sub else sub
    return d


def target_layer_types(t: dict) -> list[str] | None:
    """Per-layer type names of a target config (``layer_types``, ``layers_block_type`` or a
    ``full_attention_interval``), or None when the config names none (all attention)."""
    n = t.get("num_hidden_layers")
    for key in ("layer_types", "layers_block_type"):
        v = t.get(key)
        if isinstance(v, list) and v:
            return [str(x) for x in v]
    interval = t.get("full_attention_interval")
    if isinstance(interval, int) and interval > 0 and isinstance(n, int):
        return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    return None


# --------------------------------------------------------------------------------------------
# the checks
# --------------------------------------------------------------------------------------------


def inspect_draft(ckpt_dir: str | os.PathLike, target_dir: str | os.PathLike | None = None,
                  k: int | None = None) -> Report:
    """Inspect a draft checkpoint folder; see the module doc for the checks.

    Args:
        ckpt_dir: folder with ``config.json`` and safetensors weights.
        target_dir: the target model folder (its ``config.json``), or None: then the verifier
            path in the config is tried, else target facts are taken from the draft config.
        k: drafts per step to check against the block size (default: the config's
            ``speculative_tokens``).
    Raises:
        InputError: no readable ``config.json`` or weights.
    """
    ckpt = Path(ckpt_dir)
    if not ckpt.is_dir():
        raise InputError(f"{ckpt}: not a directory")
    d = _load_config(ckpt / "config.json")
    tensors, files = read_tensors(ckpt)
    if not files:
        raise InputError(f"{ckpt}: no .safetensors weights")

    # -- target config ------------------------------------------------------------------------
    tpath = Path(target_dir) if target_dir else None
    t_note = None
    if tpath is None:
        ver = ((d.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
        for cand in ([Path(ver), ckpt / ver, ckpt.parent / ver] if isinstance(ver, str) and ver else []):
            if (cand / "config.json").is_file():
                tpath, t_note = cand, "from the config's verifier name_or_path"
                break
    tcfg = _text_config(_load_config(tpath / "config.json")) if tpath else None
    rep = Report(str(ckpt), str(tpath) if tpath else None)

    # -- format, method ------------------------------------------------------------------------
    dtypes = sorted({t.dtype for t in tensors.values()})
    n_params = sum(int(np.prod(t.shape)) if t.shape else 1 for t in tensors.values())
    rep.add("format", "ok", f"config.json + {', '.join(files)} ({len(tensors)} tensors, "
            f"{n_params / 1e6:.2f} M values, {'/'.join(dtypes)}); headers only"
            + (f"; target {tpath} ({t_note})" if t_note else ""))

    smt = d.get("speculators_model_type")
    archs = list(d.get("architectures") or [])
    tl = d.get("transformer_layer_config") if isinstance(d.get("transformer_layer_config"), dict) else None
    dense = smt is None and (any("DSpark" in a for a in archs) or any(key.startswith("dspark_") for key in d))
    lc = tl if tl is not None else d  # layer config: speculators nest it, dense configs do not
    if smt == "dspark":
        vllm_arch = [a for a in archs if a in ("Qwen3DSparkModel", "Qwen3OmniDSparkModel")] or ["Qwen3DSparkModel"]
        rep.add("method", "ok", f"dspark (speculators {d.get('speculators_version', '?')}), "
                f"architectures {archs or 'none'} -> vLLM loads {vllm_arch[0]}")
        if tl is None:
            rep.add("method", "error", "speculators config without transformer_layer_config: "
                    "vLLM's SpeculatorsConfig refuses it")
    elif dense:
        rep.add("method", "ok", f"dspark (dense config, model_type {d.get('model_type')!r}), "
                f"architectures {archs or 'none'} -> vLLM loads Qwen3DSparkModel")
    elif smt is not None:
        rep.add("method", "warn", f"speculators_model_type {smt!r}: not DSpark; only the generic "
                "checks (vocabulary, d2t, aux layers, attention, embeddings) apply")
    else:
        rep.add("method", "error", "neither a speculators config (speculators_model_type) nor a "
                "dense DSpark config (dspark_* keys): unknown draft format")
    is_dspark = smt == "dspark" or dense

    # -- layout ------------------------------------------------------------------------------
    if smt == "dspark":
        if "sample_from_anchor" in d:
            sfa = bool(d["sample_from_anchor"])
            rep.add("layout", "ok", "sample_from_anchor=true: N query slots, the anchor predicts "
                    "draft 0" if sfa else "sample_from_anchor=false: the 1+N fill-in block, the "
                    "anchor is the bonus slot and mask j predicts draft j")
        else:
            sfa = True
            rep.add("layout", "warn", "sample_from_anchor missing: speculators drafts such a "
                    "checkpoint in the anchor layout (default true), but vLLM 0.32 loads a "
                    "speculators checkpoint without it in the 1+N layout "
                    "(sample_from_anchor=false): every draft shifts one slot; write it explicitly")
    elif dense:
        bonus = d.get("dspark_bonus_anchor")
        sfa = not bool(bonus) if bonus is not None else bool(d.get("sample_from_anchor", True))
        rep.add("layout", "ok" if bonus is not None or "sample_from_anchor" in d else "info",
                f"sample_from_anchor={str(sfa).lower()} "
                + ("(dspark_bonus_anchor)" if bonus is not None else
                   "(explicit)" if "sample_from_anchor" in d else "(vLLM's default for dense configs)"))
    else:
        sfa = bool(d.get("sample_from_anchor", False))

    # -- vocabularies ------------------------------------------------------------------------
    v_in = lc.get("vocab_size")
    v_draft = d.get("draft_vocab_size") or v_in
    v_target = (tcfg or {}).get("vocab_size") or v_in
    if not isinstance(v_in, int) or not isinstance(v_draft, int):
        rep.add("vocab", "error", "no vocab_size in the layer config: vocabularies unknown")
        v_in = v_draft = v_target = None
    else:
        src = "target config" if tcfg else "draft config (no target given)"
        if v_in < v_target:
            rep.add("vocab", "error", f"input vocabulary {v_in} < target vocabulary {v_target}: "
                    "anchors and drafts with larger ids index past markov_w1/embed_tokens")
        elif v_draft > v_target:
            rep.add("vocab", "warn", f"draft vocabulary {v_draft} > target vocabulary {v_target}: "
                    "vLLM maps it identically (no d2t); ids >= the target vocabulary are invalid")
        elif v_draft < v_target:
            rep.add("vocab", "ok", f"reduced draft vocabulary {v_draft} of {v_target} target ids "
                    f"({src}); input vocabulary {v_in}")
        else:
            rep.add("vocab", "ok", f"full vocabulary {v_draft} (= target, {src})")
    reduced = v_draft is not None and v_target is not None and v_draft < v_target

    # -- d2t / t2d ---------------------------------------------------------------------------
    d2t_ti, t2d_ti = tensors.get("d2t"), tensors.get("t2d")
    targets = None
    if reduced and d2t_ti is None:
        rep.add("d2t", "error", f"reduced vocabulary without d2t: vLLM refuses the checkpoint, and "
                f"unmapped draft ids would land in [0, {v_draft})")
    elif not reduced and d2t_ti is not None:
        rep.add("d2t", "error", "d2t in a full-vocabulary checkpoint: vLLM's Qwen3 DSpark has no "
                "draft_id_to_target_id parameter then, so loading fails")
    elif d2t_ti is None:
        rep.add("d2t", "ok", "none (full vocabulary, draft ids are target ids)")
    elif d2t_ti.dtype not in _INT_DTYPES or d2t_ti.shape != (v_draft,):
        rep.add("d2t", "error", f"d2t is {d2t_ti.dtype} {list(d2t_ti.shape)}; expected integer "
                f"offsets [{v_draft}]")
    else:
        off = read_small(d2t_ti).astype(np.int64)
        targets = np.arange(len(off)) + off
        bad = np.flatnonzero((targets < 0) | (targets >= v_target))
        uniq = np.unique(targets)
        absolute = (bad.size and (off >= 0).all() and (off < v_target).all()
                    and np.unique(off).size == off.size)
        if bad.size:
            rep.add("d2t", "error", f"{bad.size} of {len(off)} offsets map outside [0, {v_target}) "
                    f"(first: draft id {int(bad[0])} -> {int(targets[bad[0]])})"
                    + ("; d2t looks like absolute target ids, not offsets (target = id + d2t[id])"
                       if absolute else ""))
            targets = None  # t2d cannot be compared with out-of-range targets
        elif uniq.size != targets.size:
            rep.add("d2t", "error", f"{targets.size - uniq.size} duplicate targets: several draft "
                    "ids map to the same target id")
        else:
            order = "ascending" if (np.diff(targets) > 0).all() else "not ascending"
            rep.add("d2t", "ok", f"{len(off)} offsets, targets in [{int(targets.min())}, "
                    f"{int(targets.max())}], unique, {order}")
    if t2d_ti is not None:
        if t2d_ti.shape != (v_target,) or t2d_ti.dtype not in ("BOOL", "U8"):
            rep.add("t2d", "error", f"t2d is {t2d_ti.dtype} {list(t2d_ti.shape)}; expected bool "
                    f"[{v_target}]")
        else:
            mask = read_small(t2d_ti).astype(bool)
            if targets is not None and not np.array_equal(np.flatnonzero(mask), np.unique(targets)):
                rep.add("t2d", "error", f"t2d marks {int(mask.sum())} target ids that do not match "
                        f"d2t's {np.unique(targets).size} distinct targets (vLLM ignores t2d; training used it)")
            else:
                rep.add("t2d", "ok", f"{int(mask.sum())} target ids marked"
                        + (", consistent with d2t" if targets is not None else "")
                        + " (training only: vLLM drops t2d)")
    elif reduced:
        rep.add("t2d", "info", "no t2d (training only; vLLM does not need it)")

    # -- Markov head -------------------------------------------------------------------------
    if is_dspark:
        head_type = d.get("markov_head_type", "vanilla")
        rank = d.get("markov_rank")
        w1, w2 = tensors.get("markov_head.markov_w1.weight"), tensors.get("markov_head.markov_w2.weight")
        extra = sorted(n for n in tensors if n.startswith("markov_head.")
                       and not n.startswith(("markov_head.markov_w1.", "markov_head.markov_w2.")))
        if head_type != "vanilla" or extra:
            rep.add("markov", "error", f"markov_head_type {head_type!r}"
                    + (f" with {', '.join(extra[:3])}" if extra else "")
                    + ": vLLM's Qwen3 DSpark implements only the vanilla head (markov_w1/markov_w2); "
                    "gate_proj/joint_proj have no module there, so loading fails")
        if w1 is None or w2 is None:
            rep.add("markov", "error", "markov_head.markov_w1/markov_w2 missing: vLLM's Qwen3 DSpark "
                    "always builds the Markov head; its tables would stay uninitialised")
        else:
            r = rank if isinstance(rank, int) else w1.shape[-1]
            problems = []
            if v_in is not None and w1.shape != (v_in, r):
                problems.append(f"markov_w1 {list(w1.shape)} != [{v_in}, {r}] (input vocab, rank)")
            if v_draft is not None and w2.shape != (v_draft, r):
                problems.append(f"markov_w2 {list(w2.shape)} != [{v_draft}, {r}] (draft vocab, rank)")
            if rank is not None and not isinstance(rank, int) or r <= 0:
                problems.append(f"markov_rank {rank!r}")
            if problems:
                rep.add("markov", "error", "; ".join(problems))
            elif head_type == "vanilla" and not extra:
                rep.add("markov", "ok", f"vanilla head, rank {r}: markov_w1 {list(w1.shape)} over the "
                        f"target vocabulary, markov_w2 {list(w2.shape)} over the draft vocabulary")

        # -- confidence head ---------------------------------------------------------------------
        cw, cb = tensors.get("confidence_head.proj.weight"), tensors.get("confidence_head.proj.bias")
        enabled = bool(d.get("enable_confidence_head", False))
        hidden = lc.get("hidden_size")
        if cw is None:
            rep.add("confidence", "info", "enabled in config.json but no weights: vLLM drops the head"
                    if enabled else "none")
        else:
            with_markov = bool(d.get("confidence_head_with_markov", False))
            r = rank if isinstance(rank, int) else 0
            want = (1, (hidden or 0) + (r if with_markov else 0))
            if not enabled:
                rep.add("confidence", "info", "weights present but enable_confidence_head is false: "
                        "vLLM drops them")
            elif cw.shape != want:
                rep.add("confidence", "error", f"confidence_head.proj.weight {list(cw.shape)} != "
                        f"{list(want)} (hidden {hidden}"
                        + (f" + rank {r}, confidence_head_with_markov" if with_markov else "") + ")")
            elif cb is None:
                rep.add("confidence", "warn", "confidence_head.proj.bias missing: vLLM's head has a bias")
            else:
                rep.add("confidence", "ok", f"proj {list(cw.shape)} + bias"
                        + (" over [hidden, markov embedding]" if with_markov else " over hidden"))

    # -- aux layers / fc ---------------------------------------------------------------------
    if smt is not None or "aux_hidden_state_layer_ids" in d:
        aux = d.get("aux_hidden_state_layer_ids") or d.get("eagle_aux_hidden_state_layer_ids")
    else:
        tli = d.get("dspark_target_layer_ids") or d.get("target_layer_ids")
        aux = [int(i) + 1 for i in tli] if isinstance(tli, list) else None
    t_layers = (tcfg or {}).get("num_hidden_layers")
    if not isinstance(aux, list) or not aux:
        rep.add("aux_layers", "error" if is_dspark else "info",
                "no aux_hidden_state_layer_ids: the drafter has no target features to read")
        aux = []
    else:
        aux = [int(a) for a in aux]
        notes, level = [], "ok"
        if len(set(aux)) != len(aux):
            notes.append("duplicate ids")
            level = "warn"
        if aux != sorted(aux):
            notes.append("not ascending")
        if t_layers is None:
            rep.add("aux_layers", "info", f"ids {aux} (output of target layers "
                    f"{[a - 1 for a in aux]}); no target config: layer count unknown")
        else:
            out_of = [a for a in aux if a < 0 or a > t_layers]
            if out_of:
                rep.add("aux_layers", "error", f"ids {out_of} outside 0..{t_layers}: the target has "
                        f"{t_layers} layers (id a taps the output of layer a - 1)")
            else:
                if 0 in aux:
                    notes.append("id 0 taps the embedding output")
                    level = "warn"
                types = target_layer_types(tcfg)
                if types and len(types) >= t_layers and any(
                        any(x in ty for x in _LINEAR_TYPES) for ty in types):
                    full = [i for i, ty in enumerate(types[:t_layers]) if not any(x in ty for x in _LINEAR_TYPES)]
                    tapped = {a: types[a - 1] for a in aux if a >= 1}
                    wrong = [str(full[a - 1] + 1) if 1 <= a <= len(full) else "-" for a in aux]
                    level = "warn"
                    notes.append(f"hybrid target ({t_layers - len(full)} linear-attention, {len(full)} "
                                 f"full-attention layers): ids count every decoder layer (vLLM's "
                                 f"_maybe_add_hidden_state), tapping {', '.join(f'{a}->{ty}' for a, ty in tapped.items())}; "
                                 f"ids resolved against the {len(full)} full-attention layers only "
                                 f"would read aux ids [{', '.join(wrong)}] instead (-: past them)")
                rep.add("aux_layers", level, f"ids {aux} of a {t_layers}-layer target (outputs of "
                        f"layers {[a - 1 for a in aux]})" + (f"; {'; '.join(notes)}" if notes else ""))
    fc = tensors.get("fc.weight")
    t_hidden = d.get("target_hidden_size") or (tcfg or {}).get("hidden_size") or lc.get("hidden_size")
    hidden = lc.get("hidden_size")
    if fc is None:
        if is_dspark and aux:
            rep.add("fc", "error", "fc.weight missing: the aux hidden states cannot be combined")
    elif aux and t_hidden and hidden and fc.shape != (hidden, len(aux) * t_hidden):
        n_in = fc.shape[1] / t_hidden if len(fc.shape) == 2 else None
        rep.add("fc", "error", f"fc.weight {list(fc.shape)} != [{hidden}, {len(aux)} x {t_hidden}]: "
                f"{len(aux)} aux ids listed" + (f" but fc reads {n_in:g} taps" if n_in else ""))
    elif aux:
        rep.add("fc", "ok", f"{list(fc.shape)} = [hidden, {len(aux)} taps x target hidden {t_hidden}]")
    if tcfg is not None and d.get("target_hidden_size") is not None and \
            tcfg.get("hidden_size") is not None and d["target_hidden_size"] != tcfg["hidden_size"]:
        rep.add("target_hidden", "error", f"target_hidden_size {d['target_hidden_size']} != the "
                f"target's hidden_size {tcfg['hidden_size']}")

    # -- attention shapes --------------------------------------------------------------------
    heads, kv_heads = lc.get("num_attention_heads"), lc.get("num_key_value_heads") or lc.get("num_attention_heads")
    hd = lc.get("head_dim") or ((hidden // heads) if hidden and heads else None)
    gate = bool(lc.get("attn_output_gate", False))
    n_layers = lc.get("num_hidden_layers")
    if heads and hd and hidden:
        q_rows = heads * hd * (2 if gate else 1)
        problems = []
        found = 0
        for i in range(n_layers or 0):
            pre = f"layers.{i}.self_attn."
            q, kk, vv, o = (tensors.get(pre + x + ".weight") for x in ("q_proj", "k_proj", "v_proj", "o_proj"))
            if q is None:
                if tensors.get(pre + "qkv_proj.weight") is None:
                    problems.append(f"layer {i}: no q_proj")
                continue
            found += 1
            if q.shape != (q_rows, hidden):
                why = ""
                if q.shape == (2 * heads * hd, hidden) and not gate:
                    why = " (2x rows: a gated-attention q_proj, but attn_output_gate is false)"
                elif q.shape == (heads * hd, hidden) and gate:
                    why = " (attn_output_gate is true but q_proj has no gate rows)"
                problems.append(f"layer {i}: q_proj {list(q.shape)} != [{q_rows}, {hidden}]"
                                f" = heads {heads} x head_dim {hd}{' x 2 (gate)' if gate else ''}{why}")
            for nm, t, want in (("k_proj", kk, (kv_heads * hd, hidden)), ("v_proj", vv, (kv_heads * hd, hidden)),
                                ("o_proj", o, (hidden, heads * hd))):
                if t is not None and t.shape != want:
                    problems.append(f"layer {i}: {nm} {list(t.shape)} != {list(want)}")
        if problems:
            rep.add("attention", "error", "; ".join(problems[:3]) + (" ..." if len(problems) > 3 else ""))
        elif gate:
            rep.add("attention", "error", f"attn_output_gate=true ({found} layers with gated q_proj): "
                    "vLLM's Qwen3 DSpark/DFlash backbone has no output gate and would split q_proj wrong")
        elif found:
            rep.add("attention", "ok", f"{found} layer{'s' * (found != 1)}: q_proj [{q_rows}, {hidden}] = "
                    f"{heads} heads x {hd}, k/v {kv_heads} heads, no output gate")

    # -- block size vs k ---------------------------------------------------------------------
    if is_dspark:
        bs = d.get("block_size") or d.get("dspark_block_size")
        methods = (d.get("speculators_config") or {}).get("proposal_methods") or [{}]
        k_cfg = methods[0].get("speculative_tokens") if isinstance(methods[0], dict) else None
        k_eff, k_src = (k, "--k") if k is not None else (k_cfg, "speculative_tokens") if k_cfg else (None, None)
        if not isinstance(bs, int) or bs <= 0:
            rep.add("block_size", "warn", "no block_size: speculators' default is 8; vLLM takes k from "
                    "the serving config")
        else:
            trained = bs if sfa else bs - 1
            shape = f"block_size {bs} ({'N slots' if sfa else '1+N: anchor + ' + str(bs - 1) + ' masks'})"
            if k_eff is None:
                rep.add("block_size", "info", f"{shape}: k = {trained} expected; no k given")
            elif k_eff > trained:
                rep.add("block_size", "error", f"k {k_eff} ({k_src}) > {trained} drafts the {shape} "
                        "was trained for")
            elif k_eff < trained:
                rep.add("block_size", "warn", f"k {k_eff} ({k_src}) < {trained} of the trained {shape}: "
                        "the non-causal query block is narrower than in training")
            else:
                rep.add("block_size", "ok", f"k {k_eff} ({k_src}) = the {trained} drafts of {shape}")

    # -- embeddings / lm_head ----------------------------------------------------------------
    emb, head = tensors.get("embed_tokens.weight"), tensors.get("lm_head.weight")
    if emb is not None:
        want = (v_in, hidden)
        rep.add("embed_tokens", "ok" if emb.shape == want else "error",
                f"own {list(emb.shape)}" + ("" if emb.shape == want else f" != [input vocab {v_in}, hidden {hidden}]"))
    elif v_in is not None and v_target is not None and v_in > v_target:
        rep.add("embed_tokens", "error", f"missing with an input vocabulary ({v_in}) larger than the "
                "target's: vLLM requires its own embed_tokens")
    else:
        ok_share = tcfg is None or tcfg.get("hidden_size") in (None, hidden)
        rep.add("embed_tokens", "info" if ok_share else "error", "not in the checkpoint: shared from the "
                "target" + ("" if ok_share else f", whose hidden size {tcfg.get('hidden_size')} != {hidden}"))
    if head is not None:
        want = (v_draft, hidden)
        rep.add("lm_head", "ok" if head.shape == want else "error",
                f"own {list(head.shape)}" + ("" if head.shape == want else f" != [draft vocab {v_draft}, hidden {hidden}]"))
    elif reduced:
        rep.add("lm_head", "error", "missing with a reduced vocabulary: vLLM requires the draft's own "
                "lm_head (the target's full one cannot be shared)")
    else:
        ok_share = tcfg is None or tcfg.get("hidden_size") in (None, hidden)
        rep.add("lm_head", "info" if ok_share else "error", "not in the checkpoint: shared from the "
                "target" + ("" if ok_share else f", whose hidden size {tcfg.get('hidden_size')} != {hidden}"))

    # -- mask token --------------------------------------------------------------------------
    if is_dspark:
        mask = d.get("mask_token_id", d.get("dspark_noise_token_id"))
        if mask is None:
            rep.add("mask_token", "error", "no mask_token_id: vLLM has no id for the mask query slots")
        elif not isinstance(mask, int) or v_in is None or not 0 <= mask < v_in:
            rep.add("mask_token", "error", f"mask_token_id {mask!r} outside the input vocabulary [0, {v_in})")
        else:
            rep.add("mask_token", "ok", f"mask_token_id {mask}")
    return rep
