"""The facts every check reads: a draft checkpoint's config and tensors, and its target's config.

:func:`load_draft` finds the target (given, or the config's verifier ``name_or_path``), and
:class:`Draft` names the config parts the checks share: the speculators model type, the layer
config (nested by speculators, flat in dense DSpark configs) and the vocabularies.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from .files import TensorInfo, load_config, read_tensors, text_config


@dataclass
class Draft:
    """A draft checkpoint as the checks see it.

    Attributes:
        path: the checkpoint folder; config: its ``config.json``.
        tensors: name (``model.`` stripped) -> header info; files: the weight file names.
        target_path: the target folder, or None; target_note: how it was found when not given.
        target: the target's language-model config (``text_config`` unwrapped), or None.
    """

    path: Path
    config: dict
    tensors: dict[str, TensorInfo]
    files: list[str]
    target_path: Path | None
    target_note: str | None
    target: dict | None

    @property
    def model_type(self) -> str | None:
        """``speculators_model_type`` (``dspark``, ``eagle3``, ...), None in dense configs."""
        return self.config.get("speculators_model_type")

    @property
    def architectures(self) -> list:
        """The config's ``architectures`` (a list, maybe empty)."""
        return list(self.config.get("architectures") or [])

    @property
    def transformer_layer_config(self) -> dict | None:
        """The speculators ``transformer_layer_config``, or None when absent or not a dict."""
        tl = self.config.get("transformer_layer_config")
        return tl if isinstance(tl, dict) else None

    @property
    def dense(self) -> bool:
        """A dense DSpark config: no speculators model type, DSpark architecture or keys."""
        d = self.config
        return self.model_type is None and (
            any("DSpark" in a for a in self.architectures)
            or any(key.startswith("dspark_") for key in d)
        )

    @property
    def plain(self) -> bool:
        """A plain draft model: a standalone causal LM (``*ForCausalLM``, no speculators or
        DSpark keys), what vLLM runs with ``method="draft_model"``."""
        return (
            self.model_type is None
            and not self.dense
            and "speculators_config" not in self.config
            and any(str(a).endswith("ForCausalLM") for a in self.architectures)
        )

    @property
    def is_dspark(self) -> bool:
        """A DSpark draft, speculators or dense: the DSpark-only checks apply."""
        return self.model_type == "dspark" or self.dense

    @property
    def layer(self) -> dict:
        """The layer config: speculators nest it, dense configs do not."""
        tl = self.transformer_layer_config
        return tl if tl is not None else self.config

    @property
    def hidden(self):
        """The drafter's ``hidden_size`` (from the layer config), or None."""
        return self.layer.get("hidden_size")

    @property
    def markov_rank(self):
        """``markov_rank`` as configured (None when absent; not checked here)."""
        return self.config.get("markov_rank")


@dataclass
class Vocab:
    """The three vocabularies (None each when the layer config has no ``vocab_size``).

    Attributes:
        v_in: input vocabulary (anchors, ``embed_tokens``, ``markov_w1``).
        v_draft: draft (output) vocabulary (``lm_head``, ``markov_w2``, ``d2t``).
        v_target: the target's vocabulary (the target config's, else ``v_in``).
        reduced: ``v_draft < v_target``: drafts map to target ids through ``d2t``.
    """

    v_in: int | None
    v_draft: int | None
    v_target: int | None

    @property
    def reduced(self) -> bool:
        """A draft vocabulary smaller than the target's (False when either is unknown)."""
        v_draft, v_target = self.v_draft, self.v_target
        return v_draft is not None and v_target is not None and v_draft < v_target


def load_draft(ckpt_dir: str | os.PathLike, target_dir: str | os.PathLike | None = None) -> Draft:
    """Read a checkpoint folder's config and safetensors headers, and its target's config.

    Raises:
        InputError: not a directory, no readable ``config.json``, no weights, or an
        unreadable target config.
    """
    ckpt = Path(ckpt_dir)
    if not ckpt.is_dir():
        raise InputError(f"{ckpt}: not a directory")
    d = load_config(ckpt / "config.json")
    tensors, files = read_tensors(ckpt)
    if not files:
        raise InputError(f"{ckpt}: no .safetensors weights")
    tpath, t_note = (Path(target_dir), None) if target_dir else _verifier_target(ckpt, d)
    tcfg = text_config(load_config(tpath / "config.json")) if tpath else None
    return Draft(ckpt, d, tensors, files, tpath, t_note, tcfg)


def _verifier_target(ckpt: Path, d: dict) -> tuple[Path | None, str | None]:
    """The target named by ``speculators_config.verifier.name_or_path`` when it is a folder
    with a ``config.json`` (as given, or relative to the checkpoint or its parent)."""
    ver = ((d.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    if not isinstance(ver, str) or not ver:
        return None, None
    for cand in (Path(ver), ckpt / ver, ckpt.parent / ver):
        if (cand / "config.json").is_file():
            return cand, "from the config's verifier name_or_path"
    return None, None
