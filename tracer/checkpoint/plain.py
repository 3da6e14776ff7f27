"""Checks of a plain draft model (a standalone causal LM, vLLM's ``method="draft_model"``):
``tokenizer`` and ``context``. The target verifies the draft's ids as its own ids, so both
must use one tokenizer; the draft proposes at the target's positions, so its trained
context should reach as far as the target's.
"""

from __future__ import annotations

import json
from pathlib import Path

from .draft import Draft
from .report import Report


def _read_tokenizer(path: Path) -> tuple[bytes | None, str | None]:
    """A ``tokenizer.json``'s bytes, or what is wrong with it: ``(None, None)`` when there is
    no such file, ``(None, why)`` when it cannot be read or is not a tokenizer (JSON object
    with a ``model`` object, as every Hugging Face ``tokenizer.json`` has)."""
    if not path.exists() and not path.is_symlink():
        return None, None
    try:
        data = path.read_bytes()
    except OSError as e:
        return None, f"cannot be read ({e.strerror or e})"
    try:
        doc = json.loads(data)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        return None, f"is not JSON ({e})"
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
        return None, 'is not a tokenizer (a JSON object with a "model" object)'
    return data, None


def check_tokenizer(rep: Report, dr: Draft) -> None:
    """``tokenizer``: the draft's ``tokenizer.json`` against the target's (byte-equal).

    A ``tokenizer.json`` that is there but cannot be read or parsed (the draft's, or the
    target's when a target is given) is an error: the check cannot say whether an id names
    the same token in both. One that is absent is an info line (not compared), as is no
    target given."""
    sides = [("draft", dr.path)] + ([("target", dr.target_path)] if dr.target_path else [])
    read = {side: _read_tokenizer(folder / "tokenizer.json") for side, folder in sides}
    for side, folder in sides:
        why = read[side][1]
        if why is not None:
            rep.add(
                "tokenizer",
                "error",
                f"the {side}'s tokenizer.json ({folder / 'tokenizer.json'}) {why}: whether "
                "each draft id names the same token for the target cannot be checked",
            )
    if any(why is not None for _, why in read.values()):
        return
    if dr.target_path is None:
        rep.add("tokenizer", "info", "no target given (--target): tokenizer not compared")
        return
    mine, theirs = read["draft"][0], read["target"][0]
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
