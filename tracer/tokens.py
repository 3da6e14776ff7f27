"""Decode token ids for people: a thin, cached wrapper over the ``tokenizers`` library.

The tokenizer comes from ``--tokenizer PATH`` (a ``tokenizer.json`` or a model directory
holding one) or from the trace's ``meta["tokenizer"]`` / ``meta["target_model"]``.
Negative ids (padding, placeholders) decode to ``∅``; ids outside the vocabulary to ``<?id>``.
"""

from __future__ import annotations

import functools
from pathlib import Path

from .errors import InputError


class Decoder:
    """Decode single ids or id lists to text.

    Args:
        path: ``tokenizer.json`` or a directory containing it.
    Raises:
        InputError: no ``tokenizer.json`` at ``path`` or it cannot be parsed.
    """

    def __init__(self, path: str | Path) -> None:
        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
        if not p.is_file():
            raise InputError(f"{path}: no tokenizer.json found")
        from tokenizers import Tokenizer  # lazy: keeps `spectrace diff` import-light

        try:
            self._tok = Tokenizer.from_file(str(p))
        except Exception as exc:  # the library raises a bare Exception on bad JSON
            raise InputError(f"{p}: cannot load tokenizer ({str(exc)[:80]})") from None
        self.path = p
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.token = functools.lru_cache(maxsize=65536)(self._token)

    def _token(self, tid: int) -> str:
        if tid < 0:
            return "∅"
        if tid >= self.vocab_size:
            return f"<?{tid}>"
        return self._tok.decode([tid], skip_special_tokens=False)

    def text(self, ids) -> str:
        """Decode a sequence of ids (negative ids dropped) to one string."""
        ids = [int(t) for t in ids if int(t) >= 0 and int(t) < self.vocab_size]
        return self._tok.decode(ids, skip_special_tokens=False)


def show(text: str) -> str:
    """Make a decoded token visible on one line (newlines, tabs and spaces made explicit)."""
    return text.replace("\n", "⏎").replace("\t", "⇥").replace(" ", "·")


def decoder_for(explicit: str | Path | None, *metas: dict) -> Decoder | None:
    """The decoder to use: ``explicit`` if given, else the first meta naming a usable one.

    Returns:
        A :class:`Decoder`, or None when no tokenizer is known (ids are then shown raw).
    Raises:
        InputError: ``explicit`` is given but unusable.
    """
    if explicit:
        return Decoder(explicit)
    for meta in metas:
        for key in ("tokenizer", "target_model"):
            cand = meta.get(key) if meta else None
            if (
                cand
                and (Path(cand) / "tokenizer.json").is_file()
                or (cand and str(cand).endswith(".json") and Path(cand).is_file())
            ):
                try:
                    return Decoder(cand)
                except InputError:
                    continue
    return None
