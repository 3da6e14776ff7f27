"""Which blocks and findings a comparison keeps: a :class:`Selection` of request ids and
anchor positions (``--request``, ``--positions``; the fixture's ``requests``, ``positions``),
as :mod:`spectrace.tracer.gate` applies it; :class:`GateError` for a bad one."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from .errors import InputError
from .findings.model import MISSING_WORK, Finding


class GateError(InputError, ValueError):
    """A bad selection or threshold (exit 2 on the CLI; a ValueError in the fixture).

    Attributes:
        field: the argument at fault (``min_agreement``, ``max_errors``, ``ignore``,
            ``positions``).
    """

    def __init__(self, field: str, what: str) -> None:
        super().__init__(f"{field}: {what}")
        self.field = field
        self.what = what


#: Positions as given: a ``slice``/``range`` or a pair ``(A, B)`` (half-open ``A:B``; an end
#: may be None: ``(A, None)`` = ``A:``, ``(None, B)`` = ``:B``), or other ints (a set).
PositionSpec = slice | range | tuple[int | None, int | None] | Iterable[int] | None


@dataclass(frozen=True)
class Selection:
    """What counts in a comparison.

    Attributes:
        requests: request ids (ours or theirs) whose pairs are compared; None: all.
        positions: half-open ``slice`` of anchor positions (tokens), a frozenset of
            positions, or None: all.
    """

    requests: frozenset[str] | None = None
    positions: slice | frozenset[int] | None = None

    @classmethod
    def of(cls, requests: Iterable[str] | None = None, positions: PositionSpec = None):
        """A validated selection (``requests``: ids; ``positions``: slice, range, (A, B) or ints).

        Raises:
            GateError: a non-integer position or a slice with a step.
        """
        reqs = None if requests is None else frozenset(str(r) for r in requests)
        if reqs is not None and not reqs:
            reqs = None  # an empty repeatable option means "all"
        return cls(reqs, _positions(positions))

    @property
    def everything(self) -> bool:
        """True when nothing is narrowed."""
        return self.requests is None and self.positions is None

    def position_mask(self, pos: np.ndarray) -> np.ndarray:
        """bool [n]: which anchor positions (int [n]) lie in the selection."""
        p = self.positions
        if p is None:
            return np.ones(len(pos), bool)
        if isinstance(p, slice):
            lo = -1 if p.start is None else p.start
            hi = np.iinfo(np.int64).max if p.stop is None else p.stop
            return (pos >= lo) & (pos < hi)
        return np.isin(pos, np.fromiter(p, np.int64, len(p)))

    def positions_text(self) -> str | None:
        """The positions as ``A:B`` (a slice; ends may be empty) or ``3, 7`` (a set)."""
        p = self.positions
        if isinstance(p, slice):
            lo, hi = ("" if x is None else str(x) for x in (p.start, p.stop))
            return f"{lo}:{hi}"
        return None if p is None else ", ".join(str(x) for x in sorted(p)) or "(none)"


def _positions(p: PositionSpec) -> slice | frozenset[int] | None:
    if p is None:
        return None
    if isinstance(p, range) and p.step == 1:
        return _checked_slice(p.start, p.stop, repr(p))
    if isinstance(p, tuple) and len(p) == 2:  # (A, B) = A:B, as range(A, B); never {A, B}
        return _checked_slice(p[0], p[1], repr(p))
    if isinstance(p, slice):
        if p.step not in (None, 1):
            raise GateError("positions", f"a slice with step {p.step} is not supported")
        for end in (p.start, p.stop):
            if end is not None and (not isinstance(end, int) or isinstance(end, bool)):
                raise GateError("positions", f"slice ends must be ints (got {end!r})")
        return _checked_slice(p.start, p.stop, repr(p))
    if isinstance(p, str | bytes | bool) or not isinstance(p, Iterable):
        raise GateError("positions", f"expected a range, (A, B), a slice or ints, not {p!r}")
    out = []
    for x in p:
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
            raise GateError("positions", f"{x!r} is not an int")
        if x < 0:  # no anchor sits there: a list holding one is a mistake, never a filter
            raise GateError("positions", f"positions must be >= 0 (got {x!r} in {p!r})")
        out.append(int(x))
    return frozenset(out)


def _checked_slice(start: object, stop: object, given: str) -> slice:
    """``slice(start, stop)`` of positions >= 0 with stop > start, as ``--positions``
    requires (one rule for the CLI and the fixture).

    Raises:
        GateError: an end that is not an int >= 0 (None: open), or stop <= start (empty).
    """
    ends: list[int | None] = []
    for end in (start, stop):
        if end is not None and (isinstance(end, bool) or not isinstance(end, (int, np.integer))):
            raise GateError("positions", f"ends must be ints or None (got {given})")
        if end is not None and end < 0:
            raise GateError(
                "positions", f"expected A:B with positions >= 0, e.g. 5:20 or 40: (got {given})"
            )
        ends.append(None if end is None else int(end))
    lo, hi = ends
    if lo is not None and hi is not None and hi <= lo:
        how = "before" if hi < lo else "not after"
        raise GateError("positions", f"end {hi} is {how} start {lo} (got {given})")
    return slice(lo, hi)


def parse_positions(text: str) -> slice:
    """``A:B`` (half-open, tokens; either end may be left out) as a slice.

    Raises:
        GateError: not ``A:B`` with non-negative ints, or B <= A.
    """
    lo, sep, hi = text.partition(":")
    # plain ASCII digits: int() also takes "1_0" and other scripts' digits, never meant
    plain = all(re.fullmatch(r"[0-9]*", x.strip()) for x in (lo, hi))
    ends = [None if not x.strip() else int(x) for x in (lo, hi)] if plain else [-1, -1]
    if not sep:
        ends = [-1, -1]
    return _checked_slice(ends[0], ends[1], repr(text))


#: Findings about everything from their position to the request's end (the content differs
#: from there on, the output loops from there): in a window that reaches past that
#: position, not only in one that holds it.
_FROM_THERE_ON = frozenset({"content_divergence", "degenerate_output"})


def in_selection(f: Finding, sel: Selection, ids: frozenset[str] | None = None) -> bool:
    """Whether finding ``f`` lies in ``sel``: its request is selected (``ids``: every id of
    the selected pairs, both sides; default ``sel.requests``) and its position lies in the
    positions (or, for :data:`_FROM_THERE_ON`, before one of them). A finding without a
    request or position is never left out by that part, nor is missing work
    (:data:`~spectrace.tracer.findings.model.MISSING_WORK`: an engine that stopped, or lost
    blocks, outside the window did not finish the work the window is part of)."""
    if sel.requests is not None and f.request is not None:
        if f.request not in (sel.requests if ids is None else ids | sel.requests):
            return False
    p = sel.positions
    if p is None or f.position is None or f.kind in MISSING_WORK:
        return True
    if f.kind in _FROM_THERE_ON:
        if isinstance(p, slice):
            last = np.iinfo(np.int64).max if p.stop is None else p.stop - 1
        else:
            last = max(p, default=-1)
        return last >= f.position
    return bool(sel.position_mask(np.array([f.position], np.int64))[0])
