"""``spectrace import golden``: an oracle-capture JSON golden (what a parity gate keeps, e.g.
vllm.cpp's DFlash/DSpark gates) into a trace.

The golden is one JSON object: run metadata (``oracle_version``, ``pin``, ``target``,
``draft``, ``num_speculative_tokens``, ``max_tokens``, ``attention_backend``,
``enforce_eager``, ``max_num_seqs``), vLLM's counters under ``metrics``
(``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``, ``..._num_accepted_tokens``,
``..._num_accepted_tokens_per_pos``) and ``records``: per request ``prompt``,
``prompt_token_ids``, ``output_token_ids``, ``text`` and ``blocks``, each ``{call, req_row,
anchor, drafts}`` in call order. Blocks are placed as the gate does (:mod:`.placement`), and
the placed totals are checked against the golden's own counters (``meta["checks"]["golden
_counters"]``): blocks whose bonus token falls past ``max_tokens`` keep their visible
acceptance and explain an accepted-token shortfall of at most their drafts past the end
(vLLM counts acceptance before it trims the output; :mod:`.counters`), unplaced blocks a
drafts shortfall; any other difference is a ``mismatch`` (``capture_incomplete``). A
request's final proposal (anchored at its last token) is written unverified, as the vLLM
capture writes it, and left out of the counters (vLLM never verified it).
"""

from __future__ import annotations

import functools
import os
from collections import Counter
from dataclasses import dataclass, field

from spectrace.tracer import schema
from spectrace.tracer.errors import InputError
from spectrace.tracer.store import TraceWriter

from .common import JsonLines, Problems, id_list, is_int, load_json, read_text, write_trace
from .counters import (
    GOLDEN_COUNTERS,
    check_status,
    counters_check,
    placed_totals,
    unreadable_counter,
)
from .placement import UNPLACED_REASONS, PlacedBlock, place

SOURCE = "golden"
#: Golden keys copied into /meta as they are (under ``meta["golden"]``).
RUN_KEYS = ("oracle_version", "pin", "attention_backend", "enforce_eager", "max_tokens")


#: Why a golden block was not placed that means the trace lacks it (see GoldenStats.lost).
_DAMAGE = ("anchor_mismatch", "invalid_block", "invalid_record")


@dataclass
class GoldenStats:
    """What an import of a golden found (stored as ``meta["import"]``).

    Attributes:
        source: the golden's file name; ``records``: records read, ``requests``: written.
        blocks: blocks in the golden; ``placed``: placed and written.
        unplaced: reason -> blocks not placed (:data:`UNPLACED_REASONS`, ``invalid_record``).
        past_max_tokens: placed blocks whose bonus token falls past the output's end.
        final: placed blocks that are a request's final proposal (written unverified).
        problems: the counted problems; ``check``: the counter cross-check (or None).
    """

    source: str
    records: int = 0
    requests: int = 0
    blocks: int = 0
    placed: int = 0
    unplaced: Counter = field(default_factory=Counter)
    past_max_tokens: int = 0
    final: int = 0
    problems: Problems | None = None
    check: dict | None = None

    def summary(self) -> str:
        """One line: ``imported 5 of 9 blocks of 3 requests from FILE (not placed: ...)``."""
        why = ", ".join(
            f"{self.unplaced[r]} {r.replace('_', ' ')}"
            for r in (*UNPLACED_REASONS, "invalid_record")
            if self.unplaced[r]
        )
        parts = [f"not placed: {why}" if why else "every block placed"]
        if self.past_max_tokens:
            parts.append(f"{self.past_max_tokens} past max_tokens (visible acceptance)")
        if self.final:
            parts.append(f"{self.final} final proposal{'s' if self.final > 1 else ''} "
                         f"(never verified)")  # fmt: skip
        return (
            f"imported {self.placed} of {self.blocks} blocks of {self.requests} requests "
            f"from {self.source} ({'; '.join(parts)})"
        )

    def to_meta(self) -> dict:
        return {
            "source": self.source,
            "records": self.records,
            "requests": self.requests,
            "blocks": self.blocks,
            "placed": self.placed,
            "unplaced": dict(self.unplaced),
            "past_max_tokens": self.past_max_tokens,
            "final": self.final,
            "problems": self.problems.to_meta() if self.problems else {},
            "lost": self.lost(),
        }

    def lost(self) -> dict:
        """The golden's blocks the trace lacks (``meta["import"]["lost"]``, which the
        ``capture_incomplete`` finding reads, as for a llama.cpp dump) when the golden has no
        counters to say (with counters, ``checks.golden_counters`` decides): the blocks a
        damaged record or block, or a walk that ended on a wrong anchor, left unplaced. A
        block past the output's end is no loss: drafted from a token that max_tokens or a
        stop trimmed. ``{"count", "first": "FILE:LINE: what"}``."""
        if self.check is not None and self.check.get("golden") is not None:
            return {"count": 0, "first": None}
        count = sum(self.unplaced[r] for r in (*_DAMAGE, "after_walk_end"))
        return {"count": count, "first": self.problems.first_of(_DAMAGE) if self.problems else None}


def import_golden(
    path: str | os.PathLike, out: str | os.PathLike, strict: bool = False, meta: dict | None = None
) -> GoldenStats:
    """Import an oracle-capture JSON golden (what ``spectrace import golden`` runs).

    Args:
        path: the golden JSON file; ``out``: the trace to write (``.h5``).
        strict: fail on the first problem (an unreadable record or block, a block that ends
            a walk, bad metadata) instead of counting it.
        meta: /meta items that override the defaults.
    Returns:
        The :class:`GoldenStats` (also in ``meta["import"]``; the cross-check in
        ``meta["checks"]["golden_counters"]``).
    Raises:
        InputError: missing, empty or binary file, not JSON (``FILE:LINE``), no ``records``
            list, no draft block in any record, or a spec-decode counter in ``metrics``
            that is not a count (integral floats such as ``5.0`` are counts); ParseError:
            strict mode. The ``.partial`` file is removed.
    """
    source = str(path)
    text = read_text(path, "golden JSON file")
    doc = load_json(text, source)
    if not isinstance(doc, dict) or not isinstance(doc.get("records"), list):
        raise InputError(f"{source}:1: not an oracle-capture golden (no 'records' list)")
    _refuse_blockless(doc["records"], source)
    lines = JsonLines(text, source)
    bad = unreadable_counter(doc.get("metrics"))
    if bad is not None:  # read as no counter, a golden short of its blocks would pass
        raise InputError(
            f"{source}:{lines.line('metrics') or 1}: metrics field {bad[0]!r} is not a count "
            f"(value {bad[1]!r})"
        )
    problems = Problems(source, strict)
    stats = GoldenStats(source, problems=problems)
    base = {**_run_meta(doc, problems, lines), **(meta or {})}

    def fill(writer: TraceWriter) -> dict:
        placed = _write_records(writer, doc["records"], stats, _max_tokens(doc), lines)
        totals = placed_totals(placed, base.get("k"))
        stats.check = counters_check(doc.get("metrics"), totals, sum(stats.unplaced.values()))
        checks = {"golden_counters": stats.check, **check_status(stats.check)}
        return {"import": stats.to_meta(), "checks": checks}

    write_trace(out, base, fill)
    return stats


def _refuse_blockless(records: list, source: str) -> None:
    """A golden with no record, or no record holding a block, is no parity golden.

    Raises:
        InputError: naming the file and what it lacks.
    """
    if not records:
        raise InputError(f"{source}:1: not an oracle-capture golden (an empty 'records' list)")
    if not any(isinstance(r, dict) and _is_list(r, "blocks") and r["blocks"] for r in records):
        raise InputError(
            f"{source}: not an oracle-capture golden: none of its {len(records)} record(s) "
            f"has a 'blocks' list with a block"
        )


def _run_meta(doc: dict, problems: Problems, lines: JsonLines) -> dict:
    """The /meta of the trace from the golden's run metadata (bad types are problems)."""
    k = doc.get("num_speculative_tokens")
    if k is not None and not is_int(k, schema.META_MINIMUM["k"], schema.META_MAXIMUM["k"]):
        problems.add("invalid_meta", lines.line, "not a draft count", "num_speculative_tokens", k)
        k = None
    mns = doc.get("max_num_seqs")
    if mns is not None and not is_int(mns, 0):
        problems.add("invalid_meta", lines.line, "not a batch limit", "max_num_seqs", mns)
        mns = None
    mt = doc.get("max_tokens")
    if mt is not None and not is_int(mt, 1):  # read as no limit (_max_tokens)
        problems.add("invalid_meta", lines.line, "not a token limit", "max_tokens", mt)
    out: dict = {"source": SOURCE, "engine": "vllm", "k": k, "max_num_seqs": mns}
    for key, dest in (("target", "target_model"), ("draft", "draft_model")):
        if isinstance(doc.get(key), str):
            out[dest] = doc[key]
    out["golden"] = {key: doc.get(key) for key in RUN_KEYS if key in doc}
    pin = doc.get("pin")
    if isinstance(pin, str) and pin.startswith("vllm=="):  # the pinned upstream version
        out["engine_version"] = pin[len("vllm==") :]
    return {k2: v for k2, v in out.items() if v is not None}


def _max_tokens(doc: dict) -> int | None:
    v = doc.get("max_tokens")
    return v if is_int(v, 1) else None


def _write_records(
    writer: TraceWriter, records: list, stats: GoldenStats, max_tokens: int | None, lines: JsonLines
) -> list[PlacedBlock]:
    """Place and write every record's blocks; returns every placed block."""
    assert stats.problems is not None
    placed_all: list[PlacedBlock] = []
    seen: dict[str, int] = {}  # request id -> its record
    for i, rec in enumerate(records):
        stats.records += 1
        ids = _record_ids(rec, i, stats.problems, lambda i=i: lines.line("records", i))
        nblocks = len(rec["blocks"]) if isinstance(rec, dict) and _is_list(rec, "blocks") else 0
        stats.blocks += nblocks
        if ids is None:
            stats.unplaced["invalid_record"] += nblocks
            continue
        prompt, output = ids
        req_id = _request_id(rec, i, seen, lines, stats.source)
        if req_id is None:
            where = functools.partial(lines.line, "records", i)
            what = "request id is not UTF-8 text"
            stats.problems.add("invalid_record", where, what, "request_id", rec.get("request_id"))
            stats.unplaced["invalid_record"] += nblocks
            continue
        reason = "length" if max_tokens and len(output) >= max_tokens else "stop"
        writer.request(req_id, prompt, output, str(rec.get("finish_reason") or reason))
        stats.requests += 1
        at = _block_lines(lines, i)
        placed = _place_record(rec, prompt + output, len(prompt), stats, at)
        _add_blocks(writer, req_id, rec["blocks"], placed, prompt + output)
        placed_all += placed
    return placed_all


def _request_id(
    rec: dict, i: int, seen: dict[str, int], lines: JsonLines, source: str
) -> str | None:
    """Record ``i``'s request id (``request_id``, else its index), None when it is not
    UTF-8 text (a lone surrogate escape); ``seen`` maps the ids so far to their records.

    Raises:
        InputError: the id is an earlier record's (the two would merge into one request,
            the later prompt and output replacing the earlier's).
    """
    req_id = str(rec.get("request_id", i))
    try:
        req_id.encode("utf-8")
    except UnicodeEncodeError:
        return None
    if req_id in seen:
        raise InputError(
            f"{source}:{lines.line('records', i)}: request id {req_id!r} of record {i} "
            f"is also record {seen[req_id]}'s (field=request_id): give each record its own"
        )
    seen[req_id] = i
    return req_id


def _is_list(rec: dict, key: str) -> bool:
    return isinstance(rec.get(key), list)


def _block_lines(lines: JsonLines, i: int):
    """Block index -> a function computing that block's line (for a problem)."""
    return lambda j: lambda: lines.line("records", i, "blocks", j)


def _record_ids(
    rec: object, i: int, problems: Problems, line
) -> tuple[list[int], list[int]] | None:
    """Record ``i``'s prompt and output ids, or None (an ``invalid_record`` problem; one
    that is no object is named by its index, its line being the document's)."""
    if not isinstance(rec, dict):
        problems.add("invalid_record", line, f"record {i} is not an object", "records", rec)
        return None
    for key in ("prompt_token_ids", "output_token_ids"):
        if id_list(rec.get(key)) is None:
            problems.add("invalid_record", line, "not a list of token ids", key, rec.get(key))
            return None
    if not _is_list(rec, "blocks"):
        problems.add("invalid_record", line, "no blocks list", "blocks", rec.get("blocks"))
        return None
    return rec["prompt_token_ids"], rec["output_token_ids"]


def _place_record(rec: dict, full: list[int], prompt_len: int, stats: GoldenStats, at) -> list:
    """Walk one record's blocks; the block that ends the walk is a problem, unless it is the
    request's final proposal past the end (``final_past_end``: expected) or unreadable
    (already one). ``at(j)`` is block j's line function."""
    assert stats.problems is not None
    blocks = rec["blocks"]
    readable = [_block(b, stats.problems, at(j)) for j, b in enumerate(blocks)]
    _check_call_order(blocks, stats.problems, at)
    walk = place(full, prompt_len, readable)
    stats.unplaced.update(walk.unplaced)
    if walk.ended_at is not None and walk.ended_at[1] in ("anchor_mismatch", "past_end"):
        i, reason = walk.ended_at
        blk = blocks[i]
        p = walk.placed[-1].position + walk.placed[-1].accepted + 1 if walk.placed else prompt_len
        what = {
            "anchor_mismatch": f"anchor is not the token at position {p} ({_at(full, p)}): "
            f"the walk ends",
            "past_end": f"position {p} is past the end of the output ({len(full)} tokens)",
        }[reason]
        stats.problems.add(reason, at(i), what, "anchor", blk.get("anchor"))
    stats.placed += len(walk.placed)
    stats.past_max_tokens += sum(b.past_end for b in walk.placed)
    stats.final += sum(b.final for b in walk.placed)
    return walk.placed


def _check_call_order(blocks: list, problems: Problems, at) -> None:
    """Blocks are kept in call order: a ``call`` not above the previous block's is a
    ``call_order`` problem (the walk still takes the blocks in file order)."""
    prev = None
    for j, b in enumerate(blocks):
        call = b.get("call") if isinstance(b, dict) else None
        if not is_int(call):
            continue
        if prev is not None and call <= prev:
            problems.add("call_order", at(j), f"call {call} after call {prev}", "call", call)
        prev = call


def _at(full: list[int], p: int) -> str:
    return str(full[p]) if 0 <= p < len(full) else "none"


def _block(b: object, problems: Problems, line) -> tuple[int, list[int]] | None:
    """``(anchor, drafts)`` of a readable block, else None (an ``invalid_block`` problem)."""
    if not isinstance(b, dict):
        problems.add("invalid_block", line, "a block is not an object", "blocks", b)
        return None
    if not is_int(b.get("anchor")):
        problems.add("invalid_block", line, "not a token id", "anchor", b.get("anchor"))
        return None
    drafts = id_list(b.get("drafts"))
    if drafts is None or len(drafts) > 2**15 - 1:
        problems.add("invalid_block", line, "not a list of token ids", "drafts", b.get("drafts"))
        return None
    return b["anchor"], drafts


def _add_blocks(
    writer: TraceWriter, req_id: str, blocks: list, placed: list[PlacedBlock], full: list[int]
) -> None:
    for pb in placed:
        blk = blocks[pb.index]
        call, row = blk.get("call"), blk.get("req_row")
        p, acc = pb.position, pb.accepted
        verdict: dict = {}  # a final proposal is unverified: no verdict columns
        if not pb.final:
            verdict = {"verified": pb.drafts, "accepted": acc, "emitted": full[p + 1 : p + acc + 2]}
        writer.add_block(
            req_id,
            call if is_int(call) else 0,
            p,
            pb.anchor,
            pb.drafts,
            **verdict,
            t_ns=0,
            batch_row=row if is_int(row, 0, 2**15 - 1) else schema.PAD,
            proposal_source=schema.PROPOSAL_FROM_DRAFTER,
        )


__all__ = ["GOLDEN_COUNTERS", "GoldenStats", "import_golden"]
