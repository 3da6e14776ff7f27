"""Draft-trace assertions for tests: compare two traces and explain a failure in a few lines.

Used by the pytest plugin (:mod:`spectrace.tracer.testing.plugin`) and usable from any test
runner: :func:`drafts_match_report` returns None on success or the failure text.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from ..gate import (
    PositionSpec,
    Selection,
    Thresholds,
    counted_errors,
    gated_diff,
    parse_positions,
)
from ..store import Trace, open_trace
from ..tokens import Decoder, decoder_for, show


def _ids(dec: Decoder | None, ids) -> str:
    """``[id 'text', ...]`` (ids alone without a decoder)."""
    ids = [int(x) for x in ids]
    if dec is None:
        return str(ids)
    return "[" + ", ".join(f"{i} {show(dec.token(i))!r}" for i in ids) + "]"


def view_command(a: Trace, b: Trace) -> str:
    """The command that opens the pair in the TUI."""
    return "spectrace view " + " ".join(shlex.quote(str(t.paths[0])) for t in (a, b))


def drafts_match_report(
    ours,
    theirs,
    *,
    min_agreement: float | None = None,
    max_error_findings: int = 0,
    positions: PositionSpec | str = None,
    ignore: Iterable[str] = (),
    requests: Iterable[str] | None = None,
    tokenizer=None,
) -> str | None:
    """Check that our drafts match theirs on comparable content: the gate of
    :mod:`spectrace.tracer.gate`, exactly what ``spectrace diff`` applies for the same
    options (argument = option: ``requests`` = ``--request``, ``positions`` =
    ``--positions``, ``min_agreement`` = ``--min-agreement``, ``max_error_findings`` =
    ``--max-errors``, ``ignore`` = ``--ignore``).

    Args:
        ours, theirs: traces (paths, globs or :class:`Trace`; logs must be imported first,
            see the pytest plugin's ``spectrace_load``).
        min_agreement: least share (0..1) of paired blocks whose anchor and proposals agree;
            None: 1.0, not asked for (a vanilla side's content_only pair still passes; given,
            ``agreement 0/0`` fails it, as ``--min-agreement`` does).
        max_error_findings: most error findings tolerated (kinds in ``ignore`` not counted).
        positions: restrict the comparison to these anchor positions: a range, slice or
            pair ``(A, B)`` (half-open ``A:B``, B > A; ``(A, None)`` / ``(None, B)`` for an
            open end, ``--positions A:`` / ``:B``), the text ``"A:B"``, or another iterable
            of ints (a list or set: those positions).
        ignore: finding kinds to ignore (e.g. ``{"degenerate_output"}``; one string is one
            kind).
        requests: restrict the comparison to these request ids (ours or theirs; one string
            is one id).
        tokenizer: tokenizer path to decode ids (default: the one recorded in the traces).
    Returns:
        None when the drafts match; otherwise a short failure text: the first divergent block
        (request, position, slot) with both sides' ids (decoded when possible), the first
        error finding and the command that opens the pair in the TUI.
    Raises:
        GateError (a ValueError): ``min_agreement`` outside [0, 1], a negative
            ``max_error_findings``, an unknown kind in ``ignore``, bad ``positions`` or a
            request id that neither trace has (``no request 'x' (known: ...)``).
    """
    # One string is one kind, one request id, or ``A:B`` as ``--positions`` takes it: never
    # its characters (requests="01" selected requests "0" and "1").
    if isinstance(ignore, str):
        ignore = (ignore,)
    if isinstance(requests, (str, int)):  # requests=0: request id "0", as --request 0
        requests = (str(requests),)
    if isinstance(positions, str):
        positions = parse_positions(positions)
    th = Thresholds(min_agreement, max_error_findings, frozenset(ignore))
    sel = Selection.of(requests, positions)
    a = ours if isinstance(ours, Trace) else open_trace(ours)
    b = theirs if isinstance(theirs, Trace) else open_trace(theirs)
    dec = decoder_for(tokenizer, a.meta, b.meta)
    _, r, g = gated_diff(a, b, sel, th, examples=1, decoder=dec)
    if g.passed:
        return None
    lines = ["spectrace: drafts do not match: " + "; ".join(g.problems)]
    if r.examples:
        e = r.examples[0]
        lines.append(
            f"  first divergent block: request {e.ours_req}, position "
            f"{e.position}, slot {e.first_differing_slot}"
        )
        lines.append(f"    ours:   {_ids(dec, e.ours)}")
        lines.append(f"    theirs: {_ids(dec, e.theirs)}")
    errors = counted_errors(r.findings, th)
    if errors:
        lines.append(f"  first error finding: {errors[0].kind}: {errors[0].message}")
    lines.append(f"  inspect: {view_command(a, b)}")
    return "\n".join(lines)


def goldens_match(obtained: Trace, golden: Trace) -> str | None:
    """Compare an obtained trace with its golden through the alignment (request ids and
    timestamps never matter). Returns None when they match, else the diff summary.

    Drafts on either side must pair and agree (an explicit ``min_agreement`` of 1.0): a run
    that stopped drafting, or started, is not the golden even with the same outputs (the
    ``content_only`` pair that a plain diff passes); two runs without drafts compare their
    outputs."""
    drafted = len(obtained.blocks) > 0 or len(golden.blocks) > 0
    return drafts_match_report(
        obtained, golden, min_agreement=1.0 if drafted else None, max_error_findings=0
    )
