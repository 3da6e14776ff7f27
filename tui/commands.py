"""The command palette (ctrl+p): every main-screen key by name, each finding and each request.

One context-aware :class:`~textual.command.Provider` (posting's pattern): the hits are
built from the main screen's current state each time the palette opens. The actions are the
keymap's (:func:`~.keymap.palette_keys`): a key added there appears here.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider

from .keymap import palette_keys
from .messages import FindingChosen, JumpTo
from .screens.main import MainScreen
from .widgets.overview import finding_where

#: Requests offered by name (the palette is not the place to page through millions).
MAX_REQUESTS = 2000


class SpectraceCommands(Provider):
    """Actions, findings and requests of the main screen."""

    def _screen(self) -> MainScreen | None:
        for s in self.app.screen_stack:
            if isinstance(s, MainScreen):
                return s
        return None

    def _hits(self) -> list[tuple[str, Callable[[], object], str]]:
        screen = self._screen()
        if screen is None:
            return []
        out: list[tuple[str, Callable[[], object], str]] = []
        for k in palette_keys():
            out.append(
                (k.description, partial(screen.run_action, k.action), f"{k.hint} ({k.label})")
            )
        for i, f in enumerate(screen.findings):
            out.append(
                (
                    f"Finding: {f.kind} ({finding_where(f)})",
                    partial(screen.post_message, FindingChosen(i)),
                    f.message,
                )
            )
        if screen.model.requests_ready:
            for p in screen.model.pairs[:MAX_REQUESTS]:
                out.append(
                    (
                        f"Request {p.label}",
                        partial(screen.post_message, JumpTo(p.index)),
                        p.matched_by,
                    )
                )
        return out

    async def discover(self) -> Hits:
        for name, cb, help_text in self._hits()[: len(palette_keys()) + 20]:
            yield DiscoveryHit(name, cb, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, cb, help_text in self._hits():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), cb, help=help_text)
