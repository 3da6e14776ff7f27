"""The parser's pending items: a ``[SPECTRACE]`` block waiting to be written, a
``[spec-propose]`` line waiting for its block in the next step, a request's anchor chain, and
the propose join that pairs them (rules: :mod:`spectrace.hooks.vt.parser`)."""

from __future__ import annotations

from dataclasses import dataclass

from spectrace.tracer import schema

from .lines import Ids


@dataclass
class Block:
    """A parsed ``[SPECTRACE]`` block waiting to be written."""

    lineno: int
    req: str
    step: int  # the proposing step (verify step - 1)
    pos: int  # SPECTRACE pos = anchor index + 1
    k: int
    acc: int
    draft: Ids
    emit: Ids
    ns: int
    anchor: int
    sched: tuple[int, int] | None  # (have, sched) of the request's last [spec-sched]
    batch_row: int = schema.PAD
    batch_size: int = schema.PAD
    proposed: list[int] | None = None


@dataclass
class Proposal:
    """An open ``[spec-propose]`` line waiting for its block in the next step."""

    step: int
    lineno: int
    first: Ids
    per_row: int
    hint: str | None = None  # the first proposing row's request, from [spec-update]
    hint_finished: bool = False


@dataclass
class Chain:
    """A request's last ``[SPECTRACE]`` block: where the next one must start
    (``pos + ns``) and the anchor it inherits (``last``)."""

    pos: int
    ns: int
    last: int  # emit[-1], -1 when unknown
    lineno: int


def block_problems(b: Block) -> list[tuple[str, str]]:
    """The invariants a ``[SPECTRACE]`` block breaks, as ``(kind, message)`` pairs:
    ``acc != max(ns-1, 0)``, ``len(emit) != ns``, ``len(draft) != k``, ``acc > k`` and
    ``emit[:acc] != draft[:acc]`` (lists shortened with ``...`` are checked as far as known)."""
    r = f"req={b.req} pos={b.pos}"
    out = []
    if b.acc != max(b.ns - 1, 0):
        out.append(("acc != ns-1", f"{r}: acc={b.acc} but ns={b.ns}"))
    if b.emit.complete and len(b.emit.ids) != b.ns:
        out.append(("len(emit) != ns", f"{r}: emit holds {len(b.emit.ids)} ids, ns={b.ns}"))
    if b.draft.complete and len(b.draft.ids) != b.k:
        out.append(("len(draft) != k", f"{r}: draft holds {len(b.draft.ids)} ids, k={b.k}"))
    if b.acc > b.k:
        out.append(("acc > k", f"{r}: acc={b.acc} > k={b.k}"))
    n = min(b.acc, len(b.draft.ids), len(b.emit.ids))
    if b.draft.ids[:n] != b.emit.ids[:n]:
        out.append(
            (
                "emit != draft",
                f"{r}: emit[:acc] {b.emit.ids[:n]} differs from draft[:acc] {b.draft.ids[:n]}",
            )
        )
    return out


def ids_match(first: Ids, draft: Ids) -> bool:
    """Equal lists; with ``...`` lists (doc excerpts): every id known on both sides agrees
    (and at least one is)."""
    if first.complete and draft.complete:
        return first.ids == draft.ids
    n = min(len(first.ids), len(draft.ids))
    return n > 0 and first.ids[:n] == draft.ids[:n]


def choose_join(p: Proposal, blocks: list[Block]) -> tuple[int | None, str]:
    """Pick the block of the next step that ``p`` proposed for (see the module docstring)."""
    for i, b in enumerate(blocks):
        if ids_match(p.first, b.draft):
            return i, "exact"
    if p.hint is not None:  # the engine named the row: never guess past it
        for i, b in enumerate(blocks):
            if b.req == p.hint and not p.hint_finished:
                return i, "hint"
        return None, "not_verified"
    first = p.first.ids
    for i, b in enumerate(blocks):
        d = b.draft.ids
        if b.draft.complete and 0 < len(d) < len(first) and first[: len(d)] == d:
            return i, "truncated"
    best, best_score = None, 0
    for i, b in enumerate(blocks):
        d = b.draft.ids
        if len(d) == len(first) and d:
            score = sum(x == y for x, y in zip(first, d))
            if score > best_score and score >= max(1, (len(d) + 1) // 2):
                best, best_score = i, score
    return (best, "partial") if best is not None else (None, "unjoined")
