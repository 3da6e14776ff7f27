"""The bulk lexer of a whole ``VT_SPEC_TRACE`` log: bytes -> one family code per line and
numpy/list columns per line family, for :mod:`.bulk` (the fast import path).

Lines are classified by their first bytes, then every family's lines are read at once by
:func:`~.bulk_vec.read_fields` (numpy over the log's bytes). When it declines a family (a
line off the canonical format, a value out of range), that family's lines are joined and read
by ONE ``findall`` of a byte regex built from the canonical formats of :mod:`.lines`
(:data:`~.lines.FORMATS`), a little stricter than :func:`~.lines.parse_line`'s fast path
(numbers without leading zeros and at most 18 digits, request ids of printable ASCII). A line
the regex or a value-range check rejects, and any other line that may hold a tag, is handed to
:func:`~.lines.parse_line` (the exact path): a :class:`~.lines.MalformedLine` keeps today's
message, a line it reads as a record (an edited line) makes :func:`lex_log` give up.
"""

from __future__ import annotations

import mmap
import re
from dataclasses import dataclass, field
from typing import TypeAlias, cast

import numpy as np

from .bulk_vec import Buf, classify, has_at, read_fields
from .lines import (
    CANONICAL_MARGIN,
    FLOAT32_MAX,
    FORMATS,
    ID_RANGE,
    RANGES,
    MalformedLine,
    parse_line,
)

#: Bits of a line's step state ``seen`` (the bulk parser's step rules): propose, post_step,
#: update, install, sched, fwd-ops, phase-dev, phase, update_called.
SEEN_BITS = tuple(1 << i for i in range(9))

#: Per-line codes: 0 not a trace line, -1 a malformed trace line, else a (family, variant).
KEYS: tuple[tuple[str, str], ...] = (
    ("SPECTRACE", ""),
    ("spec-propose", ""),
    ("spec-propose", "no_rows"),
    ("spec-phase", "pre"),
    ("spec-phase", "old"),
    ("spec-phase", "dspark"),
    ("spec-phase-dev", ""),
    ("fwd-ops", ""),
    ("spec-sched", ""),
    ("spec-update", "req"),
    ("spec-update", "called"),
    ("spec-install", ""),
    ("spec-post_step", ""),
)
CODE = {k: i + 1 for i, k in enumerate(KEYS)}
_PREFIX = {
    b"[SPECTRACE] req": CODE["SPECTRACE", ""],
    b"[spec-propose] ": CODE["spec-propose", ""],
    b"[spec-phase] pr": CODE["spec-phase", "pre"],
    b"[spec-phase] ba": CODE["spec-phase", "old"],
    b"[spec-phase-dev": CODE["spec-phase-dev", ""],
    b"[fwd-ops] P=": CODE["fwd-ops", ""],
    b"[spec-sched] re": CODE["spec-sched", ""],
    b"[spec-update] r": CODE["spec-update", "req"],
    b"[spec-update] c": CODE["spec-update", "called"],
    b"[spec-install] ": CODE["spec-install", ""],
    b"[spec-post_step": CODE["spec-post_step", ""],
}
# Substrings without which a line can be no trace line (tags, tag-dropped payloads).
_MAYBE = (b"SPECTRACE", b"spec-", b"fwd-ops", b"req=", b"rows=", b"backbone=")
_NUM = rb"(0|-?[1-9]\d{0,17})"
_ID = rb"(?:0|-?[1-9]\d{0,17}) "
_KIND = {
    "str": rb"([!-~]+)",
    "int": _NUM,
    "arrow": _NUM,
    "ms": rb"(-?\d{1,30}\.\d\d)ms",
    "pct": rb"(-?\d{1,30}\.\d)%",
    "ids_sp": rb"\[ ((?:" + _ID + rb")*)\]",
    "ids": rb"\[((?:" + _ID + rb")*)\]",
}


class NotBulk(Exception):
    """The log needs the line-by-line parser (an edited or otherwise unusual line)."""


#: One lexed column, by field kind: int64 array [n] (integers), float64 array [n] (ms/%),
#: fixed-width bytes array [n] (``req``), or per-line float lists with ``None`` for a left-out
#: optional field (margins). Id lists live in :attr:`Family.ids`.
Column: TypeAlias = "np.ndarray | list[list[float] | None]"


def _ints(v: Column) -> np.ndarray:
    """An integer column (int64 [n]). Raises TypeError for a list column."""
    if not isinstance(v, np.ndarray):
        raise TypeError("not an integer column")
    return v


def _strs(v: Column) -> np.ndarray:
    """A ``str`` column (bytes array [n]). Raises TypeError for another column."""
    if not isinstance(v, np.ndarray) or v.dtype.kind != "S":
        raise TypeError("not a bytes column")
    return v


def _margins(v: Column) -> list[list[float] | None]:
    """An optional float-list column (``floats_opt``). Raises TypeError for an integer column."""
    if isinstance(v, np.ndarray):
        raise TypeError("not a float-list column")
    return v


@dataclass
class Family:
    """The lines of one (family, variant): 0-based line numbers and one column per field
    (int64 arrays for integers, float64 arrays for ms/%, a fixed-width bytes array for
    ``req``, per-line lists with ``None`` entries for an optional field left out) and the id
    lists."""

    lines: np.ndarray
    cols: dict[str, Column] = field(default_factory=dict)
    #: id-list field -> (every id, int64; ids per line, int64).
    ids: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def flat(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """``ids[name]``, empty arrays for a family without lines."""
        empty = np.zeros(0, np.int64)
        return self.ids.get(name, (empty, empty))

    def ints(self, name: str) -> np.ndarray:
        """Integer column ``name`` (int64 [n]); empty for a family without lines."""
        v = self.cols.get(name)
        return np.zeros(0, np.int64) if v is None else _ints(v)

    def strs(self, name: str) -> np.ndarray:
        """``str`` column ``name`` (bytes array [n]); empty for a family without lines."""
        return _strs(self.cols.get(name, np.zeros(0, "S1")))

    def margins(self, name: str) -> list[list[float] | None]:
        """Optional float-list column ``name``; empty for a family without lines."""
        return _margins(self.cols.get(name, []))


@dataclass
class Lexed:
    """A lexed log: ``codes`` int8 [n_lines] (see :data:`KEYS`), families by code, and the
    malformed lines as ``(lineno, message)`` in line order."""

    n_lines: int
    codes: np.ndarray
    families: dict[int, Family]
    malformed: list[tuple[int, str]]


#: The engine's margin spelling (one definition: the line path's canonical regex).
_MARGIN = CANONICAL_MARGIN.encode()


def _core(family: str, variant: str, fields: tuple[tuple[str, str], ...]) -> bytes:
    parts = [re.escape(f"[{family}]".encode())] + ([b"called"] if variant == "called" else [])
    tail = b""
    for name, kind in fields:
        if kind == "floats_opt":
            tail += rb"( " + re.escape(name.encode()) + rb"=\[ ((?:" + _MARGIN + rb" )*)\])?"
            continue
        arrow = b"-> " if kind == "arrow" else b""
        parts.append(arrow + re.escape(name.encode()) + b"=" + _KIND[kind])
    return b" ".join(parts) + tail


_NO_ROWS = rb"\[spec-propose\] NO proposing rows this step \(num_reqs=" + _NUM + rb"\)"


_FIELDS = {CODE[f, v]: fields for f, vs in FORMATS.items() for v, fields in vs}
_FIELDS[CODE["spec-propose", "no_rows"]] = (("num_reqs", "int"),)
_CORE = {c: _core(*KEYS[c - 1], f) for c, f in _FIELDS.items()}
_CORE[CODE["spec-propose", "no_rows"]] = _NO_ROWS
# Joined lines ("\n" + line + "\n" + ...): one match per canonical line; one line alone.
_JOINED = {c: re.compile(rb"\n" + p + rb"(?=\n)") for c, p in _CORE.items()}
_ONE = {c: re.compile(p + rb"\Z") for c, p in _CORE.items()}
# What each line of a family starts with, for the vectorised reader (no_rows: regex only).
_HEAD = {c: b"[%s]%s" % (KEYS[c - 1][0].encode(), b" called" if KEYS[c - 1][1] == "called" else b"")
         for c in _FIELDS if c != CODE["spec-propose", "no_rows"]}  # fmt: skip


#: Columns of a family that the bulk parser never reads (their lines are still checked).
_UNUSED = {
    CODE["spec-sched", ""]: ("num_new", "computed", "NumTokens", "placeholders"),
    CODE["spec-update", "req"]: ("found",),
    CODE["spec-update", "called"]: ("n",),
    CODE["spec-post_step", ""]: ("pulled", "rows"),
    CODE["spec-propose", ""]: ("rows",),
}

#: Bytes lexed at a time (cut at a line end): bounds the arrays alive per chunk.
CHUNK_BYTES = 4 << 20


def lex_log(data: bytes | mmap.mmap) -> Lexed:
    """Lex a whole log (``\\n``-separated bytes, no ``\\r``), :data:`CHUNK_BYTES` at a time.

    Raises:
        NotBulk: a line :func:`~.lines.parse_line` reads as a record that is not canonical.
    """
    parts: list[Lexed] = []
    start = n_lines = 0
    while start < len(data):
        end = data.find(b"\n", min(start + CHUNK_BYTES, len(data)) - 1)
        end = len(data) if end < 0 else end + 1
        part = _lex_chunk(data, start, end, n_lines)
        parts.append(part)
        n_lines += part.n_lines
        start = end
    return _concat(parts, n_lines)


def _lex_chunk(whole: bytes | mmap.mmap, start: int, end: int, first: int) -> Lexed:
    """Lex the lines of ``whole[start:end]``; line numbers (0-based) start at ``first``."""
    buf = Buf(whole, start, end)
    data = memoryview(whole)[start:end]
    starts, ends = buf.starts, buf.ends
    codes = _classify(buf, data, starts, ends)
    families: dict[int, Family] = {}
    slow: list[int] = []
    for code in range(1, len(KEYS) + 1):
        idx = np.flatnonzero(codes == code)
        if len(idx):
            bounds = (buf, data, idx)
            fam, bad = _lex_family(code, bounds, idx + first)
            families[code] = fam
            slow += [i - first for i in bad]
    line = _Line(data, starts, ends)
    slow += [i for i in np.flatnonzero(codes == 0).tolist() if _maybe_trace(line[i])]
    malformed = []
    for i in sorted(slow):
        msg = _slow_line(line[i])
        codes[i] = 0 if msg is None else -1
        if msg is not None:
            malformed.append((first + i + 1, msg))
    return Lexed(len(starts), codes, families, malformed)


class _Line:
    """``line[i]``: the bytes of line i of a chunk (its bounds: int64 arrays)."""

    def __init__(self, data: memoryview, starts: np.ndarray, ends: np.ndarray) -> None:
        self.data, self.starts, self.ends = data, starts, ends

    def __getitem__(self, i: int) -> bytes:
        return bytes(self.data[int(self.starts[i]) : int(self.ends[i])])


def _concat(parts: list[Lexed], n_lines: int) -> Lexed:
    """The chunks' results as one :class:`Lexed` (columns concatenated in line order)."""
    if len(parts) == 1:
        return parts[0]
    if not parts:  # an empty log
        return Lexed(0, np.zeros(0, np.int8), {}, [])
    families: dict[int, Family] = {}
    for code in sorted({c for p in parts for c in p.families}):
        fams = [p.families[code] for p in parts if code in p.families]
        cols: dict[str, Column] = {}
        for name, v in list(fams[0].cols.items()):  # each chunk's column dropped once joined
            if isinstance(v, np.ndarray):
                cols[name] = np.concatenate([_ints(f.cols.pop(name)) for f in fams])
            else:  # the same kind of list as ``v`` (mypy cannot tie the element types)
                cols[name] = cast(Column, [x for f in fams for x in f.cols.pop(name)])
        ids = {}
        for name in list(fams[0].ids):
            got = [f.ids.pop(name) for f in fams]
            ids[name] = (np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got]))
            del got
        families[code] = Family(np.concatenate([f.lines for f in fams]), cols, ids)
    codes = np.concatenate([p.codes for p in parts])
    return Lexed(n_lines, codes, families, [m for p in parts for m in p.malformed])


def _classify(buf: Buf, data: memoryview, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    codes = classify(buf, starts, ends, _PREFIX)
    line = _Line(data, starts, ends)
    for i in np.flatnonzero(codes == CODE["spec-phase", "old"]).tolist():
        if b" sequential=" in line[i]:
            codes[i] = CODE["spec-phase", "dspark"]
    prop = np.flatnonzero(codes == CODE["spec-propose", ""])
    no = has_at(buf, starts[prop] + 15, b"NO")
    codes[prop[no]] = CODE["spec-propose", "no_rows"]
    return codes


def _maybe_trace(line: bytes) -> bool:
    return any(t in line for t in _MAYBE)


def _slow_line(line: bytes) -> str | None:
    """The exact parser's verdict on one line: None (no trace line) or the malformed-line
    message. Raises NotBulk when it reads the line as a record."""
    try:
        rec = parse_line(line.decode("utf-8", "surrogateescape"))  # as the line path
    except MalformedLine as exc:
        return f"malformed trace line: {exc}"
    if rec is not None:
        raise NotBulk("an edited trace line")
    return None


def _lex_family(code: int, bounds: tuple, idx: np.ndarray) -> tuple[Family, list[int]]:
    """Read one family's lines (``bounds``: the chunk as :class:`~.bulk_vec.Buf` and bytes,
    the lines' starts and ends); returns its columns and the lines for the exact path. The
    vectorised reader first (:func:`~.bulk_vec.read_fields`), the byte regex when it
    declines."""
    buf, data, at = bounds
    got = None
    if code in _HEAD:
        got = read_fields(buf, at, _HEAD[code], _FIELDS[code])
    bad: list[int] = []
    if got is not None and _in_range(code, got[0], got[1], len(at)).all():
        fam = Family(idx, *got)
    else:
        spans = zip(buf.starts[at].tolist(), buf.ends[at].tolist())
        fam, bad = _regex_family(code, [bytes(data[s:e]) for s, e in spans], idx)
    for name in _UNUSED.get(code, ()):  # checked, then dropped: nothing reads them
        del fam.cols[name]
    return fam, bad


def _regex_family(code: int, lines: list[bytes], idx: np.ndarray) -> tuple[Family, list[int]]:
    """One family's lines read by its byte regex; returns its columns and the lines for the
    exact path."""
    groups = _JOINED[code].findall(b"\n" + b"\n".join(lines) + b"\n")
    ok = np.ones(len(lines), dtype=bool)
    if len(groups) != len(lines):  # some lines are not canonical: find them one by one
        ms = [_ONE[code].match(ln) for ln in lines]
        ok = np.array([m is not None for m in ms], dtype=bool)
        groups = [m.groups() for m in ms if m is not None]
    if not isinstance(groups[0] if groups else (), tuple):
        groups = [(g,) for g in groups]
    cols, raw = _columns(_FIELDS[code], groups)
    ids = {n: flatten(r) for n, r in raw.items()}
    good = _in_range(code, cols, ids, len(groups))
    keep = np.flatnonzero(ok)
    bad = idx[np.flatnonzero(~ok)].tolist() + idx[keep[~good]].tolist()
    if not good.all():
        cols = {n: _take(v, good) for n, v in cols.items()}
        ids = {n: flatten(_take_list(r, good)) for n, r in raw.items()}
    return Family(idx[keep[good]], cols, ids), bad


def _columns(
    fields: tuple[tuple[str, str], ...], groups: list[tuple]
) -> tuple[dict[str, Column], dict[str, list[bytes]]]:
    """Regex groups -> columns (as :func:`~.bulk_vec.read_fields` gives them) and the raw
    text of each id list (for :func:`flatten`)."""
    cols: dict[str, Column] = {}
    raw_ids: dict[str, list[bytes]] = {}
    raw = list(zip(*groups)) if groups else [()] * (len(fields) + 1)
    g = 0
    for name, kind in fields:
        col = raw[g]
        g += 1
        if kind == "floats_opt":
            inner = raw[g]
            g += 1
            cols[name] = [
                [float(x) for x in b.split()] if outer else None for outer, b in zip(col, inner)
            ]
        elif kind.startswith("ids"):
            raw_ids[name] = list(col)
        elif kind == "str":
            cols[name] = np.array(list(col), dtype="S")
        elif kind in ("ms", "pct"):
            cols[name] = np.array(list(map(float, col)), dtype=np.float64)
        else:
            cols[name] = np.array(list(map(int, col)), dtype=np.int64)
    return cols, raw_ids


def _in_range(
    code: int, cols: dict[str, Column], ids: dict[str, tuple[np.ndarray, np.ndarray]], n: int
) -> np.ndarray:
    """Rows whose values fit their trace columns (the rest: the exact path's message)."""
    good = np.ones(n, dtype=bool)
    for name, v in cols.items():
        if isinstance(v, np.ndarray) and v.dtype.kind == "i":
            lo, hi = RANGES.get(name, (-(2**63), 2**63 - 1))
            good &= (v >= lo) & (v <= hi)
        elif isinstance(v, np.ndarray) and v.dtype.kind == "f":
            good &= np.abs(v) <= FLOAT32_MAX
    for name in ids:
        good &= _ids_fit(*ids[name])
    if "margin" in cols:
        first = ids["first"][1].tolist()
        good &= np.array(
            [
                m is None or (len(m) == f and all(abs(x) <= FLOAT32_MAX for x in m))
                for m, f in zip(_margins(cols["margin"]), first)
            ],
            dtype=bool,
        )
    if code == CODE["SPECTRACE", ""]:
        good &= _ints(cols["acc"]) <= ids["draft"][1]
    return good


def _ids_fit(flat: np.ndarray, lens: np.ndarray) -> np.ndarray:
    lo, hi = ID_RANGE
    bad = (flat < lo) | (flat > hi)
    if not bad.any():
        return np.ones(len(lens), dtype=bool)
    row = np.repeat(np.arange(len(lens)), lens)
    return ~np.bincount(row[bad], minlength=len(lens)).astype(bool)


def flatten(raws: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Id lists as written (``b"318 351 372 63 "``) -> (every id, int64; ids per list)."""
    lens = np.array([b.count(b" ") for b in raws], dtype=np.int64)
    flat = np.array(list(map(int, b"".join(raws).split())), dtype=np.int64)
    return flat, lens


def _take(v: Column, good: np.ndarray) -> Column:
    """The rows of ``v`` where ``good`` (bool [n]), as the same kind of column."""
    if isinstance(v, np.ndarray):
        return v[good]
    return cast(Column, _take_list(v, good))  # same list kind as v


def _take_list(v: list, good: np.ndarray) -> list:
    return [x for x, g in zip(v, good.tolist()) if g]
