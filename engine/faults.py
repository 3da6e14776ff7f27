"""Deliberate, documented bugs for the reference engine (``--fault NAME``), off by default.

Each fault is one real failure class of ``shared/reference/spec_decode_bugs.md``, planted at a
small hook point of the engine (``if faults.active("name"): ...``) and nowhere else. A fault
run diffed against a clean run (``spectrace diff FAULT.h5 CLEAN.h5``) must name the fault's
finding kind as its first error finding; ``tests/test_faults.py`` proves it for every fault.

| fault | finding kind | where | what goes wrong |
|---|---|---|---|
| ``layout_shift`` | layout_shift | drafters | k+1 greedy drafts, returns ``[1:]`` (anchor read as the 1+N bonus slot) |
| ``anchor_shift`` | anchor_shift | core | ``[SPECTRACE] pos=`` printed one late (pos+1) |
| ``verify_overwrite`` | verified_differs | core | target verifies the drafts with the last slot overwritten by the anchor (#2116) |
| ``k_minus_one`` | k_mismatch | drafters | the anchor is counted in k: k-1 drafts |
| ``constant_depth`` | constant_drafts | drafters | the step-0 draft is copied into every slot |
| ``broken_depth`` | depth_divergence | drafters | depth >= 1: positions not advanced (every draft at the anchor's) |
| ``d2t_missing`` | vocab_mapping | drafters | ``--draft-vocab``: draft indices handed out unmapped |
| ``d2t_double`` | vocab_mapping | drafters | ``--draft-vocab``: the d2t offset applied twice |
| ``drop_drafts`` | unverified_drafts | core | requests at batch row >= 1 from step 3 on never get drafts installed again |
| ``miscount`` | acceptance_bookkeeping | core | ``acc=ns`` instead of ``ns-1`` on blocks with a rejection |
| ``stale_state`` | stale_state | core | after a rejection the drafter still sees the rejected drafts |
| ``batch_order`` | batch_dependence | core | batch rows >= 1 draft from the previous row's context |
| ``repetition`` | degenerate_output | core | after 16 output tokens the target repeats its last 4 tokens |
| ``broken_depth_late`` | depth_divergence | drafters | depth >= 3: positions not advanced (slots 0-2 right) |
| ``stale_after_accept`` | stale_state | core | after a fully accepted block the drafter's context lacks the last accepted draft |
| ``row_keyed`` | batch_dependence | core | draft context kept per batch row: a request that moves rows drafts on the row's old context |
| ``mapped_feedback`` | vocab_mapping | drafters | ``--draft-vocab``: the d2t offset applied twice, and that id fed back into the draft loop |
| ``wrong_features`` | draft_mismatch | drafters | the draft model sees only the last 8 tokens of context |
| ``content`` | content_divergence | core | at output index 10 the target emits its second-best token |

All faults are for ``--method draft_model`` (``Fault.methods``); the ``d2t_*`` faults
also need ``--draft-vocab N``. Faults are process-wide (one engine per process): the CLI calls
:func:`enable` once before the engine is built.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: Output index (tokens) from which ``repetition`` overrides the target, and the loop period.
REPEAT_AFTER = 16
REPEAT_PERIOD = 4
#: Output index (tokens) where ``content`` emits the target's second-best token.
CONTENT_AT = 10
#: Engine step (0-based) from which ``drop_drafts`` stops installing drafts of rows >= 1.
DROP_FROM_STEP = 3
#: Context tokens ``wrong_features`` lets the draft model see.
FEATURE_WINDOW = 8
#: Draft depth from which ``broken_depth_late`` stops advancing positions.
BROKEN_FROM = 3


@dataclass(frozen=True)
class Fault:
    """One registered fault: the finding kind a diff must name first, and a one-line doc."""

    kind: str
    doc: str
    methods: tuple[str, ...] = ("draft_model",)
    needs_draft_vocab: bool = False


FAULTS: dict[str, Fault] = {
    "layout_shift": Fault(
        "layout_shift",
        "the drafter generates k+1 greedy tokens and returns "
        "tokens[1:], as if the anchor were the 1+N bonus slot",
    ),
    "anchor_shift": Fault(
        "anchor_shift",
        "[SPECTRACE] pos= is printed one late (pos+1; the chain "
        "pos'=pos+ns still holds): the recorded anchor is not the token there",
    ),
    "verify_overwrite": Fault(
        "verified_differs",
        "the target verifies the drafts with the last "
        "slot overwritten by the previous emitted token (the anchor, #2116)",
    ),
    "k_minus_one": Fault("k_mismatch", "the anchor is counted in k: k-1 drafts are proposed"),
    "constant_depth": Fault("constant_drafts", "the step-0 draft is copied into every slot"),
    "broken_depth": Fault(
        "depth_divergence",
        "for depth >= 1 the draft loop does not advance "
        "positions: every fed draft sits at the anchor's position (stale "
        "positions/seq_lens); slot 0 stays right",
    ),
    "broken_depth_late": Fault(
        "depth_divergence",
        f"from depth {BROKEN_FROM} on the draft loop does not advance positions: the fed "
        f"drafts sit at the anchor's position; slots 0..{BROKEN_FROM - 1} stay right",
    ),
    "d2t_missing": Fault(
        "vocab_mapping",
        "reduced draft vocabulary: draft indices are handed out "
        "without the d2t mapping to target ids",
        needs_draft_vocab=True,
    ),
    "d2t_double": Fault(
        "vocab_mapping",
        "reduced draft vocabulary: the d2t offset is applied twice (modulo the vocabulary)",
        needs_draft_vocab=True,
    ),
    "drop_drafts": Fault(
        "unverified_drafts",
        f"a request at batch row >= 1 at step "
        f"{DROP_FROM_STEP} or later silently stops proposing: its drafts are "
        "proposed but never installed again (installed=0), it continues with "
        "plain decode steps",
    ),
    "miscount": Fault(
        "acceptance_bookkeeping",
        "acc= is reported one too high (ns instead of ns-1) on blocks with a rejection",
    ),
    "stale_state": Fault(
        "stale_state",
        "after a rejection the drafter drafts from a context that "
        "still holds the rejected drafts (KV not rolled back)",
    ),
    "stale_after_accept": Fault(
        "stale_state",
        "after a block whose drafts were all accepted the drafter reuses its own stale "
        "state: its context lacks the last accepted draft (the bonus token follows the "
        "one before it)",
    ),
    "row_keyed": Fault(
        "batch_dependence",
        "the draft context is kept per batch row: a request that moves to another row "
        "(an earlier row finished) drafts from that row's old context followed by its own "
        "tokens since the move, including at row 0",
    ),
    "mapped_feedback": Fault(
        "vocab_mapping",
        "reduced draft vocabulary: the d2t offset is applied twice and the wrongly mapped "
        "id is fed back into the draft loop (only slot 0 is a function of the right id)",
        needs_draft_vocab=True,
    ),
    "batch_order": Fault(
        "batch_dependence",
        "batch rows >= 1 draft from the previous row's "
        "context (off-by-one row index); row 0 is right",
    ),
    "repetition": Fault(
        "degenerate_output",
        f"after {REPEAT_AFTER} output tokens the target "
        f"repeats its last {REPEAT_PERIOD} tokens forever",
    ),
    "wrong_features": Fault(
        "draft_mismatch", f"the draft model sees only the last {FEATURE_WINDOW} tokens of context"
    ),
    "content": Fault(
        "content_divergence",
        f"at output index {CONTENT_AT} the target emits its "
        "second-best token instead of the argmax",
    ),
}

_active: frozenset[str] = frozenset()


def enable(names: Iterable[str]) -> None:
    """Activate exactly these faults (replacing any active ones). Unknown names raise."""
    global _active
    names = frozenset(names)
    unknown = sorted(names - FAULTS.keys())
    if unknown:
        raise ValueError(f"unknown fault {unknown[0]!r}; known: {', '.join(FAULTS)}")
    _active = names


def active(name: str) -> bool:
    """Whether fault ``name`` is on (a typo in a hook point fails loudly)."""
    if name not in FAULTS:
        raise KeyError(name)
    return name in _active


def enabled() -> list[str]:
    """Names of the active faults, in registry order."""
    return [n for n in FAULTS if n in _active]


def describe() -> str:
    """One line per fault: name, finding kind, doc (``--list-faults``)."""
    return "\n".join(f"{n:<17} -> {f.kind:<23} {f.doc}" for n, f in FAULTS.items())


def check(method: str, draft_vocab: int | None) -> None:
    """Refuse active faults that the run's configuration cannot exhibit (ValueError)."""
    for name in enabled():
        f = FAULTS[name]
        if method not in f.methods:
            raise ValueError(f"--fault {name} needs --method {'|'.join(f.methods)}")
        if f.needs_draft_vocab and not draft_vocab:
            raise ValueError(f"--fault {name} needs --draft-vocab N")


# ---------------------------------------------------------------------------- hook helpers


def map_draft_index(idx: int, d2t: Sequence[int], vocab_size: int) -> int:
    """Target id of reduced-vocabulary draft index ``idx`` as handed to the scheduler.

    Correct: ``idx + d2t[idx]`` (vLLM/speculators). ``d2t_missing``: ``idx``. ``d2t_double``:
    ``idx + 2 * d2t[idx]``, wrapped into the vocabulary (an engine would index out of its
    embedding otherwise).
    """
    if active("d2t_missing"):
        return idx
    if active("d2t_double") or active("mapped_feedback"):
        return (idx + 2 * d2t[idx]) % vocab_size
    return idx + d2t[idx]


def target_tokens(
    tokens: list[int], logits: torch.Tensor, sequence: Sequence[int], prompt_len: int
) -> list[int]:
    """The target's greedy tokens after the ``content`` / ``repetition`` faults.

    Args:
        tokens: argmax per row; row j predicts absolute position ``len(sequence) -
            len(tokens) + 1 + j``.
        logits: fp32 [len(tokens), vocab], the same rows.
        sequence: what the target saw (prompt + output + drafts under verification).
        prompt_len: tokens of the request's prompt (output index = position - prompt_len).
    """
    first = len(sequence) - len(tokens) + 1
    out = list(tokens)
    for j in range(len(out)):
        q = first + j
        if active("content") and q - prompt_len == CONTENT_AT:
            out[j] = int(logits[j].topk(2).indices[1])
        if active("repetition") and q - prompt_len >= REPEAT_AFTER:
            out[j] = int(sequence[q - REPEAT_PERIOD])  # q - 4 < len(sequence): never out[]
    return out
