"""Every key of the viewer, in one table: bindings, the footer, the help screen and the
command palette read it.

Each key has a stable ``id`` (Textual keymaps can remap it: ``App.set_keymap``), the keys,
the action, a description, a group and, for the main screen's actions, the palette's hint.
Paging keys are not animated.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding, BindingType


@dataclass(frozen=True)
class Key:
    """One binding: ``keys`` (comma-separated Textual key names), shown as ``label``;
    ``hint`` is the command palette's help line (empty: not in the palette)."""

    id: str
    keys: str
    action: str
    description: str
    group: str
    label: str
    show: bool = False
    hint: str = ""


#: The app-wide keys (the main screen), then the block view's own, then the lists'.
KEYS: tuple[Key, ...] = (
    Key("quit", "q", "app.quit", "Quit", "general", "q", show=True),
    Key(
        "help",
        "question_mark,f1",
        "help",
        "Help: every key and colour",
        "general",
        "?",
        show=True,
        hint="every key and colour",
    ),
    Key("palette", "ctrl+p", "app.command_palette", "Command palette", "general", "ctrl+p"),
    Key(
        "tab.overview",
        "1",
        "tab('overview')",
        "Overview tab",
        "general",
        "1",
        hint="metadata, findings, acceptance",
    ),
    Key(
        "tab.blocks",
        "2",
        "tab('blocks')",
        "Blocks tab",
        "general",
        "2",
        hint="one line per anchor position",
    ),
    Key(
        "tab.charts",
        "3",
        "tab('charts')",
        "Charts tab",
        "general",
        "3",
        hint="acceptance and agreement, drawn",
    ),
    Key(
        "div.next",
        "n",
        "divergence(1)",
        "Next divergent block",
        "navigate",
        "n",
        show=True,
        hint="jump to the next block whose drafts differ",
    ),
    Key(
        "div.prev",
        "N",
        "divergence(-1)",
        "Previous divergent block",
        "navigate",
        "N",
        hint="jump back",
    ),
    Key(
        "finding.next",
        "f",
        "finding(1)",
        "Next finding",
        "navigate",
        "f",
        show=True,
        hint="jump to the next finding's location",
    ),
    Key("finding.prev", "F", "finding(-1)", "Previous finding", "navigate", "F", hint="jump back"),
    Key(
        "content",
        "c",
        "content_divergence",
        "Go to this request's content divergence",
        "navigate",
        "c",
        hint="where the two texts start to differ",
    ),
    Key(
        "goto",
        "colon",
        "goto",
        "Go to anchor position",
        "navigate",
        ":",
        show=True,
        hint="type a position",
    ),
    Key(
        "req.next",
        "right_square_bracket",
        "request(1)",
        "Next request",
        "navigate",
        "]",
        hint="the next request's blocks",
    ),
    Key(
        "req.prev",
        "left_square_bracket",
        "request(-1)",
        "Previous request",
        "navigate",
        "[",
        hint="the previous request's blocks",
    ),
    Key(
        "search",
        "slash",
        "search",
        "Search a token id or text",
        "navigate",
        "/",
        show=True,
        hint="find rows containing a token",
    ),
    Key(
        "search.next",
        "full_stop",
        "search_again(1)",
        "Next search hit",
        "navigate",
        ".",
        hint="the next row with the searched token",
    ),
    Key(
        "search.prev",
        "comma",
        "search_again(-1)",
        "Previous search hit",
        "navigate",
        ",",
        hint="the previous row with the searched token",
    ),
    Key(
        "filter",
        "d",
        "filter",
        "Show only divergent blocks (toggle)",
        "view",
        "d",
        show=True,
        hint="show only blocks that differ",
    ),
    Key(
        "ids",
        "t",
        "toggle_ids",
        "Token ids / decoded text (toggle)",
        "view",
        "t",
        show=True,
        hint="decoded tokens or raw ids",
    ),
    Key(
        "requests",
        "r",
        "toggle_requests",
        "Show / hide the requests pane",
        "view",
        "r",
        hint="more room for the blocks",
    ),
)

#: Keys of the block view (focused widget).
VIEW_KEYS: tuple[Key, ...] = (
    Key("row.down", "down,j", "cursor(1)", "Next row", "block view", "↓ j"),
    Key("row.up", "up,k", "cursor(-1)", "Previous row", "block view", "↑ k"),
    Key("page.down", "pagedown,space", "page(1)", "Page down", "block view", "PgDn space"),
    Key("page.up", "pageup,b", "page(-1)", "Page up", "block view", "PgUp b"),
    Key("top", "home,g", "edge(-1)", "First row", "block view", "Home g"),
    Key("bottom", "end,G", "edge(1)", "Last row", "block view", "End G"),
    Key("scroll.left", "left,h", "pan(-8)", "Scroll left", "block view", "← h"),
    Key("scroll.right", "right,l", "pan(8)", "Scroll right", "block view", "→ l"),
    Key(
        "detail",
        "enter",
        "detail",
        "Block detail (full ids, tokens, context, timings)",
        "block view",
        "enter",
        show=True,
    ),
)

#: Keys of the requests pane.
LIST_KEYS: tuple[Key, ...] = (
    Key("list.down", "down,j", "cursor(1)", "Next request", "requests pane", "↓ j"),
    Key("list.up", "up,k", "cursor(-1)", "Previous request", "requests pane", "↑ k"),
    Key("list.pagedown", "pagedown", "page(1)", "Page down", "requests pane", "PgDn"),
    Key("list.pageup", "pageup", "page(-1)", "Page up", "requests pane", "PgUp"),
    Key("list.open", "enter", "open", "Show this request's blocks", "requests pane", "enter"),
)


def bindings(keys: tuple[Key, ...]) -> list[BindingType]:
    """Textual bindings of ``keys`` (with ids, so a keymap can remap them)."""
    return [
        Binding(k.keys, k.action, k.description, show=k.show, key_display=k.label, id=k.id)
        for k in keys
    ]


def all_keys() -> tuple[Key, ...]:
    """Every key, for the help screen."""
    return KEYS + VIEW_KEYS + LIST_KEYS


def palette_keys() -> tuple[Key, ...]:
    """The main screen's keys the command palette offers (those with a ``hint``)."""
    return tuple(k for k in KEYS if k.hint)
