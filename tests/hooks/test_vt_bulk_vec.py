"""The vectorised parts of the bulk import path: the field reader (hooks/vt/bulk_vec.py)
never accepts a line its family's byte regex rejects and reads the values the regex groups
convert to; the step automaton (hooks/vt/bulk_steps.py) gives the steps of the parser's
line loop; and the fallbacks (regex reader, line loop) record what line-by-line feeding
records."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
from test_vt_bulk import _equal_runs  # the bulk tests' own harness

from spectrace.hooks.vt import bulk, bulk_lex, bulk_steps, bulk_vec
from spectrace.hooks.vt.bulk_lex import CODE

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "traces" / "reference.vt.log"
BUNDLED_REQ = ROOT / "traces" / "reference.requests.jsonl"
FWD_OPS = (
    "[fwd-ops] P=5 Tq=5 L=2 total=1.50ms norm=10.0% conv=0.0% qkv=20.0% qknorm_rope=5.0% "
    "ctx_scatter=5.0% attn=20.0% o_proj=10.0% mlp=25.0% head=5.0%"
)
DEV = "[spec-phase-dev] pre=0.10ms fwd=1.20ms select=0.05ms walk=0.02ms"

SAMPLES = [
    "[spec-phase] backbone=15.49ms sample=0.38ms logits=40960",
    "[spec-phase] backbone=1.00ms sequential=2.00ms k=4 logits=100",
    "[spec-propose] rows=1 nqpr=2 drafts/row=2 first=[]",
    "[SPECTRACE] req=x pos=1 k=0 ns=0 acc=0 draft=[ ] emit=[ ]",
    "[SPECTRACE] req=-7 pos=2147483647 k=2 ns=1 acc=0 draft=[ -1 2147483647 ] emit=[ 0 ]",
    "[spec-sched] req=a.b have=0 num_new=-3 computed=123456789012 NumTokens=5 "
    "placeholders=0 -> sched=12345678",
    FWD_OPS,
    DEV,
]


def _lines() -> list[bytes]:
    seen: dict[bytes, None] = {}
    for line in BUNDLED.read_text().splitlines()[:120] + SAMPLES:
        seen[line.encode()] = None
    return list(seen)


def _code(line: bytes) -> int:
    buf = bulk_vec.Buf(line, 0, len(line))
    return int(bulk_lex._classify(buf, memoryview(line), buf.starts, buf.ends)[0])


def _vector(code: int, data: bytes):
    """read_fields on the first line of ``data``."""
    buf = bulk_vec.Buf(data, 0, len(data))
    return bulk_vec.read_fields(buf, np.array([0]), bulk_lex._HEAD[code], bulk_lex._FIELDS[code])


def _regex(code: int, line: bytes):
    m = bulk_lex._ONE[code].match(line)
    if m is None:
        return None
    groups = [m.groups()] if len(bulk_lex._FIELDS[code]) > 1 else [(m.group(1),)]
    cols, raw = bulk_lex._columns(bulk_lex._FIELDS[code], groups)
    return cols, {n: bulk_lex.flatten(r) for n, r in raw.items()}


def _same(got, want) -> None:
    (cols, ids), (wcols, wids) = got, want
    assert cols.keys() == wcols.keys() and ids.keys() == wids.keys()
    for name, v in cols.items():
        w = wcols[name]
        if isinstance(v, np.ndarray):
            assert v.dtype.kind == w.dtype.kind, name
            assert repr(v.tolist()) == repr(w.tolist()), name  # repr: -0.0 is not 0.0
        else:
            assert v == w, name
    for name, (flat, lens) in ids.items():
        assert flat.tolist() == wids[name][0].tolist() and lens.tolist() == wids[name][1].tolist()


def _mutate(line: bytes, rng: random.Random) -> bytes:
    s = bytearray(line)
    for _ in range(rng.randint(1, 3)):
        j = rng.randrange(len(s) + 1)
        op = rng.randrange(12)
        if op == 0 and j < len(s):
            del s[j]
        elif op == 1:
            s[j:j] = rng.choice([b" ", b"  ", b"\t", b"-", b"0", b"]", b"[", b"\xff", b"."])
        elif op == 2:
            s[j:j] = rng.choice(b"0123456789").to_bytes(1, "little")
        elif op == 3:
            s[j:j] = b"9" * rng.choice([8, 9, 15, 16, 17, 18, 19])
        elif op == 4:
            s[j:j] = b"r" * rng.choice([7, 8, 9, 63, 64, 65, 200])
        elif op == 5:
            s = s[:j]
        elif op == 6:
            s += rng.choice([b" ", b"x", b" margin=[ 0.5 ]", b"]"])
        elif op == 7 and j < len(s):
            s[j] = rng.randrange(256)
    return bytes(s).replace(b"\n", b"")


def test_canonical_lines_are_read_as_the_regex_reads_them():
    for line in _lines():
        code = _code(line)
        if code not in bulk_lex._HEAD:
            continue
        for data in (line, line + b"\n", line + b"\n" + line + b"\n"):
            got = _vector(code, data)
            assert got is not None, line
            _same(got, _regex(code, line))


@pytest.mark.parametrize("seed", range(6))
def test_edited_lines_never_read_as_the_regex_would_not(seed):
    """Random edits (digits, signs, spaces, tabs, brackets, long numbers and ids, cut or
    extended lines), alone and followed by a canonical line: whatever the vectorised reader
    accepts, the regex accepts with the same values."""
    rng = random.Random(seed)
    lines = _lines()
    accepted = rejected = 0
    for _ in range(250):
        orig = rng.choice(lines)
        code = _code(orig)
        if code not in bulk_lex._HEAD:
            continue
        line = _mutate(orig, rng)
        if not line:
            continue
        want = _regex(code, line)
        for data in (line, line + b"\n" + orig + b"\n"):
            got = _vector(code, data)
            if got is None:
                rejected += 1
                continue
            accepted += 1
            assert want is not None, line
            _same(got, want)
    assert accepted and rejected


def _loop_steps(codes: list[int], vreq: list[int]):
    s, e, last = bulk._segment(codes, vreq)
    return list(s), list(e), last


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("stretch", [3, 16, 1024])
def test_step_automaton_matches_the_line_loop(monkeypatch, seed, stretch):
    """Random code sequences (requests drawn from a few, so some repeat within a step)."""
    monkeypatch.setattr(bulk_steps, "STRETCH", stretch)
    rng = random.Random(seed)
    pool = list(range(1, len(bulk_lex.KEYS) + 1))
    weights = [6 if c in (bulk.V, bulk._SCHED) else 1 for c in pool]
    codes = rng.choices(pool, weights, k=rng.randint(0, 400))
    if seed == 0:  # sched lines first: the runner's first step
        codes = [bulk._SCHED] * 3 + [bulk.V] * 4 + codes
    vreq = [rng.randrange(4) for c in codes if c == bulk.V]
    got = bulk_steps.segment(np.array(codes), np.array(vreq), bulk._MASKS, bulk.V, bulk._SCHED)
    assert got is not None
    steps, seens, last = got
    want = _loop_steps(codes, vreq)
    assert (steps.tolist(), seens.tolist(), last) == want


@pytest.mark.parametrize("fallback", ["regex_reader", "line_loop"])
def test_fallbacks_record_what_line_by_line_records(tmp_path, monkeypatch, fallback):
    """The regex reader (the vectorised reader declines every family) and the steps' line
    loop (the automaton does not settle)."""
    if fallback == "regex_reader":
        monkeypatch.setattr(bulk_lex, "read_fields", lambda *a: None)
    else:
        monkeypatch.setattr(bulk_steps, "MAX_ROUNDS", 0)
        monkeypatch.setattr(bulk_steps, "STRETCH", 8)
    _equal_runs(tmp_path, BUNDLED, BUNDLED_REQ)


@pytest.mark.parametrize(
    "old,new",
    [
        ("req=1 ", "req=" + "q" * 80 + " "),  # an id longer than the vectorised reader reads
        ("req=2 ", "req=a]b "),  # a "]" inside an id
        ("req=3 ", "req=c=d "),
        ("draft=[ 318 ", "draft=[ 12345678901234567 "),  # 17 digits (out of range: malformed)
        ("pos=11 ", "pos=123456789 "),  # 9 digits
        ("pre=0.37ms", "pre=00012345678901234.37ms"),  # a long ms value
        ("pre=0.37ms", "pre=-0.00ms"),
        ("computed=10 ", "computed=-10 "),
    ],
)
def test_unusual_values_record_what_line_by_line_records(tmp_path, old, new):
    text = BUNDLED.read_text()
    assert old in text
    log = tmp_path / "u.log"
    log.write_text(text.replace(old, new))
    _equal_runs(tmp_path, log)


def test_log_without_final_newline(tmp_path):
    log = tmp_path / "n.log"
    log.write_text(BUNDLED.read_text().rstrip("\n"))
    _equal_runs(tmp_path, log, BUNDLED_REQ)


def test_chunks_cut_anywhere(tmp_path, monkeypatch):
    """Chunks of a few lines each (one vectorised read per family and chunk)."""
    monkeypatch.setattr(bulk_lex, "CHUNK_BYTES", 301)
    _equal_runs(tmp_path, BUNDLED, BUNDLED_REQ)
    assert CODE["SPECTRACE", ""] in bulk_lex._HEAD


def _tokens(rng: random.Random) -> list[str]:
    """Integer-like tokens: every digit count 0 to 20, signs, leading zeros, other bytes."""
    toks = ["0", "-0", "00", "07", "1", "9", "10", "99999999", "100000000", "-1", "-12345678"]
    for _ in range(3000):
        n = rng.randrange(0, 21)
        t = "".join(rng.choice("0123456789") for _ in range(n))
        if rng.random() < 0.2:
            t = "-" + t
        if t and rng.random() < 0.1:
            j = rng.randrange(len(t))
            t = t[:j] + rng.choice("+-.:/a\x7f") + t[j + 1 :]
        toks.append(t)
    return toks


@pytest.mark.parametrize("seed", range(3))
def test_integers_read_as_the_canonical_pattern_reads_them(seed):
    """_int_fast (its one-word fast path and the general reader it leaves the rest to) reads
    ``0|-?[1-9]\\d{0,17}`` as int() does and rejects anything else (up to 16 digits: longer
    integers are the regex path's)."""
    import re

    canonical = re.compile(r"0|-?[1-9]\d{0,17}")
    toks = [t for t in _tokens(random.Random(seed)) if len(t) - t.startswith("-") <= 16]
    line = ("".join(f"v={t} " for t in toks) + "\n").encode()
    buf = bulk_vec.Buf(line, 0, len(line))
    lens = np.array([len(t) for t in toks])
    starts = np.cumsum(lens + 3) - lens - 1  # past "v="
    ok, val = bulk_vec._int_fast(buf, starts, starts + lens)
    want = [canonical.fullmatch(t) is not None for t in toks]
    assert ok.tolist() == want
    assert val[ok].tolist() == [int(t) for t, w in zip(toks, want) if w]


def test_ragged_lists_padded_in_order():
    from spectrace.hooks.vt.bulk_commit import padded

    got = padded(np.array([5, 6, 7, 8, 9, 10]), np.array([2, 0, 3, 1]), 4, -1)
    assert got.tolist() == [[5, 6, -1, -1], [-1, -1, -1, -1], [7, 8, 9, -1], [10, -1, -1, -1]]
    assert padded(np.zeros(0, np.int64), np.zeros(0, np.int64), 0, -1).shape == (0, 1)
