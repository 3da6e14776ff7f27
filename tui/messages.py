"""Every custom message of the viewer, in one module (toolong's layout).

Widgets post these upward; the screen and the app react. Chatty progress messages can
replace each other (``can_replace``), so a burst collapses to one.
"""

from __future__ import annotations

from textual.message import Message


class LoadProgress(Message):
    """Background loading advanced: ``stage`` (words) and ``fraction`` (0..1)."""

    def __init__(self, stage: str, fraction: float) -> None:
        super().__init__()
        self.stage = stage
        self.fraction = fraction

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, LoadProgress)


class ModelStage(Message):
    """A loading stage of the view model finished (``requests``, ``index``, ``divergence``)."""

    def __init__(self, stage: str, generation: int) -> None:
        super().__init__()
        self.stage = stage
        self.generation = generation


class AnalysisReady(Message):
    """The whole-trace analysis finished (``analysis``) or failed (``error``)."""

    def __init__(self, analysis, error: str | None, generation: int) -> None:
        super().__init__()
        self.analysis = analysis
        self.error = error
        self.generation = generation


class JumpTo(Message):
    """Show ``pair`` at anchor ``position`` (None: first row) in the block view."""

    def __init__(self, pair: int, position: int | None = None, slot: int | None = None) -> None:
        super().__init__()
        self.pair = pair
        self.position = position
        self.slot = slot


class FindingChosen(Message):
    """A finding was selected in a list (index into the app's findings)."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index = index
