"""``spectrace import llama-dump``: llama.cpp's ``LLAMA_SPEC_DUMP`` JSONL into a trace.

The dump (``common/speculative.cpp``, ``LLAMA_SPEC_DUMP=<path>``) appends one object per
draft verification step::

    {"step": 1, "seq": 3, "n_draft": 3, "n_accepted": 2, "pmin_drop": 0, "pos": [
      {"i": 0, "tok": 292, "p": 0.977664, "logp": -0.022589, "acc": true,
       "top": [{"tok": 292, "p": 0.977664}, {"tok": 65, "p": 0.017829}]}, ...]}

``pos`` lists the ``n_draft`` drafts the target verified (``acc`` is ``i < n_accepted``);
``pmin_drop`` drafts were cut by the ``p_min`` gate before verification; ``top`` holds the
drafter's top-N candidates (``LLAMA_SPEC_DUMP_TOPK``, default 1). The dump names no request
and no position, so a requests JSONL gives each request's prompt and output ids and the
sequence (``seq``, default: ``req_id`` read as the sequence number) that served it; several
requests of one sequence are served in file order. Each sequence's steps are placed in
dump order: the first anchor at ``len(prompt)``, the next at ``p + n_accepted + 1``, the
next request of the sequence once a step reaches the end of the output.

Stored per block: ``k = n_draft + pmin_drop`` with ``proposed`` the verified ids then -1 for
the trimmed ones (ids the dump does not keep), ``verified`` the ``n_draft`` ids (so
``num_verified < k`` marks the trim, as the ``trimmed_drafts`` finding reads it),
``accepted = n_accepted``, ``emitted`` from the output, and ``draft_margin`` the drafter's
top-1 minus top-2 log-probability per slot (NaN where ``top`` has fewer than two).
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field

from spectrace.hooks.vt.requests import RequestRecord, read_requests
from spectrace.tracer import schema
from spectrace.tracer.errors import InputError
from spectrace.tracer.store import TraceWriter

from .common import Problems, is_int, jsonl_objects, read_text, write_trace

SOURCE = "llama-spec-dump"
#: Problem classes that lose a verification step: a line that is no step (not JSON, not a
#: readable step), a step that was not placed (no request of its sequence, past the end
#: of its requests) or one placed where its accepted drafts are not the output (a step
#: lost before it shifted the sequence's placement: a healthy run's accepted drafts are
#: its output). Duplicated steps are the file's repeats, not lost steps.
LOST_STEPS = ("bad_json", "invalid_step", "unknown_seq", "past_end", "accepted_mismatch")
_I16 = 2**15 - 1
_I32 = 2**31 - 1


@dataclass
class Step:
    """One verification step of the dump, checked."""

    line: int
    step: int
    seq: int
    drafts: list[int]
    accepted: int
    dropped: int
    margins: list[float]


@dataclass
class DumpStats:
    """What an import of a dump found (stored as ``meta["import"]``).

    Attributes:
        source: the dump's name; ``lines``: JSON lines read; ``steps``: readable steps.
        blocks: blocks written; ``requests``: requests written (from the requests file).
        trimmed_blocks / trimmed_drafts: blocks with ``pmin_drop > 0`` and their drafts.
        unplaced: reason -> steps not written (``unknown_seq``, ``past_end``, ...).
        problems: the counted problems.
    """

    source: str
    lines: int = 0
    steps: int = 0
    blocks: int = 0
    requests: int = 0
    trimmed_blocks: int = 0
    trimmed_drafts: int = 0
    margins: int = 0
    unplaced: Counter = field(default_factory=Counter)
    problems: Problems | None = None

    def summary(self) -> str:
        """One line for people."""
        parts = [f"{self.steps} steps"]
        if self.trimmed_blocks:
            parts.append(
                f"{self.trimmed_drafts} drafts trimmed by p_min in {self.trimmed_blocks} blocks"
            )
        parts.append(f"{self.margins} draft margins")
        if self.unplaced:
            parts.append(
                "not placed: "
                + ", ".join(f"{n} {r.replace('_', ' ')}" for r, n in self.unplaced.items())
            )
        return (
            f"imported {self.blocks} blocks of {self.requests} requests from {self.source} "
            f"({'; '.join(parts)})"
        )

    def to_meta(self) -> dict:
        out = {k: v for k, v in vars(self).items() if k not in ("unplaced", "problems")}
        out["unplaced"] = dict(self.unplaced)
        out["problems"] = self.problems.to_meta() if self.problems else {}
        out["lost"] = self.lost()
        return out

    def lost(self) -> dict:
        """The dump's steps the trace lacks (``meta["import"]["lost"]``, which the
        ``capture_incomplete`` finding reads): lines that are no step (:data:`LOST_STEPS`)
        and steps that could not be placed. ``{"count", "first": "FILE:LINE: what"}``."""
        if self.problems is None:
            return {"count": 0, "first": None}
        hits = [p for c, p in self.problems.classes.items() if c in LOST_STEPS]
        return {"count": sum(p.count for p in hits), "first": self.problems.first_of(LOST_STEPS)}


def import_dump(
    path: str | os.PathLike,
    out: str | os.PathLike,
    requests_path: str | os.PathLike,
    strict: bool = False,
    meta: dict | None = None,
) -> DumpStats:
    """Import a ``LLAMA_SPEC_DUMP`` JSONL file (what ``spectrace import llama-dump`` runs).

    Args:
        path: the dump; ``out``: the trace to write; ``requests_path``: JSONL of
            ``{"req_id", "seq"?, "prompt_ids", "output_ids", "finish_reason"?}``.
        strict: fail on the first problem instead of counting it.
        meta: /meta items that override the defaults (``engine``, ``k``, ...).
    Returns:
        The :class:`DumpStats`.
    Raises:
        InputError: missing/empty/binary file, a dump without one readable step object,
            bad requests file (``FILE:LINE``); ParseError: strict mode. The ``.partial``
            file is removed.
    """
    source = str(path)
    text = read_text(path, "LLAMA_SPEC_DUMP file")
    requests = read_requests(requests_path)
    by_seq = _requests_by_seq(requests_path, requests)
    stats = DumpStats(source, problems=Problems(source, strict))
    steps = _read_steps(text, stats)
    if not steps:
        raise InputError(_no_steps(stats, text))

    def fill(writer: TraceWriter) -> dict:
        for r in requests.values():
            writer.request(r.req_id, r.prompt_ids, r.output_ids, r.finish_reason)
        stats.requests = len(requests)
        kmax = _place_steps(writer, steps, by_seq, stats)
        items: dict = {"import": stats.to_meta()}
        if not (meta or {}).get("k"):
            items["k"] = kmax
        return items

    write_trace(out, {"source": SOURCE, "engine": "llama.cpp", **(meta or {})}, fill)
    return stats


def _requests_by_seq(path, requests: dict[str, RequestRecord]) -> dict[int, list]:
    """Sequence number -> its requests in file order (``seq`` field, else ``req_id``)."""
    seqs: dict[str, int] = {}
    for line in read_text(path, "requests file").splitlines():
        obj = json.loads(line) if line.strip() else None
        if isinstance(obj, dict) and is_int(obj.get("seq"), 0, _I32):
            seqs[str(obj["req_id"])] = obj["seq"]
    out: dict[int, list] = {}
    for rid, rec in requests.items():
        # isdigit() is also true of other digits ("²"), which int() refuses
        seq = seqs.get(rid, int(rid) if rid.isascii() and rid.isdigit() else None)
        if seq is not None:
            out.setdefault(seq, []).append(rec)
    return out


def _read_steps(text: str, stats: DumpStats) -> list[Step]:
    """The readable steps, in ``step`` order per sequence (the placement's order).

    A step that repeats a (``seq``, ``step``) already read is a ``duplicate_step`` problem
    (left out: placing it twice would move every later anchor); one whose ``step`` is below
    an earlier step of its sequence is a ``step_order`` problem (placed in step order). Both
    are the file's problems, never the engine's findings.
    """
    assert stats.problems is not None
    out = []
    seen: set[tuple[int, int]] = set()
    last: dict[int, int] = {}  # seq -> highest step read
    for n, obj in jsonl_objects(text, stats.source, stats.problems):
        stats.lines += 1
        step = _step(n, obj, stats.problems)
        if step is None:
            continue
        key = (step.seq, step.step)
        if key in seen:
            what = f"step {step.step} of seq {step.seq} again (a duplicated step line)"
            stats.problems.add("duplicate_step", n, what, "step", step.step)
            continue
        if step.step < last.get(step.seq, -1):
            what = f"step {step.step} of seq {step.seq} after step {last[step.seq]}"
            stats.problems.add("step_order", n, what, "step", step.step)
        seen.add(key)
        last[step.seq] = max(step.step, last.get(step.seq, -1))
        out.append(step)
    stats.steps = len(out)
    return sorted(out, key=lambda s: s.step)  # stable: each sequence in step order


def _no_steps(stats: DumpStats, text: str) -> str:
    """The input error of a dump with no readable step (one line, the first problem)."""
    assert stats.problems is not None
    lines = sum(1 for x in text.splitlines() if x.strip())
    first = next(iter(stats.problems.classes.values()), None)
    why = f" (first problem at {first.where}: {first.what})" if first else ""
    return (
        f"{stats.source}: no LLAMA_SPEC_DUMP step object (step, seq, n_draft, n_accepted, "
        f"pmin_drop, pos) in {lines} line(s){why}"
    )


def _step(n: int, obj: dict, problems: Problems) -> Step | None:
    """One checked step, or None (an ``invalid_step`` problem)."""
    for key, hi in (("step", _I32), ("seq", _I32), ("n_draft", _I16), ("pmin_drop", _I16)):
        if not is_int(obj.get(key), 0, hi):
            problems.add("invalid_step", n, "not a count", key, obj.get(key))
            return None
    width, kmax = obj["n_draft"] + obj["pmin_drop"], schema.META_MAXIMUM["k"]
    if width > kmax:  # no trace holds a block that wide
        what = f"{width} drafts (n_draft + pmin_drop), more than k can be ({kmax})"
        problems.add("invalid_step", n, what, "n_draft", obj["n_draft"])
        return None
    pos = obj.get("pos")
    if not isinstance(pos, list) or not all(
        isinstance(q, dict) and is_int(q.get("tok")) for q in pos
    ):
        problems.add("invalid_step", n, "not a list of {i, tok, ...} drafts", "pos", pos)
        return None
    nd, acc = obj["n_draft"], obj.get("n_accepted")
    if len(pos) != nd:
        problems.add("count_mismatch", n, f"{len(pos)} pos entries", "n_draft", nd)
    if not isinstance(acc, int) or not is_int(acc, 0, len(pos)):
        problems.add("invalid_step", n, f"not in [0, {len(pos)}]", "n_accepted", acc)
        return None
    for j, q in enumerate(pos):
        if q.get("i", j) != j:
            problems.add("pos_order", n, f"pos[{j}] is slot {q.get('i')}", "i", q.get("i"))
        if "acc" in q and q["acc"] is not (j < acc):
            problems.add("acc_label", n, f"pos[{j}] label vs n_accepted={acc}", "acc", q["acc"])
    margins = [_margin(q.get("top"), n, problems) for q in pos]
    return Step(n, obj["step"], obj["seq"], [q["tok"] for q in pos], acc, obj["pmin_drop"], margins)


def _margin(top: object, n: int, problems: Problems) -> float:
    """Top-1 minus top-2 log-probability of a slot's ``top`` list (NaN when unknown)."""
    if top is None:
        return math.nan
    if not isinstance(top, list) or not all(
        isinstance(c, dict) and isinstance(c.get("p"), (int, float)) and 0 <= c["p"] <= 1
        for c in top
    ):
        problems.add("invalid_top", n, "not a list of {tok, p} candidates", "top", top)
        return math.nan
    ps = sorted((float(c["p"]) for c in top), reverse=True)
    if len(ps) < 2 or ps[1] <= 0:
        return math.nan
    return math.log(ps[0]) - math.log(ps[1])


def _place_steps(writer: TraceWriter, steps: list[Step], by_seq: dict, stats: DumpStats) -> int:
    """Place every step on its sequence's requests and write it; returns the widest k."""
    assert stats.problems is not None
    state: dict[int, list] = {}  # seq -> [request index in its queue, next anchor position]
    kmax = 0
    for s in steps:
        queue = by_seq.get(s.seq)
        if not queue:
            stats.unplaced["unknown_seq"] += 1
            stats.problems.add("unknown_seq", s.line, "no request of this sequence", "seq", s.seq)
            continue
        st = state.setdefault(s.seq, [0, len(queue[0].prompt_ids)])
        while st[0] < len(queue) and st[1] >= len(queue[st[0]].full):
            st[0] += 1  # that request is done: the next one on this sequence
            st[1] = len(queue[st[0]].prompt_ids) if st[0] < len(queue) else 0
        if st[0] >= len(queue):
            stats.unplaced["past_end"] += 1
            stats.problems.add("past_end", s.line, "past the end of its requests", "seq", s.seq)
            continue
        rec = queue[st[0]]
        kmax = max(kmax, _write_step(writer, s, rec, st[1], stats))
        st[1] += s.accepted + 1
    return kmax


def _write_step(writer: TraceWriter, s: Step, rec: RequestRecord, p: int, st: DumpStats) -> int:
    assert st.problems is not None
    full = rec.full
    seen = full[p + 1 : p + 1 + s.accepted]
    if s.drafts[: len(seen)][: s.accepted] != seen:
        st.problems.add(
            "accepted_mismatch",
            s.line,
            f"accepted drafts differ from req={rec.req_id}'s output at position {p + 1}",
            "pos",
            s.drafts[: s.accepted],
        )
    k = len(s.drafts) + s.dropped
    writer.add_block(
        rec.req_id,
        s.step,
        p,
        full[p],
        s.drafts + [schema.PAD] * s.dropped,
        verified=s.drafts,
        accepted=s.accepted,
        emitted=full[p + 1 : p + s.accepted + 2],
        t_ns=0,
        proposal_source=schema.PROPOSAL_FROM_DRAFTER,
        draft_margin=s.margins + [math.nan] * s.dropped,
    )
    st.blocks += 1
    st.trimmed_blocks += s.dropped > 0
    st.trimmed_drafts += s.dropped
    st.margins += sum(not math.isnan(m) for m in s.margins)
    return k
