"""Recording a bulk plan (:class:`~.bulk._Plan`): the blocks as columns
(:meth:`~spectrace.tracer.store.TraceWriter.add_blocks`), the phase timings, the statistics
and the parser's state, exactly as line-by-line feeding leaves them."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import numpy as np

from spectrace.tracer import schema
from spectrace.tracer.store.bulk_rows import add_phases, register_requests

from .blocks import Chain
from .bulk_lex import CODE, KEYS, SEEN_BITS
from .lines import Record, phase_rows

_UPDATE = CODE["spec-update", "req"]
_PHASE_CODES = tuple(CODE[k] for k in KEYS if k[0] in ("spec-phase", "spec-phase-dev", "fwd-ops"))
_LEVEL = {"SPECTRACE": 1, "spec-propose": 1, "spec-phase": 1, "spec-phase-dev": 2, "fwd-ops": 3}
_PROBE = {
    ("spec-post_step", ""): "post_step",
    ("spec-update", "called"): "update_called",
    ("spec-update", "req"): "update_rows",
    ("spec-install", ""): "install",
    ("spec-sched", ""): "sched",
    ("spec-propose", "no_rows"): "propose_no_rows",
}


def commit(plan: Any) -> None:
    """Write ``plan`` into its parser's writer and statistics (see :mod:`.bulk`)."""
    _write_blocks(plan)
    _write_phases(plan)
    _count(plan)
    _notes(plan)
    _state(plan)


def padded(flat: np.ndarray, lens: np.ndarray, w: int, fill) -> np.ndarray:
    """Ragged lists (``flat`` split by ``lens``, each at most ``w`` long) as an
    [n, max(w, 1)] matrix padded with ``fill`` (``flat``'s dtype; int64 when empty)."""
    out = np.full((len(lens), max(w, 1)), fill, dtype=flat.dtype if len(flat) else np.int64)
    out[np.arange(out.shape[1]) < lens[:, None]] = flat  # row-major: the lists in order
    return out


def _write_blocks(plan: Any) -> None:
    n = plan.n
    if not n:
        return
    w = plan.p.writer
    nv = int(plan.vreq.max()) + 1  # V requests come first, in order of appearance
    widx = register_requests(w, plan.names[:nv])
    jr = np.flatnonzero(plan.joined >= 0)
    jp = plan.joined[jr]
    plen = np.maximum(plan.per_row, plan.flen)
    k = plan.dlen.copy()
    k[jr] = plen[jp]
    wk = int(max(k.max(), plan.dlen.max(), 1))
    verified = np.full((n, wk), schema.PAD, plan.dmat.dtype)
    verified[:, : plan.dmat.shape[1]] = plan.dmat
    proposed = verified.copy()
    proposed[jr] = schema.PAD
    fw = min(plan.fmat.shape[1], wk)  # a joined first=[…] holds at most k ids
    proposed[jr, :fw] = plan.fmat[jp, :fw]
    margin = np.full((n, wk), np.nan, np.float32)
    margins = plan.f(CODE["spec-propose", ""]).margins("margin")
    with_margin = [j for j, m in enumerate(margins) if m is not None]
    keep = np.isin(jp, with_margin) if with_margin else np.zeros(len(jp), bool)
    for i, j in zip(jr[keep].tolist(), jp[keep].tolist()):
        m = margins[j]
        if m is not None:  # NaN-padded to the proposal's width, as Proposal.margin_row
            width = int(plen[j])
            margin[i, :width] = (list(m) + [float("nan")] * width)[:width]
    emitted = plan.emat
    source = np.where(plan.joined >= 0, schema.PROPOSAL_FROM_DRAFTER, 0)
    w.add_blocks({
        "request": widx[plan.vreq], "step": plan.vstep - 1, "position": plan.pos - 1,
        "anchor": plan.anchor, "k": k, "proposed": proposed, "num_verified": plan.dlen,
        "verified": verified, "accepted": plan.acc, "num_emitted": plan.elen,
        "emitted": emitted, "t_ns": np.full(n, time.time_ns(), np.int64),
        "batch_row": plan.batch_row, "batch_size": plan.batch_size,
        "proposal_source": source, "draft_margin": margin,
    })  # fmt: skip


def _write_phases(plan: Any) -> None:
    """Phase rows in line order (VtTraceParser._write_phases, through lines.phase_rows, which
    reads whole columns here; ``[fwd-ops]`` shares are computed line by line)."""
    parts = []  # (line, row within the line, step, name, ms, level) columns
    for code in _PHASE_CODES:
        fam = plan.fam.get(code)
        if fam is None:
            continue
        family = KEYS[code - 1][0]
        level = np.full(len(fam.lines), _LEVEL[family], np.int64)
        if family == "spec-phase":
            seen = plan.seen_of[fam.lines]
            fwd, dev = SEEN_BITS[5], SEEN_BITS[6]  # a fwd-ops line: level 3; phase-dev: 2
            level = np.where(seen & fwd, 3, np.where(seen & dev, 2, 1))
        step = plan.step_of[fam.lines]
        rows = _phase_columns(family, fam)
        for r, (name, ms) in enumerate(rows):
            ms = np.asarray(ms, dtype=np.float64)
            keep = np.isfinite(ms)
            parts.append((fam.lines[keep], r, step[keep], name, ms[keep], level[keep]))
    if not parts:
        return
    line = np.concatenate([p[0] for p in parts])
    sub = np.concatenate([np.full(len(p[0]), p[1]) for p in parts])
    order = np.lexsort((sub, line))
    steps = np.concatenate([p[2] for p in parts])[order]
    names = np.concatenate([np.full(len(p[0]), i) for i, p in enumerate(parts)])[order]
    ms = np.concatenate([p[4] for p in parts])[order]
    levels = np.concatenate([p[5] for p in parts])[order]
    add_phases(plan.p.writer, steps, [p[3] for p in parts], names, ms, levels)
    plan.p.stats.phases += len(ms)


def _phase_columns(family: str, fam: Any) -> list[tuple[str, object]]:
    """``phase_rows`` of a whole family: (name, ms per line) in the order it names them."""
    if family != "fwd-ops":
        return phase_rows(Record(family, {n: np.asarray(v) for n, v in fam.cols.items()}))
    cols = {n: np.asarray(v).tolist() for n, v in fam.cols.items()}
    per_line = [
        phase_rows(Record(family, {n: v[j] for n, v in cols.items()}))
        for j in range(len(fam.lines))
    ]
    return [(name, [row[i][1] for row in per_line]) for i, (name, _) in enumerate(per_line[0])]


def _bump(counter: Counter[str], key: str, n: int) -> None:
    if n:
        counter[key] += int(n)


def _count(plan: Any) -> None:
    st, lx = plan.p.stats, plan.lx
    st.lines += lx.n_lines
    st.trace_lines += int((lx.codes != 0).sum())
    st.malformed += len(lx.malformed)
    for code, fam in plan.fam.items():
        key = KEYS[code - 1]
        _bump(st.families, key[0], len(fam.lines))
        if key in _PROBE:
            _bump(st.probes, _PROBE[key], len(fam.lines))
    sched = plan.f(CODE["spec-sched", ""]).cols
    if sched:
        _bump(st.probes, "sched_truncated", int((sched["sched"] < sched["have"]).sum()))
    nqpr = plan.f(CODE["spec-propose", ""]).ints("nqpr")
    for v, c in zip(*np.unique(nqpr, return_counts=True)):
        _bump(st.probes, f"nqpr={int(v)}", int(c))
    for kind, c in plan.outcome.items():
        _bump(st.joins, kind, c)
    _bump(st.joins, "proposed != verified", plan.outcome["hint"])
    joined = int((plan.joined >= 0).sum())
    _bump(st.proposed_source, "propose_line", joined)
    _bump(st.proposed_source, "verified", plan.n - joined)
    for how, c in (("chain", plan.n_chain), ("requests", plan.n_req), ("unknown", plan.n_unknown)):
        _bump(st.anchors, how, c)
    st.chain_gaps += int(plan.gap.sum())
    if plan.any_record:
        st.steps = plan.last_step + 1
    ks = [int(plan.k.max())] if plan.n else []
    ks += [int(plan.per_row.max())] if len(plan.per_row) else []
    st.k_max = max([st.k_max] + ks)
    look = plan.f(CODE["spec-install", ""]).ints("lookahead")
    st.lookahead_max = max(st.lookahead_max, int(look.max()) if len(look) else 0)
    st.blocks = plan.n
    st.requests = int(plan.vreq.max()) + 1 if plan.n else 0  # V requests rank first (_requests)


def _notes(plan: Any) -> None:
    """Malformed lines, violations and notes in line order (ImportStats.note keeps the first
    MAX_EXAMPLES of each kind; violation kinds are counted in order of first sight)."""
    st = plan.p.stats
    for line, msg in plan.lx.malformed:
        st.note("malformed", line, msg)
    for line, _, kind, msg in sorted(plan.problems, key=lambda e: (e[0], e[1])):
        if kind.startswith("!"):
            kind = kind[1:]
            st.violations[kind] += 1
        st.note(kind, line, msg)


def _state(plan: Any) -> None:
    """The parser's fields as line-by-line feeding leaves them (what finish() reads)."""
    p = plan.p
    p._lineno = plan.lx.n_lines
    p._step = plan.last_step
    p._rows = plan.n
    srt = plan.by_req
    tail = np.flatnonzero(np.diff(plan.vreq[srt], append=-1) != 0)  # a request's last block
    rows = srt[tail]  # by request index: V lines' requests follow their first appearance
    cols = (plan.vreq[rows], plan.pos[rows], plan.ns[rows], plan.last[rows], plan.vline[rows])
    for r, pos, ns, last, line in zip(*(c.tolist() for c in cols)):
        name = plan.names[r]
        p._chains[name] = Chain(pos, ns, last, line)
        p._reqs.add(name)
        p._held.plain[name] = 0
    unknown = np.flatnonzero(plan.anchor == schema.PAD)
    where = (unknown, plan.vreq[unknown], plan.pos[unknown])
    p._unresolved = [(i, plan.names[r], pos) for i, r, pos in zip(*(c.tolist() for c in where))]
    levels = {_LEVEL[KEYS[c - 1][0]] for c in plan.fam if KEYS[c - 1][0] in _LEVEL}
    p._levels_seen |= levels
    p._runner_seen = any(KEYS[c - 1][0] != "spec-sched" for c in plan.fam)
    p._proposal = None
    p._done = _finished_requests(plan)


def _finished_requests(plan: Any) -> dict[str, bool]:
    """Request id -> whether one of its ``[spec-update] req=`` lines said ``finished=1``
    (the requests with such lines; the parser's ``_done``)."""
    upd = plan.ridx[_UPDATE]
    fin = plan.f(_UPDATE).ints("finished") == 1
    said = np.bincount(upd, weights=fin, minlength=len(plan.names)) > 0
    return {plan.names[r]: bool(said[r]) for r in np.unique(upd).tolist()}
