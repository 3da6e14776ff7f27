"""Figures and severities as people read them: one home for the report's and the TUI's words.

Plain strings only (this module imports no rich): the text report (:mod:`spectrace.tracer.cli.
report`), the detectors' messages and the TUI format numbers the same way through these
functions, so ``45.1%`` means the same thing on every screen.
"""

from __future__ import annotations

#: rich style name of each finding severity (``findings.SEVERITIES``), for the report and the TUI.
SEVERITY_STYLE: dict[str, str] = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def pct(x: float | None, digits: int = 1) -> str:
    """A share in 0..1 as a percentage with ``digits`` decimals, ``-`` when unknown (None).

    ``pct(0.4512) == "45.1%"``, ``pct(0.4512, 0) == "45%"``, ``pct(None) == "-"``.
    """
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def num(x: float | None, digits: int = 3) -> str:
    """A number with ``digits`` decimals, ``-`` when unknown (None): ``num(2.5, 2) == "2.50"``."""
    return "-" if x is None else f"{x:.{digits}f}"


__all__ = ["SEVERITY_STYLE", "num", "pct"]


def counted(count: int, noun: str) -> str:
    """``1 request``, ``2 requests``: a count and its noun, plural unless the count is 1."""
    return f"{count} {noun}{'' if count == 1 else 's'}"
