"""Vocabulary checks: ``vocab``, ``d2t``, ``t2d``, ``embed_tokens`` and ``lm_head``.

Against vLLM 0.32 ``model_executor/models/qwen3_dspark.py`` (``draft_id_to_target_id``: target
id = draft id + ``d2t[draft id]``; ``t2d`` is training-only and dropped at load).
"""

from __future__ import annotations

import numpy as np

from .draft import Draft, Vocab
from .files import TensorInfo, read_small
from .report import Report

_INT_DTYPES = ("I64", "I32", "I16", "I8", "U8")


def check_vocab(rep: Report, dr: Draft) -> Vocab:
    """``vocab``: the input vocabulary (``transformer_layer_config.vocab_size``) and the draft
    vocabulary against the target's.

    A ``vocab_size`` (or ``draft_vocab_size``) given but not an int > 0 is bad input: an
    error naming the field, never compared as a vocabulary.

    Returns:
        The vocabularies (all None when the layer config has none, or a bad one).
    """
    v_in, v_draft = dr.layer.get("vocab_size"), dr.config.get("draft_vocab_size")
    if v_in is None:
        rep.add("vocab", "error", "no vocab_size in the layer config: vocabularies unknown")
        return Vocab(None, None, None)
    nested = "transformer_layer_config." if dr.transformer_layer_config is not None else ""
    for name, size in ((f"{nested}vocab_size", v_in), ("draft_vocab_size", v_draft)):
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            rep.add("vocab", "error", f"{name} is {size!r}, not an int > 0: vocabularies unknown")
            return Vocab(None, None, None)
    v_draft = v_in if v_draft is None else v_draft
    t_vocab = (dr.target or {}).get("vocab_size")
    if not isinstance(t_vocab, int) or t_vocab < 1:
        t_vocab = None  # none, or not a size
    v_target = t_vocab or v_in
    src = "target config" if dr.target else "draft config (no target given)"
    if dr.target is not None and t_vocab is None:
        # Without it the draft would be compared with itself and always pass.
        rep.add(
            "vocab",
            "error",
            f"the target config ({dr.target_path}) has no vocab_size > 0: the draft's "
            f"vocabularies cannot be checked against the target's (the checks below assume "
            f"the draft's input vocabulary {v_in})",
        )
        src = "draft config (the target's has no vocab_size)"
    if v_in < v_target:
        rep.add(
            "vocab",
            "error",
            f"input vocabulary {v_in} < target vocabulary {v_target}: "
            "anchors and drafts with larger ids index past markov_w1/embed_tokens",
        )
    elif v_draft > v_target:
        rep.add(
            "vocab",
            "warn",
            f"draft vocabulary {v_draft} > target vocabulary {v_target}: "
            "vLLM maps it identically (no d2t); ids >= the target vocabulary are invalid",
        )
    elif v_draft < v_target:
        rep.add(
            "vocab",
            "ok",
            f"reduced draft vocabulary {v_draft} of {v_target} target ids "
            f"({src}); input vocabulary {v_in}",
        )
    else:
        rep.add("vocab", "ok", f"full vocabulary {v_draft} (= target, {src})")
    return Vocab(v_in, v_draft, v_target)


def check_d2t(rep: Report, dr: Draft, vocab: Vocab) -> np.ndarray | None:
    """``d2t``: present exactly when the vocabulary is reduced (a ``d2t`` in a full-vocabulary
    checkpoint has no parameter in vLLM: the load fails); ``target = i + d2t[i]`` in range and
    without duplicates.

    Returns:
        The target id of each draft id (int64 [v_draft]) when d2t is valid enough to compare
        ``t2d`` with, else None.
    """
    d2t_ti, v_draft = dr.tensors.get("d2t"), vocab.v_draft
    if v_draft is None or vocab.v_target is None:
        rep.add("d2t", "info", "vocabularies unknown (see vocab): d2t not checked")
    elif vocab.reduced and d2t_ti is None:
        rep.add(
            "d2t",
            "error",
            f"reduced vocabulary without d2t: vLLM refuses the checkpoint, "
            f"and unmapped draft ids would land in [0, {v_draft})",
        )
    elif not vocab.reduced and d2t_ti is not None:
        rep.add(
            "d2t",
            "error",
            "d2t in a full-vocabulary checkpoint: vLLM's Qwen3 DSpark has no "
            "draft_id_to_target_id parameter then, so loading fails",
        )
    elif d2t_ti is None:
        rep.add("d2t", "ok", "none (full vocabulary, draft ids are target ids)")
    elif d2t_ti.dtype not in _INT_DTYPES or d2t_ti.shape != (v_draft,):
        rep.add(
            "d2t",
            "error",
            f"d2t is {d2t_ti.dtype} {list(d2t_ti.shape)}; expected integer offsets [{v_draft}]",
        )
    else:
        return _check_d2t_targets(rep, d2t_ti, vocab)
    return None


def _check_d2t_targets(rep: Report, d2t_ti: TensorInfo, vocab: Vocab) -> np.ndarray | None:
    """The offsets of a well-shaped d2t: every target in range, no target twice."""
    v_target = vocab.v_target
    assert v_target is not None  # a reduced vocabulary has a known target vocabulary
    off = read_small(d2t_ti).astype(np.int64)
    targets = np.arange(len(off)) + off
    bad = np.flatnonzero((targets < 0) | (targets >= v_target))
    uniq = np.unique(targets)
    absolute = (
        bad.size and (off >= 0).all() and (off < v_target).all() and np.unique(off).size == off.size
    )
    if bad.size:
        rep.add(
            "d2t",
            "error",
            f"{bad.size} of {len(off)} offsets map outside [0, {v_target}) "
            f"(first: draft id {int(bad[0])} -> {int(targets[bad[0]])})"
            + (
                "; d2t looks like absolute target ids, not offsets (target = id + d2t[id])"
                if absolute
                else ""
            ),
        )
        return None  # t2d cannot be compared with out-of-range targets
    if uniq.size != targets.size:
        rep.add(
            "d2t",
            "error",
            f"{targets.size - uniq.size} duplicate targets: several draft "
            "ids map to the same target id",
        )
    else:
        order = "ascending" if (np.diff(targets) > 0).all() else "not ascending"
        rep.add(
            "d2t",
            "ok",
            f"{len(off)} offsets, targets in [{int(targets.min())}, "
            f"{int(targets.max())}], unique, {order}",
        )
    return targets


def check_t2d(rep: Report, dr: Draft, vocab: Vocab, targets: np.ndarray | None) -> None:
    """``t2d``: a bool [v_target] mask marking exactly d2t's targets (``targets``, from
    :func:`check_d2t`). Training only: vLLM drops it."""
    t2d_ti, v_target = dr.tensors.get("t2d"), vocab.v_target
    if t2d_ti is None or v_target is None:  # an unknown vocabulary: check_d2t says so
        if vocab.reduced:
            rep.add("t2d", "info", "no t2d (training only; vLLM does not need it)")
        return
    if t2d_ti.shape != (v_target,) or t2d_ti.dtype not in ("BOOL", "U8"):
        rep.add(
            "t2d",
            "error",
            f"t2d is {t2d_ti.dtype} {list(t2d_ti.shape)}; expected bool [{v_target}]",
        )
        return
    mask = read_small(t2d_ti).astype(bool)
    if targets is not None and not np.array_equal(np.flatnonzero(mask), np.unique(targets)):
        rep.add(
            "t2d",
            "error",
            f"t2d marks {int(mask.sum())} target ids that do not match "
            f"d2t's {np.unique(targets).size} distinct targets (vLLM ignores t2d; training "
            "used it)",
        )
    else:
        rep.add(
            "t2d",
            "ok",
            f"{int(mask.sum())} target ids marked"
            + (", consistent with d2t" if targets is not None else "")
            + " (training only: vLLM drops t2d)",
        )


def check_embed_tokens(rep: Report, dr: Draft, vocab: Vocab) -> None:
    """``embed_tokens``: own ([input vocab, hidden]) or shared from the target (same hidden
    size; not possible with an input vocabulary larger than the target's)."""
    emb, v_in, hidden = dr.tensors.get("embed_tokens.weight"), vocab.v_in, dr.hidden
    if emb is not None and v_in is None:
        _own_unknown_vocab(rep, "embed_tokens", emb, hidden, "input")
    elif emb is not None:
        want = (v_in, hidden)
        rep.add(
            "embed_tokens",
            "ok" if emb.shape == want else "error",
            f"own {list(emb.shape)}"
            + ("" if emb.shape == want else f" != [input vocab {v_in}, hidden {hidden}]"),
        )
    elif v_in is not None and vocab.v_target is not None and v_in > vocab.v_target:
        rep.add(
            "embed_tokens",
            "error",
            f"missing with an input vocabulary ({v_in}) larger "
            "than the target's: vLLM requires its own embed_tokens",
        )
    else:
        _shared_from_target(rep, dr, "embed_tokens")


def check_lm_head(rep: Report, dr: Draft, vocab: Vocab) -> None:
    """``lm_head``: own ([draft vocab, hidden]) or shared from the target (same hidden size;
    not possible with a reduced vocabulary)."""
    head, v_draft, hidden = dr.tensors.get("lm_head.weight"), vocab.v_draft, dr.hidden
    if head is not None and v_draft is None:
        _own_unknown_vocab(rep, "lm_head", head, hidden, "draft")
    elif head is not None:
        want = (v_draft, hidden)
        rep.add(
            "lm_head",
            "ok" if head.shape == want else "error",
            f"own {list(head.shape)}"
            + ("" if head.shape == want else f" != [draft vocab {v_draft}, hidden {hidden}]"),
        )
    elif vocab.reduced:
        rep.add(
            "lm_head",
            "error",
            "missing with a reduced vocabulary: vLLM requires the "
            "draft's own lm_head (the target's full one cannot be shared)",
        )
    else:
        _shared_from_target(rep, dr, "lm_head")


def _own_unknown_vocab(rep: Report, check: str, ti: TensorInfo, hidden, which: str) -> None:
    """An own weight when the vocabulary is unknown (the ``vocab`` error says why): only its
    hidden size is checked, never rows against a vocabulary of None."""
    ok = len(ti.shape) == 2 and ti.shape[1] == hidden
    rep.add(
        check,
        "info" if ok else "error",
        f"own {list(ti.shape)}"
        + (
            f", {which} vocabulary unknown: rows not checked" if ok else f" != [?, hidden {hidden}]"
        ),
    )


def _shared_from_target(rep: Report, dr: Draft, check: str) -> None:
    """A weight the checkpoint lacks, shared from the target: fine unless the hidden sizes
    differ."""
    t_hidden = None if dr.target is None else dr.target.get("hidden_size")
    ok_share = t_hidden in (None, dr.hidden)
    rep.add(
        check,
        "info" if ok_share else "error",
        "not in the checkpoint: shared from the "
        "target" + ("" if ok_share else f", whose hidden size {t_hidden} != {dr.hidden}"),
    )
