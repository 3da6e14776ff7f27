"""Small typed prompts: go to a position (``ModalScreen[int | None]``) and search
(``ModalScreen[str | None]``). Escape cancels (returns None)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class _Prompt(ModalScreen):
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="prompt.cancel")]
    DEFAULT_CSS = """
    _Prompt { align: center middle; }
    _Prompt > Vertical { width: 64; height: auto; border: thick $accent; background: $surface;
                         padding: 0 1; }
    """
    prompt = ""
    placeholder = ""

    def __init__(self, value: str = "") -> None:
        super().__init__()
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.prompt)
            yield Input(value=self.value, placeholder=self.placeholder)

    def action_cancel(self) -> None:
        """Close without a value."""
        self.dismiss(None)


class GotoDialog(_Prompt):
    """Ask for an anchor position (tokens, absolute in prompt + output)."""

    prompt = "Go to anchor position (absolute token index):"
    placeholder = "e.g. 57"

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        text = event.value.strip()
        if text.lstrip("-").isdigit():
            self.dismiss(int(text))
        else:
            self.notify("a position is a whole number", severity="warning")


class SearchDialog(_Prompt):
    """Ask for a token id (digits, or ``#id``) or a piece of decoded text."""

    prompt = "Search a token id (e.g. 262 or #262) or text (matches decoded tokens):"
    placeholder = "id or text"

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value if event.value.strip() else None)
