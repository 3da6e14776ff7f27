"""The command palette (ctrl+p): every action by name, each finding and each request.

One context-aware :class:`~textual.command.Provider` (posting's pattern): the hits are
built from the main screen's current state each time the palette opens.
"""

from __future__ import annotations

from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

from .messages import FindingChosen, JumpTo
from .overview import finding_where

#: (name, action on the main screen, help)
ACTIONS = (
    ("Next divergent block", "divergence(1)", "jump to the next block whose drafts differ"),
    ("Previous divergent block", "divergence(-1)", "jump back"),
    ("Next finding", "finding(1)", "jump to the next finding's location"),
    ("Previous finding", "finding(-1)", "jump back"),
    ("Go to anchor position…", "goto", "type a position"),
    ("Go to content divergence", "content_divergence", "where the two texts start to differ"),
    ("Search token id or text…", "search", "find rows containing a token"),
    ("Toggle divergent-only filter", "filter", "show only blocks that differ"),
    ("Toggle token ids / text", "toggle_ids", "decoded tokens or raw ids"),
    ("Toggle requests pane", "toggle_requests", "more room for the blocks"),
    ("Show overview", "tab('overview')", "metadata, findings, acceptance"),
    ("Show blocks", "tab('blocks')", "one line per anchor position"),
    ("Show charts", "tab('charts')", "acceptance and agreement, drawn"),
    ("Help", "help", "every key and colour"),
)


class SpectraceCommands(Provider):
    """Actions, findings and requests of the main screen."""

    def _screen(self):
        from .main_screen import MainScreen

        for s in self.app.screen_stack:
            if isinstance(s, MainScreen):
                return s
        return None

    def _hits(self) -> list[tuple[str, object, str]]:
        screen = self._screen()
        if screen is None:
            return []
        out: list[tuple[str, object, str]] = []
        for name, action, help_text in ACTIONS:
            out.append((name, partial(screen.run_action, action), help_text))
        for i, f in enumerate(screen.findings):
            out.append((f"Finding: {f.kind} ({finding_where(f)})",
                        partial(screen.post_message, FindingChosen(i)), f.message))
        if screen.model.requests_ready:
            for p in screen.model.pairs[:2000]:
                out.append((f"Request {p.label}", partial(screen.post_message, JumpTo(p.index)),
                            p.matched_by))
        return out

    async def discover(self) -> Hits:
        for name, cb, help_text in self._hits()[:len(ACTIONS) + 20]:
            yield DiscoveryHit(name, cb, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, cb, help_text in self._hits():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), cb, help=help_text)
