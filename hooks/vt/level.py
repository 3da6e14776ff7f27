"""The ``VT_SPEC_TRACE`` level rule (``shared/reference/vt_spec_trace.md`` §1): which level the
engine runs at, and which level a line family proves. Standard library only."""

from __future__ import annotations

from collections.abc import Iterable

ENV_VAR = "VT_SPEC_TRACE"

#: The lowest propose-side level at which each line family prints.
FAMILY_LEVEL = {
    "SPECTRACE": 1,
    "spec-propose": 1,
    "spec-phase": 1,
    "spec-phase-dev": 2,
    "fwd-ops": 3,
}


def trace_level(value: str | None) -> int:
    """The propose-side trace level our engine derives from ``VT_SPEC_TRACE``.

    Returns:
        0 when unset, empty or starting with ``'0'``; else ``atoi(value)``, and 1 when that
        is 0 or less (``yes``, ``-1``).
    """
    if not value or value[0] == "0":
        return 0
    digits = value.lstrip()
    sign = -1 if digits[:1] == "-" else 1
    digits = digits[1:] if digits[:1] in "+-" else digits
    n = 0
    for ch in digits:
        if not ch.isdigit():
            break
        n = n * 10 + int(ch)
    return n * sign if n * sign > 0 else 1


def evidenced_level(families: Iterable[str]) -> int:
    """The highest level the given line families prove (1 when none proves more)."""
    return max([1] + [FAMILY_LEVEL[f] for f in families if f in FAMILY_LEVEL])


def phase_level(configured: int | None, step_families: Iterable[str]) -> int:
    """The level a ``[spec-phase]`` row is stored with: at level >= 2 its timestamps include
    the syncs of the device split.

    Args:
        configured: :func:`trace_level` of the run when known (``spectrace capture``; >= 1),
            else None.
        step_families: the families printed so far in the same step.
    Returns:
        ``configured``, else :func:`evidenced_level` of the step (3/2 when ``[fwd-ops]`` /
        ``[spec-phase-dev]`` printed, else 1).
    """
    return configured if configured is not None else evidenced_level(step_families)
