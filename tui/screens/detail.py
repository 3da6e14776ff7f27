"""The block detail dialog: full ids and decoded tokens of one row, both sides.

Shows proposed, verified and emitted ids slot by slot with their decoded tokens (and the
drafter's top-1 minus top-2 logit per slot and the target's at the anchor, where the trace
records margins), the preceding context decoded, the recorded phase timings of the block's
engine step, the row's explanation and any finding located there. Escape, enter or q closes it.
"""

from __future__ import annotations

import math

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from spectrace.tracer.findings.thresholds import NEAR_TIE_MARGIN
from spectrace.tracer.store import Trace
from spectrace.tracer.tokens import Decoder, show

from ..fmt import divergence_text, explain
from ..model import STATE_NAMES, Rows, ViewModel, Window

STATE_STYLE = {
    "equal": "green",
    "different": "bold red",
    "shifted": "bold yellow",
    "past divergence": "bright_black",
    "unpaired": "",
    "none": "dim",
}


#: One side of a row: (side name, trace, block index or -1, request row).
Side = tuple[str, Trace, int, int]


def detail_renderable(
    model: ViewModel, rows: Rows, row: int, decoder: Decoder | None, findings: list, next_ids=None
) -> Group:
    """Everything the dialog shows (a Rich renderable; tested directly)."""
    win = model.window(rows, row)
    i = row - win.start
    pair = rows.pair
    pos = int(win.pos[i])
    title = Text(
        f"Request {pair.label}   anchor position {pos}   content divergence "
        f"{divergence_text(rows.divergence)}",
        style="bold",
    )
    why = Text(explain(win, i, pair, decoder, rows.divergence, findings, next_ids))
    sides: list[Side] = [("ours", model.a, int(rows.ia[row]), pair.req_a)]
    if model.b is not None:
        sides.append(("theirs", model.b, int(rows.ib[row]), pair.req_b))
    blocks = {name: (model.block(name, idx) if idx >= 0 else None) for name, _, idx, _ in sides}
    # Identical content up to the anchor: one context says it all.
    one_context = model.b is not None and pair.matched and rows.divergence > pos
    return Group(
        title,
        Text(""),
        why,
        Text(""),
        _facts(sides, blocks, decoder),
        Text(""),
        _slots(sides, blocks, win, i, decoder),
        *_margins(sides),
        Text(""),
        *_context(model, sides, pos, decoder, one_context),
        Text(""),
        *_timings(model, sides, blocks),
    )


def _facts(sides: list[Side], blocks: dict, decoder: Decoder | None) -> Table:
    facts = Table(box=None, padding=(0, 2), show_edge=False)
    facts.add_column("", style="bold")
    for name, tr, _, _ in sides:
        facts.add_column(f"{name} ({tr.meta.get('engine') or tr.name})")
    for key, label in (
        ("step", "engine step"),
        ("k", "drafts (k)"),
        ("num_verified", "verified"),
        ("accepted", "accepted (recorded)"),
        ("num_emitted", "emitted"),
    ):
        vals = []
        for name, *_ in sides:
            blk = blocks[name]
            v = "-" if blk is None else blk[key]
            vals.append("unknown" if v == -1 else str(v))
        facts.add_row(label, *vals)
    anchor_vals = []
    for name, *_ in sides:
        blk = blocks[name]
        anchor_vals.append("-" if blk is None else f"{blk['anchor']} {_q(decoder, blk['anchor'])}")
    facts.add_row("anchor", *anchor_vals)
    return facts


def _slots(sides: list[Side], blocks: dict, win: Window, i: int, decoder: Decoder | None) -> Table:
    slots = Table(
        box=None,
        padding=(0, 1),
        show_edge=False,
        title="drafts slot by slot",
        title_justify="left",
        title_style="bold",
    )
    slots.add_column("slot", justify="right")
    for name, *_ in sides:
        for col in ("proposed", "verified", "emitted"):
            slots.add_column(f"{name} {col}")
    width = max(
        [len(b["emitted"]) for b in blocks.values() if b]
        + [len(b["proposed"]) for b in blocks.values() if b]
        + [0]
    )
    side_key = {"ours": "a", "theirs": "b"}
    for j in range(width):
        cells: list[str | Text] = [str(j)]
        for name, *_ in sides:
            blk = blocks[name]
            sd = getattr(win, side_key[name])
            for col in ("proposed", "verified", "emitted"):
                ids = blk[col] if blk else []
                if j >= len(ids):
                    cells.append("")
                    continue
                tid = ids[j]
                txt = Text(f"{tid} {_q(decoder, tid)}")
                if col == "proposed" and sd is not None and j < sd["state"].shape[1]:
                    state = STATE_NAMES[int(sd["state"][i, j])]
                    txt.stylize(STATE_STYLE.get(state, ""))
                    if sd["acc"][i, j]:
                        txt.stylize("underline")
                cells.append(txt)
        slots.add_row(*cells)
    return slots


def _margin_values(tr: Trace, idx: int) -> tuple[list[float], float]:
    """(draft margin per slot, target margin) of block ``idx``; NaN where unknown."""
    if idx < 0:
        return [], math.nan
    row = tr.blocks.draft_margin[idx]
    return [float(x) for x in row[: int(tr.blocks.k[idx])]], float(tr.blocks.target_margin[idx])


def _margins(sides: list[Side]) -> list:
    """The margins table (top-1 minus top-2 logit; near-ties show in yellow), or nothing
    when no side records margins."""
    vals = {name: _margin_values(tr, idx) for name, tr, idx, _ in sides}
    if not any(math.isfinite(x) for d, t in vals.values() for x in [*d, t]):
        return []

    def cell(x: float) -> Text:
        if not math.isfinite(x):
            return Text("-", style="dim")
        return Text(f"{x:.4f}", style="bold yellow" if x < NEAR_TIE_MARGIN else "")

    t = Table(box=None, padding=(0, 2), show_edge=False, title="margins (top-1 minus top-2 logit)")
    t.title_justify, t.title_style = "left", "bold"
    t.add_column("")
    for name in vals:
        t.add_column(name)
    t.add_row("target at anchor", *[cell(tm) for _, tm in vals.values()])
    for j in range(max(len(d) for d, _ in vals.values())):
        t.add_row(
            f"draft slot {j}", *[cell(d[j]) if j < len(d) else Text("") for d, _ in vals.values()]
        )
    return [Text(""), t]


def _context(
    model: ViewModel, sides: list[Side], pos: int, decoder: Decoder | None, one: bool
) -> list[Text]:
    parts = [Text("preceding context (anchor last)", style="bold")]
    for name, _, idx, req in sides:
        if idx < 0:
            continue
        ids = model.context(name, req, pos)
        if not len(ids):
            parts.append(Text(f"  {name}: output ids not recorded", style="dim"))
            continue
        line = Text(f"  {name}: ", style="dim")
        if decoder is not None:
            line.append("…" + show(decoder.text(ids[:-1])))
            line.append(f"⟦{show(decoder.token(int(ids[-1])))}⟧", style="bold reverse")
        else:
            line.append("… " + " ".join(str(int(x)) for x in ids[:-1]) + " ")
            line.append(f"⟦{int(ids[-1])}⟧", style="bold reverse")
        parts.append(line)
        if one:
            break
    return parts


def _timings(model: ViewModel, sides: list[Side], blocks: dict) -> list[Text]:
    timing = [Text("phase timings of the block's engine step", style="bold")]
    for name, *_ in sides:
        blk = blocks[name]
        if blk is None:
            continue
        ph = model.phases_of(name, blk["step"], blk["file"])
        if ph:
            timing.append(
                Text(f"  {name}: " + ", ".join(f"{n} {ms:.3f} ms (level {lv})" for n, ms, lv in ph))
            )
    if len(timing) == 1:
        timing.append(Text("  not recorded", style="dim"))
    return timing


def _q(decoder: Decoder | None, tid: int) -> str:
    if decoder is None or tid < 0:
        return ""
    return f"'{show(decoder.token(int(tid)))}'"


class BlockDetail(ModalScreen[None]):
    """The detail dialog of one row (see the module docstring)."""

    BINDINGS = [Binding("escape,enter,q", "close", "Close", id="detail.close")]
    DEFAULT_CSS = """
    BlockDetail { align: center middle; }
    BlockDetail > VerticalScroll {
        width: 90%; height: 90%; border: thick $accent; background: $surface; padding: 0 1;
    }
    """

    def __init__(self, body: Group) -> None:
        super().__init__()
        self.body = body

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(self.body, id="detail-body")

    def action_close(self) -> None:
        """Close."""
        self.dismiss(None)
