"""The draft-match gate: which blocks and findings count (a :class:`Selection`) and the
:class:`Thresholds` a comparison must meet.

The ONE definition behind ``spectrace diff`` / ``spectrace check``'s ``--request``,
``--positions``, ``--min-agreement``, ``--max-errors`` and ``--ignore`` and the pytest
fixture ``spectrace_assert_drafts_match``'s ``requests``, ``positions``, ``min_agreement``,
``max_error_findings`` and ``ignore``:

* a selection narrows an :class:`~spectrace.tracer.align.Alignment` to the request pairs
  named (by our or their request id) and to the paired blocks whose anchor position lies in
  the positions; a finding counts only when its location lies in the selection (a finding
  without a request or position counts always);
* a selected request id that neither trace has is bad usage (:class:`GateError`);
* the gate then fails on: a selection that leaves no paired block ("nothing selected",
  never a vacuous pass), nothing compared (unless one side is a vanilla run, see
  ``content_only``; then only a ``min_agreement`` asked for fails it, as ``0/0``),
  agreement (paired blocks with the same anchor, the same k and every slot equal, over
  paired blocks) below ``min_agreement``, or more than ``max_errors`` error
  findings outside ``ignore``. With the defaults (1.0, 0, none) it fails exactly when
  :func:`~spectrace.tracer.diff.diff_traces` says ``diverged``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from .align import Alignment, align
from .diff import diff_traces, nothing_compared
from .diff_result import DiffResult, GateSummary
from .findings.model import KINDS, MISSING_WORK, Finding
from .findings.pair import content_only
from .fmt import pct
from .selection import GateError, PositionSpec, Selection, in_selection, parse_positions
from .store import Trace
from .tokens import Decoder


@dataclass(frozen=True)
class Thresholds:
    """What a comparison must meet.

    Attributes:
        min_agreement: least share (0..1) of paired blocks that agree; None (the default)
            means 1.0 *not asked for*: only a share asked for explicitly fails a pair with
            no paired block at all (a vanilla side, ``content_only``) as ``0/0``.
        max_errors: most error findings tolerated (kinds in ``ignore`` not counted).
        ignore: finding kinds never counted (still listed).

    Raises:
        GateError: ``min_agreement`` outside [0, 1], a negative or non-integer
            ``max_errors``, or an unknown kind in ``ignore``.
    """

    min_agreement: float | None = None
    max_errors: int = 0
    ignore: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        m = self.min_agreement
        bad = isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 <= m <= 1
        if m is not None and bad:
            raise GateError("min_agreement", f"{m!r} is outside [0, 1]")
        if m is not None:  # -0.0 is 0.0 (it printed as -0.0%)
            object.__setattr__(self, "min_agreement", m + 0.0)
        e = self.max_errors
        if isinstance(e, bool) or not isinstance(e, int) or e < 0:
            raise GateError("max_errors", f"{e!r} is not an int >= 0")
        if isinstance(self.ignore, str):
            raise GateError("ignore", f"expected finding kinds, got the string {self.ignore!r}")
        object.__setattr__(self, "ignore", frozenset(self.ignore))
        unknown = sorted(self.ignore - set(KINDS))
        if unknown:
            raise GateError(
                "ignore", f"unknown finding kind {unknown[0]!r} (kinds: {', '.join(KINDS)})"
            )

    @property
    def agreement(self) -> float:
        """The least agreement required (``min_agreement``, 1.0 when not given)."""
        return 1.0 if self.min_agreement is None else float(self.min_agreement)

    @property
    def default(self) -> bool:
        """True for the defaults (1.0, 0, none): the gate equals the diff's verdict."""
        return self == Thresholds()


def select(al: Alignment, sel: Selection) -> Alignment:
    """``al`` narrowed to ``sel`` (a new Alignment; ``al`` is left as is).

    Requests: only the matched pairs where our or their request id is in ``sel.requests``
    stay (blocks of the others are no longer on matched content), and only the unmatched
    requests so named. Positions: only the paired blocks whose anchor position is in
    ``sel.positions`` stay paired.
    """
    if sel.everything:
        return al
    if sel.requests is not None:
        al = _select_requests(al, sel.requests)
    keep = sel.position_mask(al.a.blocks.position[al.ia].astype(np.int64))
    return dataclasses.replace(al, ia=al.ia[keep], ib=al.ib[keep])


def _request_mask(t: Trace, ids: frozenset[str]) -> np.ndarray:
    """bool [requests of ``t``]: the request's id is one of ``ids`` (one test per request,
    so block-wise selections index it instead of testing ids per block)."""
    return np.isin(np.asarray(t.requests.req_id, dtype=object), list(ids))


def _select_requests(al: Alignment, ids: frozenset[str]) -> Alignment:
    ma, mb = _request_mask(al.a, ids), _request_mask(al.b, ids)
    keep = (ma[al.req_a] | mb[al.req_b]) if len(al.req_a) else np.zeros(0, bool)
    new = np.where(keep, np.cumsum(keep) - 1, -1)

    def remap(pob: np.ndarray) -> np.ndarray:  # old pair index per block -> new, -1 dropped
        if not len(new):
            return np.full(len(pob), -1, np.int64)
        return np.where(pob >= 0, new[np.maximum(pob, 0)], -1)

    pa, pb = remap(al.pair_of_block_a), remap(al.pair_of_block_b)
    paired = pa[al.ia] >= 0 if len(al.ia) else np.zeros(0, bool)
    return dataclasses.replace(
        al,
        req_a=al.req_a[keep],
        req_b=al.req_b[keep],
        matched_by=[m for m, k in zip(al.matched_by, keep) if k],
        unmatched_a=al.unmatched_a[ma[al.unmatched_a]],
        unmatched_b=al.unmatched_b[mb[al.unmatched_b]],
        divergence=al.divergence[keep],
        content_known=al.content_known[keep],
        common_len=al.common_len[keep],
        pair_of_block_a=pa,
        pair_of_block_b=pb,
        comparable_a=al.comparable_a & (pa >= 0),
        comparable_b=al.comparable_b & (pb >= 0),
        ia=al.ia[paired],
        ib=al.ib[paired],
        pairs_before_selection=(
            al.pairs if al.pairs_before_selection is None else al.pairs_before_selection
        ),
    )


def request_ids(al: Alignment) -> frozenset[str]:
    """Both sides' ids of ``al``'s matched and unmatched requests."""
    ra, rb = al.a.requests.req_id, al.b.requests.req_id
    ids = {ra[i] for i in al.req_a} | {rb[j] for j in al.req_b}
    ids |= {ra[i] for i in al.unmatched_a} | {rb[j] for j in al.unmatched_b}
    return frozenset(ids)


def check_known(sel: Selection, known: Iterable[str], where: str = "") -> None:
    """Every id of ``sel.requests`` must be a request of the traces (``known``: their ids;
    ``where``: the traces' names, for the message: one golden is gated against several runs).

    Raises:
        GateError: ``no request 'ID' (known: a, b, ...) in WHERE`` (field ``requests``).
    """
    ids = frozenset(known)
    missing = sorted((sel.requests or frozenset()) - ids)
    if missing:
        shown = sorted(ids)[:KNOWN_SHOWN]
        more = ", ..." if len(ids) > KNOWN_SHOWN else ""
        listed = ", ".join(shown) + more if ids else "none: the traces hold no request"
        at = f" in {where}" if where else ""
        raise GateError("requests", f"no request {missing[0]!r} (known: {listed}){at}")


#: Known request ids an unknown ``--request`` lists.
KNOWN_SHOWN = 10


def selection_text(sel: Selection) -> str:
    """The selection in words: ``request r7, positions 1000:``."""
    parts = []
    if sel.requests is not None:
        n = len(sel.requests)
        parts.append(f"request{'s' if n > 1 else ''} {', '.join(sorted(sel.requests))}")
    if sel.positions is not None:
        parts.append(f"positions {sel.positions_text()}")
    return ", ".join(parts)


def selected_blocks(t: Trace, sel: Selection) -> int:
    """How many of ``t``'s blocks (a count) lie in ``sel``: their request's id and their
    anchor position (tokens)."""
    keep = sel.position_mask(t.blocks.position.astype(np.int64))
    if sel.requests is not None:
        keep &= _request_mask(t, sel.requests)[t.blocks.request]
    return int(keep.sum())


def nothing_selected(full: Alignment, al: Alignment, sel: Selection) -> str | None:
    """Why ``sel`` left nothing to compare, or None (it selected paired blocks; or what it
    selected has none for another reason, which :func:`nothing_compared` names; or the
    pair has no paired block at all and some block lies in the selection).

    ``full`` is the alignment before the selection, ``al`` after it.
    """
    if sel.everything or len(al.ia):
        return None
    what = selection_text(sel)
    if sel.requests is not None and al.pairs == 0 and full.pairs:
        return f"nothing selected: {what} is in no matched request pair"
    by_req = full if sel.requests is None else select(full, Selection(sel.requests))
    if sel.positions is not None and len(by_req.ia):
        pos = by_req.a.blocks.position[by_req.ia]
        return (
            f"nothing selected: {what} leaves none of the {len(by_req.ia)} paired blocks "
            f"(paired at positions {int(pos.min())}..{int(pos.max())})"
        )
    if len(full.ia) == 0 and not selected_blocks(full.a, sel) + selected_blocks(full.b, sel):
        return f"nothing selected: no block of either trace lies in {what}"
    return None


def counted_errors(findings: list[Finding], th: Thresholds) -> list[Finding]:
    """The error findings the gate counts (kinds in ``th.ignore`` left out)."""
    return [f for f in findings if f.severity == "error" and f.kind not in th.ignore]


def errors_problem(errors: list[Finding], th: Thresholds) -> str | None:
    """Why the counted ``errors`` fail the gate (None: they do not): more than
    ``th.max_errors``, or any of them missing work (:data:`MISSING_WORK`)."""
    if len(errors) > th.max_errors:
        return f"{len(errors)} error finding(s), at most {th.max_errors} allowed"
    missing = [k for k in KINDS if k in MISSING_WORK and any(f.kind == k for f in errors)]
    if missing:
        return (
            f"missing work ({', '.join(missing)}): --max-errors tolerates none; --ignore KIND does"
        )
    return None


def check_gate(
    findings: list[Finding], th: Thresholds, sel: Selection, trace: Trace | None = None
) -> tuple[list[Finding], list[str]]:
    """The gate of one trace (``spectrace check``): the findings in ``sel`` and why the
    gate fails (more than ``th.max_errors`` counted error findings, or, given ``trace``,
    a selection holding none of its blocks; empty: it passes).

    Raises:
        GateError: given ``trace``, a selected request id it does not have.
    """
    kept = [f for f in findings if in_selection(f, sel)]
    problems = []
    if trace is not None and not sel.everything:
        check_known(sel, trace.requests.req_id)
        if selected_blocks(trace, sel) == 0:
            problems.append(
                f"nothing selected: no block of the trace lies in {selection_text(sel)}"
            )
    why = errors_problem(counted_errors(kept, th), th)
    if why is not None:
        problems.append(why)
    return kept, problems


def _agreement_problem(
    al: Alignment, full: Alignment, th: Thresholds, sel: Selection, paired: int, agreeing: int
) -> str | None:
    """The agreement part of the gate (None: met)."""
    if paired:
        rate = agreeing / paired
        if rate >= th.agreement:
            return None
        return (
            f"drafts match in {agreeing} of {paired} paired blocks ({pct(rate)}), "
            f"required {pct(th.agreement)}"
        )
    empty = nothing_selected(full, al, sel)
    if empty is not None:
        return empty
    if not content_only(al):
        return nothing_compared(al)
    if th.min_agreement:  # asked for explicitly: a vanilla side cannot meet it
        return (
            f"agreement 0/0 cannot meet {pct(th.min_agreement)}: no paired block (one side "
            f"has no draft blocks: content_only)"
        )
    return None  # a vanilla baseline passes on identical outputs


def judge(
    al: Alignment,
    r: DiffResult,
    th: Thresholds,
    sel: Selection,
    full: Alignment | None = None,
) -> GateSummary:
    """The gate's verdict on diff result ``r`` of alignment ``al`` narrowed to ``sel``
    (``r.findings`` already in the selection; ``full``: the alignment before the
    selection, default ``al``).

    Returns:
        A :class:`GateSummary`; ``problems`` empty when the gate passes.
    """
    paired = r.agreement.paired_blocks
    bad = r.bad if r.bad is not None else np.zeros(0, bool)
    agreeing = paired - int(bad.sum()) if r.bad is not None else r.agreement.exact_matches
    errors = counted_errors(r.findings, th)
    problems = []
    why = _agreement_problem(al, al if full is None else full, th, sel, paired, agreeing)
    if why is not None:
        problems.append(why)
    why = errors_problem(errors, th)
    if why is not None:
        problems.append(why)
    return GateSummary(
        passed=not problems,
        problems=problems,
        paired_blocks=paired,
        agreeing_blocks=agreeing,
        agreement=agreeing / paired if paired else None,
        errors_counted=len(errors),
        min_agreement=th.agreement,
        max_errors=th.max_errors,
        ignore=sorted(th.ignore),
        requests=None if sel.requests is None else sorted(sel.requests),
        positions=sel.positions_text(),
    )


#: The selection that narrows nothing (gated_diff's default).
_EVERYTHING = Selection()


def gated_diff(
    a: Trace,
    b: Trace,
    sel: Selection = _EVERYTHING,
    th: Thresholds = Thresholds(),
    examples: int | None = 5,
    decoder: Decoder | None = None,
) -> tuple[Alignment, DiffResult, GateSummary]:
    """Align ``a`` (ours) and ``b`` (theirs), narrow to ``sel``, diff and judge.

    The result's findings are those in the selection. When ``sel`` or ``th`` is not the
    default, the result's ``diverged`` and ``reasons`` are the gate's (``passed`` and
    ``problems``) and ``result.gate`` holds the summary; with the defaults the result is
    :func:`~spectrace.tracer.diff.diff_traces`'s own (the gate agrees with it).

    Returns:
        ``(alignment, result, gate)``.
    Raises:
        GateError: a selected request id that neither trace has.
    """
    full = align(a, b)
    if sel.requests is not None:
        check_known(sel, [*a.requests.req_id, *b.requests.req_id], f"{a.name} or {b.name}")
    al = select(full, sel)
    r = diff_traces(al, examples=examples, decoder=decoder)
    if not sel.everything:
        ids = request_ids(al)
        r.findings = [f for f in r.findings if in_selection(f, sel, ids)]
    g = judge(al, r, th, sel, full)
    if not (sel.everything and th.default):
        r.diverged, r.reasons, r.gate = not g.passed, list(g.problems), g
    return al, r, g


#: The selection's names, re-exported: the gate's callers take them from here.
__all__ = [
    "GateError",
    "PositionSpec",
    "Selection",
    "Thresholds",
    "check_gate",
    "counted_errors",
    "gated_diff",
    "in_selection",
    "parse_positions",
]
