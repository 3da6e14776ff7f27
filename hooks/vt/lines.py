"""The ``VT_SPEC_TRACE`` line lexer: one stderr line -> a :class:`Record` (pure functions).

Mirrors the line formats of ``shared/reference/vt_spec_trace.md`` (vllm.cpp ``runner.cpp``,
``scheduler.cpp``, ``core.cpp``, ``qwen3_dflash.cpp``, DSpark ``speculator.cpp``): every family
is matched on its tag and read **by field name**. A canonical line takes one regex (the fast
path); anything else is read field by field, and the ways it differs from the engine's exact
format (tag dropped, double spaces, ``...`` ellipses, other ``[ ]`` spacing) are listed in
:attr:`Record.edits`. Lines that are not trace lines give None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from spectrace.tracer import schema

_TAG_RE = re.compile(
    r"\[\s*(SPECTRACE|spec-propose|spec-phase-dev|spec-phase|fwd-ops|"
    r"spec-sched|spec-update|spec-install|spec-post_step)\s*\]"
)
_FIELD_RE = re.compile(r"([A-Za-z_][\w/]*)\s*=\s*(\[[^\]]*\]|[^\s\[\]]+)")
_UNTERMINATED_RE = re.compile(r"=\s*\[[^\]]*$")
_INT_RE = re.compile(r"[+-]?\d+")
_FLOAT_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+|nan)", re.IGNORECASE)  # nan: printf's NaN
_NO_ROWS_RE = re.compile(r"NO proposing rows this step\s*\(\s*num_reqs\s*=\s*([+-]?\d+)\s*\)")
_ELLIPSES = ("...", "\u2026")
_NOT_UTF8 = re.compile("[\udc80-\udcff]")  # bytes not UTF-8 as "surrogateescape" reads them
# Tag-dropped payloads quoted in documents, recognised at the start of a line only.
_TAGLESS = (
    ("SPECTRACE", re.compile(r"\s*req=\S+\s+pos=\s*[+-]?\d+\s.*\bemit\s*=")),
    ("spec-propose", re.compile(r"\s*rows=\s*[+-]?\d+\s+nqpr=.*\bfirst\s*=")),
    ("spec-phase", re.compile(r"\s*(?:pre=\S+\s+)?backbone=\s*[+-]?[\d.]+ms")),
)

# Canonical field lists per family variant: (name, kind). Kinds: str, int, ms (F2 + "ms"),
# pct (F1 + "%"), ids_sp ("[ " ids "]"), ids ("[" ids "]"), arrow (a "->" token before it),
# floats_opt (an optional trailing "[ " floats "]" list: the line may end before it).
_F = tuple[tuple[str, str], ...]
_SPECTRACE: _F = (
    ("req", "str"),
    ("pos", "int"),
    ("k", "int"),
    ("ns", "int"),
    ("acc", "int"),
    ("draft", "ids_sp"),
    ("emit", "ids_sp"),
)
_PROPOSE: _F = (
    ("rows", "int"),
    ("nqpr", "int"),
    ("drafts/row", "int"),
    ("first", "ids"),
    ("margin", "floats_opt"),
)
#: Fields a canonical line may leave out (its tail).
OPTIONAL = frozenset({"margin"})
_PHASE: _F = (("pre", "ms"), ("backbone", "ms"), ("sample", "ms"), ("logits", "int"))
_PHASE_OLD: _F = (("backbone", "ms"), ("sample", "ms"), ("logits", "int"))
_PHASE_DSPARK: _F = (("backbone", "ms"), ("sequential", "ms"), ("k", "int"), ("logits", "int"))
_DEV: _F = (("pre", "ms"), ("fwd", "ms"), ("select", "ms"), ("walk", "ms"))
_FWD_OPS: _F = (("P", "int"), ("Tq", "int"), ("L", "int"), ("total", "ms")) + tuple(
    (n, "pct")
    for n in ("norm", "conv", "qkv", "qknorm_rope", "ctx_scatter", "attn", "o_proj", "mlp", "head")
)
_SCHED: _F = (
    ("req", "str"),
    ("have", "int"),
    ("num_new", "int"),
    ("computed", "int"),
    ("NumTokens", "int"),
    ("placeholders", "int"),
    ("sched", "arrow"),
)
_UPDATE_CALLED: _F = (("n", "int"),)
_UPDATE_REQ: _F = (
    ("req", "str"),
    ("found", "int"),
    ("finished", "int"),
    ("prefill_chunk", "int"),
    ("drafts", "int"),
)
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
PHASE_MS = ("pre", "backbone", "sample", "sequential")

# Value ranges: a field stored in a trace column must fit that column (pos - 1 is the int32
# ``position``, k/ns/acc/drafts-per-row size int16 columns, ids are int32 token ids); any
# other integer must fit int64; k at most the schema's /meta bound (the import writes the
# largest k as /meta k, which every reader checks). Out of range is a malformed line: never
# clamped or wrapped.
_I16 = (0, 2**15 - 1)
RANGES: dict[str, tuple[int, int]] = {
    "pos": (1, 2**31 - 1),
    "k": (0, schema.META_MAXIMUM["k"]),
    "ns": _I16,
    "acc": _I16,
    "drafts/row": _I16,
}
ID_RANGE = (-(2**31), 2**31 - 1)  # int32 cells (-1 pads a list the engine cut short)
_ANY_INT = (-(2**63), 2**63 - 1)
_MAX_DIGITS = 19  # longer digit strings exceed int64 (and int() has a digit limit)
FLOAT32_MAX = 3.4028235677973362e38  # the largest float that rounds to a finite float32
#: A margin as the engine prints it (``%.3f``, ``nan``; <= 12 integer digits, so a long number
#: cannot make the fast regex backtrack: ``MARGIN_RE`` there took 26 s on a 17-digit margin).
#: Any other spelling of a float (``MARGIN_RE``) is read by name and kept by :func:`_render`.
CANONICAL_MARGIN = r"(?:-?(?:0|[1-9]\d{0,11})\.\d{3}|nan)"
MARGIN_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-]?nan")


class MalformedLine(Exception):
    """A trace line whose fields cannot be read (message: what is wrong)."""


@dataclass
class Ids:
    """An id list read from ``[ … ]``: ``ids`` (int), up to the first ``...`` when
    ``complete`` is False (a list shortened with an ellipsis: doc excerpts)."""

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
        spelled: field name -> its text in the line (a line read by name).
    """

    family: str
    values: dict
    variant: str = ""
    edits: list[str] = field(default_factory=list)
    spelled: dict[str, str] = field(default_factory=dict)


def parse_line(line: str) -> Record | None:
    """Parse one stderr line.

    Args:
        line: one line (trailing newline allowed).
    Returns:
        A :class:`Record`, or ``None`` when the line is not a trace line.
    Raises:
        MalformedLine: a trace line (tagged, or a tag-dropped doc excerpt) whose fields are bad.
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
    rec = _parse_payload(family, text[m.end() :])
    _check_ranges(rec)
    canonical = _render(rec)
    if canonical is not None and canonical in (text, text.replace("=-nan", "=nan")):  # glibc: -nan
        return rec
    rec.edits += _describe_edits(rec, text, m.start(), m.group(0), family)
    return rec


def _int(name: str, text: str) -> int:
    """``text`` (an integer literal) as an int; MalformedLine past int64's digits."""
    digits = text.lstrip("+-")
    if len(digits.lstrip("0")) > _MAX_DIGITS:
        shown = text if len(text) <= 24 else f"{text[:20]}... ({len(digits)} digits)"
        raise MalformedLine(f"{name} out of range (field={name}, value={shown})")
    return int(text)


def _check_ranges(rec: Record) -> None:
    """Raise MalformedLine for a value out of its column's range (see ``RANGES``)."""
    for name, v in rec.values.items():
        if isinstance(v, Ids):
            lo, hi = ID_RANGE
            bad = next((x for x in v.ids if not lo <= x <= hi), None)
            if bad is not None:
                raise MalformedLine(
                    f"{name} holds a token id out of range [{lo}, {hi}] (field={name}, value={bad})"
                )
        elif isinstance(v, int):
            lo, hi = RANGES.get(name, _ANY_INT)
            if not lo <= v <= hi:
                raise MalformedLine(f"{name} out of range [{lo}, {hi}] (field={name}, value={v})")
        elif isinstance(v, float) and abs(v) > FLOAT32_MAX:  # NaN: unknown, in range
            raise MalformedLine(f"{name} out of range for float32 (field={name}, value={v})")
        elif isinstance(v, list):
            _check_margins(name, v, rec.values.get("first"))
        elif name == "req" and isinstance(v, str) and not v.isprintable():
            what = "bytes not UTF-8" if _NOT_UTF8.search(v) else "a control character"
            shown = v.encode(errors="surrogateescape") if _NOT_UTF8.search(v) else v
            raise MalformedLine(f"req holds {what} (field=req, value={shown!r})")
    if rec.family == "SPECTRACE":
        _check_accepted(rec.values)


def _check_margins(name: str, margins: list[float], first: object) -> None:
    """One float32 (or ``nan``: unknown) per proposed id of ``first``."""
    bad = next((x for x in margins if abs(x) > FLOAT32_MAX), None)
    if bad is not None:
        raise MalformedLine(f"{name} out of range for float32 (field={name}, value={bad})")
    if isinstance(first, Ids) and first.complete and len(margins) != len(first.ids):
        raise MalformedLine(
            f"{name} holds {len(margins)} values for {len(first.ids)} proposed ids "
            f"(field={name}, value={len(margins)})"
        )


def _check_accepted(v: dict) -> None:
    """``acc`` must not exceed the drafts the trace stores as verified (``num_verified``: the
    draft's length, or ``k`` for a list cut with ``...``): accepted <= num_verified."""
    acc, draft, k = v.get("acc"), v.get("draft"), v.get("k")
    if not isinstance(acc, int) or not isinstance(draft, Ids):
        return
    verified = len(draft.ids) if draft.complete or not isinstance(k, int) else k
    if acc > verified:
        raise MalformedLine(f"acc exceeds the {verified} verified drafts (field=acc, value={acc})")


def _canonical_regex(family: str, variant: str, fields: _F) -> re.Pattern:
    # The exact engine format as one regex (the fast path for the common, canonical line).
    num = r"(-?(?:0|[1-9]\d*))"
    pat = {
        "str": r"(\S+)",
        "int": num,
        "arrow": num,
        "ms": r"(-?\d+\.\d\d)ms",
        "pct": r"(-?\d+\.\d)%",
        "ids_sp": r"\[ ((?:-?\d+ )*)\]",
        "ids": r"\[((?:-?\d+ )*)\]",
    }
    parts = [re.escape(f"[{family}]")] + (["called"] if variant == "called" else [])
    tail = ""
    for name, kind in fields:
        if kind == "floats_opt":
            tail += rf"(?: {re.escape(name)}=\[ ((?:{CANONICAL_MARGIN} )*)\])?"
            continue
        parts.append(("-> " if kind == "arrow" else "") + re.escape(name) + "=" + pat[kind])
    return re.compile(" ".join(parts) + tail)


#: family -> [(variant, canonical fields)]: the engine's exact line formats.
FORMATS: dict[str, list[tuple[str, _F]]] = {
    "SPECTRACE": [("", _SPECTRACE)],
    "spec-propose": [("", _PROPOSE)],
    "spec-phase": [("pre", _PHASE), ("old", _PHASE_OLD), ("dspark", _PHASE_DSPARK)],
    "spec-phase-dev": [("", _DEV)],
    "fwd-ops": [("", _FWD_OPS)],
    "spec-sched": [("", _SCHED)],
    "spec-update": [("req", _UPDATE_REQ), ("called", _UPDATE_CALLED)],
    "spec-install": [("", _INSTALL)],
    "spec-post_step": [("", _POST_STEP)],
}
_CANONICAL: dict[str, list[tuple[str, _F, re.Pattern]]] = {}
for _fam, _variants in FORMATS.items():
    _CANONICAL[_fam] = [(v, f, _canonical_regex(_fam, v, f)) for v, f in _variants]


def _parse_canonical(family: str, text: str) -> Record | None:
    for variant, fields, rx in _CANONICAL[family]:
        m = rx.fullmatch(text)
        if m is None:
            continue
        values: dict = {}
        for (name, kind), raw in zip(fields, m.groups()):
            if raw is None:  # an optional field left out
                continue
            if kind == "str":
                values[name] = raw
            elif kind in ("ms", "pct"):
                values[name] = float(raw)
            elif kind.startswith("ids"):
                values[name] = Ids([_int(name, x) for x in raw.split()])
            elif kind == "floats_opt":
                values[name] = [float(x) for x in raw.split()]
            else:
                values[name] = _int(name, raw)
        rec = Record(family, values, variant)
        _check_ranges(rec)
        return rec
    return None


def _parse_tagless(text: str) -> Record | None:
    for family, rx in _TAGLESS:
        if rx.match(text):
            rec = _parse_payload(family, text)
            _check_ranges(rec)
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
    missing = sorted(names - set(rec.values) - OPTIONAL)
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
            return Record(family, {"num_reqs": _int("num_reqs", m.group(1))}, "no_rows")
    if _UNTERMINATED_RE.search(rest):
        raise MalformedLine("unterminated [ ] id list")
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
        rec.spelled[name] = value
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
    return {
        "SPECTRACE": _SPECTRACE,
        "spec-propose": _PROPOSE,
        "spec-phase-dev": _DEV,
        "fwd-ops": _FWD_OPS,
        "spec-sched": _SCHED,
        "spec-install": _INSTALL,
        "spec-post_step": _POST_STEP,
    }[f]


def _convert(name: str, value: str, kind: str | None):
    if kind == "floats_opt":
        return _parse_floats(name, value)
    if value.startswith("["):
        return _parse_ids(name, value[1:-1])
    if kind == "str":
        return value
    if kind in ("ms", "pct"):
        m = _FLOAT_RE.fullmatch(value.removesuffix("ms" if kind == "ms" else "%"))
        if not m:
            raise MalformedLine(f"{name}={value} is not a number of {kind}")
        return float(m.group(0))
    if _INT_RE.fullmatch(value):
        return _int(name, value)
    if kind is None:  # an unknown extra field: keep its text
        return value
    raise MalformedLine(f"{name}={value} is not an integer")


def _parse_ids(name: str, body: str) -> Ids:
    ids: list[int] = []
    for tok in body.split():
        cut = next((e for e in _ELLIPSES if tok.endswith(e)), None)
        if cut is not None:  # "682..." or "...": the rest of the list was left out
            head = tok[: -len(cut)]
            if head and _INT_RE.fullmatch(head):
                ids.append(_int(name, head))
            return Ids(ids, complete=False)
        if not _INT_RE.fullmatch(tok):
            raise MalformedLine(f"{name}=[…] holds {tok!r}, not an integer id")
        ids.append(_int(name, tok))
    return Ids(ids)


def _parse_floats(name: str, value: str) -> list[float]:
    """A ``[ … ]`` list of floats (``nan``: unknown), e.g. ``margin=[ 0.523 0.010 ]``."""
    if not value.startswith("["):
        raise MalformedLine(f"{name}= is not a [ ] list of numbers")
    out = []
    for tok in value[1:-1].split():
        if not MARGIN_RE.fullmatch(tok):
            raise MalformedLine(f"{name}=[…] holds {tok!r}, not a number")
        out.append(float(tok))
    return out


def _check_required(rec: Record) -> None:
    if rec.variant == "no_rows":
        return
    required = set(_REQUIRED.get(rec.family, ()))
    if rec.family == "spec-update":
        required = {"n"} if rec.variant == "called" else {"req", "drafts"}
    if rec.family == "spec-phase" and not any(n in rec.values for n in PHASE_MS):
        raise MalformedLine("no phase timing (pre=, backbone=, sample= or sequential=)")
    missing = [n for n in _fields_of(rec) if n[0] in required and n[0] not in rec.values]
    if missing:
        raise MalformedLine("missing " + ", ".join(f"{n}=" for n, _ in missing))
    for name, kind in _fields_of(rec):
        v = rec.values.get(name)
        if kind.startswith("ids") and v is not None and not isinstance(v, Ids):
            raise MalformedLine(f"{name}= is not a [ ] id list")
        if not kind.startswith("ids") and isinstance(v, Ids):
            raise MalformedLine(f"{name}= is a [ ] list, expected a value")


def _render(rec: Record) -> str | None:
    """The line exactly as the engine would print ``rec`` (None when it cannot be known)."""
    if rec.variant == "no_rows":
        return f"[spec-propose] NO proposing rows this step (num_reqs={rec.values['num_reqs']})"
    parts = [f"[{rec.family}]"] + (["called"] if rec.variant == "called" else [])
    fields = tuple(f for f in _fields_of(rec) if f[0] in rec.values or f[0] not in OPTIONAL)
    if set(rec.values) != {n for n, _ in fields}:
        return None
    for name, kind in fields:
        v = rec.values[name]
        if kind == "floats_opt":  # each float as the line spells it (any float text)
            text = rec.spelled.get(name, "").strip("[]").split() or [f"{x:.3f}" for x in v]
            parts.append(f"{name}=[ {''.join(f'{x} ' for x in text)}]")
            continue
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


def phase_rows(rec: Record) -> list[tuple[str, object]]:
    """The phase timings of a ``[spec-phase]``, ``[spec-phase-dev]`` or ``[fwd-ops]`` record as
    ``(name, ms)`` rows (``dev.<x>`` for the device split, ``fwd-ops.<op>`` as ms shares of
    ``total``). A value may be missing or non-finite in an edited line: callers skip those."""
    v = rec.values
    if rec.family == "spec-phase":
        return [(n, v[n]) for n in PHASE_MS if n in v]
    if rec.family == "spec-phase-dev":
        return [(f"dev.{n}", v[n]) for n, _ in _DEV if n in v]
    total = v["total"]  # [fwd-ops]: shares of total, stored as ms
    return [("fwd-ops.total", total)] + [
        (f"fwd-ops.{n}", total * v[n] / 100.0)
        for n, kind in _FWD_OPS
        if kind == "pct" and isinstance(v.get(n), float)
    ]
