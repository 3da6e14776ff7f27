"""capture_incomplete: how a capture or an import ended and what its log lost, from /meta
and from what the blocks themselves show missing.

A comparison of the blocks that exist cannot see a killed engine, lines an import dropped,
lines that contradict each other or blocks removed from a request's middle. This detector
reads a side's /meta (the capture's end, the engine's counters check, the recorder's block
count, the VT import's statistics: hooks/vt/stats.py ``ImportStats``), the emptiness of the
trace and, for a drafter that drafts every step, the gaps in each request's anchor chain
(:attr:`~.data.TraceData.chain_gaps`); it returns at most one error finding.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import schema
from ..align import drafts_configured, is_replay
from ..fmt import counted
from ..store import Trace
from .data import SideInput, TraceData
from .evidence import CaptureEvidence
from .ksize import drafter_name, drafts_every_step
from .model import Finding
from .work import work_complete


def _int_or_none(v) -> int | None:
    return int(v) if isinstance(v, int | np.integer) and not isinstance(v, bool) else None


def capture_end(meta: dict, status: str = schema.STATUS_COMPLETE) -> CaptureEvidence:
    """How a capture ended, from /meta and the file status: the ``capture`` object
    (``ended``, ``exit_status``, ``signal``) when present, else the older items
    ``exit_status``, ``killed_by_signal``, ``interrupted`` and ``aborted`` (hooks/capture.py);
    ``ended`` as :func:`spectrace.tracer.schema.capture_end` reads it. A file that was never
    closed (status ``recording``) ended ``capture-killed`` whoever wrote it (capture, import,
    the vLLM plugin): its writer was killed, or is still recording. Missing items are null."""
    cap = meta["capture"] if isinstance(meta.get("capture"), dict) else {}
    end = schema.capture_end(meta, status) or {}
    ended = end.get("ended") if isinstance(end.get("ended"), str) else None
    if ended is None and status == schema.STATUS_RECORDING:
        ended = "capture-killed"
    aborted = meta.get("aborted")
    checks = meta["checks"] if isinstance(meta.get("checks"), dict) else {}
    bad = checks.get("mismatch") if checks.get("status") == "mismatch" else None
    if checks.get("status") == "mismatch" and not (isinstance(bad, list) and bad):
        bad = ["counters not named"]  # a mismatch whatever lists it (or not)
    dropped, first = import_dropped(meta)
    breaks, first_break = import_chain_breaks(meta)
    broken, first_broken = import_violations(meta)
    return CaptureEvidence(
        ended=ended,
        exit_status=_int_or_none(cap.get("exit_status", meta.get("exit_status"))),
        signal=_int_or_none(cap.get("signal", meta.get("killed_by_signal"))),
        interrupted=bool(meta.get("interrupted")) or cap.get("ended") == "interrupted",
        aborted=str(aborted) if aborted else None,
        counters_mismatch=[str(x) for x in bad] if isinstance(bad, list) else [],
        checks_pending=checks.get("status") == "pending" and status == schema.STATUS_COMPLETE,
        empty=False,
        dropped_lines=dropped,
        first_dropped=first,
        chain_breaks=breaks,
        first_chain_break=first_break,
        violations=broken,
        first_violation=first_broken,
        recorded_blocks=None,
        chain_gaps=0,
        first_chain_gap=None,
        head_gaps=0,
        first_head_gap=None,
        tail_gaps=0,
        first_tail_gap=None,
        undrafted_requests=0,
        first_undrafted=None,
        missing_ranks=[],
    )


def trace_capture_end(t: Trace) -> CaptureEvidence:
    """:func:`capture_end` of every file of ``t`` (the DP ranks of one run; rank 0 first),
    merged: a rank whose capture failed, whose counters disagree or whose import lost lines
    fails the whole trace (rank 0's /meta alone spoke for the run, and a dead rank 1 read
    as clean)."""
    files = sorted(zip(t.metas, t.paths), key=lambda mp: _int_or_none(mp[0].get("dp_rank")) or 0)
    if len(files) < 2:
        return capture_end(t.meta, t.status)
    ev = capture_end(files[0][0], t.status)
    for m, path in files[1:]:
        ev = _merged(ev, capture_end(m, t.status), Path(path).name)
    given = [_int_or_none(m.get("dp_rank")) for m in t.metas]
    ranks = {r for r in given if r is not None}
    if len(ranks) == len(given):  # ranked files (the reader refuses a mix): every rank
        ev["missing_ranks"] = sorted(set(range(max(ranks) + 1)) - ranks)
    return ev


def _merged(a: CaptureEvidence, b: CaptureEvidence, file_b: str) -> CaptureEvidence:
    """Two files' :func:`capture_end`: ``a``'s, with what only ``b`` (of file ``file_b``,
    named in its texts) says added: the first failure of each kind, counts summed, counter
    names joined."""
    if b["aborted"]:
        b["aborted"] = f"{file_b}: {b['aborted']}"
    b["counters_mismatch"] = [f"{x} of {file_b}" for x in b["counters_mismatch"]]
    out = a.copy()
    if a["ended"] in (None, "clean"):
        out["ended"] = b["ended"] if b["ended"] is not None else a["ended"]
    out["exit_status"] = a["exit_status"] or b["exit_status"]
    out["signal"] = a["signal"] or b["signal"]
    out["aborted"] = a["aborted"] or b["aborted"]
    out["first_dropped"] = a["first_dropped"] or b["first_dropped"]
    out["first_chain_break"] = a["first_chain_break"] or b["first_chain_break"]
    out["first_violation"] = a["first_violation"] or b["first_violation"]
    out["interrupted"] = a["interrupted"] or b["interrupted"]
    out["checks_pending"] = a["checks_pending"] or b["checks_pending"]
    more = [x for x in b["counters_mismatch"] if x not in a["counters_mismatch"]]
    out["counters_mismatch"] = a["counters_mismatch"] + more
    out["dropped_lines"] = a["dropped_lines"] + b["dropped_lines"]
    out["chain_breaks"] = a["chain_breaks"] + b["chain_breaks"]
    v = dict(a["violations"])
    for kind, n in b["violations"].items():
        v[kind] = v.get(kind, 0) + n
    out["violations"] = v
    return out


def _dict(d: dict, key: str) -> dict:
    """``d[key]`` when it is a dict, else ``{}`` (a /meta item of unknown shape)."""
    v = d.get(key)
    return v if isinstance(v, dict) else {}


def import_dropped(meta: dict) -> tuple[int, str | None]:
    """``(dropped lines, the first as FILE:LINE: what or None)``: the trace lines a VT
    import lost, from /meta ``import`` (hooks/vt/stats.py ImportStats): malformed lines
    (unreadable or out-of-range values) and, for a drafter that drafts every step, chain
    gaps; the first from the import's examples. A file importer's lost steps (``import``
    ``lost``: llama-dump lines that are no step, steps no request holds) count too.
    ``(0, None)`` without an import."""
    imp = _dict(meta, "import")
    kinds = {"malformed": _int_or_none(imp.get("malformed")) or 0}
    if drafts_every_step(meta):
        kinds["chain gap"] = _int_or_none(imp.get("chain_gaps")) or 0
    first = _first_example(imp, kinds)
    lost = _dict(imp, "lost")  # hooks/importers/llama_dump.py DumpStats.lost
    n_lost = _int_or_none(lost.get("count")) or 0
    if n_lost and first is None and isinstance(lost.get("first"), str):
        first = lost["first"]
    return sum(kinds.values()) + n_lost, first


def import_chain_breaks(meta: dict) -> tuple[int, str | None]:
    """``(chain breaks, the first as FILE:LINE: what or None)`` of a VT import (/meta
    ``import`` violations, hooks/vt/blocks.py chain_break): blocks at a position their
    request had passed, which no run prints (``--strict`` refuses them). ``(0, None)``
    without an import."""
    imp = _dict(meta, "import")
    kinds = {"chain break": _int_or_none(_dict(imp, "violations").get("chain break")) or 0}
    return kinds["chain break"], _first_example(imp, kinds)


#: Broken invariants that another finding names block by block: chain breaks (above) and
#: the acceptance counts (``acceptance_bookkeeping`` flags every block whose recorded
#: accepted count disagrees with its emitted tokens).
_NAMED_ELSEWHERE = frozenset({"chain break", "acc != ns-1", "emit != draft", "acc > k"})


def import_violations(meta: dict) -> tuple[dict[str, int], str | None]:
    """``({kind: count}, the first as FILE:LINE: what or None)``: the invariants a lenient
    VT import found broken (/meta ``import`` violations; hooks/vt/blocks.py
    ``block_problems`` and the anchor check) that no other finding names:
    ``len(emit) != ns``, ``len(draft) != k``, ``drafts/row``, ``anchor mismatch`` with the
    requests file. A healthy engine's lines never break them (``--strict`` refuses each):
    the lines contradict each other or the requests file. ``({}, None)`` without an import."""
    imp = _dict(meta, "import")
    kinds = {
        str(k): n
        for k, v in _dict(imp, "violations").items()
        if k not in _NAMED_ELSEWHERE and (n := _int_or_none(v) or 0) > 0
    }
    return kinds, _first_example(imp, kinds)


#: The import's counts of lines whose accepted count disagrees with their own emitted ids:
#: ``acceptance_bookkeeping`` names them (a trace without outputs keeps no other trace of an
#: ``emit != draft`` line: its emitted ids are checked by no detector).
BOOKKEEPING_LINES = ("acc != ns-1", "emit != draft")


def import_bookkeeping(t: Trace) -> tuple[dict[str, int], str | None]:
    """``({kind: lines}, the first as FILE:LINE: what or None)``: the :data:`BOOKKEEPING_LINES`
    that the VT imports of ``t``'s files counted (summed over its files; ``({}, None)``
    when none)."""
    kinds: dict[str, int] = {}
    first = None
    for meta in t.metas:
        imp = _dict(meta, "import")
        found = {
            k: n
            for k in BOOKKEEPING_LINES
            if (n := _int_or_none(_dict(imp, "violations").get(k)) or 0) > 0
        }
        for k, n in found.items():
            kinds[k] = kinds.get(k, 0) + n
        first = first or _first_example(imp, found)
    return kinds, first


def _first_example(imp: dict, kinds: dict[str, int]) -> str | None:
    """The earliest example line of the import's ``kinds`` that occurred, as FILE:LINE: what."""
    examples = _dict(imp, "examples")
    firsts = [
        ex[0]
        for k, n in kinds.items()
        if n and isinstance(ex := examples.get(k), list) and ex and isinstance(ex[0], list)
    ]
    first = min(firsts, key=lambda e: e[0], default=None)
    return f"{imp.get('source', '?')}:{first[0]}: {first[1]}" if first else None


def _how(ev: CaptureEvidence) -> list[str]:
    """What went wrong with a capture, in words (empty: it ended cleanly or nothing says)."""
    out = []
    if ev["ended"] == "capture-killed":
        out.append("the trace file was never closed: its writer was killed or is still recording")
    elif ev["ended"] not in (None, "clean"):
        out.append(f"ended {ev['ended']}")
    if ev["signal"]:
        out.append(f"the engine was killed by signal {ev['signal']}")
    elif ev["exit_status"]:
        out.append(f"the engine exited with status {ev['exit_status']}")
    if ev["interrupted"] and "ended interrupted" not in out:
        out.append("the capture was interrupted")
    if ev["aborted"]:
        out.append(f"the capture aborted ({ev['aborted']})")
    out += _counters_how(ev)
    if ev["checks_pending"]:
        out.append(
            "the recorder's close stopped before it flushed and cross-checked the blocks "
            "(/meta checks still pending)"
        )
    return out


#: /meta ``source`` of a file importer -> what its lost work is, in its own words (a VT
#: import's are trace lines).
_LOST_WORDS = {
    "golden": ("the golden lost", "block", "not placed: a damaged record or block, or a walk "
               "that ended on an anchor the output contradicts"),
    "llama-spec-dump": ("the dump lost", "step", "a line that is no step, a step no request "
                        "holds, or placed off its output after a lost one"),
}  # fmt: skip
_LOG_WORDS = ("the log lost", "trace line", "dropped as malformed or unplaceable, placed off "
              "its output after a lost step, or a chain gap")  # fmt: skip


def _counters_how(ev: CaptureEvidence) -> list[str]:
    """The counters' disagreement, in words (empty: they agree or were not compared)."""
    if not ev["counters_mismatch"]:
        return []
    names = ", ".join(ev["counters_mismatch"])
    return [f"the trace's totals differ from the engine's own counters ({names})"]


def _log_how(ev: CaptureEvidence, source: object = None) -> list[str]:
    """What is wrong with an imported log's trace lines (a golden's blocks, a dump's steps:
    ``source``, the /meta ``source``), in words (empty: nothing)."""
    out = []
    if ev["dropped_lines"]:
        first = f"; first: {ev['first_dropped']}" if ev["first_dropped"] else ""
        lead, unit, why = (
            _LOST_WORDS.get(source, _LOG_WORDS) if isinstance(source, str) else _LOG_WORDS
        )
        out.append(f"{lead} {counted(ev['dropped_lines'], unit)} ({why}){first}")
    if ev["chain_breaks"]:
        first = f"; first: {ev['first_chain_break']}" if ev["first_chain_break"] else ""
        out.append(
            f"the log has {counted(ev['chain_breaks'], 'block')} at a position its request had "
            f"passed (a repeated or reordered trace line, or a reused request id){first}"
        )
    if ev["violations"]:
        kinds = ", ".join(f"{n} {k}" for k, n in ev["violations"].items())
        first = f"; first: {ev['first_violation']}" if ev["first_violation"] else ""
        out.append(
            f"the log breaks the engine's invariants ({kinds}: its lines contradict each "
            f"other or the requests file){first}"
        )
    return out


def _recorded_blocks(t: Trace) -> int | None:
    """The blocks the vLLM hook's recorder counted at close (/meta ``checks`` ``trace``
    ``blocks``, hooks/vllm/crosscheck.py ``file_totals``), summed over a trace's files;
    None when a file says nothing."""
    total = 0
    for m in t.metas:
        n = _int_or_none(_dict(_dict(m, "checks"), "trace").get("blocks"))
        if n is None:
            return None
        total += n
    return total


def _block_evidence(s: SideInput, ev: CaptureEvidence) -> None:
    """Fill ``ev``'s block-level items: the recorder's block count and, for a model drafter
    (it drafts at every step), the requests it served without a block, the requests whose
    output goes on past their last block and the gaps in the anchor chain (steps it drafted
    with no block in the trace; an import's own count stands for a VT log)."""
    td = s.td
    t, b = td.t, td.t.blocks
    ev["recorded_blocks"] = _recorded_blocks(t)
    model = drafts_configured(t) and drafts_every_step(t.meta)
    if not model or is_replay(t):
        return
    _undrafted(td, ev)
    if not len(b):
        return
    # A VT log whose drafts were not installed at some steps says the engine decoded plain
    # tokens there (unverified_drafts names them): a request's end without blocks is no loss.
    # Per file: one rank's uninstalled drafts say nothing of another rank's requests.
    plain = [
        bool(_int_or_none(_dict(_dict(m, "import"), "joins").get("not_installed"))) for m in t.metas
    ]
    if not all(plain):
        skip = np.flatnonzero(plain)
        _head_evidence(td, ev, skip)
        _tail_evidence(td, ev, skip)
    if "chain_gaps" in _dict(t.meta, "import"):
        return  # the VT import counted its own gaps (dropped_lines)
    rows, expected = td.chain_gaps
    ev["chain_gaps"] = len(rows)
    if len(rows):
        r, p = int(rows[0]), int(td.prev[rows[0]])
        ev["first_chain_gap"] = (
            f"request {td.req_id(r)}: the block at position {int(b.position[p])} accepted "
            f"{int(b.accepted[p])}, the next drafts from position {int(b.position[r])}, not "
            f"{int(expected[0])}"
        )


def _undrafted(td: TraceData, ev: CaptureEvidence) -> None:
    """Requests with 2 or more output tokens and no block: the first output token comes
    from the prefill, the second from a step verifying drafts made from the first."""
    t = td.t
    served = np.bincount(t.blocks.request[t.blocks.request >= 0], minlength=len(td.length))
    # td.length: prompt + output tokens, 0 where the output is unknown
    emitted = td.length - td.prompt_lengths
    none = np.flatnonzero((td.length > 0) & (emitted >= 2) & (served[: len(td.length)] == 0))
    ev["undrafted_requests"] = len(none)
    if len(none):
        ev["first_undrafted"] = t.requests.req_id[int(none[0])]


def _kept(
    td: TraceData, gaps: tuple[np.ndarray, np.ndarray], skip_files: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``gaps`` (block rows, a value per row) without the rows whose request is of one of
    ``skip_files`` (indexes into ``td.t.metas``)."""
    rows, values = gaps
    if not len(skip_files):
        return rows, values
    keep = ~np.isin(td.t.requests.file[td.t.blocks.request[rows]], skip_files)
    return rows[keep], values[keep]


def _head_evidence(td: TraceData, ev: CaptureEvidence, skip_files: np.ndarray) -> None:
    """Fill ``ev``'s head gaps (requests of ``skip_files`` left out, as for the tail)."""
    rows, start = _kept(td, td.head_gaps, skip_files)
    ev["head_gaps"] = len(rows)
    if len(rows):
        r = int(rows[0])
        ev["first_head_gap"] = (
            f"request {td.req_id(r)}: its first block drafts from position "
            f"{int(td.t.blocks.position[r])}; its first output token is at position "
            f"{int(start[0])}"
        )


def _tail_evidence(td: TraceData, ev: CaptureEvidence, skip_files: np.ndarray) -> None:
    """Fill ``ev``'s tail gaps, leaving out the requests of files ``skip_files`` (indexes
    into ``td.t.metas``: VT imports that decoded plain tokens where drafts went uninstalled)."""
    rows, reach = _kept(td, td.tail_gaps, skip_files)
    ev["tail_gaps"] = len(rows)
    if len(rows):
        r = int(rows[0])
        end = int(td.length[int(td.t.blocks.request[r])]) - 1
        ev["first_tail_gap"] = (
            f"request {td.req_id(r)}: its last block, at position "
            f"{int(td.t.blocks.position[r])}, reaches position {int(reach[0])}; its output "
            f"goes on to position {end}"
        )


def _blocks_how(ev: CaptureEvidence, held: int, drafter: str) -> list[str]:
    """What the blocks themselves show missing, in words (empty: nothing)."""
    out = []
    if ev["missing_ranks"]:
        miss = ", ".join(map(str, ev["missing_ranks"]))
        out.append(
            f"no file of the data-parallel run's rank {miss}: its requests and blocks are missing"
        )
    rec = ev["recorded_blocks"]
    if rec is not None and rec != held:
        out.append(
            f"the trace holds {counted(held, 'block')} where its recorder counted {rec} at "
            f"close (/meta checks.trace.blocks): blocks were lost or added since"
        )
    if ev["chain_gaps"]:
        out.append(
            f"{counted(ev['chain_gaps'], 'gap')} in the anchor chain although its {drafter} "
            f"drafts at every step (first: {ev['first_chain_gap']}): the blocks "
            f"between are missing"
        )
    if ev["head_gaps"]:
        out.append(
            f"{counted(ev['head_gaps'], 'request')} whose first block drafts past its first "
            f"output token although its {drafter} drafts at every step (first: "
            f"{ev['first_head_gap']}): the blocks at the start are missing"
        )
    if ev["tail_gaps"]:
        out.append(
            f"{counted(ev['tail_gaps'], 'request')} whose output goes on past its last block "
            f"although its {drafter} drafts at every step (first: {ev['first_tail_gap']}): "
            f"the blocks at the end are missing"
        )
    if ev["undrafted_requests"] and not held:
        out.append(
            f"no block although its {drafter} drafts at every step and "
            f"{counted(ev['undrafted_requests'], 'request')} emitted 2 or more tokens"
        )
    elif ev["undrafted_requests"]:
        n = ev["undrafted_requests"]
        out.append(
            f"{counted(n, 'request')} emitted 2 or more tokens without a block although its "
            f"{drafter} drafts at every step (first: request {ev['first_undrafted']}): "
            f"{'its blocks are' if n == 1 else 'their blocks are'} missing"
        )
    return out


def incomplete_reasons(t: Trace) -> list[str]:
    """Why trace ``t``'s capture or import is missing work, in words, from its files' /meta
    and status alone (what ``capture_incomplete`` says, but for an empty trace); empty when
    it ended cleanly or nothing says (e.g. for a replay's reference)."""
    ev = trace_capture_end(t)
    return _how(ev) + _log_how(ev, t.meta.get("source"))


_AFTER_WORK = ("every request finished and the trace equals the engine's counters: the engine "
               "was stopped after its work (a hung shutdown?), not during it")  # fmt: skip
_BEFORE_END = "requests and blocks after that point are missing, agreement of the rest proves nothing"  # fmt: skip  # noqa: E501


def capture(s: SideInput) -> Finding | None:
    """capture_incomplete: the capture did not end cleanly (:func:`_how`: exit status,
    signal, interrupted, aborted, counters that disagree or were never checked), an import
    lost lines or broke invariants (:func:`_log_how`), the blocks show work missing
    (:func:`_block_evidence`: block count, chain gaps, missing ranks...), or the trace
    holds nothing at all (no block, no request; whoever wrote it)."""
    td = s.td
    ev = trace_capture_end(td.t)
    # No block and no request: whatever wrote the trace (a capture, an import, the plugin
    # or the API) recorded no work, and a verdict on nothing would read as agreement.
    ev["empty"] = len(td.t.blocks) == 0 and len(td.t.requests) == 0
    _block_evidence(s, ev)
    how, log = _how(ev), _log_how(ev, td.t.meta.get("source"))
    blk = _blocks_how(ev, len(td.t.blocks), drafter_name(td.t.meta))
    if how and how == _counters_how(ev):
        # the totals alone: the run ended cleanly, blocks it counted are missing anywhere
        message = (
            f"{td.side}: {'; '.join(how + log + blk)}: blocks the engine counted are missing "
            f"from the trace, agreement of the rest proves nothing"
        )
    elif how:
        done = not log and not blk and work_complete(td.t)  # stopped in its shutdown
        message = f"{td.side}: the capture did not end cleanly ({'; '.join(how + log + blk)}): "
        message += _AFTER_WORK if done else _BEFORE_END
    elif log:
        what = (
            "missing from the trace"
            if ev["dropped_lines"]
            else "not one run's record"
            if ev["chain_breaks"]
            else "not a consistent record"
        )
        message = (
            f"{td.side}: {'; '.join(log + blk)}: the blocks on those lines are {what}, agreement "
            f"of the rest proves nothing"
        )
    elif blk:
        message = f"{td.side}: {'; '.join(blk)}: agreement of the rest proves nothing"
    elif ev["empty"]:
        message = (
            f"{td.side}: the trace recorded nothing: no draft block and no request reached "
            f"it (did the engine run with drafts, under the capture or the plugin?)"
        )
    else:
        return None
    return Finding("capture_incomplete", "error", side=td.side, message=message, evidence=ev)
