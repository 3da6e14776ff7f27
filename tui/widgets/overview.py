"""The overview tab: both engines' metadata side by side, the verdict, the findings (select
one to jump to it) and acceptance on matched vs all content.

Pure presentation of :class:`~spectrace.tui.model.Analysis` and the traces' /meta;
computes nothing heavier than a table.
"""

from __future__ import annotations

import json

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from spectrace.tracer.diff_result import CountedAcceptance
from spectrace.tracer.findings import Finding
from spectrace.tracer.fmt import SEVERITY_STYLE, pct
from spectrace.tracer.metrics import CONVENTIONS, Acceptance
from spectrace.tracer.verdict import vanilla_side, verdict

from ..messages import FindingChosen
from ..model import Analysis, ViewModel

#: Metadata rows, in order (key, label).
META_ROWS = (
    ("engine", "engine"),
    ("engine_version", "version"),
    ("engine_commit", "commit"),
    ("method", "method"),
    ("k", "k"),
    ("layout", "layout"),
    ("sampling", "sampling"),
    ("target_model", "target model"),
    ("draft_model", "draft model"),
    ("draft_vocab_size", "draft vocab"),
    ("d2t", "d2t"),
    ("backends", "backends"),
    ("source", "source"),
    ("trace_level", "trace level"),
    ("max_num_seqs", "max_num_seqs"),
)


def _value(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True, separators=(", ", ": "))
    return str(v)


def meta_table(model: ViewModel) -> Table:
    """Metadata of one or both traces, differing values highlighted."""
    t = Table(show_edge=False, box=None, padding=(0, 2), expand=False)
    t.add_column("", style="bold")
    traces = [("ours", model.a)] + ([("theirs", model.b)] if model.b is not None else [])
    for label, tr in traces:
        t.add_column(f"{label}: {tr.name}", overflow="fold", max_width=48)
    rows: list[tuple[str, list[str]]] = [
        ("files", [", ".join(p.name for p in tr.paths) for _, tr in traces]),
        ("status", [tr.status for _, tr in traces]),
        ("blocks", [f"{len(tr.blocks):,}" for _, tr in traces]),
    ]
    for key, label in META_ROWS:
        vals = [_value(tr.meta.get(key)) for _, tr in traces]
        if all(v == "-" for v in vals):
            continue
        rows.append((label, vals))
    for label, vals in rows:
        differ = len(vals) == 2 and vals[0] != vals[1] and label not in ("files", "blocks")
        cells = [Text(v, style="bold yellow" if differ else "") for v in vals]
        t.add_row(Text(label + (" ≠" if differ else "")), *cells)
    return t


def finding_line(f: Finding, where: str) -> Text:
    """One findings-list line: severity, kind, location, message."""
    t = Text()
    t.append(f"{f.severity:<8}", SEVERITY_STYLE.get(f.severity, ""))
    t.append(f"{f.kind:<22}", "bold")
    t.append(f"{where:<26}", "dim")
    t.append(f.message)
    return t


def finding_where(f: Finding) -> str:
    """``side req @pos slot j`` (the finding's first location)."""
    parts: list[str] = [f.side]
    if f.request is not None:
        parts.append(str(f.request))
    if f.position is not None:
        parts.append(f"@{f.position}")
    if f.slot is not None:
        parts.append(f"slot {f.slot}")
    return " ".join(parts)


def verdict_text(an: Analysis | None, model: ViewModel, error: str | None = None) -> Text:
    """The verdict lines at the top of the overview: the diff's verdict sentence
    (:func:`spectrace.tracer.verdict.verdict`), the request counts and where the first
    divergent block is (or, for one trace, its size and findings)."""
    t = Text()
    if an is None:
        t.append(
            error or "Analysing the traces… (the block view works meanwhile: press 2)", style="dim"
        )
    elif an.diff is not None:
        v = verdict(an.diff.diverged, an.diff.reasons, vanilla_side(an.diff.findings))
        t.append(v.word.upper(), style="bold red" if v.diverged else "bold green")
        t.append(v.detail + "\n")
        q = an.diff.requests
        t.append(
            f"{q.matched} request pairs matched; content diverged in "
            f"{q.content_diverged}; unmatched: ours {len(q.unmatched_ours)}, "
            f"theirs {len(q.unmatched_theirs)}.\n"
        )
        first = next(
            ((p, d["first_bad"]) for p, d in enumerate(an.per_pair) if d["first_bad"] is not None),
            None,
        )
        if first is not None and first[0] < len(model.pairs):
            t.append("First divergent block: ", style="bold")
            t.append(f"request {model.pairs[first[0]].label}, position {first[1]}")
            t.append(
                "  — press n to go there, enter on it for the detail, ? for help.", style="dim"
            )
    elif an.summary is not None:
        s = an.summary
        t.append(f"{s['requests']} requests, {s['blocks']} blocks, {len(an.findings)} findings.\n")
        t.append("Press 2 for the blocks, f for the next finding, ? for help.", style="dim")
    return t


def acceptance_table(an: Analysis, paired: bool) -> Table:
    """Acceptance per engine on matched and on all content (recorded / recomputed)."""
    t = Table(show_edge=False, box=None, padding=(0, 2))
    t.add_column("recorded / recomputed", style="bold")
    cols: list[tuple[str, CountedAcceptance]] = []
    if paired and an.diff is not None:
        acc = an.diff.acceptance
        for side, engine in (("ours", acc.ours), ("theirs", acc.theirs)):
            cols += [
                (f"{side} matched", engine.matched_content),
                (f"{side} all", engine.all_content),
            ]
    elif an.summary is not None:
        s = an.summary  # spectrace info's dict: its acceptance keys are Acceptance's fields
        cols = [
            (
                "all content",
                CountedAcceptance(Acceptance(**s["recorded"]), Acceptance(**s["recomputed"])),
            )
        ]
    for name, _ in cols:
        t.add_column(name, justify="right")

    def cell(d: CountedAcceptance, key: str, fmt) -> str:
        return f"{fmt(getattr(d.recorded, key))} / {fmt(getattr(d.recomputed, key))}"

    num = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
    t.add_row("blocks", *[str(d.recorded.blocks) for _, d in cols])
    t.add_row("acceptance rate", *[cell(d, "acceptance_rate", pct) for _, d in cols])
    t.add_row("mean acceptance length", *[cell(d, "mean_acceptance_length", num) for _, d in cols])
    t.add_row(
        "accepted / verified tokens",
        *[f"{d.recorded.accepted_tokens} / {d.recorded.verified_tokens}" for _, d in cols],
    )
    return t


class Overview(VerticalScroll):
    """The overview tab (see the module docstring)."""

    DEFAULT_CSS = """
    Overview { padding: 0 1; }
    Overview .ov-title { text-style: bold; color: $accent; margin-top: 1; }
    Overview #ov-verdict { margin-top: 1; }
    Overview #ov-findings { height: auto; max-height: 16; border: none; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.findings: list[Finding] = []

    def compose(self) -> ComposeResult:
        yield Static("", id="ov-verdict")
        yield Static("Engines", classes="ov-title")
        yield Static("", id="ov-meta")
        yield Static("Findings (enter: go to the block)", classes="ov-title")
        yield OptionList(id="ov-findings")
        yield Static("Acceptance", classes="ov-title")
        yield Static("", id="ov-acceptance")

    def show_model(self, model: ViewModel) -> None:
        """Fill the metadata (available at once)."""
        self.query_one("#ov-meta", Static).update(meta_table(model))

    def show_verdict(self, text: Text) -> None:
        """The verdict lines at the top."""
        self.query_one("#ov-verdict", Static).update(text)

    def show_analysis(self, an: Analysis | None, paired: bool, error: str | None = None) -> None:
        """Findings and acceptance from the analysis (or a placeholder while it runs)."""
        opts = self.query_one("#ov-findings", OptionList)
        opts.clear_options()
        acc = self.query_one("#ov-acceptance", Static)
        if an is None:
            opts.add_option(
                Option(
                    Text(error or "analysing… (runs in the background)", style="dim"), disabled=True
                )
            )
            acc.update(Text(error or "analysing…", style="dim"))
            return
        self.findings = list(an.findings)
        if not self.findings:
            opts.add_option(Option(Text("no findings", style="dim"), disabled=True))
        for i, f in enumerate(self.findings):
            opts.add_option(Option(finding_line(f, finding_where(f)), id=f"finding-{i}"))
        parts: list[RenderableType] = [acceptance_table(an, paired)]
        if paired and an.diff is not None:
            c, g = an.diff.coverage, an.diff.agreement
            parts.append(
                Text(
                    f"\npaired blocks {g.paired_blocks}; exact matches {g.exact_matches} "
                    f"({pct(g.exact_match_rate)}); coverage ours {pct(c.ours_coverage)}, "
                    f"theirs {pct(c.theirs_coverage)} of the blocks on matched content",
                    style="dim",
                )
            )
        parts.append(Text(f"conventions: {CONVENTIONS}", style="dim"))
        acc.update(Group(*parts))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        oid = event.option.id or ""
        if oid.startswith("finding-"):
            self.post_message(FindingChosen(int(oid.split("-")[1])))
