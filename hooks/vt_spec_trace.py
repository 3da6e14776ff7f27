"""Streaming parser of our engine's ``VT_SPEC_TRACE`` stderr lines into a spectrace trace.

Mirrors the line formats of ``shared/reference/vt_spec_trace.md`` (vllm.cpp ``runner.cpp``,
``scheduler.cpp``, ``core.cpp``, ``qwen3_dflash.cpp``, DSpark ``speculator.cpp``): every family
is matched on its tag and read **by field name**. Lenient mode (the default) also reads lines
edited by hand in documents (tag dropped, double spaces, ``...`` ellipses, other ``[ ]``
spacing) and counts them; strict mode requires the engine's exact format and raises
:class:`ParseError` (``FILE:LINE: what``) on the first deviation, malformed line or broken
invariant. Lines that are not trace lines pass through untouched (``feed_line`` returns False).

Rules this parser decides (the format leaves them open):

* **Engine steps.** Only runner and engine-core lines delimit steps, because under async
  scheduling the scheduler's ``[spec-sched]`` lines of step t+1 can print before the runner
  lines of step t. Within a step the order is verify (``[SPECTRACE]``) → phases (``[fwd-ops]``,
  ``[spec-phase-dev]``, ``[spec-phase]``) → ``[spec-propose]`` → post (``[spec-post_step]``,
  ``[spec-update]``, ``[spec-install]``, sync only). A line starts a new step when it cannot
  belong to the current one: a ``[SPECTRACE]`` after any phase/propose/post line or for a
  request already verified in this step; a phase line after the propose or a post line (or
  out of order); a second ``[spec-propose]``; a second ``[spec-post_step]`` or
  ``[spec-update] called``; a ``[spec-sched]`` after a post line (sync scheduling only).
  A log whose first runner line is a ``[SPECTRACE]`` gets an implicit untraced step 0 (the
  prefill step that proposed those drafts). Steps are numbered from 0 per log.
* **Block step.** A block verified in step s was proposed at the end of step s-1, so its
  ``step`` column is s-1: the step whose ``[spec-phase]`` timings describe its proposal.
* **Propose join.** ``[spec-propose] first=[…]`` (step s, no request id) belongs to the first
  proposing row. It is joined to one ``[SPECTRACE]`` block of step s+1, tried in this order:
  (1) *exact*: the first block whose ``draft`` equals ``first`` (with ``...`` lists: every
  known id equal); (2) *hint*: under sync scheduling the ``[spec-update] req=…`` rows after the
  propose line list the draft payload in batch order, so the first row with ``drafts > 0`` and
  ``prefill_chunk=0`` *is* the first proposing row: its block, if it has one; when that request
  finished (``finished=1``) or has no block, the proposal was never verified and nothing is
  guessed. Without update rows (async): (3) *truncated*: the first block whose ``draft`` is a
  proper non-empty prefix of ``first`` (the scheduler cut it: ``[spec-sched] sched < have``);
  (4) *partial*: the block of the same length that agrees with ``first`` in the most slots, at
  least half of them (the #2116 corruption overwrites one slot); otherwise *unjoined*, counted.
  The joined block stores ``proposed = first`` and ``verified = draft``; every other block
  (ngram, MTP, draft_model, non-first rows) stores ``proposed = verified``, which is all the
  engine reveals. ``meta["import"]["proposed_source"]`` counts both kinds. The ``k`` column
  counts proposed ids (schema), so after a truncated join it is ``len(first)`` while
  ``num_verified`` is the line's ``k=``.
* **Anchors.** The anchor of a block is the previous block's ``emit[-1]`` for the same request
  when the chain holds (``pos = pos_prev + ns_prev``). ``pos`` past that is a *gap*, not an
  error: rows without drafts print no ``[SPECTRACE]`` (ngram found nothing, k clamped to 0);
  ``pos`` before it is a *chain break* (violation). After either, and for a request's first
  block, it is ``(prompt_ids + output_ids)[pos-1]`` from the requests file (which also wins,
  counted as an ``anchor mismatch`` violation, where the two disagree). Without that file
  it is ``-1`` and the row is remembered so :meth:`VtTraceParser.set_requests` (called later,
  e.g. when a captured command has written its requests file) can fix it; rows already written
  are patched through the writer before it closes.
* **Batch rows.** ``batch_row``/``batch_size`` of a block come from the ``[spec-update]
  req=…`` payload of its proposing step (one row per batch row, sync only); else ``-1``.
* **Invariants.** Chain breaks (``pos < pos_prev + ns_prev``), ``acc !=
  max(ns-1, 0)``, ``len(emit) != ns``, ``len(draft) != k``, ``acc > k`` and
  ``emit[:acc] != draft[:acc]`` are counted with line numbers (lenient) or raise (strict)
  after the block is recorded: no block is ever dropped for them.
* **Phase level.** ``[fwd-ops]`` rows get level 3, ``[spec-phase-dev]`` level 2. A
  ``[spec-phase]`` row gets the configured trace level when known (capture), else the highest
  level evidenced in the same step (3/2 when ``[fwd-ops]``/``[spec-phase-dev]`` lines printed),
  else 1: at level ≥ 2 its timestamps include the syncs of the device split.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from spectrace.tracer import schema
from spectrace.tracer.errors import InputError, ParseError
from spectrace.tracer.store import TraceWriter

SOURCE = "vt_spec_trace"
DEFAULT_ENGINE = "vllm.cpp"
#: How many offending line numbers each statistic keeps.
MAX_EXAMPLES = 20

_TAG_RE = re.compile(r"\[\s*(SPECTRACE|spec-propose|spec-phase-dev|spec-phase|fwd-ops|"
                     r"spec-sched|spec-update|spec-install|spec-post_step)\s*\]")
_FIELD_RE = re.compile(r"([A-Za-z_][\w/]*)\s*=\s*(\[[^\]]*\]|[^\s\[\]]+)")
_UNTERMINATED_RE = re.compile(r"=\s*\[[^\]]*$")
_INT_RE = re.compile(r"[+-]?\d+")
_FLOAT_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)")
_NO_ROWS_RE = re.compile(r"NO proposing rows this step\s*\(\s*num_reqs\s*=\s*([+-]?\d+)\s*\)")
_ELLIPSES = ("...", "\u2026")
# Tag-dropped payloads quoted in documents, recognised at the start of a line only.
_TAGLESS = (
    ("SPECTRACE", re.compile(r"\s*req=\S+\s+pos=\s*[+-]?\d+\s.*\bemit\s*=")),
    ("spec-propose", re.compile(r"\s*rows=\s*[+-]?\d+\s+nqpr=.*\bfirst\s*=")),
    ("spec-phase", re.compile(r"\s*(?:pre=\S+\s+)?backbone=\s*[+-]?[\d.]+ms")),
)

# Canonical field lists per family variant: (name, kind). Kinds: str, int, ms (F2 + "ms"),
# pct (F1 + "%"), ids_sp ("[ " ids "]"), ids ("[" ids "]"), arrow (a "->" token before it).
_F = tuple[tuple[str, str], ...]
_SPECTRACE: _F = (("req", "str"), ("pos", "int"), ("k", "int"), ("ns", "int"), ("acc", "int"),
                  ("draft", "ids_sp"), ("emit", "ids_sp"))
_PROPOSE: _F = (("rows", "int"), ("nqpr", "int"), ("drafts/row", "int"), ("first", "ids"))
_PHASE: _F = (("pre", "ms"), ("backbone", "ms"), ("sample", "ms"), ("logits", "int"))
_PHASE_OLD: _F = (("backbone", "ms"), ("sample", "ms"), ("logits", "int"))
_PHASE_DSPARK: _F = (("backbone", "ms"), ("sequential", "ms"), ("k", "int"), ("logits", "int"))
_DEV: _F = (("pre", "ms"), ("fwd", "ms"), ("select", "ms"), ("walk", "ms"))
_FWD_OPS: _F = (("P", "int"), ("Tq", "int"), ("L", "int"), ("total", "ms")) + tuple(
    (n, "pct") for n in ("norm", "conv", "qkv", "qknorm_rope", "ctx_scatter", "attn", "o_proj",
                         "mlp", "head"))
_SCHED: _F = (("req", "str"), ("have", "int"), ("num_new", "int"), ("computed", "int"),
              ("NumTokens", "int"), ("placeholders", "int"), ("sched", "arrow"))
_UPDATE_CALLED: _F = (("n", "int"),)
_UPDATE_REQ: _F = (("req", "str"), ("found", "int"), ("finished", "int"),
                   ("prefill_chunk", "int"), ("drafts", "int"))
_INSTALL: _F = (("req", "str"), ("installed", "int"), ("lookahead", "int"))
_POST_STEP: _F = (("pulled", "int"), ("rows", "int"))

#: Fields a line must carry to be usable (lenient mode fills or skips the others).
_REQUIRED = {
    "SPECTRACE": {"req", "pos", "ns", "draft", "emit"},
    "spec-propose": {"first"},
    "spec-phase-dev": set(),
    "fwd-ops": {"total"},
    "spec-sched": {"req", "have", "sched"},
    "spec-update": set(),
    "spec-install": {"req", "installed"},
    "spec-post_step": set(),
}
_PHASE_MS = ("pre", "backbone", "sample", "sequential")


# ------------------------------------------------------------------------------------------
# Line parsing (pure functions)
# ------------------------------------------------------------------------------------------


class _Malformed(Exception):
    """A trace line whose fields cannot be read (message: what is wrong)."""


@dataclass
class Ids:
    """An id list read from ``[ … ]``.

    Attributes:
        ids: the ids read (int), up to the first ``...`` when ``complete`` is False.
        complete: False when the list was shortened with an ellipsis (doc excerpts).
    """

    ids: list[int]
    complete: bool = True

    def padded(self, n: int) -> list[int]:
        """The ids padded with ``-1`` (unknown) to length ``n`` (never cut)."""
        return self.ids + [schema.PAD] * (n - len(self.ids))


@dataclass
class Record:
    """One parsed trace line.

    Attributes:
        family: the tag without brackets (``SPECTRACE``, ``spec-propose``, ...).
        values: field name -> int, float (ms or %), str (req) or :class:`Ids`.
        variant: ``called``/``req`` for ``spec-update``, ``no_rows`` for the NO-rows propose
            line, ``pre``/``old``/``dspark`` for ``spec-phase``, else ``""``.
        edits: why the line differs from the engine's exact format (empty when canonical).
    """

    family: str
    values: dict
    variant: str = ""
    edits: list[str] = field(default_factory=list)


def parse_line(line: str) -> Record | None:
    """Parse one stderr line.

    Args:
        line: one line (trailing newline allowed).
    Returns:
        A :class:`Record`, or ``None`` when the line is not a trace line.
    Raises:
        _Malformed: a trace line (tagged, or a tag-dropped doc excerpt) whose fields are bad.
    """
    text = line.rstrip("\r\n")
    m = _TAG_RE.search(text)
    if m is None:
        return _parse_tagless(text)
    if m.start() == 0:
        fast = _parse_canonical(m.group(1), text)
        if fast is not None:
            return fast
    family = m.group(1)
    rec = _parse_payload(family, text[m.end():])
    canonical = _render(rec)
    if canonical is not None and canonical == text:
        return rec
    rec.edits += _describe_edits(rec, text, m.start(), m.group(0), family)
    return rec


def _canonical_regex(family: str, variant: str, fields: _F) -> re.Pattern:
    # The exact engine format as one regex (the fast path for the common, canonical line).
    num = r"(-?(?:0|[1-9]\d*))"
    pat = {"str": r"(\S+)", "int": num, "arrow": num, "ms": r"(-?\d+\.\d\d)ms",
           "pct": r"(-?\d+\.\d)%", "ids_sp": r"\[ ((?:-?\d+ )*)\]", "ids": r"\[((?:-?\d+ )*)\]"}
    parts = [re.escape(f"[{family}]")] + (["called"] if variant == "called" else [])
    for name, kind in fields:
        parts.append(("-> " if kind == "arrow" else "") + re.escape(name) + "=" + pat[kind])
    return re.compile(" ".join(parts))


_CANONICAL: dict[str, list[tuple[str, _F, re.Pattern]]] = {}
for _fam, _variants in {
        "SPECTRACE": [("", _SPECTRACE)], "spec-propose": [("", _PROPOSE)],
        "spec-phase": [("pre", _PHASE), ("old", _PHASE_OLD), ("dspark", _PHASE_DSPARK)],
        "spec-phase-dev": [("", _DEV)], "fwd-ops": [("", _FWD_OPS)], "spec-sched": [("", _SCHED)],
        "spec-update": [("req", _UPDATE_REQ), ("called", _UPDATE_CALLED)],
        "spec-install": [("", _INSTALL)], "spec-post_step": [("", _POST_STEP)]}.items():
    _CANONICAL[_fam] = [(v, f, _canonical_regex(_fam, v, f)) for v, f in _variants]


def _parse_canonical(family: str, text: str) -> Record | None:
    for variant, fields, rx in _CANONICAL[family]:
        m = rx.fullmatch(text)
        if m is None:
            continue
        values = {}
        for (name, kind), raw in zip(fields, m.groups()):
            if kind == "str":
                values[name] = raw
            elif kind in ("ms", "pct"):
                values[name] = float(raw)
            elif kind.startswith("ids"):
                values[name] = Ids([int(x) for x in raw.split()])
            else:
                values[name] = int(raw)
        return Record(family, values, variant)
    return None


def _parse_tagless(text: str) -> Record | None:
    for family, rx in _TAGLESS:
        if rx.match(text):
            rec = _parse_payload(family, text)
            rec.edits.insert(0, "tag missing")
            return rec
    return None


def _describe_edits(rec: Record, text: str, start: int, tag: str, family: str) -> list[str]:
    edits = []
    if text[:start].strip():
        edits.append("text before the tag")
    if tag != f"[{family}]":
        edits.append("spaces inside the tag")
    if any(isinstance(v, Ids) and not v.complete for v in rec.values.values()):
        edits.append("ellipsis in an id list")
    names = {n for n, _ in _fields_of(rec)}
    missing = sorted(names - set(rec.values))
    extra = sorted(set(rec.values) - names)
    if missing:
        edits.append("missing " + ", ".join(f"{n}=" for n in missing))
    if extra:
        edits.append("unknown " + ", ".join(f"{n}=" for n in extra))
    return edits or ["spacing or number format"]


def _parse_payload(family: str, rest: str) -> Record:
    if family == "spec-propose":
        m = _NO_ROWS_RE.search(rest)
        if m:
            return Record(family, {"num_reqs": int(m.group(1))}, "no_rows")
    if _UNTERMINATED_RE.search(rest):
        raise _Malformed("unterminated [ ] id list")
    raw: dict[str, str] = {}
    dup = []
    for m in _FIELD_RE.finditer(rest):
        if m.group(1) in raw:
            dup.append(m.group(1))
        else:
            raw[m.group(1)] = m.group(2)
    variant = _variant(family, rest, raw)
    rec = Record(family, {}, variant)
    kinds = dict(_fields_of(rec))
    for name, value in raw.items():
        rec.values[name] = _convert(name, value, kinds.get(name))
    if dup:
        rec.edits.append("repeated " + ", ".join(f"{n}=" for n in dup))
    _check_required(rec)
    return rec


def _variant(family: str, rest: str, raw: dict[str, str]) -> str:
    if family == "spec-update":
        return "called" if re.match(r"\s*called\b", rest) else "req"
    if family == "spec-phase":
        if "sequential" in raw:
            return "dspark"
        return "pre" if "pre" in raw else "old"
    return ""


def _fields_of(rec: Record) -> _F:
    f = rec.family
    if f == "spec-phase":
        return {"pre": _PHASE, "old": _PHASE_OLD, "dspark": _PHASE_DSPARK}[rec.variant]
    if f == "spec-update":
        return _UPDATE_CALLED if rec.variant == "called" else _UPDATE_REQ
    return {"SPECTRACE": _SPECTRACE, "spec-propose": _PROPOSE, "spec-phase-dev": _DEV,
            "fwd-ops": _FWD_OPS, "spec-sched": _SCHED, "spec-install": _INSTALL,
            "spec-post_step": _POST_STEP}[f]


def _convert(name: str, value: str, kind: str | None):
    if value.startswith("["):
        return _parse_ids(name, value[1:-1])
    if kind == "str":
        return value
    if kind in ("ms", "pct"):
        m = _FLOAT_RE.fullmatch(value.removesuffix("ms" if kind == "ms" else "%"))
        if not m:
            raise _Malformed(f"{name}={value} is not a number of {kind}")
        return float(m.group(0))
    if _INT_RE.fullmatch(value):
        return int(value)
    if kind is None:  # an unknown extra field: keep its text
        return value
    raise _Malformed(f"{name}={value} is not an integer")


def _parse_ids(name: str, body: str) -> Ids:
    ids: list[int] = []
    for tok in body.split():
        cut = next((e for e in _ELLIPSES if tok.endswith(e)), None)
        if cut is not None:  # "682..." or "...": the rest of the list was left out
            head = tok[: -len(cut)]
            if head and _INT_RE.fullmatch(head):
                ids.append(int(head))
            return Ids(ids, complete=False)
        if not _INT_RE.fullmatch(tok):
            raise _Malformed(f"{name}=[…] holds {tok!r}, not an integer id")
        ids.append(int(tok))
    return Ids(ids)


def _check_required(rec: Record) -> None:
    if rec.variant == "no_rows":
        return
    required = set(_REQUIRED.get(rec.family, ()))
    if rec.family == "spec-update":
        required = {"n"} if rec.variant == "called" else {"req", "drafts"}
    if rec.family == "spec-phase" and not any(n in rec.values for n in _PHASE_MS):
        raise _Malformed("no phase timing (pre=, backbone=, sample= or sequential=)")
    missing = [n for n in _fields_of(rec) if n[0] in required and n[0] not in rec.values]
    if missing:
        raise _Malformed("missing " + ", ".join(f"{n}=" for n, _ in missing))
    for name, kind in _fields_of(rec):
        v = rec.values.get(name)
        if kind.startswith("ids") and v is not None and not isinstance(v, Ids):
            raise _Malformed(f"{name}= is not a [ ] id list")
        if not kind.startswith("ids") and isinstance(v, Ids):
            raise _Malformed(f"{name}= is a [ ] list, expected a value")


def _render(rec: Record) -> str | None:
    """The line exactly as the engine would print ``rec`` (None when it cannot be known)."""
    if rec.variant == "no_rows":
        return f"[spec-propose] NO proposing rows this step (num_reqs={rec.values['num_reqs']})"
    parts = [f"[{rec.family}]"] + (["called"] if rec.variant == "called" else [])
    fields = _fields_of(rec)
    if set(rec.values) != {n for n, _ in fields}:
        return None
    for name, kind in fields:
        v = rec.values[name]
        if kind == "arrow":
            parts.append("->")
        if kind in ("ids", "ids_sp"):
            if not v.complete:
                return None
            body = "".join(f"{x} " for x in v.ids)
            parts.append(f"{name}=[{' ' if kind == 'ids_sp' else ''}{body}]")
        elif kind == "ms":
            parts.append(f"{name}={v:.2f}ms")
        elif kind == "pct":
            parts.append(f"{name}={v:.1f}%")
        else:
            parts.append(f"{name}={v}")
    return " ".join(parts)


# ------------------------------------------------------------------------------------------
# Requests file
# ------------------------------------------------------------------------------------------


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


def read_requests(path: str | os.PathLike) -> dict[str, RequestRecord]:
    """Read a requests JSONL file: one ``{"req_id", "prompt_ids", "output_ids",
    "finish_reason"}`` object per line (blank lines skipped; ``finish_reason`` optional).

    Returns:
        req_id (str) -> :class:`RequestRecord`, in file order.
    Raises:
        InputError: missing file, or ``FILE:LINE: what`` for a bad line.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such requests file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read requests file ({exc})") from None
    out: dict[str, RequestRecord] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            rec = _request_from_json(line, f"{path}:{n}")
            out[rec.req_id] = rec
    return out


def _request_from_json(line: str, where: str) -> RequestRecord:
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise InputError(f"{where}: not JSON ({exc})") from None
    if not isinstance(obj, dict) or "req_id" not in obj:
        raise InputError(f"{where}: expected an object with req_id, prompt_ids, output_ids")
    ids = {}
    for key in ("prompt_ids", "output_ids"):
        v = obj.get(key, [])
        if not isinstance(v, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                              for t in v):
            raise InputError(f"{where}: {key} must be a list of integer token ids")
        ids[key] = v
    reason = obj.get("finish_reason") or ""
    return RequestRecord(str(obj["req_id"]), ids["prompt_ids"], ids["output_ids"], str(reason))


# ------------------------------------------------------------------------------------------
# Statistics
# ------------------------------------------------------------------------------------------


@dataclass
class ImportStats:
    """What a parse found: counts, and the first offending line numbers of each kind.

    Attributes:
        source: the log's name (file name or ``<stdin>``), used in messages.
        lines: lines fed; ``trace_lines`` of them were trace lines.
        blocks: blocks written; ``requests``: distinct request ids among them.
        steps: engine steps delimited; ``k_max``: the largest k seen (drafts per block).
        chain_gaps: blocks whose ``pos`` is past the previous block's ``pos + ns``: the
            request decoded tokens in steps without drafts, which print no line.
        malformed: trace lines skipped because their fields are unreadable.
        edited: trace lines used although they differ from the engine's exact format.
        violations: broken invariants by kind (chain break, acc != ns-1, ...).
        examples: kind -> list of ``[line, message]`` (at most MAX_EXAMPLES each).
        families: line count per tag; ``probes``: scheduler/engine-core details.
        joins: propose-join outcome counts (exact, hint, truncated, partial, unjoined, ...).
        proposed_source: blocks whose ``proposed`` came from a ``[spec-propose]`` line
            (``propose_line``) or copies ``verified`` (``verified``).
        anchors: anchor source counts (chain, requests, unknown, patched later).
        phases: phase rows written.
    """

    source: str = "?"
    lines: int = 0
    trace_lines: int = 0
    blocks: int = 0
    requests: int = 0
    steps: int = 0
    k_max: int = 0
    chain_gaps: int = 0
    malformed: int = 0
    edited: int = 0
    violations: Counter = field(default_factory=Counter)
    examples: dict[str, list] = field(default_factory=dict)
    families: Counter = field(default_factory=Counter)
    probes: Counter = field(default_factory=Counter)
    joins: Counter = field(default_factory=Counter)
    proposed_source: Counter = field(default_factory=Counter)
    anchors: Counter = field(default_factory=Counter)
    phases: int = 0
    trace_level: int | None = None

    def note(self, kind: str, lineno: int, msg: str) -> None:
        """Keep ``[lineno, msg]`` as an example of ``kind`` (the first MAX_EXAMPLES only)."""
        ex = self.examples.setdefault(kind, [])
        if len(ex) < MAX_EXAMPLES:
            ex.append([lineno, msg])

    def summary(self, verb: str = "imported") -> str:
        """One line for people, e.g. ``imported 412 blocks of 4 requests from LOG (k=4, …)``."""
        parts = [f"k={self.k_max}", f"{self.steps} steps", f"{self.malformed} malformed lines"]
        if self.edited:
            parts.append(f"{self.edited} edited lines")
        nviol = sum(self.violations.values())
        if nviol:
            kinds = ", ".join(f"{n} {k}" for k, n in self.violations.most_common())
            first = self._first_line()
            parts.append(f"{nviol} invariant violations ({kinds}; first at line {first})")
        if self.chain_gaps:
            parts.append(f"{self.chain_gaps} chain gaps")
        if self.anchors.get("unknown"):
            parts.append(f"{self.anchors['unknown']} anchors unknown")
        if self.families.get("spec-propose"):
            joined = self.proposed_source.get("propose_line", 0)
            parts.append(f"{joined} proposals joined, {self.joins.get('unjoined', 0)} unjoined")
            if self.joins.get("proposed != verified"):
                parts.append(f"{self.joins['proposed != verified']} proposed != verified")
        if self.phases:
            parts.append(f"{self.phases} phase timings")
        return (f"{verb} {_plural(self.blocks, 'block')} of {_plural(self.requests, 'request')} "
                f"from {self.source} ({', '.join(parts)})")

    def _first_line(self) -> int:
        lines = [ex[0][0] for k, ex in self.examples.items() if k in self.violations and ex]
        return min(lines, default=0)

    def to_meta(self) -> dict:
        """The statistics as a JSON-ready dict (stored as ``meta["import"]``)."""
        return {
            "source": self.source, "lines": self.lines, "trace_lines": self.trace_lines,
            "blocks": self.blocks, "requests": self.requests, "steps": self.steps,
            "k_max": self.k_max, "chain_gaps": self.chain_gaps, "malformed": self.malformed,
            "edited": self.edited,
            "violations": dict(self.violations), "examples": self.examples,
            "families": dict(self.families), "probes": dict(self.probes),
            "joins": dict(self.joins), "proposed_source": dict(self.proposed_source),
            "anchors": dict(self.anchors), "phases": self.phases,
        }


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# ------------------------------------------------------------------------------------------
# The streaming parser
# ------------------------------------------------------------------------------------------


@dataclass
class _Block:
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
class _Proposal:
    """An open ``[spec-propose]`` line waiting for its block in the next step."""

    step: int
    lineno: int
    first: Ids
    per_row: int
    hint: str | None = None  # the first proposing row's request, from [spec-update]
    hint_finished: bool = False


@dataclass
class _Chain:
    pos: int
    ns: int
    last: int  # emit[-1], -1 when unknown
    lineno: int


# Families that belong to the post section of a step, and the phase order.
_POST = ("spec-post_step", "spec-update", "spec-install")
_PHASE_RANK = {"fwd-ops": 0, "spec-phase-dev": 1, "spec-phase": 2}


class VtTraceParser:
    """Parse ``VT_SPEC_TRACE`` lines as they arrive and record them in a :class:`TraceWriter`.

    Args:
        writer: the open trace writer (the parser registers requests, blocks and phases).
        strict: raise :class:`ParseError` on the first malformed, edited or inconsistent line.
        source_name: the log's name in messages (``FILE`` of ``FILE:LINE``).
        trace_level: the configured ``VT_SPEC_TRACE`` level when known (capture), else None.

    Usage: ``feed_line(line, lineno)`` for every line of a file or a live stderr pipe, then
    :meth:`finish`. Blocks are written at once, except while a ``[spec-propose]`` waits for
    its join (at most the rest of one step's ``[SPECTRACE]`` lines).
    """

    def __init__(self, writer: TraceWriter, *, strict: bool = False, source_name: str = "<log>",
                 trace_level: int | None = None) -> None:
        self.writer = writer
        self.strict = strict
        self.stats = ImportStats(source=source_name)
        self.trace_level = trace_level
        self.late_patches: list[tuple[int, int]] = []  # (row, anchor) fixed after writing
        self._lineno = 0
        self._step = 0
        self._seen: set[str] = set()
        self._verified: set[str] = set()
        self._section: list[_Block] = []
        self._proposal: _Proposal | None = None
        self._chains: dict[str, _Chain] = {}
        self._sched: dict[str, tuple[int, int]] = {}
        self._requests: dict[str, RequestRecord] | None = None
        self._unresolved: list[tuple[int, str, int]] = []  # (row, req, pos) with anchor -1
        self._rows = 0
        self._reqs: set[str] = set()
        self._levels_seen: set[int] = set()
        self._finished = False
        self._payload: dict[str, int] = {}  # [spec-update] rows of this step: req -> row
        self._prev_payload: dict[str, int] = {}  # ... of the previous (proposing) step
        self._runner_seen = False  # a runner/engine-core line was seen (not just sched)
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
        except _Malformed as exc:
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
                self._problem("edited", f"{rec.family} line differs from the engine's format "
                                        f"({'; '.join(rec.edits)})")
            self._dispatch(rec)  # record first: a strict failure never drops the block
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        return True

    def set_requests(self, requests: dict[str, RequestRecord]) -> int:
        """Register the requests' prompt/output ids and resolve anchors still unknown.

        May be called before feeding (import) or after (capture: the command writes its
        requests file at exit). Anchors of rows already written are patched through the
        writer (:meth:`~spectrace.tracer.store.TraceWriter.patch_blocks`) and listed in
        :attr:`late_patches`.

        Returns:
            The number of anchors resolved by this call.
        """
        self._requests = requests
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
        """Write what is still pending, close the open proposal, store stats in /meta.

        Idempotent. Returns:
            The :class:`ImportStats`.
        """
        if self._finished:
            return self.stats
        self._finished = True
        self._close_section()
        if self._proposal is not None:
            self.stats.joins["not_verified"] += 1  # the log ended before the next step
            self._proposal = None
        self._update_meta()
        return self.stats

    def abort(self) -> ImportStats:
        """The exception path: write pending blocks without a join, store stats in /meta.

        Returns:
            The :class:`ImportStats` so far.
        """
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
        self._new_step_if(bool(self._seen - {"sched"}) or req in self._verified)
        self._verified.add(req)
        self._levels_seen.add(1)
        b = self._make_block(rec)
        self._check_block(b)
        p = self._proposal
        if p is not None and p.step == self._step - 1:
            if _ids_match(p.first, b.draft):  # the best possible join: resolve at once
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
        level = {"fwd-ops": 3, "spec-phase-dev": 2, "spec-phase": 1}[rec.family]
        self._levels_seen.add(level)
        self._write_phases(rec, level)

    def _on_propose(self, rec: Record) -> None:
        self._new_step_if(bool(self._seen & {"spec-propose", *_POST}))
        self._runner_seen = True
        self._close_section()
        self._seen.add("spec-propose")
        self._levels_seen.add(1)
        if self._proposal is not None:
            self.stats.joins["not_verified"] += 1
            self._proposal = None
        if rec.variant == "no_rows":
            self.stats.probes["propose_no_rows"] += 1
            return
        first: Ids = rec.values["first"]
        per_row = rec.values.get("drafts/row", len(first.ids))
        if first.complete and per_row != len(first.ids):
            self._violation("drafts/row", f"drafts/row={per_row} but first=[…] holds "
                                          f"{len(first.ids)} ids")
        if isinstance(rec.values.get("nqpr"), int):
            self.stats.probes[f"nqpr={rec.values['nqpr']}"] += 1
        self.stats.k_max = max(self.stats.k_max, per_row)
        self._proposal = _Proposal(self._step, self._lineno, first, per_row)

    def _on_sched(self, rec: Record) -> None:
        # Only a post line (sync scheduling) ends a step before the next schedule.
        self._new_step_if(bool(self._seen & set(_POST)))
        self._seen.add("sched")
        v = rec.values
        self.stats.probes["sched"] += 1
        if v["sched"] < v["have"]:
            self.stats.probes["sched_truncated"] += 1
        self._sched[v["req"]] = (v["have"], v["sched"])

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
            f, "update_called" if rec.variant == "called" else "update_rows")
        self.stats.probes[key] += 1
        if key != "update_rows":
            return
        self._payload.setdefault(v["req"], len(self._payload))
        p = self._proposal
        # The payload lists batch rows in order: its first drafting row is propose_rows[0].
        if p is not None and p.step == self._step and p.hint is None and \
                v["drafts"] > 0 and v.get("prefill_chunk", 0) == 0:
            p.hint, p.hint_finished = v["req"], v.get("finished", 0) == 1

    # -- blocks ------------------------------------------------------------------------------

    def _make_block(self, rec: Record) -> _Block:
        v = rec.values
        draft: Ids = v["draft"]
        emit: Ids = v["emit"]
        k = v.get("k", len(draft.ids))
        ns = v["ns"]
        acc = v.get("acc", max(ns - 1, 0))
        req = v["req"]
        self._reqs.add(req)
        self.stats.k_max = max(self.stats.k_max, k)
        anchor = self._chain_anchor(req, v["pos"])
        self._chains[req] = _Chain(v["pos"], ns, emit.ids[-1] if emit.complete and emit.ids
                                   else schema.PAD, self._lineno)
        row = self._prev_payload.get(req)
        return _Block(self._lineno, req, self._step - 1, v["pos"], k, acc, draft, emit, ns,
                      anchor, self._sched.pop(req, None),
                      schema.PAD if row is None else row,
                      len(self._prev_payload) if row is not None else schema.PAD)

    def _chain_anchor(self, req: str, pos: int) -> int:
        prev = self._chains.get(req)
        from_req = self._anchor_from_requests(req, pos)
        expected = prev.pos + prev.ns if prev is not None else pos
        if pos > expected:  # steps without drafts print no [SPECTRACE] line (ngram, k=0)
            self.stats.chain_gaps += 1
            self.stats.note("chain gap", self._lineno,
                            f"req={req} pos={pos}: {pos - expected} tokens decoded without "
                            f"drafts since line {prev.lineno}")
        elif pos < expected:
            self._violation("chain break", f"req={req} pos={pos}, expected {expected} "
                                           f"(pos={prev.pos} ns={prev.ns} at line "
                                           f"{prev.lineno}; a reused request id?)")
        elif prev is not None and prev.last != schema.PAD:
            if from_req != schema.PAD and from_req != prev.last:
                self._violation("anchor mismatch", f"req={req}: previous emit[-1]={prev.last} "
                                                   f"but the requests file has {from_req} at "
                                                   f"position {pos - 1}")
                self.stats.anchors["requests"] += 1
                return from_req
            self.stats.anchors["chain"] += 1
            return prev.last
        self.stats.anchors["requests" if from_req != schema.PAD else "unknown"] += 1
        return from_req

    def _anchor_from_requests(self, req: str, pos: int) -> int:
        r = self._requests.get(req) if self._requests is not None else None
        if r is None:
            return schema.PAD
        full = r.full
        return full[pos - 1] if 0 < pos <= len(full) else schema.PAD

    def _check_block(self, b: _Block) -> None:
        r = f"req={b.req} pos={b.pos}"
        if b.acc != max(b.ns - 1, 0):
            self._violation("acc != ns-1", f"{r}: acc={b.acc} but ns={b.ns}")
        if b.emit.complete and len(b.emit.ids) != b.ns:
            self._violation("len(emit) != ns", f"{r}: emit holds {len(b.emit.ids)} ids, ns={b.ns}")
        if b.draft.complete and len(b.draft.ids) != b.k:
            self._violation("len(draft) != k", f"{r}: draft holds {len(b.draft.ids)} ids, "
                                               f"k={b.k}")
        if b.acc > b.k:
            self._violation("acc > k", f"{r}: acc={b.acc} > k={b.k}")
        n = min(b.acc, len(b.draft.ids), len(b.emit.ids))
        if b.draft.ids[:n] != b.emit.ids[:n]:
            self._violation("emit != draft", f"{r}: emit[:acc] {b.emit.ids[:n]} differs from "
                                             f"draft[:acc] {b.draft.ids[:n]}")

    def _close_section(self) -> None:
        """Resolve the pending proposal against this step's blocks, then write them."""
        p, blocks = self._proposal, self._section
        if p is not None and blocks and p.step == blocks[0].step:
            idx, kind = _choose_join(p, blocks)
            if idx is None:
                self.stats.joins[kind] += 1
                if kind == "unjoined":
                    self.stats.note(kind, p.lineno, "[spec-propose] first=[…] matches no "
                                                    "[SPECTRACE] draft of the next step")
            else:
                self._join(p, blocks[idx], kind)
            self._proposal = None
        for b in blocks:
            self._write(b)
        self._section = []

    def _join(self, p: _Proposal, b: _Block, kind: str) -> None:
        self.stats.joins[kind] += 1
        b.proposed = p.first.padded(max(p.per_row, len(p.first.ids)))
        if kind != "exact":
            why = ""
            if kind == "truncated" and b.sched and b.sched[1] < b.sched[0]:
                why = f" (explained by [spec-sched] have={b.sched[0]} sched={b.sched[1]})"
            self.stats.note("proposed != verified", b.lineno,
                            f"req={b.req} pos={b.pos}: proposed {p.first.ids} (line "
                            f"{p.lineno}), verified {b.draft.ids} [{kind} join]{why}")
            self.stats.joins["proposed != verified"] += 1
        self._proposal = None

    def _write(self, b: _Block) -> None:
        verified = b.draft.padded(b.k) if not b.draft.complete else b.draft.ids
        emitted = b.emit.padded(b.ns) if not b.emit.complete else b.emit.ids
        proposed = b.proposed if b.proposed is not None else verified
        self.stats.proposed_source["propose_line" if b.proposed is not None else "verified"] += 1
        if not b.draft.complete or not b.emit.complete:
            self.stats.probes["ellipsis_blocks"] += 1
        self.writer.add_block(b.req, b.step, b.pos - 1, b.anchor, proposed, verified=verified,
                              accepted=b.acc, emitted=emitted, batch_row=b.batch_row,
                              batch_size=b.batch_size,
                              proposal_source=schema.PROPOSAL_FROM_DRAFTER
                              if b.proposed is not None
                              else schema.PROPOSAL_COPIED_FROM_VERIFIED)
        if b.anchor == schema.PAD:
            self._unresolved.append((self._rows, b.req, b.pos))
        self._rows += 1
        self.stats.blocks = self._rows
        self.stats.requests = len(self._reqs)

    def _write_phases(self, rec: Record, level: int) -> None:
        v = rec.values
        if rec.family == "spec-phase":
            if self.trace_level is not None:
                level = max(1, self.trace_level)
            else:  # [fwd-ops]/[spec-phase-dev] of this step: its stamps include their syncs
                level = max([1] + [3 if f == "fwd-ops" else 2 for f in self._seen
                                   if f in ("fwd-ops", "spec-phase-dev")])
            rows = [(n, v[n]) for n in _PHASE_MS if n in v]
        elif rec.family == "spec-phase-dev":
            rows = [(f"dev.{n}", v[n]) for n, _ in _DEV if n in v]
        else:  # [fwd-ops]: shares of total, stored as ms
            total = v["total"]
            rows = [("fwd-ops.total", total)] + [
                (f"fwd-ops.{n}", total * v[n] / 100.0) for n, kind in _FWD_OPS
                if kind == "pct" and isinstance(v.get(n), float)]
        for name, ms in rows:
            if isinstance(ms, float) and math.isfinite(ms):
                self.writer.add_phase(self._step, name, ms, level)
                self.stats.phases += 1

    # -- problems ----------------------------------------------------------------------------

    def _problem(self, kind: str, msg: str) -> None:
        self.stats.note(kind, self._lineno, msg)
        if self.strict and self._error is None:
            self._error = ParseError(f"{self.stats.source}:{self._lineno}: {msg}")

    def _violation(self, kind: str, msg: str) -> None:
        self.stats.violations[kind] += 1
        self._problem(kind, f"{kind}: {msg}")

    def _update_meta(self) -> None:
        s = self.stats
        s.trace_level = self.trace_level if self.trace_level is not None else (
            max(self._levels_seen) if self._levels_seen else (0 if s.trace_lines else None))
        meta = self.writer.meta
        imp = s.to_meta()
        imp["trace_level_source"] = "configured" if self.trace_level is not None else \
            "inferred (lower bound)"
        items = {"import": imp, "k": meta.get("k") or s.k_max}
        if meta.get("trace_level") is None and s.trace_level is not None:
            items["trace_level"] = s.trace_level
        self.writer.update_meta(**items)


def _ids_match(first: Ids, draft: Ids) -> bool:
    # Equal lists; with "..." lists (doc excerpts): every id known on both sides agrees.
    if first.complete and draft.complete:
        return first.ids == draft.ids
    n = min(len(first.ids), len(draft.ids))
    return n > 0 and first.ids[:n] == draft.ids[:n]


def _choose_join(p: _Proposal, blocks: list[_Block]) -> tuple[int | None, str]:
    """Pick the block of the next step that ``p`` proposed for (see the module docstring)."""
    for i, b in enumerate(blocks):
        if _ids_match(p.first, b.draft):
            return i, "exact"
    if p.hint is not None:  # the engine named the row: never guess past it
        for i, b in enumerate(blocks):
            if b.req == p.hint and not p.hint_finished:
                return i, "hint"
        return None, "not_verified"
    first = p.first.ids
    for i, b in enumerate(blocks):
        d = b.draft.ids
        if b.draft.complete and 0 < len(d) < len(first) and first[:len(d)] == d:
            return i, "truncated"
    best, best_score = None, 0
    for i, b in enumerate(blocks):
        d = b.draft.ids
        if len(d) == len(first) and d:
            score = sum(x == y for x, y in zip(first, d))
            if score > best_score and score >= max(1, (len(d) + 1) // 2):
                best, best_score = i, score
    return (best, "partial") if best is not None else (None, "unjoined")


# ------------------------------------------------------------------------------------------
# Files
# ------------------------------------------------------------------------------------------


def _open_log(log: str | os.PathLike) -> tuple[Iterable[str], str, Callable[[], None]]:
    if str(log) == "-":
        stream = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
        return stream, "<stdin>", stream.detach  # detach: never close the process's stdin
    try:
        fh = open(log, encoding="utf-8", errors="replace", newline="")
    except FileNotFoundError:
        raise InputError(f"{log}: no such log file") from None
    except OSError as exc:
        raise InputError(f"{log}: cannot read log file ({exc})") from None
    return fh, str(log), fh.close


def import_log(log: str | os.PathLike, out: str | os.PathLike,
               requests_path: str | os.PathLike | None = None, strict: bool = False,
               meta: dict | None = None) -> ImportStats:
    """Import a ``VT_SPEC_TRACE`` log (what ``spectrace import vt`` runs).

    Args:
        log: the stderr log file, or ``-`` for stdin.
        out: the trace file to write (``.h5``; written as ``.h5.partial`` until done).
        requests_path: JSONL of ``{"req_id", "prompt_ids", "output_ids", "finish_reason"}``
            (resolves first-block anchors and fills /requests), or None.
        strict: fail on the first malformed/edited line or broken invariant.
        meta: /meta items that override the defaults (``engine``, ``k``, ``method``, ...).
    Returns:
        The :class:`ImportStats` (also stored as ``meta["import"]``).
    Raises:
        InputError: missing log, bad requests file (``FILE:LINE``), unwritable output.
        ParseError: strict mode; the ``.partial`` file keeps everything parsed before it.
    """
    requests = read_requests(requests_path) if requests_path is not None else None
    lines, name, close = _open_log(log)
    try:
        writer = TraceWriter(out, {"source": SOURCE, "engine": DEFAULT_ENGINE, **(meta or {})})
        parser = VtTraceParser(writer, strict=strict, source_name=name)
        with writer:
            if requests is not None:
                parser.set_requests(requests)
            try:
                for n, line in enumerate(lines, 1):
                    parser.feed_line(line, n)
            except BaseException:
                parser.abort()  # keep every block parsed so far in the .partial file
                raise
            stats = parser.finish()
    finally:
        close()
    return stats
