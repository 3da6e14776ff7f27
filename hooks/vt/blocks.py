"""The parser's pending items: a ``[SPECTRACE]`` block waiting to be written, a
``[spec-propose]`` line waiting for its block in the next step, a request's anchor chain, the
propose join that pairs them, and proposals never installed (rules:
:mod:`spectrace.hooks.vt.parser`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from spectrace.tracer import schema

from .lines import Ids
from .requests import RequestRecord


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
    #: False for a proposal never installed: no verified ids, accepted or emitted ids.
    verify_record: bool = True
    #: The drafter's margins per proposed slot (NaN unknown), from a joined ``margin=[…]``.
    margin: list[float] | None = None


@dataclass
class Proposal:
    """An open ``[spec-propose]`` line waiting for its block in the next step."""

    step: int
    lineno: int
    first: Ids
    per_row: int
    hint: str | None = None  # the first proposing row's request, from [spec-update]
    hint_finished: bool = False
    margin: list[float] | None = None  # margin=[…]: one float per id of first

    def proposed_row(self) -> list[int]:
        """The ids a block joined to this proposal stores as ``proposed`` (padded to
        drafts/row with -1)."""
        return self.first.padded(max(self.per_row, len(self.first.ids)))

    def margin_row(self) -> list[float] | None:
        """The margins stored with :meth:`proposed_row` (NaN-padded), None without any."""
        if self.margin is None:
            return None
        n = max(self.per_row, len(self.first.ids))
        return (self.margin + [float("nan")] * n)[:n]

    def join_note(self, b: Block, kind: str) -> str:
        """The import note of a join to ``b`` that is not exact (proposed != verified)."""
        why = ""
        if kind == "truncated" and b.sched and b.sched[1] < b.sched[0]:
            why = f" (explained by [spec-sched] have={b.sched[0]} sched={b.sched[1]})"
        return (
            f"req={b.req} pos={b.pos}: proposed {self.first.ids} (line {self.lineno}), "
            f"verified {b.draft.ids} [{kind} join]{why}"
        )


@dataclass
class Chain:
    """A request's last ``[SPECTRACE]`` block: where the next one must start
    (``pos + ns``) and the anchor it inherits (``last``)."""

    pos: int
    ns: int
    last: int  # emit[-1], -1 when unknown
    lineno: int


@dataclass
class NotInstalled:
    """Proposals whose row's ``[spec-install]`` said ``installed=0``: kept as blocks without
    a verify record. A request decodes one token without drafts per ``installed=0``; its
    anchor index is then its last block's ``pos + ns - 1`` (the prompt length before any
    block) plus those plain steps. Proposals not placeable yet (a capture reads its
    requests file at the end) wait in ``waiting`` as ``(request, plain steps, proposal,
    batch row)``."""

    plain: dict[str, int] = field(default_factory=dict)
    waiting: list[tuple[str, int, Proposal, int]] = field(default_factory=list)

    def install(
        self, p: Proposal | None, req: str, installed: int, step: int, payload: dict[str, int]
    ) -> bool:
        """``req``'s drafts of ``step`` reach verification (``installed``) or not (0: a
        ``[spec-install] installed=0``, or a ``[spec-sched] sched=0`` of the next step);
        ``payload`` is that step's ``[spec-update]`` rows (request -> batch row). True
        (``p`` queued in ``waiting``) when nothing was installed and ``p`` is that step's
        proposal of that unfinished row."""
        row = payload.get(req, schema.PAD)
        if installed != 0:
            return False
        hit = p is not None and p.step == step and p.hint == req and not p.hint_finished
        if hit and p is not None:
            self.waiting.append((req, self.plain.get(req, 0), p, row))
        self.plain[req] = self.plain.get(req, 0) + 1
        return hit

    def place(
        self,
        chains: dict[str, Chain],
        requests: Mapping[str, RequestRecord],
        anchor_of: Callable[[str, int], int],
    ) -> list[tuple[Block, str]]:
        """The waiting proposals that can be placed now (from the request's chain, or its
        prompt length in ``requests``), as blocks without a verify record, each with where
        its anchor came from (``chain``: the last ``emit[-1]``; ``requests``:
        ``anchor_of(req, pos)``; ``unknown``); the rest keep waiting."""
        out, keep = [], []
        for req, plain, p, row in self.waiting:
            c = chains.get(req)
            n = len(requests[req].prompt_ids) if req in requests else None
            if c is None and n is None:
                keep.append((req, plain, p, row))
                continue
            last = c.last if c is not None and plain == 0 else schema.PAD
            # The [SPECTRACE] pos: after the chain, else after the prompt (n known then).
            pos = (c.pos + c.ns if c is not None else (n or 0) + 1) + plain
            ids = Ids(p.proposed_row())
            b = Block(p.lineno, req, p.step, pos, len(ids.ids), -1, ids, Ids([]), 0, last, None)
            b.batch_row, b.proposed, b.verify_record = row, ids.ids, False
            b.margin = p.margin_row()
            src = "chain" if last >= 0 else "requests"
            b.anchor = last if last >= 0 else anchor_of(req, pos)
            out.append((b, src if b.anchor >= 0 else "unknown"))
        self.waiting = keep
        return out


def gap_note(req: str, pos: int, expected: int, since: int) -> str:
    """The ``chain gap`` note: ``pos`` is past the ``expected`` ``pos + ns`` of the
    request's block at line ``since`` (steps without drafts print no line)."""
    return f"req={req} pos={pos}: {pos - expected} tokens decoded without drafts since line {since}"


def chain_break(req: str, pos: int, expected: int, prev: Chain) -> str:
    """The ``chain break`` message: ``pos`` before ``prev.pos + prev.ns``."""
    return (
        f"req={req} pos={pos}, expected {expected} (pos={prev.pos} ns={prev.ns} at line "
        f"{prev.lineno}; a reused request id?)"
    )


def anchor_mismatch(req: str, last: int, from_req: int, pos: int) -> str:
    """The ``anchor mismatch`` message: the chain's ``emit[-1]`` against the requests file."""
    return (
        f"req={req}: previous emit[-1]={last} but the requests file has {from_req} at "
        f"position {pos - 1}"
    )


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


@dataclass
class PlainSteps:
    """What the log says of each request between its blocks, for strict mode's checks that a
    block belongs to the request it names (a wrong request id passes the chain otherwise):

    * a chain gap needs a step without drafts to explain it (``[SPECTRACE]`` prints only
      rows with drafts): ``[spec-update] req=X drafts=0``, ``[spec-install] installed=0``,
      ``[spec-sched] sched=0``, or a step whose ``[spec-update] req=`` payload has no row
      for X; checked when the log prints that payload;
    * a block needs an earlier ``[spec-sched]`` line for its request (printed for every
      request that carries drafts), when the log prints them and the payload (sync
      scheduling: the drafts are installed before the next schedule);
    * no block after the request's ``[spec-update] finished=1``;
    * no second block of a request in one step, when the log prints ``[spec-post_step]``
      (once per step under sync scheduling) and none came between.

    A log without those lines (async scheduling, a filtered log) contradicts nothing.
    """

    strict: bool = False  # only strict mode checks (lenient: every method does nothing)
    payload_ever: bool = False  # the log prints [spec-update] req= rows
    plain: set[str] = field(default_factory=set)  # evidence since the request's last block
    active: set[str] = field(default_factory=set)  # requests with a block
    drafting: set[str] = field(default_factory=set)  # drafts > 0 in this step's payload
    payload: bool = False  # this step printed payload rows
    scheduled: set[str] = field(default_factory=set)  # requests a [spec-sched] line named
    finished: dict[str, int] = field(default_factory=dict)  # request -> line of finished=1

    def probe(self, req: str, drafts: int) -> None:
        """``[spec-install]`` (``installed=``) or ``[spec-sched]`` (``sched=``) gives ``req``
        ``drafts`` drafts."""
        if self.strict and drafts == 0:
            self.plain.add(req)

    def row(self, req: str, drafts: int, finished: bool, lineno: int) -> None:
        """A ``[spec-update] req=`` payload row at line ``lineno``."""
        if not self.strict:
            return
        self.payload = self.payload_ever = True
        (self.drafting if drafts > 0 else self.plain).add(req)
        if finished:
            self.finished.setdefault(req, lineno)

    def end_step(self) -> None:
        """A step ends: a request with a block but no drafts in its payload decodes plain."""
        if self.strict and self.payload:
            self.plain |= self.active - self.drafting
        self.payload, self.drafting = False, set()

    def verify(self, req: str, pos: int, prev: Chain | None, again: bool) -> list[tuple[str, str]]:
        """A block of ``req`` at ``pos`` after ``prev`` (``again``: a second block of ``req``
        in one step): the strict problems, as ``(kind, message)`` pairs (a wrong request id
        shows as one of them); the request's evidence starts again."""
        if not self.strict:
            return []
        out, r = [], f"req={req} pos={pos}"
        if self.payload_ever and self.scheduled and req not in self.scheduled:
            out.append(("unscheduled", f"{r}: no [spec-sched] line named req={req} before"))
        if req in self.finished:
            out.append(("after finish", f"{r}: req={req} finished at line {self.finished[req]}"))
        if again:
            out.append(("block twice", f"{r}: a second block of req={req} in one step"))
        expected = prev.pos + prev.ns if prev is not None else pos
        if pos > expected and self.payload_ever and req not in self.plain:
            assert prev is not None
            msg = f"{r}, expected {expected} (block at line {prev.lineno}), but every step "
            out.append(("chain gap", msg + f"since gave req={req} drafts"))
        self.plain.discard(req)
        self.active.add(req)
        return out
