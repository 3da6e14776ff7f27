"""The bulk import path (hooks/vt/bulk*.py) records exactly what line-by-line feeding
records, declines the logs it cannot reproduce, and the optional ``margin=[…]`` field of
``[spec-propose]`` lines lands in ``draft_margin``."""

from __future__ import annotations

import random
from pathlib import Path

import h5py
import numpy as np
import pytest

from spectrace.hooks.vt import bulk_lex
from spectrace.hooks.vt.bulk import bulk_feed
from spectrace.hooks.vt.importer import import_log
from spectrace.hooks.vt.parser import VtTraceParser
from spectrace.hooks.vt.requests import read_requests
from spectrace.tracer.store import TraceWriter, open_trace

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"
VERDICTS = ROOT / "tests" / "data_verdicts"
BUNDLED = ROOT / "traces" / "reference.vt.log"
BUNDLED_REQ = ROOT / "traces" / "reference.requests.jsonl"


def _parse(log: Path, out: Path, bulk: bool, requests: Path | None = None):
    w = TraceWriter(out, {"source": "test"})
    p = VtTraceParser(w, source_name=str(log))
    if requests is not None:
        p.set_requests(read_requests(requests), source=str(requests))
    if bulk:
        assert bulk_feed(p, log.read_bytes()) is not None, "the bulk path declined"
    else:
        with open(log, encoding="utf-8", errors="replace", newline="") as fh:
            for n, line in enumerate(fh, 1):
                p.feed_line(line, n)
    stats = p.finish()
    w.close()
    return stats


def _columns(path: Path) -> dict:
    out = {}
    with h5py.File(path) as f:
        for table in ("blocks", "phases", "requests"):
            for name, ds in f[table].items():
                if name != "t_ns":
                    out[f"{table}/{name}"] = [np.asarray(x).tolist() for x in ds[()]]
        out["phase names"] = list(f["phases"].attrs["names"])
    return out


def _equal_runs(tmp_path: Path, log: Path, requests: Path | None = None) -> None:
    """The bulk path and the line-by-line path record the same stats, meta and columns."""
    slow = _parse(log, tmp_path / "slow.h5", False, requests)
    fast = _parse(log, tmp_path / "fast.h5", True, requests)
    assert fast.to_meta() == slow.to_meta()
    assert fast.summary() == slow.summary()
    a, b = _columns(tmp_path / "slow.h5"), _columns(tmp_path / "fast.h5")
    assert {k: repr(v) for k, v in a.items()} == {k: repr(v) for k, v in b.items()}


@pytest.mark.parametrize(
    "log,requests",
    [
        (BUNDLED, BUNDLED_REQ),
        (BUNDLED, None),
        (DATA / "vt_sync_dflash.log", None),
        (DATA / "engine_draft_model.log", None),
        (VERDICTS / "trimmed.log", None),
        (VERDICTS / "installed.log", None),
    ],
    ids=["bundled+requests", "bundled", "dflash", "draft_model", "trimmed", "installed"],
)
def test_bulk_equals_line_by_line(tmp_path, log, requests):
    slow = _parse(log, tmp_path / "slow.h5", False, requests)
    fast = _parse(log, tmp_path / "fast.h5", True, requests)
    assert fast.to_meta() == slow.to_meta()
    assert fast.summary() == slow.summary()
    a, b = _columns(tmp_path / "slow.h5"), _columns(tmp_path / "fast.h5")
    assert a.keys() == b.keys()
    for key in a:
        assert repr(a[key]) == repr(b[key]), key  # repr: NaN cells compare equal


def test_bulk_lexes_in_chunks_like_whole(tmp_path, monkeypatch):
    """Chunks cut at line ends (997 bytes here, 4 MiB by default) change nothing."""
    whole = _parse(BUNDLED, tmp_path / "whole.h5", True, BUNDLED_REQ)
    monkeypatch.setattr(bulk_lex, "CHUNK_BYTES", 997)
    chunked = _parse(BUNDLED, tmp_path / "chunked.h5", True, BUNDLED_REQ)
    assert chunked.to_meta() == whole.to_meta()
    a, b = _columns(tmp_path / "whole.h5"), _columns(tmp_path / "chunked.h5")
    assert {k: repr(v) for k, v in a.items()} == {k: repr(v) for k, v in b.items()}


def test_bulk_keeps_malformed_line_messages(tmp_path):
    text = BUNDLED.read_text().splitlines()
    text[20] = "[SPECTRACE] req=0 pos=11 k=4 ns=3 acc=99999 draft=[ 1 2 3 4 ] emit=[ 1 2 3 ]"
    text[30] = (
        "[spec-sched] req=0 have=4 num_new=5 computed=10 NumTokens=11 placeholders=0 -> sched=x"
    )
    log = tmp_path / "m.log"
    log.write_text("\n".join(text) + "\nunrelated engine output\n")
    slow = _parse(log, tmp_path / "slow.h5", False)
    fast = _parse(log, tmp_path / "fast.h5", True)
    assert fast.to_meta() == slow.to_meta()
    assert fast.malformed == 2
    assert [n for n, _ in fast.examples["malformed"]] == [21, 31]
    assert fast.examples["malformed"][0][1] == (
        "malformed trace line: acc out of range [0, 32767] (field=acc, value=99999)"
    )


@pytest.mark.parametrize(
    "case",
    ["never_installed", "never_scheduled", "edited", "strict", "crlf"],
)
def test_bulk_declines_what_it_does_not_reproduce(tmp_path, case):
    log = tmp_path / "x.log"
    if case in ("never_installed", "never_scheduled"):
        log.write_bytes((VERDICTS / f"{case}.log").read_bytes())
    else:
        text = BUNDLED.read_text()
        if case == "edited":
            text = text.replace("[SPECTRACE] req=0 pos=11", "[SPECTRACE]  req=0 pos=11", 1)
        if case == "strict":
            text = text.replace("acc=2 draft=[ 318", "acc=1 draft=[ 318", 1)
        if case == "crlf":
            text = text.replace("\n", "\r\n")
        log.write_text(text)
    w = TraceWriter(tmp_path / "t.h5", {"source": "test"})
    p = VtTraceParser(w, strict=case == "strict")
    assert bulk_feed(p, log.read_bytes()) is None
    assert p.stats.lines == 0 and w.rows_written == 0
    w.close()


MARGIN_LOG = """\
[spec-phase] pre=0.10ms backbone=1.00ms sample=0.10ms logits=100
[spec-propose] rows=1 nqpr=2 drafts/row=2 first=[5 6 ] margin=[ 0.523 0.010 ]
[spec-post_step] pulled=1 rows=1
[spec-update] called n=1
[spec-update] req=a found=1 finished=0 prefill_chunk=0 drafts=2
[spec-install] req=a installed=2 lookahead=2
[spec-sched] req=a have=2 num_new=3 computed=4 NumTokens=5 placeholders=0 -> sched=2
[SPECTRACE] req=a pos=5 k=2 ns=2 acc=1 draft=[ 5 6 ] emit=[ 5 9 ]
[spec-phase] pre=0.10ms backbone=1.00ms sample=0.10ms logits=100
[spec-propose] rows=1 nqpr=2 drafts/row=2 first=[9 7 ]
[spec-post_step] pulled=1 rows=1
[spec-update] called n=1
[spec-update] req=a found=1 finished=0 prefill_chunk=0 drafts=2
[spec-install] req=a installed=2 lookahead=2
[spec-sched] req=a have=2 num_new=3 computed=6 NumTokens=7 placeholders=0 -> sched=2
[SPECTRACE] req=a pos=7 k=2 ns=1 acc=0 draft=[ 9 7 ] emit=[ 4 ]
"""


@pytest.mark.parametrize("path", ["bulk", "line_by_line"])
def test_margin_field_lands_in_draft_margin(tmp_path, path):
    log = tmp_path / "m.log"
    log.write_text(MARGIN_LOG)
    stats = _parse(log, tmp_path / "t.h5", path == "bulk")
    assert stats.malformed == 0 and stats.edited == 0
    assert stats.joins["exact"] == 2
    t = open_trace(tmp_path / "t.h5")
    m = np.asarray(t.blocks.draft_margin)
    assert m.shape == (2, 2)
    assert m[0].tolist() == [np.float32(0.523), np.float32(0.010)]
    assert np.isnan(m[1]).all()  # the second propose line carries no margin
    assert np.asarray(t.blocks.proposed).tolist() == [[5, 6], [9, 7]]


@pytest.mark.parametrize(
    "line,message",
    [
        (
            "[spec-propose] rows=1 nqpr=2 drafts/row=2 first=[5 6 ] margin=[ 0.523 ]",
            "margin holds 1 values for 2 proposed ids (field=margin, value=1)",
        ),
        (
            "[spec-propose] rows=1 nqpr=2 drafts/row=2 first=[5 6 ] margin=[ 0.5 x ]",
            "margin=[…] holds 'x', not a number",
        ),
        (
            "[spec-propose] rows=1 nqpr=2 drafts/row=2 first=[5 6 ] margin=[ 0.5 1e39 ]",
            "margin out of range for float32 (field=margin, value=1e+39)",
        ),
    ],
    ids=["count", "not_a_number", "float32"],
)
def test_bad_margin_is_a_malformed_line(tmp_path, line, message):
    log = tmp_path / "m.log"
    log.write_text(MARGIN_LOG.replace(MARGIN_LOG.splitlines()[1], line))
    stats = import_log(log, tmp_path / "t.h5")
    assert stats.malformed == 1
    assert stats.examples["malformed"] == [[2, f"malformed trace line: {message}"]]
    t = open_trace(tmp_path / "t.h5")
    assert np.isnan(np.asarray(t.blocks.draft_margin)).all()
    # The dropped propose line joins nothing: the first block copies verified.
    assert np.asarray(t.blocks.proposal_source).tolist() == [0, 1]


def test_margin_line_is_canonical_and_strict_accepts_it(tmp_path):
    log = tmp_path / "m.log"
    log.write_text(MARGIN_LOG)
    stats = import_log(log, tmp_path / "t.h5", strict=True)
    assert stats.blocks == 2 and stats.edited == 0


def _mutate(lines: list[str], rng, mode: int) -> list[str]:
    lines = list(lines)
    for _ in range(rng.randint(1, 25)):
        j = rng.randrange(len(lines))
        if mode == 0:  # lines lost: gaps, missing proposals, steps merged
            del lines[j]
        elif mode == 1:  # lines repeated: chain breaks, second proposals, new steps
            lines.insert(j, lines[rng.randrange(len(lines))])
        elif mode == 2 and lines[j].startswith("[SPECTRACE]"):  # drafts no proposal matches
            lines[j] = lines[j].replace("draft=[ ", "draft=[ 7 ", 1).replace(" k=4 ", " k=5 ", 1)
        elif mode == 3:  # zero counts: never installed, sched=0, empty rows
            lines[j] = lines[j].replace("=4", "=0", 1)
    return lines


@pytest.mark.parametrize("seed", range(16))
def test_bulk_equals_line_by_line_on_mutated_logs(tmp_path, seed):
    """The bundled log with lines deleted, repeated or changed (seeded): whenever the bulk
    path takes the log, it records what line-by-line feeding records."""
    rng = random.Random(seed)
    text = "\n".join(_mutate(BUNDLED.read_text().splitlines(), rng, seed % 4)) + "\n"
    log = tmp_path / "m.log"
    log.write_text(text)
    requests = BUNDLED_REQ if seed % 2 == 0 else None
    w = TraceWriter(tmp_path / "probe.h5", {"source": "test"})
    taken = bulk_feed(VtTraceParser(w), log.read_bytes()) is not None
    w.close()
    if not taken:
        pytest.skip("the bulk path declines this log (the line-by-line parser reads it)")
    _equal_runs(tmp_path, log, requests)


FWD_OPS = (
    "[fwd-ops] P=5 Tq=5 L=2 total=1.50ms norm=10.0% conv=0.0% qkv=20.0% qknorm_rope=5.0% "
    "ctx_scatter=5.0% attn=20.0% o_proj=10.0% mlp=25.0% head=5.0%"
)
DEV = "[spec-phase-dev] pre=0.10ms fwd=1.20ms select=0.05ms walk=0.02ms"


def test_bulk_equals_line_by_line_at_level_3(tmp_path):
    """``[fwd-ops]`` and ``[spec-phase-dev]`` before every ``[spec-phase]``: phase rows,
    their levels (3 for the step's spec-phase) and names as line-by-line feeding writes."""
    out = []
    for line in BUNDLED.read_text().splitlines():
        if line.startswith("[spec-phase] "):
            out += [FWD_OPS, DEV]
        out.append(line)
    log = tmp_path / "l3.log"
    log.write_text("\n".join(out) + "\n")
    slow = _parse(log, tmp_path / "slow.h5", False, BUNDLED_REQ)
    fast = _parse(log, tmp_path / "fast.h5", True, BUNDLED_REQ)
    assert fast.to_meta() == slow.to_meta()
    a, b = _columns(tmp_path / "slow.h5"), _columns(tmp_path / "fast.h5")
    assert {k: repr(v) for k, v in a.items()} == {k: repr(v) for k, v in b.items()}
    assert sorted(set(a["phases/level"])) == [2, 3]  # dev 2; fwd-ops and spec-phase 3


@pytest.mark.parametrize(
    "margins,edited",
    [
        ("0.523 0.010", 0),
        ("-0.000 nan", 0),
        # not %.3f, but float text: canonical on both paths (the bulk lexer hands them over)
        ("1 2", 0),
        ("0.5 -0.0", 0),
        ("1E2 0.010", 0),
        ("0123.000 0.010", 0),
        ("+0.500 0.010", 0),
        ("1234567890123456.000 0.010", 0),
        ("12345678901234567.000 0.010", 0),
        ("3.4028235e38 -nan", 0),  # float32's max as %g prints it; printf's negative NaN
        ("0.5  0.010", 1),  # two spaces: an edited line on both paths
    ],
)
def test_margin_spellings_edited_as_line_by_line(tmp_path, margins, edited):
    """``import vt`` (bulk where it takes the log, else the line path) reads any float text
    as a margin, and counts a line spaced otherwise as edited, as the line path does."""
    log = tmp_path / "m.log"
    log.write_text(MARGIN_LOG.replace("margin=[ 0.523 0.010 ]", f"margin=[ {margins} ]"))
    slow = _parse(log, tmp_path / "slow.h5", False)
    fast = import_log(log, tmp_path / "fast.h5")
    assert (slow.edited, fast.edited) == (edited, edited)
    assert fast.summary() == slow.summary()
    a, b = _columns(tmp_path / "slow.h5"), _columns(tmp_path / "fast.h5")
    assert repr(a) == repr(b)
