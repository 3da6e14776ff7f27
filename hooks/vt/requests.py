"""The requests JSONL file a ``VT_SPEC_TRACE`` run writes: prompt and output ids per request
(they resolve the anchors the log leaves unknown, and fill /requests)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from spectrace.tracer.errors import InputError

#: Token ids are int32 in the trace (/requests prompt_ids, output_ids): never clamped.
_ID_RANGE = (0, 2**31 - 1)


@dataclass
class RequestRecord:
    """One request of a requests JSONL file (ids are token ids, int)."""

    req_id: str
    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str = ""

    @property
    def full(self) -> list[int]:
        """Prompt + output ids: absolute positions index this list."""
        return self.prompt_ids + self.output_ids


#: ``finish_reason`` of a request the log shows running but never finishing.
UNFINISHED = "unfinished"


def mark_unfinished(
    writer, done: dict[str, bool], drafted: set[str], requests: dict[str, RequestRecord] | None
) -> list[str]:
    """Give finish reason :data:`UNFINISHED` to the requests whose ``[spec-update] req=``
    lines never said ``finished=1`` (the log ends before they did: a killed or cut-short
    run), unless the requests file gives one; only requests the trace holds (with blocks,
    ``drafted``, or in the requests file).

    Args:
        writer: the import's :class:`~spectrace.tracer.store.TraceWriter`.
        done: request id -> whether one of its update lines said ``finished=1`` (requests
            without update lines are absent: the log's trace level does not print them).
    Returns:
        The request ids marked, in ``done``'s order.
    """
    requests = requests or {}
    given = {r for r, rec in requests.items() if rec.finish_reason}
    held = drafted | requests.keys()
    out = [r for r, fin in done.items() if not fin and r in held and r not in given]
    for r in out:
        writer.request(r, finish_reason=UNFINISHED)
    return out


#: The import violation of :func:`note_cut_before_finish`.
CUT_BEFORE_FINISH = "ends before finished=1"


def note_cut_before_finish(
    stats, done: dict[str, bool], requests: dict[str, RequestRecord] | None, lineno: int
) -> str | None:
    """Count, as the import violation :data:`CUT_BEFORE_FINISH`, the requests the requests
    file gives a finish reason for whose ``[spec-update] req=`` lines never said
    ``finished=1``: the engine finished them and the log ended first (a copy cut short, a
    log that lost its tail), so their last blocks are missing (``capture_incomplete``; the
    finish reason stays the file's). A log without update lines says nothing about
    finishing (``done`` is empty).

    Args:
        stats: the import's :class:`~.stats.ImportStats` (``violations``, ``note``).
        done: request id -> whether one of its update lines said ``finished=1``.
        requests: the requests file's records (None: no file).
        lineno: the log's last line number (the example's line).
    Returns:
        The violation as strict mode's one-line error (``LOG:LINE: ...``), None when no
        request was cut.
    """
    given = {r for r, rec in (requests or {}).items() if rec.finish_reason}
    cut = [r for r, fin in done.items() if not fin and r in given]
    if not cut:
        return None
    msg = (
        f"{CUT_BEFORE_FINISH}: the log ends before {len(cut)} request(s) that the requests "
        f"file says finished printed finished=1 (first: req={cut[0]}): their last blocks "
        f"are missing"
    )
    stats.violations[CUT_BEFORE_FINISH] += len(cut)
    stats.note(CUT_BEFORE_FINISH, lineno, msg)
    return f"{stats.source}:{lineno}: {msg}"


def read_requests(path: str | os.PathLike) -> dict[str, RequestRecord]:
    """Read a requests JSONL file: one ``{"req_id", "prompt_ids", "output_ids",
    "finish_reason"}`` object per line (blank lines skipped; ``finish_reason`` optional).

    Returns:
        req_id (str) -> :class:`RequestRecord`, in file order.
    Raises:
        InputError: missing file, or ``FILE:LINE: what`` for a bad line (a ``req_id`` given
            twice is one: which line would hold the request's ids is unknown).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such requests file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read requests file ({exc})") from None
    out: dict[str, RequestRecord] = {}
    first: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            rec = _request_from_json(line, f"{path}:{n}")
            if rec.req_id in first:
                raise InputError(
                    f"{path}:{n}: req_id {rec.req_id!r} given twice (first at line "
                    f"{first[rec.req_id]})"
                )
            out[rec.req_id], first[rec.req_id] = rec, n
    return out


def _request_from_json(line: str, where: str) -> RequestRecord:
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise InputError(f"{where}: not JSON ({exc})") from None
    if not isinstance(obj, dict) or "req_id" not in obj:
        raise InputError(f"{where}: expected an object with req_id, prompt_ids, output_ids")
    ids = {key: _token_ids(obj, key, where) for key in ("prompt_ids", "output_ids")}
    if not isinstance(obj.get("finish_reason"), str | None):
        got = json.dumps(obj["finish_reason"])
        raise InputError(
            f"{where}: finish_reason must be a string (field=finish_reason, value={got})"
        )
    req_id, reason = str(obj["req_id"]), str(obj.get("finish_reason") or "")
    for key, text in (("req_id", req_id), ("finish_reason", reason)):
        if "\x00" in text:
            raise InputError(f"{where}: {key} holds a NUL character (field={key}, value={text!r})")
    return RequestRecord(req_id, ids["prompt_ids"], ids["output_ids"], reason)


def _token_ids(obj: dict, key: str, where: str) -> list[int]:
    """``obj[key]`` checked: a list of int token ids within int32 (InputError otherwise)."""
    v = obj.get(key, [])
    if not isinstance(v, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in v
    ):
        raise InputError(f"{where}: {key} must be a list of integer token ids (field={key})")
    lo, hi = _ID_RANGE
    bad = next((t for t in v if not lo <= t <= hi), None)
    if bad is not None:
        raise InputError(
            f"{where}: {key} holds a token id out of range [{lo}, {hi}] (field={key}, value={bad})"
        )
    return v
