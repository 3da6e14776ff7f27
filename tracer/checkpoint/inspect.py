"""``inspect_draft``: every check of a draft checkpoint, in report order."""

from __future__ import annotations

import os

from .draft import load_draft
from .identity import check_block_size, check_format, check_layout, check_mask_token, check_method
from .plain import check_context, check_tokenizer
from .report import Report
from .shapes import (
    check_attention,
    check_aux_layers,
    check_confidence,
    check_fc,
    check_markov,
    check_target_hidden,
)
from .vocab import check_d2t, check_embed_tokens, check_lm_head, check_t2d, check_vocab


def inspect_draft(
    ckpt_dir: str | os.PathLike, target_dir: str | os.PathLike | None = None, k: int | None = None
) -> Report:
    """Inspect a draft checkpoint folder; see :mod:`spectrace.tracer.checkpoint` for the checks.

    Args:
        ckpt_dir: folder with ``config.json`` and safetensors weights.
        target_dir: the target model folder (its ``config.json``), or None: then the verifier
            path in the config is tried, else target facts are taken from the draft config.
        k: drafts per step to check against the block size (default: the config's
            ``speculative_tokens``).
    Returns:
        The :class:`Report`, one or more verdicts per check.
    Raises:
        InputError: no readable ``config.json`` or weights.
    """
    dr = load_draft(ckpt_dir, target_dir)
    rep = Report(str(dr.path), str(dr.target_path) if dr.target_path else None)
    check_format(rep, dr)
    check_method(rep, dr)
    sfa = check_layout(rep, dr)
    vocab = check_vocab(rep, dr)
    check_t2d(rep, dr, vocab, check_d2t(rep, dr, vocab))
    if dr.plain:
        check_tokenizer(rep, dr)
        check_context(rep, dr)
    if dr.is_dspark:
        check_markov(rep, dr, vocab)
        check_confidence(rep, dr)
    check_fc(rep, dr, check_aux_layers(rep, dr))
    check_target_hidden(rep, dr)
    check_attention(rep, dr)
    if dr.is_dspark:
        check_block_size(rep, dr, k, sfa)
    check_embed_tokens(rep, dr, vocab)
    check_lm_head(rep, dr, vocab)
    if dr.is_dspark:
        check_mask_token(rep, dr, vocab)
    return rep
