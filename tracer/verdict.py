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


def verdict(diverged: bool, reasons: list[str], content_only: bool = False) -> Verdict:
    """The verdict sentence of a diff (``DiffResult.diverged``, ``.reasons``, and whether a
    ``content_only`` finding says one side has no drafts: a vanilla baseline).

    ``DIVERGED: reason; reason``, ``no divergence on comparable blocks``, or for a vanilla
    baseline ``no divergence in content (no drafts on one side: no draft comparison)``.
    """
    if diverged:
        return Verdict(True, "DIVERGED", ": " + "; ".join(reasons))
    if content_only:
        return Verdict(
            False, "no divergence", " in content (no drafts on one side: no draft comparison)"
        )
    return Verdict(False, "no divergence", " on comparable blocks")
