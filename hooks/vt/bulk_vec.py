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

import mmap

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


class Buf:
    """A chunk's bytes for the vectorised reader (positions: bytes from the chunk's start).

    Attributes:
        words: uint64: the 8 bytes from each position (little-endian; see :meth:`word`).
        a: the chunk's bytes (uint8 [len]).
        sep: positions of every space and ``\\n`` (int64), then the chunk's length (repeated:
            a cursor past a line that does not match stays in bounds).
        starts, ends: the lines (int64 [n], end exclusive of ``\\n``), as
            ``bytes.split(b"\\n")`` cuts them, less a last empty line.
        first_sep: index in ``sep`` of each line's first separator (int64 [n]).
        rb, rb_sep: positions of every ``]`` just before a separator, then the chunk's
            length, and the index in ``sep`` of that separator.
    """

    def __init__(self, data: bytes | mmap.mmap, start: int, end: int) -> None:
        n = self.n = end - start
        pad = np.empty(_OFF + n + _TAIL, np.uint8)  # one copy of the chunk, zero padded
        pad[:_OFF], pad[_OFF + n :] = 0, 0
        pad[_OFF : _OFF + n] = np.frombuffer(data, np.uint8, n, start)
        self.words = np.ndarray((len(pad) - 7,), "<u8", pad, 0, (1,))  # words[p + _OFF]: p
        a = self.a = pad[_OFF : _OFF + n]
        is_sep = a == 32
        is_sep |= a == 10
        sep = np.flatnonzero(is_sep)
        self.sep = np.concatenate([sep, [n] * _TAIL])
        nl = np.flatnonzero(a[sep] == 10)  # the lines' ends, as indexes in sep
        # A list's "]" ends its token: the byte before a separator (a "]" elsewhere is in a
        # token that cannot be an id, so the reader rejects that line anyway).
        after = np.flatnonzero(pad[_OFF - 1 :][self.sep[: len(sep) + 1]] == 93)
        if n and a[-1] != 10:  # a last line without "\n" ends at the first sentinel
            nl = np.concatenate([nl, [len(sep)]])
        self.ends = self.sep[nl]
        self.starts = np.concatenate([[0], self.ends[:-1] + 1]).astype(np.int64, copy=False)
        self.first_sep = np.concatenate([[0], nl[:-1] + 1]).astype(np.int64, copy=False)
        self.rb = np.concatenate([self.sep[after] - 1, [n]])
        self.rb_sep = np.concatenate([after, [len(sep)]])

    def word(self, p: np.ndarray) -> np.ndarray:
        """The 8 bytes from each position ``p`` (int64 [k], -8 <= p <= len) as uint64."""
        return self.words[p + _OFF]

    def byte(self, p: np.ndarray) -> np.ndarray:
        return self.words[p + _OFF] & _U(0xFF)


def has_at(buf: Buf, at: np.ndarray, lit: bytes) -> np.ndarray:
    """Whether each line holds ``lit`` at ``at``, bool [n] (``lit`` holds no ``\n`` and no
    NUL, so it never matches across a line's end or the chunk's padding)."""
    ok = np.ones(len(at), bool)
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
    groups: dict[bytes, list[tuple[bytes, int]]] = {}
    for key, code in prefix.items():  # keys share few first words: one pass per word
        groups.setdefault(key[:8], []).append((key[8:], code))
    for first, keys in groups.items():
        rows = np.flatnonzero(w0 == _U(int.from_bytes(first, "little")))
        for rest, code in keys:  # in the order given: the first key that matches wins
            todo = rows[codes[rows] == 0]
            codes[todo[has_at(buf, starts[todo] + 8, rest)]] = code
    return codes


def _digits(
    buf: Buf, end: np.ndarray, nd: np.ndarray, x: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The ``nd`` (0 to 8) bytes before ``end``: whether all are ASCII digits, their value
    (``x``: those 8 bytes, ``a[end - 8:end]`` as uint64, when the caller holds them)."""
    low = _LOW[8 - nd]
    x = buf.word(end - 8) if x is None else x
    x = (x & ~low) | (_B[0x30] & low)  # bytes before the digits: "0"
    ok = ((x & _F0) == _B[0x30]) & (((x + _B[0x06]) & _F0) == _B[0x30])
    x = x - _B[0x30]
    x = (x * _U(10) + (x >> _U(8))) & _U(0x00FF00FF00FF00FF)
    x = (x * _U(100) + (x >> _U(16))) & _U(0x0000FFFF0000FFFF)
    x = (x * _U(10000) + (x >> _U(32))) & _U(0xFFFFFFFF)
    return ok, x.astype(np.int64)


def _number(
    buf: Buf, lo: np.ndarray, end: np.ndarray, last: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``a[lo:end]`` as 1 to 16 digits: (ok, value int64); ``last``: ``a[end - 8:end]``."""
    nd = end - lo
    ok = (nd >= 1) & (nd <= _MAX_DIGITS)
    nd = np.clip(nd, 0, _MAX_DIGITS)
    ok_lo, v_lo = _digits(buf, end, np.minimum(nd, 8), last)
    if not (nd > 8).any():
        return ok & ok_lo, v_lo
    ok_hi, v_hi = _digits(buf, end - 8, np.maximum(nd - 8, 0))
    return ok & ok_lo & ok_hi, v_hi * 100_000_000 + v_lo


class _Long(Exception):
    """A value this path does not read (the regex path does)."""


def _int(buf: Buf, c: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The canonical integer ``0|-?[1-9]\\d{0,17}`` spanning ``a[c:end]``: (ok, value)."""
    w = buf.word(c)
    first = w & _U(0xFF)
    neg = first == 45
    lo = c + neg
    nd = end - lo
    if ((nd > _MAX_DIGITS) & (nd <= 18)).any():
        raise _Long
    lead = np.where(neg, (w >> _U(8)) & _U(0xFF), first)
    span = end - c
    last = None
    if (span <= 8).all():  # the digits lie in w: right-align them
        last = w << ((8 - np.clip(span, 1, 8)) * 8).astype(_U)
    ok, val = _number(buf, lo, end, last)
    ok &= (lead != 48) | ((nd == 1) & ~neg)
    return ok, np.where(neg, -val, val)


#: For :func:`_uint` by digit count m (0 to 8; 9: more): the high m bytes of a word, and the
#: least value of m digits without a leading zero (m = 0 or 9: none, so they fail).
_HIGH = np.array([((1 << 64) - 1) ^ ((1 << (8 * (8 - m))) - 1) for m in range(9)] + [0], _U)
_LEAST = np.array([1 << 62, 0] + [10 ** (m - 1) for m in range(2, 9)] + [1 << 62], np.int64)
_M16, _M32 = _U(0x00FF00FF00FF00FF), _U(0x0000FFFF0000FFFF)
_X10, _X100, _X10K = _U(1 + (10 << 8)), _U(1 + (100 << 16)), _U(1 + (10000 << 32))


def _uint(buf: Buf, c: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The common case of :func:`_int`: ``[1-9]\\d{0,7}|0`` spanning ``a[c:end]``, read from
    the one word that ends at ``end``: (ok, value); ok is False for anything else (a sign,
    more than 8 digits), which :func:`_int` decides then."""
    m = np.clip(end - c, 0, 9)
    z = (buf.words[end + (_OFF - 8)] ^ _B[0x30]) & _HIGH[m]  # digits -> 0..9, the rest 0
    ok = ((z | (z + _B[0x06])) & _F0) == 0  # every byte kept is 0..9
    # Pairs, quads, then all 8 digits (the first digit is the lowest byte): three multiplies.
    z = (z * _X10) >> _U(8)
    z = ((z & _M16) * _X100) >> _U(16)
    val = (((z & _M32) * _X10K) >> _U(32)).view(np.int64)
    ok &= val >= _LEAST[m]  # a leading zero, or no digit / more than 8: too small
    return ok, val


def _int_fast(buf: Buf, c: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_int` (same verdicts and values, same :class:`_Long`), by :func:`_uint` first
    and :func:`_int` for the values it leaves."""
    ok, val = _uint(buf, c, end)
    rest = np.flatnonzero(~ok)
    if len(rest):
        ok[rest], val[rest] = _int(buf, c[rest], end[rest])
    return ok, val


def _float(buf: Buf, c: np.ndarray, end: np.ndarray, kind: str):
    """``-?\\d{1,30}\\.\\d\\d`` + ``ms`` (or ``-?\\d{1,30}\\.\\d`` + ``%``) spanning
    ``a[c:end]``: (ok, value as ``float()`` reads it)."""
    suffix, frac = (b"ms", 2) if kind == "ms" else (b"%", 1)
    ok = has_at(buf, end - len(suffix), suffix)
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

    def __init__(self, buf: Buf, lines: np.ndarray) -> None:
        self.buf, self.c, self.e = buf, buf.starts[lines], buf.ends[lines]
        self.r = buf.first_sep[lines]
        self.ok = np.ones(len(lines), dtype=bool)

    def sep(self, r: np.ndarray) -> np.ndarray:
        return self.buf.sep[r]

    def literal(self, lit: bytes) -> None:
        """``lit`` (no space) at the cursor."""
        self.ok &= has_at(self.buf, self.c, lit)
        self.c = self.c + len(lit)

    def next_token(self) -> None:
        """Past the separator at the cursor (a space, or the line's ``\n`` when it is the
        last): to the next token's start."""
        self.ok &= self.sep(self.r) == self.c
        self.c, self.r = self.c + 1, self.r + 1


def _template(head: bytes, fields: tuple) -> list[tuple]:
    """A family's canonical line as steps: ``("run", [(prefix, kind or None), ...])`` for
    tokens read side by side (``None``: the token is the prefix), ``("ids", name, glued)``
    for an id list (``glued``: its first id follows ``[`` without a space), ``("opt", name)``
    for an optional trailing field."""
    steps: list[tuple] = []
    run: list[tuple[bytes, str | None]] = [(t, None) for t in head.split(b" ")]
    for name, kind in fields:
        key = name.encode() + b"="
        if kind == "floats_opt":
            steps += [("run", run)] if run else []
            steps.append(("opt", name))
            run = []
        elif kind == "ids_sp":
            steps += [("run", run + [(key + b"[", None)]), ("ids", name, False)]
            run = []
        elif kind == "ids":
            steps += [("run", run)] if run else []
            steps.append(("ids", name, key + b"["))
            run = []
        else:
            run += [(b"->", None)] if kind == "arrow" else []
            run.append((key, kind))
    return steps + ([("run", run)] if run else [])


_TEMPLATES: dict[tuple, list[tuple]] = {}


class _RunSpec:
    """A run's tokens as arrays, built once per run (``toks`` as in :func:`_run`)."""

    def __init__(self, toks: list) -> None:
        heads = [p[:8] for p, _ in toks]
        self.mask = _LOW[[len(h) for h in heads]][:, None]
        self.want = np.array([int.from_bytes(h, "little") for h in heads], _U)[:, None]
        # The rest of a name longer than 8 bytes: (token, offset, mask, bytes) per 8 bytes.
        self.tails = [
            (j, o, _LOW[len(p[o : o + 8])], _U(int.from_bytes(p[o : o + 8], "little")))
            for j, (p, _) in enumerate(toks)
            for o in range(8, len(p), 8)
        ]
        self.lits = [j for j, (_, kind) in enumerate(toks) if kind is None]
        self.lit_len = np.array([len(toks[j][0]) for j in self.lits], np.int64)[:, None]
        self.ints = [j for j, (_, kind) in enumerate(toks) if kind in ("int", "arrow")]
        self.int_len = np.array([len(toks[j][0]) for j in self.ints], np.int64)[:, None]
        self.other = [(j, p, kind) for j, (p, kind) in enumerate(toks) if kind in _OTHER]


_OTHER = ("str", "ms", "pct")
_SPECS: dict[tuple, _RunSpec] = {}


def _run(cur: _Cursor, toks: list, cols: dict, names: list) -> None:
    """Tokens ``toks`` side by side from the cursor (at a token's start); leaves it at the
    start of the next token. Arrays are [token, line]: one contiguous row per token."""
    buf, k = cur.buf, len(toks)
    spec = _SPECS.get(key := tuple(toks))
    if spec is None:
        spec = _SPECS[key] = _RunSpec(toks)
    ends = cur.sep(cur.r + np.arange(k)[:, None])  # [k, n]: token j ends at sep[r + j]
    starts = np.empty_like(ends)
    starts[0] = cur.c
    np.add(ends[:-1], 1, out=starts[1:])
    ok = ((buf.words[starts + _OFF] & spec.mask) == spec.want).all(0)
    for j, o, mask, piece in spec.tails:
        ok &= (buf.words[starts[j] + (_OFF + o)] & mask) == piece
    if spec.lits:
        ok &= ((ends[spec.lits] - starts[spec.lits]) == spec.lit_len).all(0)
    if spec.ints:
        e = ends[spec.ints]
        good, vals = _int_fast(buf, (starts[spec.ints] + spec.int_len).ravel(), e.ravel())
        ok &= good.reshape(e.shape).all(0)
        vals = vals.reshape(e.shape)
        for i, j in enumerate(spec.ints):
            cols[names[j]] = vals[i]
    for j, p, kind in spec.other:
        if kind == "str":
            got, cols[names[j]] = _str(buf, starts[j] + len(p), ends[j])
        else:
            got, cols[names[j]] = _float(buf, starts[j] + len(p), ends[j], kind)
        ok &= got
    cur.ok &= ok
    cur.c, cur.r = ends[-1] + 1, cur.r + k


def _ids(cur: _Cursor) -> tuple[np.ndarray, np.ndarray]:
    """``((?:ID )*)\\]`` at the cursor: every id (int64) and ids per line; moves past ``]``."""
    buf, c = cur.buf, cur.c
    at = np.minimum(np.searchsorted(buf.rb, c), len(buf.rb) - 1)
    q = np.maximum(buf.rb[at], c)
    cur.ok &= q < cur.e  # the closing "]"
    lens = np.maximum(buf.rb_sep[at] - cur.r, 0)  # every id ends with a space
    last = cur.sep(cur.r + lens - 1)
    cur.ok &= np.where(lens > 0, last == q - 1, q == c)
    if len(lens) and lens[0] > 0 and (lens == lens[0]).all():  # as many ids on every line
        ends = cur.sep(cur.r + np.arange(int(lens[0]))[:, None])  # [id, line]
        starts = np.empty_like(ends)
        starts[0] = c
        np.add(ends[:-1], 1, out=starts[1:])
        ok, flat = _int_fast(buf, starts.ravel(), ends.ravel())
        flat = flat.reshape(ends.shape).T.ravel()  # line by line
        cur.ok &= ok.reshape(ends.shape).all(0)
    else:
        offs = np.cumsum(lens) - lens
        ends = cur.sep(np.repeat(cur.r - offs, lens) + np.arange(int(lens.sum())))
        starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)
        starts[offs[lens > 0]] = c[lens > 0]
        ok, flat = _int_fast(buf, starts, ends)
        if not ok.all():
            bad = np.bincount(np.repeat(np.arange(len(c)), lens)[~ok], minlength=len(c))
            cur.ok &= bad == 0
    cur.c, cur.r = q + 1, cur.r + lens
    return flat, lens


def read_fields(buf: Buf, lines: np.ndarray, head: bytes, fields: tuple):
    """Columns of a family whose lines are ``head`` then ``fields`` (canonical kinds), or None
    when a line does not match (or holds a value this path leaves to the regex).

    Args:
        buf: the chunk; lines: the family's lines in it (indexes, int64 [n]).
    Returns:
        ``(cols, ids)``: name -> int64 [n] (int, arrow), float64 [n] (ms, pct), fixed-width
        bytes [n] (str), list of None (an optional ``floats_opt`` left out on every line);
        ids: name -> (every id, int64; ids per line, int64).
    """
    steps = _TEMPLATES.get((head, fields))
    if steps is None:
        steps = _TEMPLATES[head, fields] = _template(head, fields)
    cur = _Cursor(buf, lines)
    cols: dict = {}
    ids: dict = {}
    try:
        for step in steps:
            if step[0] == "run":
                toks = step[1]
                _run(cur, toks, cols, [p[:-1].decode() if k else "" for p, k in toks])
            elif step[0] == "opt":  # present on some line: the regex path reads it
                cols[step[1]] = [None] * len(lines)
            else:
                if step[2]:
                    cur.literal(step[2])
                ids[step[1]] = _ids(cur)
                cur.next_token()
            if not cur.ok.all():
                return None
    except _Long:
        return None
    cur.ok &= cur.c == cur.e + 1  # the last token ended the line
    return (cols, ids) if cur.ok.all() else None
