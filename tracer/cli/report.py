"""Text rendering of ``info`` and ``diff`` results for people (rich tables on stdout).

Pure presentation: takes the dict built by :func:`metrics.trace_summary` and the typed
:class:`~spectrace.tracer.diff_result.DiffResult`, computes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from rich.console import Console
from rich.markup import escape as _markup_escape
from rich.table import Table

from ..diff_result import (
    AcceptanceBySide,
    DiffResult,
    Example,
    GateSummary,
    RequestRow,
    RunSummary,
)
from ..fmt import SEVERITY_STYLE, num, pct
from ..metrics import CONVENTIONS
from ..schema import SOURCE_REPLAY, capture_end
from ..verdict import ignored_errors, ignored_note, vanilla_side, verdict
from .output import one_line


def escape(text: str) -> str:
    """``text`` as literal rich markup on one line: brackets escaped, and control characters
    (a request id's newline or terminal escape, read from a trace) written as their escapes,
    so that a finding stays its two lines and cannot drive the terminal."""
    return _markup_escape(one_line(text))


#: Content divergences listed one per line in the text report (JSON lists all).
CONTENT_LINES = 10


_META_SHOWN = (
    "engine",
    "engine_version",
    "method",
    "k",
    "source",
    "target_model",
    "draft_model",
    "sampling",
    "layout",
    "command",
)


def print_info(con: Console, s: dict) -> None:
    """Render a :func:`metrics.trace_summary` dict."""
    meta = s["meta"]
    fmt = ", ".join(s.get("format_version", []))
    t = Table(
        title=escape(f"trace {', '.join(s['files'])}  [{s['status']}, format {fmt}]"),
        show_header=False,
        title_justify="left",
    )
    t.add_column("key", style="bold")
    t.add_column("value")
    for key in _META_SHOWN:
        if key in meta:
            t.add_row(key, escape(_meta_text(key, meta[key])))
    ended = capture_end(meta, s["status"])
    if ended is not None:
        t.add_row("capture", escape(capture_text(ended)))
    if "checks" in meta:
        t.add_row("checks", escape(str(meta["checks"])))
    imp = meta.get("import")
    if isinstance(imp, dict):
        keys = (
            "lines",
            "trace_lines",
            "steps",
            "malformed",
            "violations",
            "chain_gaps",
            "joins",
            "proposed_source",
        )
        t.add_row("import", escape(", ".join(f"{k}={imp[k]}" for k in keys if k in imp)))
    con.print(t)
    rec, rc = s["recorded"], s["recomputed"]
    f = Table(title="figures", title_justify="left")
    f.add_column("figure", style="bold")
    f.add_column("recorded", justify="right")
    f.add_column("recomputed from output", justify="right")
    f.add_row("requests", str(s["requests"]), "")
    f.add_row("blocks", str(s["blocks"]), "")
    f.add_row("blocks verified", str(rec["blocks"]), str(rc["blocks"]))
    f.add_row("proposed tokens", str(s["proposed_tokens"]), "")
    f.add_row("verified tokens", str(s["verified_tokens"]), str(rc["verified_tokens"]))
    f.add_row("unverified blocks", str(s["unverified_blocks"]), "")
    f.add_row("accepted tokens", str(rec["accepted_tokens"]), str(rc["accepted_tokens"]))
    f.add_row("acceptance rate", pct(rec["acceptance_rate"]), pct(rc["acceptance_rate"]))
    f.add_row(
        "mean acceptance length",
        num(rec["mean_acceptance_length"]),
        num(rc["mean_acceptance_length"]),
    )
    for i, (x, y) in enumerate(zip(rec["per_position"], rc["per_position"])):
        f.add_row(f"acceptance at slot {i}", pct(x), pct(y))
    con.print(f)
    _print_left_out(con, s)
    if s["phases_ms"]:
        ph = ", ".join(f"{k}={v:.2f}ms" for k, v in s["phases_ms"].items())
        con.print(f"phase medians: {ph}")
    con.print(f"[dim]conventions: {CONVENTIONS}[/dim]")


def _print_left_out(con: Console, s: dict) -> None:
    """The impossible_values line under the figures, when blocks were left out of them."""
    found = s.get("impossible_values")
    if found:
        con.print(
            f"[bold red]impossible values[/bold red]: {escape(found['message'])}; the "
            f"figures above leave the same {s.get('left_out_blocks', 0)} block(s) out "
            f"(spectrace check exits 1 on them)"
        )


def _meta_text(key: str, value: object) -> str:
    """A /meta value as shown; None (unknown, e.g. the engine of an imported log) says so."""
    if value is None:
        return f"unknown (not recorded; set it with --meta {key}=...)"
    return str(value)


#: How :func:`capture_text` words each ``ended`` value (:data:`schema.CAPTURE_END`).
_ENDED_TEXT = {
    "clean": "command exited cleanly",
    "engine-exit": "command failed",
    "engine-signal": "command KILLED by signal {signal}",
    "interrupted": "interrupted (spectrace got signal {signal} and forwarded it)",
    "timeout": "stopped after --timeout {timeout_s} s (signal {signal})",
    "capture-failed": "capture failed: {error}",
    "capture-killed": "capture killed or still running (the file was never finished)",
}


def capture_text(ended: dict) -> str:
    """One phrase for a :func:`schema.capture_end` record, e.g. ``command KILLED by signal 9
    (exit status 137)``."""
    what = ended.get("ended")
    text = _ENDED_TEXT.get(str(what), f"ended {what!r}")
    try:
        text = text.format(**{"signal": "?", "timeout_s": "?", "error": "?", **ended})
    except (KeyError, IndexError, ValueError):
        pass  # a foreign record: the template as is
    code = ended.get("exit_status")
    return text if code is None else f"{text} (exit status {code})"


def print_findings(con: Console, findings: list) -> None:
    """Render findings, most severe first, one block each: kind, where, sentence."""
    if not findings:
        con.print("findings: [green]none[/green]")
        return
    con.print(f"findings ({len(findings)}):")
    for f in findings:
        where = ", ".join(
            x
            for x in (
                f"request {escape(f.request)}" if f.request is not None else "",
                f"position {f.position}" if f.position is not None else "",
                f"slot {f.slot}" if f.slot is not None else "",
            )
            if x
        )
        style = SEVERITY_STYLE[f.severity]
        # One trace (check): no side to name; a diff names ours, theirs or both.
        place = "; ".join(x for x in ("" if f.side == "trace" else f.side, where) if x)
        con.print(
            f"  [{style}]{f.severity:<7}[/{style}] [bold]{f.kind}[/bold]"
            f"{f' ({place})' if place else ''}"
        )
        con.print(f"          {escape(f.message)}")


def print_diff(con: Console, r: DiffResult) -> None:
    """Render a :class:`DiffResult`: verdict, content, agreement, acceptance, examples."""
    _print_sides(con, r)
    if r.gate is not None:
        _print_gate(con, r.gate)
    _print_replay(con, r)
    print_findings(con, r.findings)
    _print_requests(con, r)
    _print_agreement(con, r)
    _print_acceptance(con, r.acceptance)
    _print_examples(con, r.examples)
    if r.by_request is not None:
        print_by_request(con, r.by_request)
    con.print(f"[dim]conventions: {CONVENTIONS}[/dim]")


def _print_gate(con: Console, g: GateSummary) -> None:
    """One line: what the verdict was judged by, and the agreement it met or missed."""
    where = [
        f"requests {', '.join(g.requests)}" if g.requests is not None else "",
        f"positions {g.positions}" if g.positions is not None else "",
    ]
    rule = (
        f"agreement {g.agreeing_blocks}/{g.paired_blocks} ({pct(g.agreement)}) >= "
        f"{pct(g.min_agreement)}, error findings {g.errors_counted} <= {g.max_errors}"
        + (f" (ignoring {', '.join(g.ignore)})" if g.ignore else "")
    )
    style, word = ("green", "passed") if g.passed else ("red", "FAILED")
    scope = "; ".join(x for x in where if x)
    con.print(
        f"gate: {escape(scope + ': ' if scope else '')}{escape(rule)}: [{style}]{word}[/{style}]"
    )


def print_check_gate(con: Console, problems: list[str], ignored: Sequence[str] = ()) -> None:
    """``check``'s threshold verdict (one line); ``ignored``: the kinds of the error
    findings ``--ignore`` left out, one per finding (said when it passed)."""
    if problems:
        con.print(f"gate: [red]FAILED[/red]: {escape('; '.join(problems))}")
    else:
        con.print(f"gate: [green]passed[/green]{escape(ignored_note(ignored))}")


def print_by_request(con: Console, rows: list[RequestRow]) -> None:
    """The ``--by-request`` table: one row per matched request pair."""
    t = Table(title="per request (matched pairs)", title_justify="left")
    for col in ("request", "paired", "exact", "first divergent block", "first error"):
        t.add_column(col, justify="right" if col in ("paired", "exact") else "left")
    t.add_column("acceptance ours", justify="right")
    t.add_column("acceptance theirs", justify="right")
    for x in rows:
        req = x.ours_req if x.ours_req == x.theirs_req else f"{x.ours_req} / {x.theirs_req}"
        first = "-"
        if x.first_divergent_position is not None:
            first = (
                f"position {x.first_divergent_position} slot {x.first_divergent_slot}: "
                f"{x.ours} vs {x.theirs}"
            )
        t.add_row(
            escape(req),
            str(x.paired_blocks),
            pct(x.exact_match_rate),
            escape(first),
            escape(x.first_error or "-"),
            pct(x.acceptance_ours),
            pct(x.acceptance_theirs),
        )
    con.print(t)


def print_runs(con: Console, results: list[DiffResult]) -> None:
    """``diff GOLDEN RUN RUN...``: one summary row per run, then how many diverge (and the
    per-request table of each run given ``--by-request``)."""
    con.print(escape(f"golden: {', '.join(results[0].ours.files)}"))
    t = Table(title="runs against the golden", title_justify="left")
    for col in ("run", "verdict", "paired", "exact", "first error", "acc golden", "acc run"):
        t.add_column(col, justify="right" if col in ("paired", "exact") or "acc" in col else "left")
    for r in results:
        row = RunSummary.of(r)
        word = "[bold red]DIVERGED[/bold red]" if row.diverged else "[green]agrees[/green]"
        t.add_row(
            escape(", ".join(row.files)),
            word,
            str(row.paired_blocks),
            f"{row.exact_matches}/{row.paired_blocks} ({pct(row.exact_match_rate)})",
            escape(row.first_error or "-"),
            pct(row.golden_acceptance),
            pct(row.run_acceptance),
        )
    con.print(t)
    for r in results:  # a run that diverged with no error finding: say why (its gate)
        if r.diverged and not RunSummary.of(r).first_error and r.reasons:
            con.print(escape(f"run {', '.join(r.theirs.files)}: {r.reasons[0]}"))
    n = sum(r.diverged for r in results)
    style = "bold red" if n else "bold green"
    con.print(f"[{style}]{n} of {len(results)} runs diverge[/{style}]")
    for r in results:
        if r.by_request is not None:
            con.print(escape(f"run {', '.join(r.theirs.files)}:"))
            print_by_request(con, r.by_request)
    con.print(f"[dim]acceptance: recorded, on matched content; {CONVENTIONS}[/dim]")


def _print_sides(con: Console, r: DiffResult) -> None:
    """One line per trace (files, engine, method, k, blocks), then the verdict."""
    for label, side in (("ours:  ", r.ours), ("theirs:", r.theirs)):
        engine = " ".join(str(x) for x in (side.engine, side.engine_version) if x)
        con.print(
            escape(
                f"{label} {', '.join(side.files)}  ({engine or 'engine unknown'}, "
                f"{side.method or 'method unknown'}, k={'?' if side.k is None else side.k}, "
                f"{side.blocks} blocks)"
            )
        )
    g = r.gate
    if g is not None and g.passed and g.agreeing_blocks < g.paired_blocks:
        # never "no divergence" while paired blocks differ: the thresholds let them pass
        n = g.paired_blocks - g.agreeing_blocks
        con.print(
            f"[bold yellow]gate passed[/bold yellow]: {n} of {g.paired_blocks} paired blocks "
            f"differ (within the thresholds)"
        )
        return
    ignored = ignored_errors(r.findings, g.ignore if g is not None else ())
    v = verdict(r.diverged, r.reasons, vanilla_side(r.findings), ignored)
    style = "bold red" if v.diverged else "bold green"
    con.print(f"[{style}]{v.word}[/{style}]{escape(v.detail)}")


def _print_replay(con: Console, r: DiffResult) -> None:
    """For a replay pair (both sides ``source: replay``): what the pairing and the
    acceptance figures mean there."""
    if not r.ours.source == r.theirs.source == SOURCE_REPLAY:
        return
    cv = r.coverage
    unpaired = max(cv.ours_on_matched_content, cv.theirs_on_matched_content) - cv.paired
    con.print(
        "replay pair: both engines drafted from the same reference prefixes, so every "
        "position pairs where their targets sampled the same anchor "
        f"({unpaired} position(s) where they did not are left out); acceptance is "
        "teacher-forced (the drafts checked against the reference sequence)"
    )


def _print_requests(con: Console, r: DiffResult) -> None:
    """Request matching and the first :data:`CONTENT_LINES` content divergences."""
    q = r.requests
    con.print(
        f"requests: {q.matched} matched (by prompt {q.matched_by.prompt}, "
        f"by id {q.matched_by.req_id}, by order {q.matched_by.order}); "
        f"unmatched ours {len(q.unmatched_ours)}, theirs {len(q.unmatched_theirs)}; "
        f"content diverged in {q.content_diverged}{_drift_note(r)}"
    )
    for c in r.content_divergence[:CONTENT_LINES]:
        con.print(
            f"  content diverges: request {escape(c.ours_req)} / {escape(c.theirs_req)} at "
            f"position {c.position} (output token {c.position - c.prompt_len}): ours "
            f"{escape(str(c.ours_token))}, theirs {escape(str(c.theirs_token))}; later blocks "
            f"are not compared"
        )
    if len(r.content_divergence) > CONTENT_LINES:
        con.print(
            f"  ... and {len(r.content_divergence) - CONTENT_LINES} more requests "
            f"diverge (--format json lists every one)"
        )


def _drift_note(r: DiffResult) -> str:
    """``; N paired by similar prompts (prompt_drift, not compared)`` or empty."""
    n = sum(f.evidence.get("requests", 0) for f in r.findings if f.kind == "prompt_drift")
    return f"; {n} paired by similar prompts (prompt_drift, not compared)" if n else ""


def _print_agreement(con: Console, r: DiffResult) -> None:
    """Coverage, the paired blocks' agreement and the per-position agreement table."""
    cv, ag = r.coverage, r.agreement
    outside = [
        f"{cv.blocks(side) - cv.on_matched_content(side)} of {side}"
        for side in ("ours", "theirs")
        if cv.blocks(side) > cv.on_matched_content(side)
    ]
    note = (
        f"; not on matched content: {' and '.join(outside)} (past a divergence or the "
        f"shorter output's end, in unmatched requests, or a request's final proposal that "
        f"only one side drafted, never verified)"
        if outside
        else ""
    )
    con.print(
        f"coverage: {cv.paired} paired blocks = {pct(cv.ours_coverage)} of ours "
        f"({cv.ours_on_matched_content}) and {pct(cv.theirs_coverage)} of theirs "
        f"({cv.theirs_on_matched_content}) on matched content{note}"
    )
    con.print(
        f"paired blocks: anchors equal {ag.paired_blocks - ag.anchor_mismatches}"
        f"/{ag.paired_blocks}, proposals identical {ag.exact_matches}"
        f"/{ag.paired_blocks} ({pct(ag.exact_match_rate)}), k differs in "
        f"{ag.k_mismatches}, mean common prefix {num(ag.mean_common_prefix, 2)}"
    )
    pp = Table(title="per-position agreement (paired blocks)", title_justify="left")
    pp.add_column("slot", justify="right")
    pp.add_column("blocks", justify="right")
    pp.add_column("equal", justify="right")
    pp.add_column(escape("ours[i] == theirs[i+1]"), justify="right")
    pp.add_column(escape("ours[i+1] == theirs[i]"), justify="right")
    for i, (x, n) in enumerate(zip(ag.per_position, ag.per_position_blocks)):
        sp = ag.shift_plus_one[i] if i < len(ag.shift_plus_one) else None
        sm = ag.shift_minus_one[i] if i < len(ag.shift_minus_one) else None
        pp.add_row(str(i), str(n), pct(x), pct(sp), pct(sm))
    con.print(pp)


def _print_examples(con: Console, examples: list[Example]) -> None:
    """The first divergent blocks as a table (nothing when there are none)."""
    if not examples:
        return
    ex = Table(title="first divergent blocks", title_justify="left")
    for col in ("request", "position", "anchor", "ours", "theirs", "slot"):
        ex.add_column(col)
    for e in examples:
        anchor = str(e.anchor_ours) if e.anchor_equal else f"{e.anchor_ours} vs {e.anchor_theirs}"
        ex.add_row(
            escape(e.ours_req),
            str(e.position),
            anchor,
            escape(str(e.ours)),
            escape(str(e.theirs)),
            str(e.first_differing_slot),
        )
    con.print(ex)


def _print_acceptance(con: Console, acc: AcceptanceBySide) -> None:
    """Acceptance per engine (matched/all content, recorded/recomputed) and per position."""
    t = Table(title="acceptance per engine", title_justify="left")
    columns: tuple[tuple[str, Literal["left", "right"]], ...] = (
        ("engine", "left"),
        ("content", "left"),
        ("counted", "left"),
        ("blocks", "right"),
        ("acc/verified", "right"),
        ("rate", "right"),
        ("mean length", "right"),
    )
    for col, just in columns:
        t.add_column(col, justify=just)
    for side in ("ours", "theirs"):
        for scope, label in (("matched_content", "matched"), ("all_content", "all")):
            for how, name in (("recorded", "recorded"), ("recomputed", "from output")):
                x = getattr(getattr(getattr(acc, side), scope), how)
                t.add_row(
                    side,
                    label,
                    name,
                    str(x.blocks),
                    f"{x.accepted_tokens}/{x.verified_tokens}",
                    pct(x.acceptance_rate),
                    num(x.mean_acceptance_length, 2),
                )
    con.print(t)
    pp = Table(title="per-position acceptance (recorded)", title_justify="left")
    pp.add_column("slot", justify="right")
    cols = [
        (side, scope) for scope in ("matched_content", "all_content") for side in ("ours", "theirs")
    ]
    for side, scope in cols:
        pp.add_column(f"{side}, {scope.split('_')[0]}", justify="right")
    curves = [getattr(getattr(acc, side), scope).recorded.per_position for side, scope in cols]
    for i in range(max(len(c) for c in curves)):
        pp.add_row(str(i), *(pct(c[i]) if i < len(c) else "-" for c in curves))
    con.print(pp)
