"""Checks of a plain draft model (a standalone causal LM, vLLM's ``method="draft_model"``):
``tokenizer`` and ``context``. The target verifies the draft's ids as its own ids, so both
must use one tokenizer; the draft proposes at the target's positions, so its trained
context should reach as far as the target's.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from .draft import Draft
from .report import Report


def _digest(path: Path) -> str | None:
    """sha256 of a file, None when it does not exist."""
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def check_tokenizer(rep: Report, dr: Draft) -> None:
    """``tokenizer``: the draft's ``tokenizer.json`` against the target's (byte-equal)."""
    if dr.target_path is None:
        rep.add("tokenizer", "info", "no target given (--target): tokenizer not compared")
        return
    mine, theirs = _digest(dr.path / "tokenizer.json"), _digest(dr.target_path / "tokenizer.json")
    if mine is None or theirs is None:
        missing = "draft" if mine is None else "target"
        rep.add("tokenizer", "info", f"no tokenizer.json in the {missing} folder: not compared")
    elif mine == theirs:
        rep.add("tokenizer", "ok", "tokenizer.json identical to the target's")
    else:
        rep.add(
            "tokenizer",
            "warn",
            "tokenizer.json differs from the target's: the target verifies draft ids as its "
            "own, so an id must name the same token in both",
        )


def check_context(rep: Report, dr: Draft) -> None:
    """``context``: the draft's ``max_position_embeddings`` against the target's."""
    mine = dr.config.get("max_position_embeddings")
    theirs = (dr.target or {}).get("max_position_embeddings")
    if not isinstance(mine, int):
        rep.add("context", "info", "no max_position_embeddings in the draft config")
    elif not isinstance(theirs, int):
        rep.add("context", "info", f"max_position_embeddings {mine}; target's unknown")
    elif mine < theirs:
        rep.add(
            "context",
            "warn",
            f"max_position_embeddings {mine} < the target's {theirs}: positions past {mine} "
            f"lie outside the draft's trained context",
        )
    else:
        rep.add("context", "ok", f"max_position_embeddings {mine} >= the target's {theirs}")
