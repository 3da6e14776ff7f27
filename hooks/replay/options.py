"""Engine options of a replay (what ``--method --k --target --draft --fault`` set)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class EngineOptions:
    """How to run the replaying engine.

    Attributes:
        method: ``draft_model`` | ``ngram``; ``k``: proposals per block (tokens).
        target, draft: model folders (None: the bundled models).
        faults: reference engine only: planted bugs (:mod:`spectrace.engine.faults`).
        batch: sites per drafter call (reference engine).
        command: ``cmd`` engine only: the engine command (``{prompts}`` is replaced by the
            JSONL path).
        margins: vLLM: record the drafter's margins (costs a device-to-host copy per draft
            step on a GPU; on by default on the CPU).
        timeout_s: vLLM / cmd: seconds before the engine is stopped (None: wait).
    """

    method: str = "draft_model"
    k: int = 4
    target: Path | None = None
    draft: Path | None = None
    faults: list[str] = field(default_factory=list)
    batch: int = 64
    command: list[str] = field(default_factory=list)
    margins: bool | None = None
    timeout_s: float | None = None
