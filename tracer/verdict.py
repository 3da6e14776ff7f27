"""The verdict of a diff in words: one definition for the text report and the viewer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """A diff's verdict: ``word`` (the headline a report styles) and ``detail`` (the rest
    of the sentence, starting with its separator)."""

    diverged: bool
    word: str
    detail: str

    @property
    def sentence(self) -> str:
        """The whole sentence, unstyled."""
        return self.word + self.detail


def verdict(diverged: bool, reasons: list[str]) -> Verdict:
    """The verdict sentence of a diff (``DiffResult.diverged`` and ``.reasons``).

    ``DIVERGED: reason; reason`` or ``no divergence on comparable blocks``.
    """
    if diverged:
        return Verdict(True, "DIVERGED", ": " + "; ".join(reasons))
    return Verdict(False, "no divergence", " on comparable blocks")
