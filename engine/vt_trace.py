"""`VT_SPEC_TRACE` stderr lines, byte-for-byte in our engine's format.

Format and gating follow shared/reference/vt_spec_trace.md:

* latches (§1): each reader looks at the variable once per process, on first use;
  - verify side (`[SPECTRACE]`): set, non-empty, first char not '0';
  - propose-side level (`[spec-phase]`, `[spec-propose]`): 0 if unset/empty/'0'-prefixed,
    else atoi(value), and a value <= 0 becomes 1;
  - scheduler / engine-core probes (`[spec-sched]`, `[spec-post_step]`, `[spec-update]`,
    `[spec-install]`): ANY value, including "0" and "".
* id lists: `[SPECTRACE]` writes `[ ` then each id followed by a space (`draft=[ 6 18 ]`);
  `[spec-propose]` writes `[` then each id followed by a space (`first=[13 198 ]`).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO

ENV_VAR = "VT_SPEC_TRACE"

_latches: dict[str, object] = {}


def _atoi(value: str) -> int:
    """C atoi: optional leading whitespace and sign, then digits; 0 when there are none."""
    m = re.match(r"\s*([+-]?\d+)", value)
    return int(m.group(1)) if m else 0


def _latch(name: str, compute: Callable[[str | None], Any]) -> Any:
    # First use wins for the rest of the process, like the engine's function-local statics.
    if name not in _latches:
        _latches[name] = compute(os.environ.get(ENV_VAR))
    return _latches[name]


def verify_enabled() -> bool:
    """Verify-side latch: set, non-empty, and not starting with '0'."""
    return bool(_latch("verify", lambda v: v is not None and v[:1] not in ("", "0")))


def propose_level() -> int:
    """Propose-side level: 0 when off, else atoi(value) with <= 0 mapped to 1."""

    def level(v: str | None) -> int:
        if not v or v[0] == "0":
            return 0
        n = _atoi(v)
        return n if n > 0 else 1

    return int(_latch("propose", level))


def probes_enabled() -> bool:
    """Scheduler/engine-core probes: `getenv != nullptr`, i.e. any value at all."""
    return bool(_latch("probes", lambda v: v is not None))


def reset_latches() -> None:
    """Forget latched values (tests only; the engine itself never re-reads the variable)."""
    _latches.clear()


def spaced_ids(ids: Sequence[int]) -> str:
    """`[ 6 18 ]`: the `[SPECTRACE]` list form (space after '[', each id followed by a space)."""
    return "[ " + "".join(f"{int(t)} " for t in ids) + "]"


def spaced_margins(margins: Sequence[float]) -> str:
    """`[ 0.523 0.010 ]`: the optional `[spec-propose] margin=` list (one %.3f per draft)."""
    return "[ " + "".join(f"{float(m):.3f} " for m in margins) + "]"


def tight_ids(ids: Sequence[int]) -> str:
    """`[13 198 ]`: the `[spec-propose]` list form (no space after '[', each id then a space)."""
    return "[" + "".join(f"{int(t)} " for t in ids) + "]"


class VtTrace:
    """Writes the trace families to `stream` (stderr by default), each gated by its latch."""

    def __init__(self, stream: TextIO | None = None, margins: bool = False):
        self._stream = stream
        #: Print the optional per-slot `margin=[ ... ]` field on `[spec-propose]` lines.
        self.margins = margins

    def _emit(self, line: str) -> None:
        stream = self._stream if self._stream is not None else sys.stderr
        stream.write(line + "\n")

    # 1. schedule
    def sched(
        self,
        req: str,
        have: int,
        num_new: int,
        computed: int,
        num_tokens: int,
        placeholders: int,
        sched: int,
    ) -> None:
        """Print `[spec-sched]` (any VT_SPEC_TRACE value); mirrors scheduler.cpp `Scheduler::schedule`. Counts are tokens."""
        if probes_enabled():
            self._emit(
                f"[spec-sched] req={req} have={have} num_new={num_new} computed={computed} "
                f"NumTokens={num_tokens} placeholders={placeholders} -> sched={sched}"
            )

    # 2. verify
    def spectrace(
        self,
        req: str,
        pos: int,
        k: int,
        ns: int,
        acc: int,
        draft: Sequence[int],
        emit: Sequence[int],
    ) -> None:
        """Print one `[SPECTRACE]` verify line (level >= 1); mirrors runner.cpp `sample_tokens_with_rejection`. `pos` = tokens before write-back, ids int."""
        if verify_enabled():
            self._emit(
                f"[SPECTRACE] req={req} pos={pos} k={k} ns={ns} acc={acc} "
                f"draft={spaced_ids(draft)} emit={spaced_ids(emit)}"
            )

    # 3. propose
    def phase(self, pre_ms: float, backbone_ms: float, sample_ms: float, logits: int) -> None:
        """Print `[spec-phase] pre= backbone= sample= logits=` (level >= 1; times in ms, `logits` = numel); mirrors runner.cpp `propose_drafts_block`."""
        if propose_level() >= 1:
            self._emit(
                f"[spec-phase] pre={pre_ms:.2f}ms backbone={backbone_ms:.2f}ms sample={sample_ms:.2f}ms logits={logits}"
            )

    def propose(
        self,
        rows: int,
        nqpr: int,
        first: Sequence[int],
        margins: Sequence[float] | None = None,
    ) -> None:
        """Print `[spec-propose]` for the first proposing row (level >= 1); mirrors runner.cpp
        `propose_drafts_block`. With ``self.margins`` and known ``margins`` (the drafter's
        top-1 minus top-2 logit per draft of that row) it appends ` margin=[ 0.523 0.010 ]`."""
        if propose_level() >= 1:
            extra = ""
            if self.margins and margins is not None and len(margins) == len(first):
                extra = f" margin={spaced_margins(margins)}"
            self._emit(
                f"[spec-propose] rows={rows} nqpr={nqpr} drafts/row={len(first)} "
                f"first={tight_ids(first)}{extra}"
            )

    def propose_none(self, num_reqs: int) -> None:
        """Print the `[spec-propose] NO proposing rows` variant (level >= 1)."""
        if propose_level() >= 1:
            self._emit(f"[spec-propose] NO proposing rows this step (num_reqs={num_reqs})")

    # 4. post step / draft install
    def post_step(self, pulled: bool, rows: int) -> None:
        """Print `[spec-post_step]` (any value; sync scheduling); mirrors core.cpp `EngineCore::post_step`."""
        if probes_enabled():
            self._emit(f"[spec-post_step] pulled={int(pulled)} rows={rows}")

    def update_called(self, n: int) -> None:
        """Print `[spec-update] called n=` (any value); mirrors scheduler.cpp `update_draft_token_ids`."""
        if probes_enabled():
            self._emit(f"[spec-update] called n={n}")

    def update_req(
        self, req: str, found: bool, finished: bool, prefill_chunk: bool, drafts: int
    ) -> None:
        """Print one `[spec-update] req=` row (any value); mirrors scheduler.cpp `update_draft_token_ids`."""
        if probes_enabled():
            self._emit(
                f"[spec-update] req={req} found={int(found)} finished={int(finished)} "
                f"prefill_chunk={int(prefill_chunk)} drafts={drafts}"
            )

    def install(self, req: str, installed: int, lookahead: int) -> None:
        """Print `[spec-install]` (any value): drafts installed for a request, the scheduler's lookahead in tokens."""
        if probes_enabled():
            self._emit(f"[spec-install] req={req} installed={installed} lookahead={lookahead}")
