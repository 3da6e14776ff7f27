"""A text widget of fixed height whose updates repaint without a layout pass.

``Static.update`` re-runs the screen layout; the block view's title and explanation change
on every cursor move, so they use this instead (one repaint, no layout).
"""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget


class TextLine(Widget):
    """Shows a :class:`~rich.text.Text` (wrapped to the width); :meth:`set` replaces it."""

    DEFAULT_CSS = "TextLine { height: 1; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.text = Text()

    def set(self, text: Text) -> None:
        """Replace the text (repaint only)."""
        if text != self.text:
            self.text = text
            self.refresh()

    def render(self) -> Text:
        return self.text
