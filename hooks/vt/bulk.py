"""The fast import path: a whole saved log read at once into a :class:`~.parser.VtTraceParser`,
with the result of feeding it line by line (the parser's bulk front end; rules: the package
docstring).

:func:`bulk_feed` lexes the log with :func:`~.bulk_lex.lex_log`, segments engine steps with
:func:`~.bulk_steps.segment` (the parser's step rules as bit masks, run over many stretches
of line codes at once; :func:`_segment`, one pass over the codes, where it does not
settle), and computes blocks,
joins, anchors, batch rows, phases and statistics with numpy. It takes only logs whose every
decision it reproduces exactly: canonical lines (malformed ones are counted with today's
messages), sync-scheduling joins (exact or hinted), no ``installed=0`` / ``sched=0``, and in
strict mode no problem at all. Any other log is left untouched (it returns None) for
:meth:`~.parser.VtTraceParser.feed_line`, which also reports the first strict failure.
"""

from __future__ import annotations

import mmap

import numpy as np

from spectrace.tracer import schema

from .blocks import Block, Chain, Proposal, anchor_mismatch, block_problems, chain_break, gap_note
from .bulk_commit import commit, padded
from .bulk_lex import CODE, KEYS, SEEN_BITS, Family, Lexed, NotBulk, lex_log
from .bulk_steps import segment
from .lines import Ids
from .parser import VtTraceParser

V = CODE["SPECTRACE", ""]
_PROPOSE, _NO_ROWS = CODE["spec-propose", ""], CODE["spec-propose", "no_rows"]
_SCHED, _INSTALL = CODE["spec-sched", ""], CODE["spec-install", ""]
_UPD, _CALLED = CODE["spec-update", "req"], CODE["spec-update", "called"]
_POST_STEP = CODE["spec-post_step", ""]
_PHASES = (CODE["spec-phase", "pre"], CODE["spec-phase", "old"], CODE["spec-phase", "dspark"])
_DEV, _FWD = CODE["spec-phase-dev", ""], CODE["fwd-ops", ""]
# The parser's step rules (VtTraceParser._on_*): bits of `seen` (bulk_lex.SEEN_BITS), what
# each code adds and which seen bits make it start a new step.
PR, PS, UP, IN, SC, FW, DV, PH, CA = SEEN_BITS
_POST = PS | UP | IN
_ADD = {_PROPOSE: PR, _NO_ROWS: PR, _POST_STEP: PS, _UPD: UP, _CALLED: UP | CA, _INSTALL: IN}
_ADD |= {_SCHED: SC, _FWD: FW, _DEV: DV} | {c: PH for c in _PHASES}
_NEW = {_PROPOSE: PR | _POST, _NO_ROWS: PR | _POST, _SCHED: _POST, _POST_STEP: PS}
_NEW |= {_CALLED: CA, _UPD: 0, _INSTALL: 0, _FWD: PR | _POST | DV | PH, _DEV: PR | _POST | DV | PH}
_NEW |= {c: PR | _POST | PH for c in _PHASES}
# The same as arrays by code (0: no trace line) for bulk_steps; a [SPECTRACE] line adds
# nothing and starts a step on any bit but sched.
_MASKS = tuple(np.zeros(len(KEYS) + 1, np.int64) for _ in range(2))
for _c, _bits in _NEW.items():
    _MASKS[0][_c] = _bits
for _c, _bits in _ADD.items():
    _MASKS[1][_c] = _bits
_MASKS[0][V] = sum(SEEN_BITS) & ~SC


def bulk_feed(parser: VtTraceParser, data: bytes | mmap.mmap) -> bool | None:
    """Feed a whole log (bytes of a file, or the file mapped) to a fresh ``parser`` at once.

    Returns:
        Whether the log holds a NUL byte (binary), or None when the log needs
        :meth:`~.parser.VtTraceParser.feed_line` (nothing was recorded then).
    """
    if data.find(b"\r") >= 0 or parser.stats.lines or parser.trace_level is not None:
        return None
    try:
        lexed = lex_log(data)
        plan = _Plan(parser, lexed)
    except NotBulk:
        return None
    commit(plan)
    return data.find(b"\x00") >= 0  # (``in`` on a mapped file is a Python loop)


def _segment(codes: list[int], vreq: list[int]) -> tuple[list[int], list[int], int]:
    """Step of every trace line and the `seen` bits after it (VtTraceParser._new_step_if)."""
    steps, seens = [0] * len(codes), [0] * len(codes)
    seen = step = vi = 0
    runner = False
    verified: set[int] = set()
    new, add = _NEW, _ADD
    for i, c in enumerate(codes):
        if c == V:
            if not runner:  # an implicit, untraced step 0 proposed these drafts
                runner, step = True, 1
            r = vreq[vi]
            vi += 1
            if seen & ~SC or r in verified:
                step, seen, verified = step + 1, 0, set()
            verified.add(r)
        else:
            if seen & new[c]:
                step, seen, verified = step + 1, 0, set()
            seen |= add[c]
            runner = runner or c != _SCHED
        steps[i], seens[i] = step, seen
    return steps, seens, step


class _Plan:
    """Everything a line-by-line parse of ``lexed`` would record, computed before anything
    is written (NotBulk: a decision only the line-by-line parser makes)."""

    def __init__(self, parser: VtTraceParser, lexed: Lexed) -> None:
        self.p, self.lx, self.fam = parser, lexed, lexed.families
        self.empty = Family(np.zeros(0, np.int64), {})
        self.problems: list[tuple[int, int, str, str]] = []  # (line, order, kind, message)
        self._requests()
        order = np.flatnonzero(lexed.codes > 0)
        vreq = self.ridx.get(V, np.zeros(0, np.int64))
        codes = lexed.codes[order]
        self.by_req = np.argsort(vreq, kind="stable")  # blocks by request, in line order
        got = segment(codes, vreq, _MASKS, V, _SCHED, self.by_req)
        if got is None:  # the automaton did not settle: one pass over the lines
            s, e, last = _segment(codes.tolist(), vreq.tolist())
            got = (np.asarray(s, np.int64), np.asarray(e, np.int64), last)
        steps, seens, self.last_step = got
        self.step_of = np.zeros(lexed.n_lines, np.int64)
        self.step_of[order] = steps
        self.seen_of = np.zeros(lexed.n_lines, np.int64)
        self.seen_of[order] = seens
        self.any_record = len(order) > 0
        self._refuse()
        self._blocks()
        self._joins()
        if parser.strict and (lexed.malformed or any(e[2][0] == "!" for e in self.problems)):
            raise NotBulk("strict mode: the line-by-line parser names the first problem")
        if parser.strict and self._strict_refusals():  # the line parser's PlainSteps decides
            raise NotBulk("strict mode: a block that may not belong to its request")

    def _strict_refusals(self) -> bool:
        """Whether a block may break a :class:`~.blocks.PlainSteps` rule (a superset: the
        line-by-line parser decides): a chain gap, a block after the first ``[spec-sched]``
        whose request no earlier one named, a block after its request's ``finished=1``, or
        two blocks of a request without a ``[spec-post_step]`` between them."""
        vl, fs, fu = self.f(V).lines, self.f(_SCHED), self.f(_UPD)
        if self.gap.any() or not self.n:
            return bool(self.gap.any())
        named = self._first_line(fs.lines, self.ridx[_SCHED])[self.vreq]
        if len(fs.lines) and ((vl > fs.lines[0]) & (named > vl)).any():
            return True
        fin = fu.ints("finished") == 1 if len(fu.lines) else np.zeros(0, bool)
        if (self._first_line(fu.lines[fin], self.ridx[_UPD][fin])[self.vreq] < vl).any():
            return True
        posts, hp = self.f(_POST_STEP).lines, np.flatnonzero(self.prev >= 0)
        between = np.searchsorted(posts, vl[hp]) - np.searchsorted(posts, vl[self.prev[hp]])
        return bool(len(posts) and (between == 0).any())

    def _first_line(self, lines: np.ndarray, reqs: np.ndarray) -> np.ndarray:
        """Per request index: the first of ``lines`` (``reqs``: their requests), else int64 max."""
        first = np.full(len(self.names), np.iinfo(np.int64).max, np.int64)
        np.minimum.at(first, reqs, lines)
        return first

    def f(self, code: int) -> Family:
        return self.fam.get(code, self.empty)

    def _requests(self) -> None:
        """One index per request id over every family (``ridx[code]``: per line), in order
        of first appearance (``[SPECTRACE]`` lines first, then update, install, sched)."""
        codes = (V, _UPD, _INSTALL, _SCHED)
        cols = [self.f(code).strs("req") for code in codes]
        ids = np.concatenate(cols)
        if ids.dtype.itemsize <= 8:  # sort 8-byte words: much faster than bytes
            ids = ids.astype("S8").view(np.uint64)
        uniq, first, inv = np.unique(ids, return_index=True, return_inverse=True)
        order = np.argsort(first)
        rank = np.empty(len(uniq), np.int64)
        rank[order] = np.arange(len(uniq))
        index = rank[inv.ravel()]
        cuts = np.cumsum([len(c) for c in cols])[:-1]
        self.ridx = dict(zip(codes, np.split(index, cuts)))
        allr = np.concatenate(cols)
        self.names = [r.decode("ascii") for r in allr[first[order]].tolist()]

    def _refuse(self) -> None:
        if (self.f(_INSTALL).ints("installed") == 0).any():
            raise NotBulk("installed=0")
        if (self.f(_SCHED).ints("sched") == 0).any():
            raise NotBulk("sched=0")

    def _blocks(self) -> None:
        """Blocks in line order: ids, the anchor chain per request, batch rows."""
        fv = self.f(V)
        self.n = n = len(fv.lines)
        self.vline = fv.lines + 1
        self.vstep = self.step_of[fv.lines]
        self.pos, self.ns = fv.ints("pos"), fv.ints("ns")
        self.acc, self.k = fv.ints("acc"), fv.ints("k")
        self.dflat, self.dlen = fv.flat("draft")
        self.eflat, self.elen = fv.flat("emit")
        self.doff = np.concatenate([[0], np.cumsum(self.dlen)])[:-1].astype(np.int64)
        self.eoff = np.concatenate([[0], np.cumsum(self.elen)])[:-1].astype(np.int64)
        self.dmat = padded(self.dflat, self.dlen, int(self.dlen.max(initial=1)), schema.PAD)
        self.emat = padded(self.eflat, self.elen, int(self.elen.max(initial=1)), schema.PAD)
        self.vreq = self.ridx[V]
        last = np.full(n, schema.PAD, np.int64)
        has = self.elen > 0
        last[has] = self.eflat[self.eoff[has] + self.elen[has] - 1]
        self.last = last
        self._anchors()
        self._batch_rows()
        self._problems()

    def _anchors(self) -> None:
        n, pos = self.n, self.pos
        srt = self.by_req
        prev = np.full(n, -1, np.int64)
        same = self.vreq[srt[1:]] == self.vreq[srt[:-1]]
        prev[srt[1:][same]] = srt[:-1][same]
        self.prev, hp = prev, prev >= 0
        pp = np.where(hp, prev, 0)
        self.expected = np.where(hp, pos[pp] + self.ns[pp], pos)
        from_req = self._from_requests()
        self.gap = hp & (pos > self.expected)
        self.brk = hp & (pos < self.expected)
        chain = hp & (pos == self.expected) & (self.last[pp] != schema.PAD)
        self.mism = chain & (from_req != schema.PAD) & (from_req != self.last[pp])
        use_chain = chain & ~self.mism
        self.anchor = np.where(use_chain, self.last[pp], from_req)
        self.n_chain = int(use_chain.sum())
        self.n_req = int((~use_chain & (from_req != schema.PAD)).sum())
        self.n_unknown = n - self.n_chain - self.n_req
        self.from_req = from_req

    def _from_requests(self) -> np.ndarray:
        """``(prompt_ids + output_ids)[pos - 1]`` from the requests file, else -1."""
        reqs = self.p._requests or {}
        fulls = [reqs[r].full if r in reqs else [] for r in self.names]
        flen = np.array([len(x) for x in fulls], np.int64)
        cat = np.array([t for x in fulls for t in x] + [schema.PAD], np.int64)
        off = np.concatenate([[0], np.cumsum(flen)])[:-1].astype(np.int64)
        lens = flen[self.vreq] if self.n else np.zeros(0, np.int64)
        ok = (self.pos > 0) & (self.pos <= lens)
        at = np.where(ok, off[self.vreq] + self.pos - 1, len(cat) - 1) if self.n else lens
        return cat[at] if self.n else lens

    def _batch_rows(self) -> None:
        """``[spec-update] req=`` rows of the proposing step (VtTraceParser._payload)."""
        fu = self.f(_UPD)
        self.batch_row = np.full(self.n, schema.PAD, np.int64)
        self.batch_size = np.full(self.n, schema.PAD, np.int64)
        if not len(fu.lines) or not self.n:
            return
        nr = max(len(self.names), 1)
        ustep = self.step_of[fu.lines]
        key = ustep * nr + self.ridx[_UPD]
        _, first = np.unique(key, return_index=True)
        first.sort()
        fs, fk = ustep[first], key[first]
        rank = np.arange(len(first)) - np.searchsorted(fs, fs, "left")
        size = np.bincount(fs, minlength=int(self.last_step) + 2)
        srt = np.argsort(fk)
        want = (self.vstep - 1) * nr + self.vreq
        at = np.clip(np.searchsorted(fk[srt], want), 0, len(fk) - 1)
        hit = fk[srt][at] == want
        self.batch_row[hit] = rank[srt][at][hit]
        self.batch_size[hit] = size[self.vstep[hit] - 1]

    def _problems(self) -> None:
        """Chain events and block invariants (VtTraceParser._chain_anchor, block_problems)."""
        acc, ns, k, dl, el = self.acc, self.ns, self.k, self.dlen, self.elen
        bad = (acc != np.maximum(ns - 1, 0)) | (el != ns) | (dl != k) | (acc > k)
        m = np.minimum(np.minimum(acc, dl), el)
        w = min(self.dmat.shape[1], self.emat.shape[1])  # m <= both widths
        differ = self.dmat[:, :w] != self.emat[:, :w]
        bad |= (differ & (np.arange(w) < m[:, None])).any(1)
        for i in np.flatnonzero(bad | self.brk | self.mism | self.gap).tolist():
            self._row_events(i)

    def _row_events(self, i: int) -> None:
        req, pos, line = self.names[self.vreq[i]], int(self.pos[i]), int(self.vline[i])
        exp, pv = int(self.expected[i]), int(self.prev[i])
        if self.gap[i]:
            self.problems.append((line, 0, "chain gap", gap_note(req, pos, exp, self.vline[pv])))
        elif self.brk[i]:
            prev = Chain(int(self.pos[pv]), int(self.ns[pv]), 0, int(self.vline[pv]))
            self._violation(line, 0, "chain break", chain_break(req, pos, exp, prev))
        elif self.mism[i]:
            msg = anchor_mismatch(req, int(self.last[pv]), int(self.from_req[i]), pos)
            self._violation(line, 0, "anchor mismatch", msg)
        for kind, msg in block_problems(self.block(i)):
            self._violation(line, 1, kind, msg)

    def _violation(self, line: int, order: int, kind: str, msg: str) -> None:
        self.problems.append((line, order, "!" + kind, f"{kind}: {msg}"))

    def block(self, i: int) -> Block:
        """Block ``i`` as the line-by-line parser holds it (for messages)."""
        d, e = self.doff[i], self.eoff[i]
        draft = Ids(self.dflat[d : d + self.dlen[i]].tolist())
        emit = Ids(self.eflat[e : e + self.elen[i]].tolist())
        b = Block(int(self.vline[i]), self.names[self.vreq[i]], int(self.vstep[i]) - 1,
                  int(self.pos[i]), int(self.k[i]), int(self.acc[i]), draft, emit,
                  int(self.ns[i]), int(self.anchor[i]), None)  # fmt: skip
        return b

    def _joins(self) -> None:
        """Each ``[spec-propose]`` against the blocks of the next step (choose_join)."""
        fp = self.f(_PROPOSE)
        self.pstep = self.step_of[fp.lines]
        self.fflat, self.flen = fp.flat("first")
        self.foff = np.concatenate([[0], np.cumsum(self.flen)])[:-1].astype(np.int64)
        self.fmat = padded(self.fflat, self.flen, int(self.flen.max(initial=1)), schema.PAD)
        self.per_row = fp.ints("drafts/row")
        self.joined = np.full(self.n, -1, np.int64)  # block -> proposal
        self.outcome = {"exact": 0, "hint": 0, "not_verified": 0}
        prop_at = np.full(int(self.last_step) + 2, -1, np.int64)  # step -> its proposal
        prop_at[self.pstep] = np.arange(len(self.pstep))
        pj = prop_at[self.vstep - 1] if self.n else np.zeros(0, np.int64)  # block -> candidate
        exact = self._same_ids(pj)
        _, at = np.unique(pj[exact], return_index=True)
        first_exact = np.flatnonzero(exact)[at]  # the first exact block of each proposal
        self.joined[first_exact] = pj[first_exact]
        self.outcome["exact"] = len(first_exact)
        todo = np.setdiff1d(np.arange(len(self.flen)), pj[first_exact])
        srt = np.argsort(pj, kind="stable")
        lo, hi = np.searchsorted(pj[srt], todo, "left"), np.searchsorted(pj[srt], todo, "right")
        self._todo = todo
        hints = self._hints(prop_at)
        for j, a, b in zip(todo.tolist(), lo.tolist(), hi.tolist()):
            self._join_one(j, srt[a:b].tolist(), hints.get(j))
        bad = np.flatnonzero(self.per_row != self.flen)
        for j in bad.tolist():
            msg = f"drafts/row={self.per_row[j]} but first=[…] holds {self.flen[j]} ids"
            self._violation(int(fp.lines[j]) + 1, 0, "drafts/row", msg)

    def _same_ids(self, pj: np.ndarray) -> np.ndarray:
        """Blocks whose draft is the ``first=[…]`` of proposal ``pj`` (-1: none), bool [n]."""
        has = np.flatnonzero(pj >= 0)
        has = has[self.dlen[has] == self.flen[pj[has]]]
        w = min(self.dmat.shape[1], self.fmat.shape[1])  # equal lengths: PAD past both
        same = (self.dmat[has, :w] == self.fmat[pj[has], :w]).all(1)
        exact = np.zeros(self.n, bool)
        exact[has[same]] = True
        return exact

    def _hints(self, prop_at: np.ndarray) -> dict[int, tuple[int, bool]]:
        """Proposal -> (request, finished) of the first ``[spec-update] req=`` row of its
        step with drafts and no prefill chunk (VtTraceParser._on_post)."""
        fu = self.f(_UPD)
        if not len(fu.lines):
            return {}
        ok = np.flatnonzero((fu.ints("drafts") > 0) & (fu.ints("prefill_chunk") == 0))
        steps = self.step_of[fu.lines[ok]]
        _, at = np.unique(steps, return_index=True)
        rows = ok[at]
        js = prop_at[np.minimum(steps[at], len(prop_at) - 1)]
        fin = fu.ints("finished")
        has = js >= 0
        js, rows = js[has], rows[has]
        todo = np.zeros(len(self.flen), bool)
        todo[self._todo] = True
        keep = todo[js]  # only the proposals without an exact block ask for a hint
        js, rows = js[keep].tolist(), rows[keep]
        reqs, fins = self.ridx[_UPD][rows].tolist(), (fin[rows] == 1).tolist()
        return dict(zip(js, zip(reqs, fins)))

    def _join_one(self, j: int, blocks: list[int], hint) -> None:
        """Proposal ``j`` without an exact block among ``blocks`` (its next step's)."""
        if hint is None and blocks:
            raise NotBulk("a join without hint (truncated/partial/unjoined)")
        got = None
        if hint is not None and not hint[1]:
            got = next((i for i in blocks if self.vreq[i] == hint[0]), None)
        if got is None:
            self.outcome["not_verified"] += 1
            return
        self.joined[got] = j
        self.outcome["hint"] += 1
        p = self.proposal(j)
        p.hint = self.names[hint[0]]
        self.problems.append((int(self.vline[got]), 2, "proposed != verified",
                              p.join_note(self.block(got), "hint")))  # fmt: skip

    def proposal(self, j: int) -> Proposal:
        """Proposal ``j`` as the line-by-line parser holds it."""
        o = int(self.foff[j])
        first = Ids(self.fflat[o : o + self.flen[j]].tolist())
        p = Proposal(int(self.pstep[j]), int(self.f(_PROPOSE).lines[j]) + 1, first,
                     int(self.per_row[j]))  # fmt: skip
        p.margin = self.f(_PROPOSE).margins("margin")[j]
        return p
