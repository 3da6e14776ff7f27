"""Streaming parser of our engine's ``VT_SPEC_TRACE`` stderr lines into a spectrace trace.

Lines are read by :mod:`.lines`; this module decides what they mean. It mirrors the line
formats of ``shared/reference/vt_spec_trace.md`` (vllm.cpp ``runner.cpp``, ``scheduler.cpp``,
``core.cpp``, ``qwen3_dflash.cpp``, DSpark ``speculator.cpp``): every family is matched on its
tag and read **by field name**. Lenient mode (the default) also reads lines edited by hand
in documents (tag dropped, double spaces, ``...`` ellipses, other ``[ ]`` spacing) and counts
them; strict mode requires the engine's exact format and raises :class:`ParseError`
(``FILE:LINE: what``) on the first deviation, malformed line or broken invariant. Lines that
are not trace lines pass through untouched (``feed_line`` returns False). The rules it decides
where the format leaves them open: the package docstring.
"""

from __future__ import annotations

import math

from spectrace.tracer import schema
from spectrace.tracer.errors import InputError, ParseError
from spectrace.tracer.store import TraceWriter

from .blocks import (
    Block,
    Chain,
    NotInstalled,
    PlainSteps,
    Proposal,
    anchor_mismatch,
    block_problems,
    chain_break,
    choose_join,
    gap_note,
    ids_match,
)
from .level import FAMILY_LEVEL, phase_level
from .lines import Ids, MalformedLine, Record, parse_line, phase_rows
from .requests import RequestRecord, mark_unfinished, note_cut_before_finish
from .stats import ImportStats, check_requests

SOURCE = "vt_spec_trace"

# Families that belong to the post section of a step, and the phase order.
_POST = ("spec-post_step", "spec-update", "spec-install")
_PHASE_RANK = {"fwd-ops": 0, "spec-phase-dev": 1, "spec-phase": 2}


class VtTraceParser:
    """Parse ``VT_SPEC_TRACE`` lines as they arrive and record them in a :class:`TraceWriter`.

    Args:
        writer: the open trace writer (the parser registers requests, blocks and phases).
        strict: raise :class:`ParseError` on the first malformed, edited or inconsistent line.
        source_name: the log's name in messages (``FILE`` of ``FILE:LINE``).
        trace_level: :func:`~.level.trace_level` of the run when known (capture; >= 1), else
            None (inferred from the lines seen).

    Usage: ``feed_line(line, lineno)`` for every line of a file or a live stderr pipe, then
    :meth:`finish`. Blocks are written at once, except while a ``[spec-propose]`` waits for
    its join (at most the rest of one step's ``[SPECTRACE]`` lines).
    """

    def __init__(
        self,
        writer: TraceWriter,
        *,
        strict: bool = False,
        source_name: str = "<log>",
        trace_level: int | None = None,
    ) -> None:
        self.writer, self.strict = writer, strict
        self.stats = ImportStats(source=source_name)
        self.trace_level = trace_level
        self.late_patches: list[tuple[int, int]] = []  # (row, anchor) fixed after writing
        self._lineno = 0
        self._step = 0
        self._seen: set[str] = set()
        self._verified: set[str] = set()
        self._section: list[Block] = []
        self._proposal: Proposal | None = None
        self._chains: dict[str, Chain] = {}
        self._sched: dict[str, tuple[int, int]] = {}
        self._requests: dict[str, RequestRecord] | None = None
        self._requests_source = ""
        self._unresolved: list[tuple[int, str, int]] = []  # (row, req, pos) with anchor -1
        self._rows = 0
        self._reqs: set[str] = set()
        self._levels_seen: set[int] = set()
        self._finished = False
        self._payload: dict[str, int] = {}  # [spec-update] rows of this step: req -> row
        self._done: dict[str, bool] = {}  # [spec-update] req -> it printed finished=1
        self._prev_payload: dict[str, int] = {}  # ... of the previous (proposing) step
        self._runner_seen = False  # a runner/engine-core line was seen (not just sched)
        self._held = NotInstalled()  # proposals never installed ([spec-install] installed=0)
        self._plain = PlainSteps(strict)  # strict: what explains a chain gap, who was scheduled
        self._error: ParseError | None = None  # strict mode: raised after the line is recorded

    # -- input -------------------------------------------------------------------------------

    def feed_line(self, line: str, lineno: int | None = None) -> bool:
        """Parse one line.

        Args:
            line: one line of the log (str; trailing newline allowed).
            lineno: its 1-based line number; None counts lines fed.
        Returns:
            True for a trace line (used or counted as malformed), False for any other line.
        Raises:
            ParseError: strict mode, on a malformed/edited line or a broken invariant.
        """
        self._lineno = lineno if lineno is not None else self._lineno + 1
        self.stats.lines += 1
        try:
            rec = parse_line(line)
        except MalformedLine as exc:
            self.stats.trace_lines += 1
            self.stats.malformed += 1
            self._problem("malformed", f"malformed trace line: {exc}")
            rec = None
        else:
            if rec is None:
                return False
            self.stats.trace_lines += 1
            self.stats.families[rec.family] += 1
            if rec.edits:
                self.stats.edited += 1
                self._problem(
                    "edited",
                    f"{rec.family} line differs from the engine's format ({'; '.join(rec.edits)})",
                )
            self._dispatch(rec)  # record first: a strict failure never drops the block
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        return True

    def set_requests(
        self, requests: dict[str, RequestRecord], source: str = "requests file"
    ) -> int:
        """Register the requests' prompt/output ids and resolve anchors still unknown.

        May be called before feeding (import) or after (capture: the command writes its
        requests file at exit; :meth:`finish` checks it against the log, naming it
        ``source``). Anchors of rows already written are patched through the
        writer (:meth:`~spectrace.tracer.store.TraceWriter.patch_blocks`) and listed in
        :attr:`late_patches`. Returns the number of anchors resolved by this call.
        """
        self._requests = requests
        self._requests_source = source
        for r in requests.values():
            self.writer.request(r.req_id, r.prompt_ids, r.output_ids, r.finish_reason)
        resolved = 0
        for b in self._section:  # pending blocks: fix in place
            if b.anchor == schema.PAD:
                b.anchor = self._anchor_from_requests(b.req, b.pos)
                resolved += b.anchor != schema.PAD
        still, late = [], []
        for row, req, pos in self._unresolved:
            a = self._anchor_from_requests(req, pos)
            if a == schema.PAD:
                still.append((row, req, pos))
            else:
                late.append((row, a))
                resolved += 1
        self._unresolved = still
        if late:
            self.writer.patch_blocks("anchor", [r for r, _ in late], [a for _, a in late])
            self.late_patches.extend(late)
        self.stats.anchors["unknown"] -= resolved
        self.stats.anchors["requests"] += resolved
        if not self.stats.anchors["unknown"]:
            del self.stats.anchors["unknown"]
        return resolved

    def finish(self) -> ImportStats:
        """Write what is still pending, close the open proposal, check the requests file
        against the log (requests with only never-installed blocks count as in the log),
        store stats in /meta. Idempotent; returns the :class:`ImportStats`.

        Raises:
            InputError: strict mode: the requests file does not match the log or finished more.
        """
        if self._finished:
            return self.stats
        self._finished = True
        self._close_section()
        self._write_not_installed(final=True)
        mark_unfinished(self.writer, self._done, self._reqs, self._requests)
        cut = note_cut_before_finish(self.stats, self._done, self._requests, self._lineno)
        if self._proposal is not None:
            self.stats.joins["not_verified"] += 1  # the log ended before the next step
            self._proposal = None
        if self._requests is not None:
            reached = {r: c.pos for r, c in self._chains.items()}
            named = self._reqs | self._done.keys()  # drafted, or named by [spec-update]
            reached |= {r: 0 for r in sorted(named - reached.keys())}
            lengths = {r: len(rec.full) for r, rec in self._requests.items()}
            check = check_requests(self._requests_source, self.stats.source, reached, lengths)
            self.stats.requests_check = check
        self._update_meta()
        if self.strict and (self.stats.requests_warning() or cut):  # every broken invariant
            raise InputError(self.stats.requests_warning() or cut)
        return self.stats

    def abort(self) -> ImportStats:
        """The exception path: write pending blocks without a join, store stats in /meta;
        returns the :class:`ImportStats` so far."""
        for b in self._section:
            self._write(b)
        self._section = []
        self._update_meta()
        return self.stats

    # -- dispatch ------------------------------------------------------------------------------

    def _dispatch(self, rec: Record) -> None:
        f = rec.family
        if f == "SPECTRACE":
            self._on_spectrace(rec)
        elif f in _PHASE_RANK:
            self._on_phase(rec)
        elif f == "spec-propose":
            self._on_propose(rec)
        elif f == "spec-sched":
            self._on_sched(rec)
        else:
            self._on_post(rec)

    def _new_step_if(self, cond: bool) -> None:
        if cond:
            self._close_section()
            self._plain.end_step()
            self._step += 1
            self._seen.clear()
            self._verified.clear()
            self._prev_payload, self._payload = self._payload, {}
            if self._proposal is not None and self._proposal.step < self._step - 1:
                self.stats.joins["not_verified"] += 1  # no [SPECTRACE] in the next step
                self._proposal = None
        self.stats.steps = self._step + 1

    def _on_spectrace(self, rec: Record) -> None:
        if not self._runner_seen:  # an implicit, untraced step 0 proposed these drafts
            self._runner_seen = True
            self._step = 1
        req = rec.values["req"]
        again = req in self._verified and not self._seen - {"sched"}  # no step line between
        again = again and self.stats.probes["post_step"] > 0
        self._new_step_if(bool(self._seen - {"sched"}) or req in self._verified)
        self._verified.add(req)
        self._levels_seen.add(FAMILY_LEVEL[rec.family])
        checks = self._plain.verify(req, rec.values["pos"], self._chains.get(req), again)
        b = self._make_block(rec)
        for kind, msg in checks + block_problems(b):
            self._violation(kind, msg)
        p = self._proposal
        if p is not None and p.step == self._step - 1:
            if ids_match(p.first, b.draft):  # the best possible join: resolve at once
                self._join(p, b, "exact")
                self._section.append(b)
                self._close_section()
                return
            self._section.append(b)
            return
        self._write(b)

    def _on_phase(self, rec: Record) -> None:
        rank = _PHASE_RANK[rec.family]
        later = {f for f, r in _PHASE_RANK.items() if r > rank or (r == rank and r > 0)}
        self._new_step_if(bool(self._seen & ({"spec-propose", *_POST} | later)))
        self._runner_seen = True
        self._close_section()
        self._seen.add(rec.family)
        level = FAMILY_LEVEL[rec.family]
        self._levels_seen.add(level)
        self._write_phases(rec, level)

    def _on_propose(self, rec: Record) -> None:
        self._new_step_if(bool(self._seen & {"spec-propose", *_POST}))
        self._runner_seen = True
        self._close_section()
        self._seen.add("spec-propose")
        self._levels_seen.add(FAMILY_LEVEL[rec.family])
        if self._proposal is not None:
            self.stats.joins["not_verified"] += 1
            self._proposal = None
        if rec.variant == "no_rows":
            self.stats.probes["propose_no_rows"] += 1
            return
        first: Ids = rec.values["first"]
        per_row = rec.values.get("drafts/row", len(first.ids))
        if first.complete and per_row != len(first.ids):
            self._violation(
                "drafts/row", f"drafts/row={per_row} but first=[…] holds {len(first.ids)} ids"
            )
        if isinstance(rec.values.get("nqpr"), int):
            self.stats.probes[f"nqpr={rec.values['nqpr']}"] += 1
        self.stats.k_max = max(self.stats.k_max, per_row)
        self._proposal = Proposal(self._step, self._lineno, first, per_row)
        self._proposal.margin = rec.values.get("margin")

    def _on_sched(self, rec: Record) -> None:
        # Only a post line (sync scheduling) ends a step before the next schedule.
        self._new_step_if(bool(self._seen & set(_POST)))
        self._seen.add("sched")
        v = rec.values
        self.stats.probes["sched"] += 1
        if v["sched"] < v["have"]:
            self.stats.probes["sched_truncated"] += 1
        self._sched[v["req"]] = (v["have"], v["sched"])
        self._plain.scheduled.add(v["req"])
        if v["sched"] == 0:  # every draft cut: last step's proposal is never verified
            self._not_installed(v["req"], 0, self._step - 1, self._prev_payload)

    def _on_post(self, rec: Record) -> None:
        f, v = rec.family, rec.values
        once = {"spec-post_step": "spec-post_step", "spec-update": "update_called"}.get(f)
        if f == "spec-update" and rec.variant != "called":
            once = None
        self._new_step_if(once is not None and once in self._seen)
        self._runner_seen = True
        self._close_section()
        self._seen.add(f)
        if once:
            self._seen.add(once)
        key = {"spec-post_step": "post_step", "spec-install": "install"}.get(
            f, "update_called" if rec.variant == "called" else "update_rows"
        )
        self.stats.probe(key, v)
        if key == "install":
            self._not_installed(v["req"], v["installed"], self._step, self._payload)
        if key != "update_rows":
            return
        self._payload.setdefault(v["req"], len(self._payload))
        self._plain.row(v["req"], v["drafts"], v.get("finished", 0) == 1, self._lineno)
        self._done[v["req"]] = self._done.get(v["req"], False) or v.get("finished", 0) == 1
        p = self._proposal
        # The payload lists batch rows in order: its first drafting row is propose_rows[0].
        if (
            p is not None
            and p.step == self._step
            and p.hint is None
            and v["drafts"] > 0
            and v.get("prefill_chunk", 0) == 0
        ):
            p.hint, p.hint_finished = v["req"], v.get("finished", 0) == 1

    # -- blocks ------------------------------------------------------------------------------

    def _make_block(self, rec: Record) -> Block:
        v = rec.values
        draft: Ids = v["draft"]
        emit: Ids = v["emit"]
        k = v.get("k", len(draft.ids))
        ns = v["ns"]
        acc = v.get("acc", max(ns - 1, 0))
        req = v["req"]
        self._reqs.add(req)
        self._held.plain[req] = 0
        self.stats.k_max = max(self.stats.k_max, k)
        anchor = self._chain_anchor(req, v["pos"])
        self._chains[req] = Chain(
            v["pos"], ns, emit.ids[-1] if emit.complete and emit.ids else schema.PAD, self._lineno
        )
        row = self._prev_payload.get(req)
        return Block(
            self._lineno,
            req,
            self._step - 1,
            v["pos"],
            k,
            acc,
            draft,
            emit,
            ns,
            anchor,
            self._sched.pop(req, None),
            schema.PAD if row is None else row,
            len(self._prev_payload) if row is not None else schema.PAD,
        )

    def _chain_anchor(self, req: str, pos: int) -> int:
        prev = self._chains.get(req)
        from_req = self._anchor_from_requests(req, pos)
        expected = prev.pos + prev.ns if prev is not None else pos
        if pos > expected:  # steps without drafts print no [SPECTRACE] line (ngram, k=0)
            assert prev is not None  # expected == pos without a previous block
            self.stats.chain_gaps += 1
            self.stats.note("chain gap", self._lineno, gap_note(req, pos, expected, prev.lineno))
        elif pos < expected:
            assert prev is not None
            self._violation("chain break", chain_break(req, pos, expected, prev))
        elif prev is not None and prev.last != schema.PAD:
            if from_req != schema.PAD and from_req != prev.last:
                self._violation("anchor mismatch", anchor_mismatch(req, prev.last, from_req, pos))
                self.stats.anchors["requests"] += 1
                return from_req
            self.stats.anchors["chain"] += 1
            return prev.last
        self.stats.anchors["requests" if from_req != schema.PAD else "unknown"] += 1
        return from_req

    def _anchor_from_requests(self, req: str, pos: int) -> int:
        r = (self._requests or {}).get(req)
        return r.full[pos - 1] if r is not None and 0 < pos <= len(r.full) else schema.PAD

    def _close_section(self) -> None:
        """Resolve the pending proposal against this step's blocks, then write them."""
        p, blocks = self._proposal, self._section
        if p is not None and blocks and p.step == blocks[0].step:
            idx, kind = choose_join(p, blocks)
            if idx is None:
                self.stats.joins[kind] += 1
                if kind == "unjoined":
                    self.stats.note(
                        kind,
                        p.lineno,
                        "[spec-propose] first=[…] matches no [SPECTRACE] draft of the next step",
                    )
            else:
                self._join(p, blocks[idx], kind)
            self._proposal = None
        for b in blocks:
            self._write(b)
        self._section = []

    def _join(self, p: Proposal, b: Block, kind: str) -> None:
        self.stats.joins[kind] += 1
        b.proposed, b.margin = p.proposed_row(), p.margin_row()
        if kind != "exact":
            self.stats.note("proposed != verified", b.lineno, p.join_note(b, kind))
            self.stats.joins["proposed != verified"] += 1
        self._proposal = None

    def _not_installed(self, req: str, installed: int, step: int, payload: dict) -> None:
        """Nothing of ``req``'s drafts proposed at ``step`` reaches verification
        (``installed=0``, or ``[spec-sched] sched=0``): see :class:`~.blocks.NotInstalled`."""
        self._plain.probe(req, installed)
        if self._held.install(self._proposal, req, installed, step, payload):
            self.stats.joins["not_installed"] += 1  # this step's proposal is never verified
            self._proposal = None
            self._write_not_installed()

    def _write_not_installed(self, final: bool = False) -> None:
        got = self._held.place(self._chains, self._requests or {}, self._anchor_from_requests)
        for b, src in got:
            self.stats.anchors[src] += 1
            self._reqs.add(b.req)
            self._write(b)
        if final and self._held.waiting:  # never placed: the request stayed unknown
            self.stats.joins["not_installed, position unknown"] += len(self._held.waiting)

    def _write(self, b: Block) -> None:
        verified = b.draft.padded(b.k) if not b.draft.complete else b.draft.ids
        emitted = b.emit.padded(b.ns) if not b.emit.complete else b.emit.ids
        drafter = b.proposed is not None  # the drafter's own ids (a joined propose line)
        proposed = b.proposed if b.proposed is not None else verified
        self.stats.proposed_source["propose_line" if drafter else "verified"] += 1
        source = schema.PROPOSAL_FROM_DRAFTER if drafter else schema.PROPOSAL_COPIED_FROM_VERIFIED
        if not b.draft.complete or not b.emit.complete:
            self.stats.probes["ellipsis_blocks"] += 1
        self.writer.add_block(
            b.req,
            b.step,
            b.pos - 1,
            b.anchor,
            proposed,
            verified=verified if b.verify_record else None,
            accepted=b.acc,
            emitted=emitted if b.verify_record else None,
            batch_row=b.batch_row,
            batch_size=b.batch_size,
            proposal_source=source,
            draft_margin=b.margin,
        )
        if b.anchor == schema.PAD:
            self._unresolved.append((self._rows, b.req, b.pos))
        self._rows += 1
        self.stats.blocks = self._rows
        self.stats.requests = len(self._reqs)

    def _write_phases(self, rec: Record, level: int) -> None:
        if rec.family == "spec-phase":  # its stamps include the syncs of this step's split
            level = phase_level(self.trace_level, self._seen)
        for name, ms in phase_rows(rec):
            if isinstance(ms, float) and math.isfinite(ms):
                self.writer.add_phase(self._step, name, ms, level)
                self.stats.phases += 1

    def _problem(self, kind: str, msg: str) -> None:
        self.stats.note(kind, self._lineno, msg)
        if self.strict and self._error is None:
            self._error = ParseError(f"{self.stats.source}:{self._lineno}: {msg}")

    def _violation(self, kind: str, msg: str) -> None:
        self.stats.violations[kind] += 1
        self._problem(kind, f"{kind}: {msg}")

    def _update_meta(self) -> None:
        items = self.stats.meta_items(self.trace_level, self._levels_seen, self.writer.meta)
        self.writer.update_meta(**items)
