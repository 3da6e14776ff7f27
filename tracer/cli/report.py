"""Text rendering of ``info`` and ``diff`` results for people (rich tables on stdout).

Pure presentation: takes the dicts built by :mod:`metrics` and :mod:`diff`, computes nothing.
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..diff_result import AcceptanceBySide, DiffResult
from ..metrics import CONVENTIONS

#: Content divergences listed one per line in the text report (JSON lists all).
CONTENT_LINES = 10


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x, fmt: str = "{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


_META_SHOWN = ("engine", "engine_version", "method", "k", "source", "target_model",
               "draft_model", "sampling", "layout", "command")


def print_info(con: Console, s: dict) -> None:
    """Render a :func:`metrics.trace_summary` dict."""
    meta = s["meta"]
    fmt = ", ".join(s.get("format_version", []))
    t = Table(title=escape(f"trace {', '.join(s['files'])}  [{s['status']}, format {fmt}]"),
              show_header=False, title_justify="left")
    t.add_column("key", style="bold")
    t.add_column("value")
    for key in _META_SHOWN:
        if key in meta:
            t.add_row(key, str(meta[key]))
    if "checks" in meta:
        t.add_row("checks", escape(str(meta["checks"])))
    imp = meta.get("import")
    if isinstance(imp, dict):
        keys = ("lines", "trace_lines", "steps", "malformed", "violations", "chain_gaps",
                "joins", "proposed_source")
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
    f.add_row("acceptance rate", _pct(rec["acceptance_rate"]), _pct(rc["acceptance_rate"]))
    f.add_row("mean acceptance length", _num(rec["mean_acceptance_length"]),
              _num(rc["mean_acceptance_length"]))
    for i, (x, y) in enumerate(zip(rec["per_position"], rc["per_position"])):
        f.add_row(f"acceptance at slot {i}", _pct(x), _pct(y))
    con.print(f)
    if s["phases_ms"]:
        ph = ", ".join(f"{k}={v:.2f}ms" for k, v in s["phases_ms"].items())
        con.print(f"phase medians: {ph}")
    con.print(f"[dim]conventions: {CONVENTIONS}[/dim]")


_SEV_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def print_findings(con: Console, findings: list) -> None:
    """Render findings, most severe first, one block each: kind, where, sentence."""
    if not findings:
        con.print("findings: [green]none[/green]")
        return
    con.print(f"findings ({len(findings)}):")
    for f in findings:
        where = ", ".join(x for x in (
            f"request {f.request}" if f.request is not None else "",
            f"position {f.position}" if f.position is not None else "",
            f"slot {f.slot}" if f.slot is not None else "") if x)
        style = _SEV_STYLE[f.severity]
        con.print(f"  [{style}]{f.severity:<7}[/{style}] [bold]{f.kind}[/bold] ({f.side}"
                  f"{'; ' + where if where else ''})")
        con.print(f"          {escape(f.message)}")


def print_diff(con: Console, r: DiffResult) -> None:
    """Render a :class:`DiffResult`: verdict, content, agreement, acceptance, examples."""
    o, t = r.ours, r.theirs
    for label, side in (("ours:  ", o), ("theirs:", t)):
        engine = " ".join(str(x) for x in (side.engine, side.engine_version) if x)
        con.print(escape(f"{label} {', '.join(side.files)}  ({engine or '?'}, "
                         f"{side.method or 'method ?'}, k={side.k or '?'}, "
                         f"{side.blocks} blocks)"))
    verdict = ("[bold red]DIVERGED[/bold red]: " + "; ".join(r.reasons)) if r.diverged else \
        "[bold green]no divergence[/bold green] on comparable blocks"
    con.print(verdict)
    print_findings(con, r.findings)
    q = r.requests
    con.print(f"requests: {q.matched} matched (by prompt {q.matched_by.prompt}, "
              f"by id {q.matched_by.req_id}, by order {q.matched_by.order}); "
              f"unmatched ours {len(q.unmatched_ours)}, theirs {len(q.unmatched_theirs)}; "
              f"content diverged in {q.content_diverged}")
    for c in r.content_divergence[:CONTENT_LINES]:
        con.print(f"  content diverges: request {c.ours_req} / {c.theirs_req} at position "
                  f"{c.position} (output token {c.position - c.prompt_len}): ours "
                  f"{c.ours_token}, theirs {c.theirs_token}; later blocks are not compared")
    if len(r.content_divergence) > CONTENT_LINES:
        con.print(f"  ... and {len(r.content_divergence) - CONTENT_LINES} more requests "
                  f"diverge (--format json lists every one)")
    cv, ag = r.coverage, r.agreement
    outside = [f"{cv.blocks(side) - cv.on_matched_content(side)} of {side}"
               for side in ("ours", "theirs")
               if cv.blocks(side) > cv.on_matched_content(side)]
    note = (f"; not on matched content: {' and '.join(outside)} (past a divergence, in "
            f"unmatched requests, or a request's final proposal, never verified)"
            if outside else "")
    con.print(f"coverage: {cv.paired} paired blocks = {_pct(cv.ours_coverage)} of ours "
              f"({cv.ours_on_matched_content}) and {_pct(cv.theirs_coverage)} of theirs "
              f"({cv.theirs_on_matched_content}) on matched content{note}")
    con.print(f"paired blocks: anchors equal {ag.paired_blocks - ag.anchor_mismatches}"
              f"/{ag.paired_blocks}, proposals identical {ag.exact_matches}"
              f"/{ag.paired_blocks} ({_pct(ag.exact_match_rate)}), k differs in "
              f"{ag.k_mismatches}, mean common prefix {_num(ag.mean_common_prefix, '{:.2f}')}")
    pp = Table(title="per-position agreement (paired blocks)", title_justify="left")
    pp.add_column("slot", justify="right")
    pp.add_column("blocks", justify="right")
    pp.add_column("equal", justify="right")
    pp.add_column(escape("ours[i] == theirs[i+1]"), justify="right")
    pp.add_column(escape("ours[i+1] == theirs[i]"), justify="right")
    for i, (x, n) in enumerate(zip(ag.per_position, ag.per_position_blocks)):
        sp = ag.shift_plus_one[i] if i < len(ag.shift_plus_one) else None
        sm = ag.shift_minus_one[i] if i < len(ag.shift_minus_one) else None
        pp.add_row(str(i), str(n), _pct(x), _pct(sp), _pct(sm))
    con.print(pp)
    _print_acceptance(con, r.acceptance)
    if r.examples:
        ex = Table(title="first divergent blocks", title_justify="left")
        for col in ("request", "position", "anchor", "ours", "theirs", "slot"):
            ex.add_column(col)
        for e in r.examples:
            anchor = str(e.anchor_ours) if e.anchor_equal else \
                f"{e.anchor_ours} vs {e.anchor_theirs}"
            ex.add_row(escape(e.ours_req), str(e.position), anchor,
                       escape(str(e.ours)), escape(str(e.theirs)),
                       str(e.first_differing_slot))
        con.print(ex)
    con.print(f"[dim]conventions: {CONVENTIONS}[/dim]")


def _print_acceptance(con: Console, acc: AcceptanceBySide) -> None:
    t = Table(title="acceptance per engine", title_justify="left")
    for col, just in (("engine", "left"), ("content", "left"), ("counted", "left"),
                      ("blocks", "right"), ("acc/verified", "right"),
                      ("rate", "right"), ("mean length", "right")):
        t.add_column(col, justify=just)
    for side in ("ours", "theirs"):
        for scope, label in (("matched_content", "matched"), ("all_content", "all")):
            for how, name in (("recorded", "recorded"), ("recomputed", "from output")):
                x = getattr(getattr(getattr(acc, side), scope), how)
                t.add_row(side, label, name, str(x.blocks),
                          f"{x.accepted_tokens}/{x.verified_tokens}",
                          _pct(x.acceptance_rate),
                          _num(x.mean_acceptance_length, "{:.2f}"))
    con.print(t)
    pp = Table(title="per-position acceptance (recorded)", title_justify="left")
    pp.add_column("slot", justify="right")
    cols = [(side, scope) for scope in ("matched_content", "all_content")
            for side in ("ours", "theirs")]
    for side, scope in cols:
        pp.add_column(f"{side}, {scope.split('_')[0]}", justify="right")
    curves = [getattr(getattr(acc, side), scope).recorded.per_position for side, scope in cols]
    for i in range(max(len(c) for c in curves)):
        pp.add_row(str(i), *(_pct(c[i]) if i < len(c) else "-" for c in curves))
    con.print(pp)
