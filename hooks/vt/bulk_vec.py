"""Vectorised reading of canonical ``VT_SPEC_TRACE`` lines, for :mod:`.bulk_lex`: no Python
object per line or field, and no numpy operation per byte of a line (a few per field).

A chunk of the log is held as :class:`Buf`: its bytes with zero padding and an unaligned
little-endian uint64 view (``words[p]``: the 8 bytes from ``p``), so a field's name is tested
and its digits are parsed 8 bytes at a time (SWAR), and the positions of its separators
(spaces and ``\\n``), so each line's cursor moves field by field. :func:`read_fields` reads
all lines of one family at once by walking their canonical format (:data:`~.lines.FORMATS`).
It accepts exactly what the byte regex of :mod:`.bulk_lex` accepts or gives up (None) for
the whole family, and the regex reads it then: it never accepts a line that regex rejects,
and the values it returns are the ones the regex groups convert to (ints as ``int()``,
``ms``/``%`` as ``float()``: an exact integer over 100 or 10 rounds the same).
"""

from __future__ import annotations

import numpy as np

_U = np.uint64
_OFF = 8  # bytes of padding before the chunk (words[p - 8] stays in bounds)
_TAIL = 128  # and after it: reads a little past a line that does not match stay in bounds
#: Digits parsed at most (longer: the regex path); the regex allows 18.
_MAX_DIGITS = 16
#: ``ms``/``%`` integer parts longer than this go to the regex path: the value as an exact
#: integer over 100 (10) must stay below 2**53 to round like ``float()``.
_FLOAT_DIGITS = 13
#: Widest request id read here, in bytes (longer: the regex path).
_STR_W = 64
_LOW = np.array([(1 << (8 * m)) - 1 for m in range(9)], dtype=_U)  # the low m bytes
_B = {x: _U(int.from_bytes(bytes([x]) * 8, "little")) for x in (0x01, 0x06, 0x30, 0x5F)}
_F0, _H80 = _U(0xF0F0F0F0F0F0F0F0), _U(0x8080808080808080)
_X7F = _U(0x7F7F7F7F7F7F7F7F)
_POW = 10 ** np.arange(0, 19, dtype=np.int64)


class Buf:
    """A chunk's bytes for the vectorised reader (positions: bytes from the chunk's start).

    Attributes:
        words: uint64: the 8 bytes from each position (little-endian; see :meth:`word`).
        sep: positions of every space and ``\\n`` (int64), then the chunk's length.
        rb: positions of every ``]`` (int64), then the chunk's length.
    """

    def __init__(self, data: bytes) -> None:
        n = len(data)
        self.n = n
        pad = np.frombuffer(b"\x00" * _OFF + data + b"\x00" * _TAIL, np.uint8)
        self.words = np.ndarray((len(pad) - 7,), "<u8", pad, 0, (1,))  # words[p + _OFF]: p
        a = pad[_OFF : _OFF + n]
        self.a = a
        self.sep = np.concatenate([np.flatnonzero((a == 32) | (a == 10)), [n]]).astype(np.int64)
        self.rb = np.concatenate([np.flatnonzero(a == 93), [n]]).astype(np.int64)

    def word(self, p: np.ndarray) -> np.ndarray:
        """The 8 bytes from each position ``p`` (int64 [k], -8 <= p <= len) as uint64."""
        return self.words[p + _OFF]

    def byte(self, p: np.ndarray) -> np.ndarray:
        return self.words[p + _OFF] & _U(0xFF)


def line_bounds(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends (int64 [n], end exclusive of ``\\n``) of the lines of ``a`` (uint8),
    as ``bytes.split(b"\\n")`` cuts them, less a last empty line."""
    nl = np.flatnonzero(a == 10)
    starts = np.concatenate([[0], nl + 1]).astype(np.int64)
    ends = np.concatenate([nl, [len(a)]]).astype(np.int64)
    if len(starts) and starts[-1] == len(a):
        starts, ends = starts[:-1], ends[:-1]
    return starts, ends


def has_at(buf: Buf, at: np.ndarray, ends: np.ndarray, lit: bytes) -> np.ndarray:
    """Whether each line holds ``lit`` at ``at`` (before its end ``ends``), bool [n]."""
    ok = at + len(lit) <= ends
    for k in range(0, len(lit), 8):
        piece = lit[k : k + 8]
        mask = _LOW[len(piece)]
        ok &= (buf.word(at + k) & mask) == _U(int.from_bytes(piece, "little"))
    return ok


def classify(buf: Buf, starts: np.ndarray, ends: np.ndarray, prefix: dict) -> np.ndarray:
    """Family code (int8 [n]) by each line's first 15 bytes, else its first 12 (``prefix``:
    bytes -> code, keys of 15 or 12 bytes; lines shorter than a key never match it)."""
    codes = np.zeros(len(starts), np.int8)
    w0 = buf.word(starts)
    for key, code in prefix.items():  # keys share few first words: test those first
        hit = (codes == 0) & (w0 == _U(int.from_bytes(key[:8], "little")))
        rows = np.flatnonzero(hit)
        rest = key[8:]
        ok = has_at(buf, starts[rows] + 8, ends[rows], rest)
        codes[rows[ok]] = code
    return codes


def _digits(buf: Buf, end: np.ndarray, nd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ``nd`` (0 to 8) bytes before ``end``: whether all are ASCII digits, their value."""
    low = _LOW[8 - nd]
    x = (buf.word(end - 8) & ~low) | (_B[0x30] & low)  # bytes before the digits: "0"
    ok = ((x & _F0) == _B[0x30]) & (((x + _B[0x06]) & _F0) == _B[0x30])
    x = x - _B[0x30]
    x = (x * _U(10) + (x >> _U(8))) & _U(0x00FF00FF00FF00FF)
    x = (x * _U(100) + (x >> _U(16))) & _U(0x0000FFFF0000FFFF)
    x = (x * _U(10000) + (x >> _U(32))) & _U(0xFFFFFFFF)
    return ok, x.astype(np.int64)


def _number(buf: Buf, lo: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``a[lo:end]`` as 1 to 16 digits: (ok, value int64)."""
    nd = end - lo
    ok = (nd >= 1) & (nd <= _MAX_DIGITS)
    nd = np.clip(nd, 0, _MAX_DIGITS)
    ok_lo, v_lo = _digits(buf, end, np.minimum(nd, 8))
    ok_hi, v_hi = _digits(buf, end - 8, np.maximum(nd - 8, 0))
    return ok & ok_lo & ok_hi, v_hi * 100_000_000 + v_lo


class _Long(Exception):
    """A value this path does not read (the regex path does)."""


def _int(buf: Buf, c: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The canonical integer ``0|-?[1-9]\\d{0,17}`` spanning ``a[c:end]``: (ok, value)."""
    neg = buf.byte(c) == 45
    lo = c + neg
    if ((end - lo > _MAX_DIGITS) & (end - lo <= 18)).any():
        raise _Long
    ok, val = _number(buf, lo, end)
    ok &= (buf.byte(lo) != 48) | ((end - lo == 1) & ~neg)
    return ok, np.where(neg, -val, val)


def _float(buf: Buf, c: np.ndarray, end: np.ndarray, kind: str):
    """``-?\\d{1,30}\\.\\d\\d`` + ``ms`` (or ``-?\\d{1,30}\\.\\d`` + ``%``) spanning
    ``a[c:end]``: (ok, value as ``float()`` reads it)."""
    suffix, frac = (b"ms", 2) if kind == "ms" else (b"%", 1)
    ok = has_at(buf, end - len(suffix), end, suffix)
    dot = end - len(suffix) - frac - 1
    neg = buf.byte(c) == 45
    lo = c + neg
    ok &= (dot - lo >= 1) & (dot > c) & (buf.byte(dot) == 46)
    if (ok & (dot - lo > _FLOAT_DIGITS)).any():
        raise _Long
    ok_i, ip = _number(buf, lo, dot)
    ok_f, fp = _digits(buf, end - len(suffix), np.full(len(c), frac))
    scale = 10**frac
    val = (ip * scale + fp) / float(scale)
    return ok & ok_i & ok_f, np.where(neg, -val, val)


def _str(buf: Buf, c: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[!-~]+`` spanning ``a[c:end]``: (ok, fixed-width bytes array [n])."""
    n = end - c
    w = int(n.max()) if len(n) else 1
    if w > _STR_W:
        raise _Long
    k = max(-(-w // 8), 1)
    out = np.zeros((len(c), k), _U)
    ok = n >= 1
    for j in range(k):
        low = _LOW[np.clip(n - 8 * j, 0, 8)]
        x = buf.word(c + 8 * j)
        t = (x & low) | (_B[0x30] & ~low)  # bytes past the id: a printable stand-in
        t7 = t & _X7F
        bad = (t & _H80) | (~(t7 + _B[0x5F]) & _H80) | ((t7 + _B[0x01]) & _H80)
        ok &= bad == 0
        out[:, j] = x & low
    return ok, out.view(f"S{8 * k}").ravel()


class _Cursor:
    """One read position per line of a family: ``c`` (a byte) and ``r`` (the index in
    ``buf.sep`` of the first separator at or after ``c``); ``ok`` while the line matches."""

    def __init__(self, buf: Buf, starts: np.ndarray, ends: np.ndarray) -> None:
        self.buf, self.c, self.e = buf, starts.copy(), ends
        self.r = np.searchsorted(buf.sep, starts)
        self.ok = np.ones(len(starts), dtype=bool)

    def sep(self, r: np.ndarray) -> np.ndarray:
        return self.buf.sep[np.minimum(r, len(self.buf.sep) - 1)]

    def literal(self, lit: bytes) -> None:
        """``lit`` at the cursor; its spaces are the next separators."""
        self.ok &= has_at(self.buf, self.c, self.e, lit)
        for o in [i for i, ch in enumerate(lit) if ch == 32]:
            self.ok &= self.sep(self.r) == self.c + o
            self.r = self.r + 1
        self.c = self.c + len(lit)

    def value(self) -> np.ndarray:
        """End of the value at the cursor (its next separator)."""
        return np.maximum(self.sep(self.r), self.c)


def _ids(cur: _Cursor) -> tuple[np.ndarray, np.ndarray]:
    """``((?:ID )*)\\]`` at the cursor: every id (int64) and ids per line; moves past ``]``."""
    buf, c = cur.buf, cur.c
    q = np.maximum(buf.rb[np.minimum(np.searchsorted(buf.rb, c), len(buf.rb) - 1)], c)
    cur.ok &= q < cur.e  # the closing "]"
    lens = np.maximum(np.searchsorted(buf.sep, q) - cur.r, 0)  # every id ends with a space
    last = cur.sep(cur.r + lens - 1)
    cur.ok &= np.where(lens > 0, last == q - 1, q == c)
    offs = np.cumsum(lens) - lens
    ends = cur.sep(np.repeat(cur.r - offs, lens) + np.arange(int(lens.sum())))
    starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)
    starts[offs[lens > 0]] = c[lens > 0]
    ok, flat = _int(buf, starts, ends)
    bad = np.bincount(np.repeat(np.arange(len(c)), lens)[~ok], minlength=len(c))
    cur.ok &= bad == 0
    cur.c, cur.r = q + 1, cur.r + lens
    return flat, lens


def read_fields(buf: Buf, starts: np.ndarray, ends: np.ndarray, head: bytes, fields: tuple):
    """Columns of a family whose lines are ``head`` then ``fields`` (canonical kinds), or None
    when a line does not match (or holds a value this path leaves to the regex).

    Args:
        buf: the chunk; starts, ends: the family's lines in it (int64 [n]).
    Returns:
        ``(cols, ids)``: name -> int64 [n] (int, arrow), float64 [n] (ms, pct), fixed-width
        bytes [n] (str), list of None (an optional ``floats_opt`` left out on every line);
        ids: name -> (every id, int64; ids per line, int64).
    """
    cur = _Cursor(buf, starts, ends)
    cur.literal(head)
    cols: dict = {}
    ids: dict = {}
    try:
        for name, kind in fields:
            if kind == "floats_opt":  # present on some line: the regex path reads it
                cur.ok &= cur.c == cur.e
                cols[name] = [None] * len(starts)
                continue
            arrow = "-> " if kind == "arrow" else ""
            brack = {"ids_sp": "[ ", "ids": "["}.get(kind, "")
            cur.literal(f" {arrow}{name}={brack}".encode())
            if kind.startswith("ids"):
                ids[name] = _ids(cur)
                continue
            end = cur.value()
            if kind == "str":
                ok, cols[name] = _str(buf, cur.c, end)
            elif kind in ("ms", "pct"):
                ok, cols[name] = _float(buf, cur.c, end, kind)
            else:
                ok, cols[name] = _int(buf, cur.c, end)
            cur.ok &= ok
            cur.c = end
            if not cur.ok.all():
                return None
    except _Long:
        return None
    cur.ok &= cur.c == cur.e
    return (cols, ids) if cur.ok.all() else None
