"""VT_SPEC_TRACE parser: every line family, doc-edited lines, steps, joins, chains, strictness.

Expected values are derived by hand from the logs (tests/hooks/data/vt_sync_dflash.log is annotated
below) or, for the reference engine, recomputed from the raw lines with a tiny regex.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from spectrace.hooks.vt.importer import import_log
from spectrace.hooks.vt.lines import Ids, MalformedLine, parse_line
from spectrace.hooks.vt.parser import VtTraceParser
from spectrace.hooks.vt.requests import read_requests
from spectrace.tracer.errors import InputError, ParseError
from spectrace.tracer.store import TraceWarning, TraceWriter, open_trace

DATA = Path(__file__).parent / "data"
SYNC_LOG = DATA / "vt_sync_dflash.log"
SYNC_REQS = DATA / "vt_sync_dflash.requests.jsonl"
SPECTRACE = os.path.join(os.path.dirname(sys.executable), "spectrace")


def _write(tmp_path, text: str, name: str = "run.log") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _open(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        return open_trace(path)


# -- line grammar ------------------------------------------------------------------------------

CANONICAL = [
    (
        "[SPECTRACE] req=0 pos=10 k=2 ns=3 acc=2 draft=[ 364 1141 ] emit=[ 364 1141 25438 ]",
        "SPECTRACE",
        "",
        {
            "req": "0",
            "pos": 10,
            "k": 2,
            "ns": 3,
            "acc": 2,
            "draft": Ids([364, 1141]),
            "emit": Ids([364, 1141, 25438]),
        },
    ),
    (
        "[spec-propose] rows=1 nqpr=9 drafts/row=2 first=[13 198 ]",
        "spec-propose",
        "",
        {"rows": 1, "nqpr": 9, "drafts/row": 2, "first": Ids([13, 198])},
    ),
    (
        "[spec-propose] NO proposing rows this step (num_reqs=4)",
        "spec-propose",
        "no_rows",
        {"num_reqs": 4},
    ),
    (
        "[spec-phase] pre=0.26ms backbone=0.30ms sample=19.36ms logits=2234880",
        "spec-phase",
        "pre",
        {"pre": 0.26, "backbone": 0.30, "sample": 19.36, "logits": 2234880},
    ),
    (
        "[spec-phase] backbone=27.44ms sample=10.50ms logits=100",
        "spec-phase",
        "old",
        {"backbone": 27.44, "sample": 10.50, "logits": 100},
    ),
    (
        "[spec-phase] backbone=1.00ms sequential=2.50ms k=8 logits=96",
        "spec-phase",
        "dspark",
        {"backbone": 1.0, "sequential": 2.5, "k": 8, "logits": 96},
    ),
    (
        "[spec-phase-dev] pre=6.84ms fwd=36.19ms select=4.22ms walk=0.02ms",
        "spec-phase-dev",
        "",
        {"pre": 6.84, "fwd": 36.19, "select": 4.22, "walk": 0.02},
    ),
    (
        "[fwd-ops] P=8 Tq=9 L=5 total=10.00ms norm=1.0% conv=2.0% qkv=3.0% qknorm_rope=4.0% "
        "ctx_scatter=5.0% attn=6.0% o_proj=7.0% mlp=8.0% head=64.0%",
        "fwd-ops",
        "",
        {
            "P": 8,
            "Tq": 9,
            "L": 5,
            "total": 10.0,
            "norm": 1.0,
            "conv": 2.0,
            "qkv": 3.0,
            "qknorm_rope": 4.0,
            "ctx_scatter": 5.0,
            "attn": 6.0,
            "o_proj": 7.0,
            "mlp": 8.0,
            "head": 64.0,
        },
    ),
    (
        "[spec-sched] req=r7 have=4 num_new=3 computed=10 NumTokens=11 placeholders=0 -> sched=2",
        "spec-sched",
        "",
        {
            "req": "r7",
            "have": 4,
            "num_new": 3,
            "computed": 10,
            "NumTokens": 11,
            "placeholders": 0,
            "sched": 2,
        },
    ),
    ("[spec-update] called n=2", "spec-update", "called", {"n": 2}),
    (
        "[spec-update] req=dflash2_0 found=1 finished=0 prefill_chunk=0 drafts=4",
        "spec-update",
        "req",
        {"req": "dflash2_0", "found": 1, "finished": 0, "prefill_chunk": 0, "drafts": 4},
    ),
    (
        "[spec-install] req=0 installed=4 lookahead=5",
        "spec-install",
        "",
        {"req": "0", "installed": 4, "lookahead": 5},
    ),
    ("[spec-post_step] pulled=1 rows=2", "spec-post_step", "", {"pulled": 1, "rows": 2}),
    (
        "[SPECTRACE] req=0 pos=3 k=2 ns=1 acc=0 draft=[ -1 -1 ] emit=[ 7 ]",
        "SPECTRACE",
        "",
        {"req": "0", "pos": 3, "k": 2, "ns": 1, "acc": 0, "draft": Ids([-1, -1]), "emit": Ids([7])},
    ),  # async placeholders: negative ids
]


@pytest.mark.parametrize(
    "line,family,variant,values", CANONICAL, ids=[c[0][:22] for c in CANONICAL]
)
def test_every_family_parses_by_name(line, family, variant, values):
    rec = parse_line(line + "\n")
    assert (rec.family, rec.variant, rec.edits) == (family, variant, [])
    assert rec.values == values


DOC_EDITED = [
    # (line, edit reason, a field to check)
    (
        "[SPECTRACE] req=0 pos=8  k=8 ns=2 acc=1 draft=[3177 421 682 ...] emit=[3177 34756]",
        "ellipsis in an id list",
        ("draft", Ids([3177, 421, 682], complete=False)),
    ),
    (
        "[SPECTRACE] req=0 pos=8  k=2 ns=2 acc=1 draft=[3177 421] emit=[3177 34756]",
        "spacing or number format",
        ("pos", 8),
    ),
    (
        "rows=1 nqpr=8 drafts/row=8 first=[13 198 12 2972 57590 11 11751 11]",
        "tag missing",
        ("first", Ids([13, 198, 12, 2972, 57590, 11, 11751, 11])),
    ),
    (
        "req=0 pos=10 k=8 ns=3 acc=2 draft=[364 1141 12761 ...] emit=[364 1141 25438]",
        "tag missing",
        ("emit", Ids([364, 1141, 25438])),
    ),
    ("[spec-phase] backbone=27.44ms sample=10.50ms", "missing logits=", ("backbone", 27.44)),
    (
        "[ SPECTRACE ] req=0 pos=3 k=1 ns=1 acc=0 draft=[ 5 ] emit=[ 6 ]",
        "spaces inside the tag",
        ("draft", Ids([5])),
    ),
    (
        "I1130 12:00:00 [spec-sched] req=0 have=4 num_new=3 computed=1 NumTokens=2 "
        "placeholders=0 -> sched=2",
        "text before the tag",
        ("sched", 2),
    ),
]


@pytest.mark.parametrize("line,reason,check", DOC_EDITED, ids=[d[1] for d in DOC_EDITED])
def test_doc_edited_lines_are_read_and_flagged(line, reason, check):
    rec = parse_line(line)
    assert reason in rec.edits
    assert rec.values[check[0]] == check[1]


@pytest.mark.parametrize(
    "line,msg",
    [
        (
            "[SPECTRACE] req=0 pos=x k=1 ns=1 acc=0 draft=[ 1 ] emit=[ 1 ]",
            "pos=x is not an integer",
        ),
        ("[SPECTRACE] req=0 pos=1 k=1 ns=1 acc=0 draft=[ 1 emit=[ 2 ]", "not an integer id"),
        ("[SPECTRACE] req=0 pos=1 k=1 ns=1 acc=0 draft=[ 1 ] emit=[ 2", "unterminated"),
        ("[SPECTRACE] req=0 pos=1 k=1 acc=0 draft=[ 1 ]", "missing ns=, emit="),
        ("[spec-propose] rows=1 nqpr=2 drafts/row=1", "missing first="),
        ("[spec-phase] logits=3", "no phase timing"),
        ("[spec-phase] pre=abcms backbone=1.00ms sample=1.00ms logits=3", "pre=abcms"),
    ],
)
def test_malformed_lines(line, msg):
    with pytest.raises(MalformedLine, match=re.escape(msg)):
        parse_line(line)


@pytest.mark.parametrize(
    "line",
    [
        "vllm.cpp: request 3 has outgrown the draft speculative context (4096 tokens)",
        "vllm.cpp: request 2 was admitted with 17 tokens already computed",
        "vllm-cli: run=2/5 spec_drafts_proposed=196 spec_drafts_accepted=90 "
        "spec_drafted_request_steps=28",
        "[DFLASH-GRAPH] replays=12 captures=1",
        "Traceback (most recent call last):",
        "",
        "req=0 is not a trace line",
    ],
)
def test_other_lines_pass_through(line):
    assert parse_line(line) is None


# -- a synchronous DFlash-style log (tests/hooks/data/vt_sync_dflash.log) -------------------
#
# step 0 (lines 2-9): prefill of requests 0 and 1; propose first=[101 102 103] for row 0 (req 0).
# step 1 (10-22): verify req 0 (pos=4, exact join) and req 1 (pos=3); propose [105 106 107].
# step 2 (23-33): req 0 verifies [105 106 104] (#2116-style corruption; the [spec-update]
#   payload names req 0 as the first proposing row: "hint" join); req 0 finishes, yet it is
#   the first proposing row again (first=[301 302 303], finished=1: never verified).
# step 3 (34-40): req 1 verifies its last block; NO proposing rows.


def test_sync_log_blocks_exactly(tmp_path):
    stats = import_log(SYNC_LOG, tmp_path / "t.h5", requests_path=SYNC_REQS, strict=True)
    assert (stats.blocks, stats.requests, stats.steps, stats.k_max) == (5, 2, 4, 3)
    assert (stats.lines, stats.trace_lines, stats.malformed, stats.edited) == (40, 37, 0, 0)
    t = open_trace(tmp_path / "t.h5")
    b = t.blocks
    assert t.requests.req_id == ["0", "1"]
    assert b.request.tolist() == [0, 1, 0, 1, 1]
    assert b.step.tolist() == [0, 0, 1, 1, 2]  # the proposing step (verify step - 1)
    assert b.position.tolist() == [3, 2, 6, 3, 7]  # SPECTRACE pos - 1
    assert b.anchor.tolist() == [100, 200, 104, 205, 209]
    assert b.proposed[:, :3].tolist() == [
        [101, 102, 103],
        [201, 202, 203],
        [105, 106, 107],
        [206, 207, 208],
        [210, 211, 212],
    ]
    assert b.verified[2, :3].tolist() == [105, 106, 104]
    assert b.accepted.tolist() == [2, 0, 2, 3, 1]
    assert b.num_emitted.tolist() == [3, 1, 3, 4, 2]
    assert b.emitted[3].tolist() == [206, 207, 208, 209]
    assert b.batch_row.tolist() == [0, 1, 0, 1, 1]
    assert b.batch_size.tolist() == [2, 2, 2, 2, 2]
    assert dict(stats.joins) == {
        "exact": 1,
        "hint": 1,
        "proposed != verified": 1,
        "not_verified": 1,
    }
    assert dict(stats.proposed_source) == {"propose_line": 2, "verified": 3}
    assert dict(stats.anchors) == {"requests": 2, "chain": 3}
    assert stats.examples["proposed != verified"][0][0] == 25
    ph = t.phases()
    assert ph["step"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert ph["name"].tolist() == ["pre", "backbone", "sample"] * 3
    assert [round(x, 2) for x in ph["ms"].tolist()] == [0.1, 0.2, 0.3, 1.1, 1.2, 1.3, 2.1, 2.2, 2.3]
    assert set(ph["level"].tolist()) == {1}
    meta = t.meta
    # A VT log names neither its engine nor its method: unknown (None), never guessed.
    assert (meta["source"], meta["engine"], meta["method"], meta["k"], meta["trace_level"]) == (
        "vt_spec_trace",
        None,
        None,
        3,
        1,
    )
    imp = meta["import"]
    assert imp["probes"] == {
        "nqpr=4": 3,
        "post_step": 4,
        "update_called": 4,
        "update_rows": 7,
        "install": 5,
        "sched": 5,
        "propose_no_rows": 1,
    }
    assert stats.summary().startswith(
        f"imported 5 blocks of 2 requests from {SYNC_LOG} (k=3, 4 steps, 0 malformed lines"
    )


def test_async_log_same_blocks_other_joins(tmp_path):
    text = SYNC_LOG.read_text()
    lines = [
        ln
        for ln in text.splitlines()
        if not ln.startswith(("[spec-post_step]", "[spec-update]", "[spec-install]"))
    ]
    # Scheduler lines of the next step print before the runner's propose lines of this one.
    sched = [ln for ln in lines if ln.startswith("[spec-sched]")]
    rest = [ln for ln in lines if not ln.startswith("[spec-sched]")]
    i = rest.index("[spec-phase] pre=1.10ms backbone=1.20ms sample=1.30ms logits=24")
    rest[i:i] = sched[2:4]
    rest[1:1] = sched[:2]
    j = rest.index("[spec-phase] pre=2.10ms backbone=2.20ms sample=2.30ms logits=24")
    rest[j:j] = sched[4:]
    log = _write(tmp_path, "\n".join(rest) + "\n")
    stats = import_log(log, tmp_path / "t.h5", requests_path=SYNC_REQS, strict=True)
    b = open_trace(tmp_path / "t.h5").blocks
    assert stats.steps == 4
    assert b.step.tolist() == [0, 0, 1, 1, 2]
    assert b.anchor.tolist() == [100, 200, 104, 205, 209]
    # No payload rows: step 1's proposal joins by 2 of 3 equal slots, step 2's by nothing.
    assert dict(stats.joins) == {"exact": 1, "partial": 1, "proposed != verified": 1, "unjoined": 1}
    assert b.proposed[2, :3].tolist() == [105, 106, 107]
    assert b.batch_row.tolist() == [-1] * 5
    line = rest.index("[spec-propose] rows=2 nqpr=4 drafts/row=3 first=[301 302 303 ]") + 1
    assert [e[0] for e in stats.examples["unjoined"]] == [line]


def test_ngram_log_without_propose_lines(tmp_path):
    """Only verify lines (MTP/ngram): steps split on a request's second block; no requests
    file, so first-block anchors stay -1 and are counted."""
    log = _write(
        tmp_path,
        "\n".join(
            [
                "[SPECTRACE] req=a pos=5 k=2 ns=1 acc=0 draft=[ 1 2 ] emit=[ 9 ]",
                "[SPECTRACE] req=b pos=7 k=1 ns=2 acc=1 draft=[ 3 ] emit=[ 3 4 ]",
                "[SPECTRACE] req=a pos=6 k=2 ns=3 acc=2 draft=[ 5 6 ] emit=[ 5 6 7 ]",
                "[SPECTRACE] req=b pos=9 k=2 ns=1 acc=0 draft=[ 8 8 ] emit=[ 1 ]",
                "[SPECTRACE] req=a pos=9 k=1 ns=1 acc=0 draft=[ 2 ] emit=[ -3 ]",
            ]
        )
        + "\n",
    )
    stats = import_log(log, tmp_path / "t.h5")
    b = open_trace(tmp_path / "t.h5").blocks
    assert b.step.tolist() == [0, 0, 1, 1, 2]  # implicit untraced step 0 proposed the first
    assert b.position.tolist() == [4, 6, 5, 8, 8]
    assert b.anchor.tolist() == [-1, -1, 9, 4, 7]
    assert b.proposed[:, :2].tolist() == [[1, 2], [3, -1], [5, 6], [8, 8], [2, -1]]
    assert b.k.tolist() == [2, 1, 2, 2, 1]
    assert b.emitted[4, 0] == -3
    assert (stats.steps, stats.anchors["unknown"], stats.anchors["chain"]) == (4, 2, 3)
    assert stats.summary().endswith("2 anchors unknown)")


def test_truncated_join_explained_by_sched(tmp_path):
    log = _write(
        tmp_path,
        "\n".join(
            [
                "[spec-propose] rows=1 nqpr=5 drafts/row=4 first=[1 2 3 4 ]",
                "[spec-sched] req=x have=4 num_new=3 computed=9 NumTokens=10 placeholders=0 -> sched=2",
                "[SPECTRACE] req=y pos=4 k=1 ns=1 acc=0 draft=[ 7 ] emit=[ 8 ]",
                "[SPECTRACE] req=x pos=10 k=2 ns=3 acc=2 draft=[ 1 2 ] emit=[ 1 2 5 ]",
                "[spec-propose] NO proposing rows this step (num_reqs=2)",
            ]
        )
        + "\n",
    )
    stats = import_log(log, tmp_path / "t.h5", strict=True)
    b = open_trace(tmp_path / "t.h5").blocks
    assert b.proposed.tolist() == [[7, -1, -1, -1], [1, 2, 3, 4]]
    assert b.verified[1, :2].tolist() == [1, 2] and b.num_verified.tolist() == [1, 2]
    assert b.k.tolist() == [1, 4]  # k counts proposed ids (schema); num_verified = k=
    assert stats.joins["truncated"] == 1 and stats.probes["sched_truncated"] == 1
    assert (
        "explained by [spec-sched] have=4 sched=2" in stats.examples["proposed != verified"][0][1]
    )


def test_phase_levels_and_names(tmp_path):
    log = _write(
        tmp_path,
        "\n".join(
            [
                "[spec-phase] backbone=1.00ms sample=2.00ms logits=9",  # step 0, level 1
                "[spec-propose] rows=1 nqpr=3 drafts/row=2 first=[1 2 ]",
                "[SPECTRACE] req=0 pos=4 k=2 ns=3 acc=2 draft=[ 1 2 ] emit=[ 1 2 3 ]",
                "[fwd-ops] P=2 Tq=3 L=1 total=10.00ms norm=10.0% conv=0.0% qkv=0.0% qknorm_rope=0.0% "
                "ctx_scatter=0.0% attn=50.0% o_proj=0.0% mlp=40.0% head=0.0%",
                "[spec-phase-dev] pre=1.00ms fwd=2.00ms select=3.00ms walk=4.00ms",
                "[spec-phase] pre=0.50ms backbone=0.25ms sample=9.00ms logits=9",  # step 1: level 3
                "[spec-propose] rows=1 nqpr=3 drafts/row=2 first=[4 5 ]",
                "[spec-phase] backbone=3.00ms sequential=4.00ms k=2 logits=8",  # DSpark: step 2
            ]
        )
        + "\n",
    )
    stats = import_log(log, tmp_path / "t.h5", strict=True)
    t = open_trace(tmp_path / "t.h5")
    ph = t.phases()
    got = list(
        zip(ph["step"].tolist(), ph["name"].tolist(), ph["ms"].tolist(), ph["level"].tolist())
    )
    assert got == [
        (0, "backbone", 1.0, 1),
        (0, "sample", 2.0, 1),
        (1, "fwd-ops.total", 10.0, 3),
        (1, "fwd-ops.norm", 1.0, 3),
        (1, "fwd-ops.conv", 0.0, 3),
        (1, "fwd-ops.qkv", 0.0, 3),
        (1, "fwd-ops.qknorm_rope", 0.0, 3),
        (1, "fwd-ops.ctx_scatter", 0.0, 3),
        (1, "fwd-ops.attn", 5.0, 3),
        (1, "fwd-ops.o_proj", 0.0, 3),
        (1, "fwd-ops.mlp", 4.0, 3),
        (1, "fwd-ops.head", 0.0, 3),
        (1, "dev.pre", 1.0, 2),
        (1, "dev.fwd", 2.0, 2),
        (1, "dev.select", 3.0, 2),
        (1, "dev.walk", 4.0, 2),
        (1, "pre", 0.5, 3),
        (1, "backbone", 0.25, 3),
        (1, "sample", 9.0, 3),
        (2, "backbone", 3.0, 1),
        (2, "sequential", 4.0, 1),
    ]
    assert stats.steps == 3 and t.meta["trace_level"] == 3
    assert stats.joins["not_verified"] == 1  # step 1's proposal: step 2 verified nothing


# -- chains, invariants, strict vs lenient -----------------------------------------------------

BROKEN = (
    "\n".join(
        [
            "vllm.cpp: request 0 was admitted with 3 tokens already computed",  # 1
            "[SPECTRACE] req=0 pos=4 k=2 ns=3 acc=2 draft=[ 5 6 ] emit=[ 5 6 7 ]",  # 2
            "[SPECTRACE] req=0 pos=9 k=2 ns=2 acc=1 draft=[ 8 9 ] emit=[ 8 1 ]",  # 3 gap of 2
            "[SPECTRACE] req=0 pos=11 k=2 ns=2 acc=0 draft=[ 2 3 ] emit=[ 4 1 ]",  # 4 acc
            "[SPECTRACE] req=0 pos=13 k=3 ns=1 acc=0 draft=[ 2 3 ] emit=[ 4 ]",  # 5 len(draft)
            "[SPECTRACE] req=0 pos=x k=3 ns=1 acc=0 draft=[ 2 3 ] emit=[ 4 ]",  # 6 malformed
            "[SPECTRACE] req=0 pos=14 k=8 ns=2 acc=1 draft=[ 1 2 ... ] emit=[ 1 5 ]",  # 7 edited
            "[SPECTRACE] req=0 pos=15 k=1 ns=1 acc=0 draft=[ 3 ] emit=[ 9 ]",  # 8 backwards
        ]
    )
    + "\n"
)
# Positions 7 and 8 hold 0 and 9; the rest follows the emitted ids of lines 2-7.
FULL = [1, 2, 3, 4, 5, 6, 7, 0, 9, 8, 1, 4, 1, 4, 1, 5]
REQS = json.dumps({"req_id": "0", "prompt_ids": FULL[:3], "output_ids": FULL[3:]}) + "\n"


def test_lenient_counts_every_problem_with_line_numbers(tmp_path):
    log = _write(tmp_path, BROKEN)
    reqs = _write(tmp_path, REQS, "r.jsonl")
    stats = import_log(log, tmp_path / "t.h5", requests_path=reqs)
    assert stats.blocks == 6 and stats.malformed == 1 and stats.edited == 1
    assert dict(stats.violations) == {"chain break": 1, "acc != ns-1": 1, "len(draft) != k": 1}
    assert stats.chain_gaps == 1 and [e[0] for e in stats.examples["chain gap"]] == [3]
    assert (
        stats.examples["chain gap"][0][1]
        == "req=0 pos=9: 2 tokens decoded without drafts since line 2"
    )
    assert [e[0] for e in stats.examples["acc != ns-1"]] == [4]
    assert [e[0] for e in stats.examples["len(draft) != k"]] == [5]
    assert [e[0] for e in stats.examples["malformed"]] == [6]
    assert [e[0] for e in stats.examples["edited"]] == [7]
    assert [e[0] for e in stats.examples["chain break"]] == [8]
    assert stats.examples["chain break"][0][1] == (
        "chain break: req=0 pos=15, expected 16 (pos=14 ns=2 at line 7; a reused request id?)"
    )
    t = open_trace(tmp_path / "t.h5")
    b = t.blocks
    # The first block and those after the gap and the break read the requests file.
    assert b.position.tolist() == [3, 8, 10, 12, 13, 14]
    assert b.anchor.tolist() == [FULL[3], FULL[8], 1, 1, 4, FULL[14]]
    assert b.verified[4].tolist()[:3] == [1, 2, -1] and b.num_verified[4] == 8
    assert t.meta["import"]["malformed"] == 1
    assert t.meta["import"]["examples"]["malformed"][0][0] == 6
    assert "3 invariant violations" in stats.summary() and "first at line 4" in stats.summary()
    assert "1 chain gaps" in stats.summary()


def test_emit_draft_mismatch_is_a_violation(tmp_path):
    log = _write(tmp_path, "[SPECTRACE] req=0 pos=4 k=2 ns=2 acc=1 draft=[ 5 6 ] emit=[ 9 6 ]\n")
    stats = import_log(log, tmp_path / "t.h5")
    assert stats.violations == {"emit != draft": 1}


@pytest.mark.parametrize(
    "stop_line,msg",
    [
        (4, "acc != ns-1: req=0 pos=11: acc=0 but ns=2"),
    ],
)
def test_strict_fails_at_first_problem_and_removes_partial(tmp_path, stop_line, msg):
    log = _write(tmp_path, BROKEN)
    with pytest.raises(ParseError) as exc:
        import_log(log, tmp_path / "t.h5", strict=True)
    assert str(exc.value).startswith(f"{log}:{stop_line}: {msg}")
    assert str(exc.value).endswith(f" (partial trace {tmp_path / 't.h5.partial'} removed)")
    assert "\n" not in str(exc.value)
    assert not (tmp_path / "t.h5").exists() and not (tmp_path / "t.h5.partial").exists()


@pytest.mark.parametrize(
    "text,where",
    [
        (
            "[SPECTRACE] req=0 pos=8  k=2 ns=2 acc=1 draft=[ 1 2 ] emit=[ 1 3 ]\n",
            "1: SPECTRACE line differs from the engine's format (spacing or number format)",
        ),
        (
            "ok\n[spec-phase] backbone=27.44ms sample=10.50ms\n",
            "2: spec-phase line differs from the engine's format (missing logits=)",
        ),
        (
            "rows=1 nqpr=8 drafts/row=2 first=[13 198]\n",
            "1: spec-propose line differs from the engine's format (tag missing)",
        ),
        (
            "\n\n[SPECTRACE] req=0 pos=4 k=2 ns=2 acc=1 draft=[ 1 ... ] emit=[ 1 3 ]\n",
            "3: SPECTRACE line differs from the engine's format (ellipsis in an id list)",
        ),
        ("[spec-sched] req=0 have=x\n", "1: malformed trace line: have=x is not an integer"),
    ],
)
def test_strict_rejects_doc_edits(tmp_path, text, where):
    log = _write(tmp_path, text)
    with pytest.raises(ParseError, match=re.escape(f"{log}:{where}")):
        import_log(log, tmp_path / "t.h5", strict=True)
    import_log(log, tmp_path / "u.h5")  # lenient reads the same log


# -- requests file, late anchors ---------------------------------------------------------------


def test_requests_file_errors_name_file_and_line(tmp_path):
    bad = _write(
        tmp_path, '{"req_id": "0", "prompt_ids": [1], "output_ids": []}\n{oops\n', "r.jsonl"
    )
    with pytest.raises(InputError, match=re.escape(f"{bad}:2: not JSON")):
        read_requests(bad)
    ids = _write(tmp_path, '\n{"req_id": 3, "prompt_ids": [1, "a"], "output_ids": []}\n', "s.jsonl")
    with pytest.raises(InputError, match=re.escape(f"{ids}:2: prompt_ids must be a list")):
        read_requests(ids)
    with pytest.raises(InputError, match="no such requests file"):
        read_requests(tmp_path / "missing.jsonl")
    with pytest.raises(InputError, match="no such log file"):
        import_log(tmp_path / "missing.log", tmp_path / "t.h5")


def test_late_requests_patch_flushed_anchors(tmp_path):
    """Capture reads the requests file after the command exits: rows already flushed with
    anchor -1 are patched in the closed file."""
    w = TraceWriter(tmp_path / "t.h5", {}, flush_interval=0, flush_rows=1)
    p = VtTraceParser(w)
    p.feed_line("[SPECTRACE] req=a pos=3 k=1 ns=1 acc=0 draft=[ 5 ] emit=[ 6 ]")
    p.feed_line("[SPECTRACE] req=a pos=4 k=1 ns=2 acc=1 draft=[ 7 ] emit=[ 7 8 ]")
    p.feed_line("[SPECTRACE] req=b pos=2 k=1 ns=1 acc=0 draft=[ 5 ] emit=[ 6 ]")
    assert w.rows_written == 3  # flushed with anchors -1, 6, -1
    resolved = p.set_requests(
        read_requests(
            _write(
                tmp_path,
                '{"req_id": "a", "prompt_ids": [1, 2, 42], "output_ids": [6, 7, 8]}\n',
                "r.jsonl",
            )
        )
    )
    assert resolved == 1 and p.late_patches == [(0, 42)]
    stats = p.finish()
    path = w.close()
    t = open_trace(path)
    assert t.blocks.anchor.tolist() == [42, 6, -1]
    assert t.requests.req_id == ["a", "b"] and t.requests.full_sequence(0).tolist()[2] == 42
    assert stats.anchors == {"requests": 1, "chain": 1, "unknown": 1}


def test_import_from_stdin_via_cli(tmp_path):
    out = tmp_path / "t.h5"
    r = subprocess.run(
        [SPECTRACE, "import", "vt", "-", "-o", str(out), "--requests", str(SYNC_REQS)],
        input=SYNC_LOG.read_text(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    assert r.stderr.startswith("spectrace: imported 5 blocks of 2 requests from <stdin> (k=3")
    assert len(open_trace(out).blocks) == 5


def test_cli_strict_error_is_one_line_exit_2(tmp_path):
    log = _write(tmp_path, BROKEN)
    r = subprocess.run(
        [SPECTRACE, "import", "vt", str(log), "-o", str(tmp_path / "t.h5"), "--strict"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"spectrace: error: {log}:4: acc != ns-1: req=0 pos=11: acc=0 but ns=2 "
        f"(partial trace {tmp_path / 't.h5.partial'} removed)"
    ]
    assert not (tmp_path / "t.h5").exists() and not (tmp_path / "t.h5.partial").exists()


# -- the reference engine ----------------------------------------------------------------------
#
# tests/hooks/data/engine_{draft_model,ngram}.log: real stderr of `python -m spectrace.engine --k 4
# --max-tokens 24 --batch-size 3` (bundled models and prompts, VT_SPEC_TRACE=1); the live
# test below runs the engine under `spectrace capture` when the bundled models exist.

_BLOCK_RE = re.compile(
    r"^\[SPECTRACE\] req=(\S+) pos=(\d+) k=(\d+) ns=(\d+) acc=(\d+) "
    r"draft=\[ ([-\d ]*)\] emit=\[ ([-\d ]*)\]$"
)


def _check_against_raw(trace_path: Path, log_text: str, reqs: Path, stats) -> None:
    """Recompute blocks, anchors and acceptance from the raw lines + requests file."""
    full = {}
    for line in reqs.read_text().splitlines():
        o = json.loads(line)
        full[str(o["req_id"])] = o["prompt_ids"] + o["output_ids"]
    rows = [
        _BLOCK_RE.match(ln).groups() for ln in log_text.splitlines() if ln.startswith("[SPECTRACE]")
    ]
    assert rows and stats.blocks == len(rows)
    t = open_trace(trace_path)
    b = t.blocks
    assert [t.requests.req_id[i] for i in b.request.tolist()] == [r[0] for r in rows]
    assert b.position.tolist() == [int(r[1]) - 1 for r in rows]
    assert b.anchor.tolist() == [full[r[0]][int(r[1]) - 1] for r in rows]
    assert b.accepted.tolist() == [int(r[4]) for r in rows]
    assert int(b.accepted.sum()) == sum(int(r[4]) for r in rows)
    assert b.num_verified.tolist() == [int(r[2]) for r in rows]
    assert [b.verified[i, : int(r[2])].tolist() for i, r in enumerate(rows)] == [
        [int(x) for x in r[5].split()] for r in rows
    ]
    assert [b.emitted[i, : int(r[3])].tolist() for i, r in enumerate(rows)] == [
        [int(x) for x in r[6].split()] for r in rows
    ]
    assert stats.malformed == 0 and stats.edited == 0 and not stats.violations
    nxt, gaps = {}, 0  # a request's next block starts at pos + ns, later after draftless steps
    for r in rows:
        gaps += r[0] in nxt and int(r[1]) > nxt[r[0]]
        nxt[r[0]] = int(r[1]) + int(r[3])
    assert stats.chain_gaps == gaps
    assert stats.anchors.get("unknown", 0) == 0
    # Every proposal is joined exactly or known unverified (its request finished): the
    # reference engine never corrupts drafts, and the payload rows name the first row.
    assert stats.joins.get("unjoined", 0) == 0 and stats.joins.get("partial", 0) == 0
    assert stats.joins.get("proposed != verified", 0) == 0
    assert stats.proposed_source["propose_line"] == stats.joins["exact"] + stats.joins["hint"]
    assert (b.proposed == b.verified).all()


@pytest.mark.parametrize("method,blocks,joined", [("draft_model", 61, 22), ("ngram", 28, 0)])
def test_reference_engine_log_imports_exactly(tmp_path, method, blocks, joined):
    log = DATA / f"engine_{method}.log"
    reqs = DATA / f"engine_{method}.requests.jsonl"
    stats = import_log(log, tmp_path / "t.h5", requests_path=reqs, strict=True)
    assert (stats.blocks, stats.requests, stats.proposed_source["propose_line"]) == (
        blocks,
        5,
        joined,
    )
    assert (stats.chain_gaps > 0) == (method == "ngram")  # rows without an n-gram match
    _check_against_raw(tmp_path / "t.h5", log.read_text(), reqs, stats)


def _engine_ready() -> str | None:
    try:
        import torch  # noqa: F401

        from spectrace.engine.loader import bundled_model_dir, bundled_prompts_path

        for name in ("target", "draft"):
            d = Path(bundled_model_dir(name))
            if not any(d.glob("*.safetensors")):
                return f"no bundled {name} model in {d}"
        bundled_prompts_path()
    except Exception as exc:  # the engine or its extra is not installed
        return f"reference engine unavailable ({exc})"
    return None


def test_capture_of_the_live_reference_engine(tmp_path):
    """`spectrace capture` on the real engine: forwarded log, requests read after exit,
    first-block anchors patched, everything equal to an independent reading of the log."""
    why = _engine_ready()
    if why:
        pytest.skip(why)
    from spectrace.engine.loader import bundled_prompts_path

    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(bundled_prompts_path().read_text().splitlines(True)[:3]))
    reqs, log, out = tmp_path / "r.jsonl", tmp_path / "raw.log", tmp_path / "t.h5"
    env = {k: v for k, v in os.environ.items() if k != "VT_SPEC_TRACE"}
    r = subprocess.run(
        [
            SPECTRACE,
            "capture",
            "-o",
            str(out),
            "--requests",
            str(reqs),
            "--log",
            str(log),
            "--strict",
            "--",
            sys.executable,
            "-m",
            "spectrace.engine",
            "--method",
            "draft_model",
            "--k",
            "4",
            "--max-tokens",
            "16",
            "--batch-size",
            "2",
            "--prompts",
            str(prompts),
            "--requests-out",
            str(reqs),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.splitlines()[:-1] == log.read_text().splitlines()
    assert "anchors resolved from the requests file" in r.stderr.splitlines()[-1]
    stats = import_log(log, tmp_path / "u.h5", requests_path=reqs, strict=True)
    _check_against_raw(out, log.read_text(), reqs, stats)


# -- requests file checked against the log (issue 12 item 6) --------------------------------------

# Request a: blocks at pos 10 and 12 (its last anchor is token 11); b: one block at pos 5.
_TWO_REQUESTS = (
    "[SPECTRACE] req=a pos=10 k=2 ns=2 acc=1 draft=[ 5 6 ] emit=[ 5 7 ]\n"
    "[SPECTRACE] req=a pos=12 k=2 ns=2 acc=1 draft=[ 8 9 ] emit=[ 8 3 ]\n"
    "[SPECTRACE] req=b pos=5 k=2 ns=1 acc=0 draft=[ 4 4 ] emit=[ 2 ]\n"
)


def _requests(tmp_path, rows: list[tuple[str, int, list[int]]]) -> Path:
    p = tmp_path / "r.jsonl"
    p.write_text(
        "".join(
            json.dumps({"req_id": r, "prompt_ids": [1] * n, "output_ids": out}) + "\n"
            for r, n, out in rows
        )
    )
    return p


def _import_cli(log, req, *extra) -> subprocess.CompletedProcess:
    out = Path(log).parent / "t.h5"
    return subprocess.run(
        [SPECTRACE, "import", "vt", str(log), "-o", str(out), "--requests", str(req), *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_requests_with_every_id_wrong_warn_with_counts(tmp_path):
    log = _write(tmp_path, _TWO_REQUESTS)
    req = _requests(tmp_path, [("x", 10, [5]), ("y", 4, [2])])
    r = _import_cli(log, req)
    assert r.returncode == 0, r.stderr
    warning = (
        f"spectrace: warning: {req}: does not match {log}: 2 of 2 log requests are not in it "
        f"(first: req=a); 2 of its 2 requests are not in the log (first: req=x)"
    )
    assert r.stderr.splitlines()[1:] == [warning]
    check = open_trace(tmp_path / "t.h5").meta["import"]["requests_check"]
    assert check == {
        "log_requests": 2,
        "file_requests": 2,
        "missing": 2,
        "unmatched": 2,
        "short": 0,
        "first_missing": "a",
        "first_unmatched": "x",
        "message": warning.removeprefix("spectrace: warning: "),
    }


def test_requests_shorter_than_the_log(tmp_path):
    log = _write(tmp_path, _TWO_REQUESTS)
    # a: 10 + 1 = 11 ids, but its last anchor is token 11 (pos 12); b: 4 + 1 = 5 ids, pos 5: ok.
    req = _requests(tmp_path, [("a", 10, [5]), ("b", 4, [2])])
    stats = import_log(log, tmp_path / "t.h5", requests_path=req)
    assert stats.requests_check["short"] == 1 and stats.requests_check["missing"] == 0
    assert stats.requests_warning() == (
        f"{req}: does not match {log}: 1 of 2 log requests end before the log's last anchor "
        f"(first: req=a has 11 ids, the log reached position 12)"
    )


def test_strict_makes_a_requests_mismatch_an_error(tmp_path):
    log = _write(tmp_path, _TWO_REQUESTS)
    req = _requests(tmp_path, [("a", 10, [5, 7, 8, 3])])  # b is missing
    r = _import_cli(log, req, "--strict")
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"spectrace: error: {req}: does not match {log}: 1 of 2 log requests are not in it "
        f"(first: req=b) (partial trace {tmp_path / 't.h5.partial'} removed)"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl", "run.log"]


def test_matching_requests_file_is_silent(tmp_path):
    log = _write(tmp_path, _TWO_REQUESTS)
    req = _requests(tmp_path, [("a", 10, [5, 7, 8, 3]), ("b", 4, [2])])
    r = _import_cli(log, req, "--strict")
    assert r.returncode == 0, r.stderr
    assert len(r.stderr.splitlines()) == 1  # the summary only
    check = open_trace(tmp_path / "t.h5").meta["import"]["requests_check"]
    assert check == {
        "log_requests": 2,
        "file_requests": 2,
        "missing": 0,
        "unmatched": 0,
        "short": 0,
        "message": "",
    }
