"""The help screen: every key (from the keymap, so it is complete), the colours of the block
view and the words it uses."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ..keymap import all_keys
from ..widgets.block_view import BlockView

#: (sample, block view component, fallback style, meaning)
LEGEND = (
    ("cat", "equal", "green", "equal: both engines proposed this id in this slot"),
    ("cat", "different", "bold red", "different: the ids differ"),
    ("cat", "shifted", "bold yellow", "shifted: equal to the other side one slot off"),
    (
        "cat",
        "past",
        "bright_black",
        "past the content divergence (the texts differ) or a "
        "request's final, never-verified proposal only one side drafted: not comparable",
    ),
    ("cat", "solo", "", "unpaired: only this side drafted from this position"),
    ("cat", "accepted", "underline", "inside the accepted prefix (the target took it)"),
    ("cat", "unverified", "dim italic", "not verified by the target"),
    ("*", "vdiff", "bold magenta", "before a slot: the verified id differs from the proposed"),
    ("●", "bad", "bold red", "gutter: this block diverges (anchor or drafts differ)"),
    ("◆", "finding", "bold yellow", "gutter: a finding points at this position"),
)

WORDS = (
    ("anchor", "the last verified (or bonus) token; drafts continue from it"),
    ("position", "absolute index of the anchor in prompt + output, in tokens"),
    ("drafts / slots", "the k ids the drafter proposed for positions position+1 .. +k"),
    ("accepted", "how many leading drafts the target kept (as the engine recorded it)"),
    (
        "content divergence",
        "first position where the two engines' texts differ; "
        "blocks from there on cannot be compared",
    ),
    (
        "divergent block",
        "same request, same position, identical content, but the anchors "
        "or the drafts differ: the thing to explain",
    ),
)


def help_renderable(styles: dict | None = None) -> Group:
    """Keys, legend and words as one renderable (``styles``: the block view's component
    styles by name, so the legend looks like the view under the current theme)."""
    keys = Table(
        box=None,
        padding=(0, 2),
        show_edge=False,
        title="Keys",
        title_justify="left",
        title_style="bold",
    )
    keys.add_column("keys", style="bold cyan")
    keys.add_column("does")
    keys.add_column("where", style="dim")
    for k in all_keys():
        keys.add_row(k.label, k.description, k.group)
    keys.add_row("tab / shift+tab", "Move focus between panes", "general")
    legend = Table(
        box=None,
        padding=(0, 2),
        show_edge=False,
        title="Block view colours",
        title_justify="left",
        title_style="bold",
    )
    legend.add_column("looks")
    legend.add_column("means")
    for sample, comp, style, text in LEGEND:
        legend.add_row(Text(sample, style=(styles or {}).get(comp) or style), text)
    words = Table(
        box=None,
        padding=(0, 2),
        show_edge=False,
        title="Words",
        title_justify="left",
        title_style="bold",
    )
    words.add_column("word", style="bold")
    words.add_column("meaning")
    for w, m in WORDS:
        words.add_row(w, m)
    return Group(keys, Text(""), legend, Text(""), words)


class HelpScreen(ModalScreen[None]):
    """Every key and colour (escape, q or ? closes)."""

    BINDINGS = [Binding("escape,q,question_mark", "close", "Close", id="help.close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 96; height: 90%; border: thick $accent;
                                  background: $surface; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        styles = {}
        try:
            view = self.app.screen_stack[-1].query_one(BlockView)
            styles = {
                comp: view.get_component_rich_style(f"blockview--{comp}", partial=True)
                for _, comp, _, _ in LEGEND
            }
        except Exception:  # no block view on the stack: plain colours
            styles = {}
        with VerticalScroll():
            yield Static(help_renderable(styles), id="help-body")

    def action_close(self) -> None:
        """Close."""
        self.dismiss(None)
