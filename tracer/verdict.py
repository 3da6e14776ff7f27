"""The verdict of a diff in words: one definition for the text report and the viewer."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .findings.model import Finding


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


def verdict(
    diverged: bool, reasons: list[str], no_drafts: str | None = None, ignored: Sequence[str] = ()
) -> Verdict:
    """The verdict sentence of a diff (``DiffResult.diverged``, ``.reasons``, and
    ``no_drafts``: the side of its ``content_only`` finding, a vanilla baseline, from
    :func:`vanilla_side`).

    ``DIVERGED: reason; reason``, ``no divergence on comparable blocks``, or for a vanilla
    baseline ``no divergence in content (no drafts on one side: no draft comparison)``
    (``on either side`` when neither drafted).
    ``ignored``: the kinds of the error findings a gate left out (``--ignore``), one entry
    per finding; a passing verdict says them, so that ignored missing work is never silent.
    """
    if diverged:
        return Verdict(True, "DIVERGED", ": " + "; ".join(reasons))
    note = ignored_note(ignored)
    if no_drafts is not None:
        where = "either side" if no_drafts == "both" else "one side"
        return Verdict(
            False,
            "no divergence",
            f" in content (no drafts on {where}: no draft comparison)" + note,
        )
    return Verdict(False, "no divergence", " on comparable blocks" + note)


def vanilla_side(findings: Iterable[Finding]) -> str | None:
    """The side of the ``content_only`` finding (``ours``, ``theirs`` or ``both``: the side
    without drafts), or None when there is none."""
    return next((f.side for f in findings if f.kind == "content_only"), None)


def ignored_note(ignored: Sequence[str]) -> str:
    """``, with 2 error findings ignored (capture_incomplete, unverified_drafts)``, or ``""``
    when ``ignored`` (error finding kinds, one per finding) is empty."""
    if not ignored:
        return ""
    n = len(ignored)
    kinds = ", ".join(sorted(set(ignored)))
    return f", with {n} error finding{'s' if n > 1 else ''} ignored ({kinds})"


def ignored_errors(findings: Sequence[Finding], ignore: Iterable[str]) -> list[str]:
    """The kinds of the error findings a gate leaves out (``ignore``, its ``--ignore``
    kinds), one per finding: what :func:`~spectrace.tracer.gate.counted_errors` does not
    count, for :func:`verdict` and ``check``'s gate line to name."""
    left_out = frozenset(ignore)
    return [f.kind for f in findings if f.severity == "error" and f.kind in left_out]
