"""Draft-trace assertions for tests: compare two traces and explain a failure in a few lines.

Used by the pytest plugin (:mod:`spectrace.tracer.testing.plugin`) and usable from any test
runner: :func:`drafts_match_report` returns None on success or the failure text.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

import numpy as np

from ..align import Alignment, align
from ..diff import DiffResult, diff_traces, nothing_compared
from ..findings.pair import content_only
from ..fmt import pct
from ..store import Trace, open_trace
from ..tokens import Decoder, decoder_for, show


def restrict(al: Alignment, positions) -> Alignment:
    """Keep only paired blocks whose anchor position is in ``positions`` (a range, slice or
    iterable of ints; None keeps all). Narrows ``al.ia``/``al.ib`` in place and returns ``al``."""
    if positions is None:
        return al
    pos = al.a.blocks.position[al.ia].astype(np.int64)
    if isinstance(positions, slice):
        lo = positions.start if positions.start is not None else -1
        hi = positions.stop if positions.stop is not None else np.iinfo(np.int64).max
        keep = (pos >= lo) & (pos < hi)
    else:
        keep = np.isin(pos, np.fromiter((int(x) for x in positions), np.int64))
    al.ia, al.ib = al.ia[keep], al.ib[keep]
    return al


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
    min_agreement: float = 1.0,
    max_error_findings: int = 0,
    positions=None,
    ignore: Iterable[str] = (),
    tokenizer=None,
) -> str | None:
    """Check that our drafts match theirs on comparable content.

    Args:
        ours, theirs: traces (paths, globs or :class:`Trace`; logs must be imported first,
            see the pytest plugin's ``spectrace_load``).
        min_agreement: least share of paired blocks whose proposals are identical (0..1).
        max_error_findings: most error findings tolerated (kinds in ``ignore`` not counted).
        positions: restrict the comparison to these anchor positions (range/slice/iterable).
        ignore: finding kinds to ignore (e.g. ``{"degenerate_output"}``).
        tokenizer: tokenizer path to decode ids (default: the one recorded in the traces).
    Returns:
        None when the drafts match; otherwise a short failure text: the first divergent block
        (request, position, slot) with both sides' ids (decoded when possible), the first
        error finding and the command that opens the pair in the TUI.
    """
    a = ours if isinstance(ours, Trace) else open_trace(ours)
    b = theirs if isinstance(theirs, Trace) else open_trace(theirs)
    dec = decoder_for(tokenizer, a.meta, b.meta)
    al = restrict(align(a, b), positions)
    r = diff_traces(al, examples=1, decoder=dec)
    ignored = set(ignore)
    errors = [f for f in r.findings if f.severity == "error" and f.kind not in ignored]
    problems = _problems(al, r, len(errors), min_agreement, max_error_findings)
    if not problems:
        return None
    lines = ["spectrace: drafts do not match: " + "; ".join(problems)]
    if r.examples:
        e = r.examples[0]
        lines.append(
            f"  first divergent block: request {e.ours_req}, position "
            f"{e.position}, slot {e.first_differing_slot}"
        )
        lines.append(f"    ours:   {_ids(dec, e.ours)}")
        lines.append(f"    theirs: {_ids(dec, e.theirs)}")
    if errors:
        lines.append(f"  first error finding: {errors[0].kind}: {errors[0].message}")
    lines.append(f"  inspect: {view_command(a, b)}")
    return "\n".join(lines)


def _problems(
    al: Alignment, r: DiffResult, n_errors: int, min_agreement: float, max_error_findings: int
) -> list[str]:
    """Why the drafts do not match (empty when they do): nothing compared, too little
    agreement, too many error findings."""
    paired = r.agreement.paired_blocks
    rate = r.agreement.exact_match_rate
    problems = []
    if paired == 0:
        if not content_only(al):  # a vanilla baseline passes on identical outputs
            problems.append(nothing_compared(al))
    elif rate is not None and rate < min_agreement:
        problems.append(
            f"drafts match in {r.agreement.exact_matches} of {paired} paired "
            f"blocks ({pct(rate)}), required {pct(min_agreement)}"
        )
    if n_errors > max_error_findings:
        problems.append(f"{n_errors} error finding(s), at most {max_error_findings} allowed")
    return problems


def goldens_match(obtained: Trace, golden: Trace) -> str | None:
    """Compare an obtained trace with its golden through the alignment (request ids and
    timestamps never matter). Returns None when they match, else the diff summary."""
    return drafts_match_report(obtained, golden, min_agreement=1.0, max_error_findings=0)
