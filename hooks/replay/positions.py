"""The reference sequences of a replay and the positions chosen in them.

A position is the anchor's absolute index in prompt + output (tokens), as in every trace;
replayable positions run from the first output token to the second-to-last token of the
sequence (teacher-forced acceptance needs at least the next reference token).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spectrace.tracer.cli.output import say
from spectrace.tracer.errors import InputError
from spectrace.tracer.findings.capture import incomplete_reasons
from spectrace.tracer.store import Trace, open_trace

#: ``--positions`` words (or an integer N: N positions per request, evenly spaced).
POSITION_MODES = ("all", "blocks")


@dataclass(frozen=True)
class Reference:
    """One reference request: its id and token ids (int)."""

    req_id: str
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    finish_reason: str = "length"

    @property
    def sequence(self) -> tuple[int, ...]:
        """Prompt + output ids: the text every replayed prefix is cut from."""
        return self.prompt_ids + self.output_ids


@dataclass(frozen=True)
class Site:
    """One replayed (request, position): the prompt is ``sequence[:position]``.

    Attributes:
        request: index into the reference list; ``position``: the anchor's index (tokens).
        ident: the request id given to the engine (``"<n>"``, the site's index as a string).
    """

    request: int
    position: int
    ident: str


def read_references(path: str | os.PathLike) -> tuple[list[Reference], Trace | None]:
    """The reference requests of a trace (``.h5``) or a requests JSONL (``{"req_id" or
    "id", "prompt_ids", "output_ids"}`` per line). Returns them with the trace (None for JSONL).

    Raises:
        InputError: unreadable input, or a request without prompt or output ids.
    """
    p = Path(path)
    if p.suffix == ".jsonl":
        return _read_jsonl(p), None
    t = open_trace(p)
    r = t.requests
    refs = [
        Reference(
            str(r.req_id[i]),
            tuple(int(x) for x in r.prompt_ids[i]),
            tuple(int(x) for x in r.output_ids[i]),
            str(r.finish_reason[i]) or "length",
        )
        for i in range(len(r))
    ]
    for ref in refs:
        if not ref.prompt_ids or not ref.output_ids:
            raise InputError(
                f"{p}: request {ref.req_id} has no prompt or output ids: nothing to replay"
            )
    again = _repeated([ref.req_id for ref in refs])
    if again is not None:  # ranks that number their requests each from 0: ids repeat
        raise InputError(
            f"{p}: request id {refs[again].req_id!r} is on two of its files (data-parallel "
            f"ranks that reuse request ids): a replay names each request once; replay one "
            f"rank's file at a time"
        )
    why = incomplete_reasons(t)
    if why:  # the replay covers what it recorded only: say so, never silently
        say(
            f"warning: {p}: the reference's capture is missing work ({'; '.join(why)}): "
            f"only the sequences it recorded are replayed"
        )
    return refs, t


def _read_jsonl(p: Path) -> list[Reference]:
    refs: list[Reference] = []
    try:
        lines = p.read_text().splitlines()
    except OSError as exc:
        raise InputError(f"{p}: cannot read ({exc.strerror or exc})") from None
    seen: dict[str, int] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise InputError(f"{p}:{n}: not JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise InputError(f"{p}:{n}: not a request object ({type(obj).__name__})")
        if "prompt_ids" not in obj or "output_ids" not in obj:
            raise InputError(f"{p}:{n}: not a request with prompt_ids and output_ids")
        given = obj.get("req_id", obj.get("id"))
        rid = str(len(refs) if given is None else given)
        prompt, output = _token_ids(p, n, obj, "prompt_ids"), _token_ids(p, n, obj, "output_ids")
        if rid in seen:
            raise InputError(f"{p}:{n}: request id {rid!r} given twice (first on line {seen[rid]})")
        seen[rid] = n
        if not prompt or not output:
            raise InputError(f"{p}:{n}: request {rid} has empty prompt or output ids")
        if min(prompt + output) < 0:
            raise InputError(f"{p}:{n}: request {rid} has a negative token id")
        refs.append(Reference(rid, prompt, output, str(obj.get("finish_reason") or "length")))
    if not refs:
        raise InputError(f"{p}: no requests")
    return refs


def _token_ids(p: Path, n: int, obj: dict, field: str) -> tuple[int, ...]:
    """``obj[field]`` as token ids: a list of JSON integers (never a float or a bool, which
    ``int()`` would truncate into another token).

    Raises:
        InputError: ``FILE:LINE: ...`` naming the field.
    """
    v = obj[field]
    if not isinstance(v, list) or not all(type(x) is int for x in v):
        bad = v if not isinstance(v, list) else next(x for x in v if type(x) is not int)
        raise InputError(f"{p}:{n}: {field} is not a list of integer token ids ({bad!r})")
    return tuple(v)


def _repeated(ids: list[str]) -> int | None:
    """The index of the first id seen before in ``ids``, or None."""
    seen: set[str] = set()
    for i, x in enumerate(ids):
        if x in seen:
            return i
        seen.add(x)
    return None


def select_requests(refs: list[Reference], ids: Sequence[str] | None) -> list[Reference]:
    """The references named in ``ids`` (all when None), in reference order.

    Raises:
        InputError: an id that is not a reference request.
    """
    if not ids:
        return refs
    known = {r.req_id for r in refs}
    missing = [i for i in ids if i not in known]
    if missing:
        raise InputError(f"--requests: no request {missing[0]!r} (known: {', '.join(known)})")
    return [r for r in refs if r.req_id in set(ids)]


def replayable(ref: Reference) -> range:
    """Positions of ``ref`` that can be replayed: first output token .. second-to-last."""
    return range(len(ref.prompt_ids), len(ref.sequence) - 1)


def parse_positions(value: str) -> str | int:
    """``--positions`` value: ``all``, ``blocks`` or an integer N >= 1 (ValueError else)."""
    if value in POSITION_MODES:
        return value
    n = int(value)
    if n < 1:
        raise ValueError("N must be >= 1")
    return n


def choose_sites(
    refs: list[Reference], mode: str | int, traces: Sequence[Trace] = ()
) -> list[Site]:
    """The sites to replay, by request then position.

    Args:
        refs: the reference requests.
        mode: ``all`` (every replayable position), ``blocks`` (positions where one of
            ``traces`` drafted, requests matched by prompt ids), or N (N positions per
            request, evenly spaced over the replayable ones, first and last included).
        traces: the natural traces whose block positions ``blocks`` takes.
    """
    drafted = _drafted_positions(traces) if mode == "blocks" else {}
    sites: list[Site] = []
    for i, ref in enumerate(refs):
        span = replayable(ref)
        if mode == "all":
            chosen = list(span)
        elif mode == "blocks":
            chosen = sorted(p for p in drafted.get(ref.prompt_ids, set()) if p in span)
        else:
            picks = np.linspace(span.start, span.stop - 1, num=min(int(mode), len(span)))
            chosen = sorted({int(round(x)) for x in picks}) if len(span) else []
        sites += [Site(i, p, "") for p in chosen]
    return [Site(s.request, s.position, str(n)) for n, s in enumerate(sites)]


def _drafted_positions(traces: Sequence[Trace]) -> dict[tuple[int, ...], set[int]]:
    """prompt ids -> anchor positions drafted from in any of ``traces``."""
    out: dict[tuple[int, ...], set[int]] = {}
    for t in traces:
        req, pos = t.blocks.request, t.blocks.position
        for i in range(len(t.requests)):
            key = tuple(int(x) for x in t.requests.prompt_ids[i])
            out.setdefault(key, set()).update(int(p) for p in pos[req == i])
    return out
