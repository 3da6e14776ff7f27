"""The bundled real traces (traces/): figures derived independently from the raw files."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from spectrace.tracer.store import open_trace

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "traces"
SPECTRACE = os.path.join(os.path.dirname(sys.executable), "spectrace")
LINE = re.compile(
    r"^\[SPECTRACE\] req=(\S+) pos=(\d+) +k=(\d+) ns=(\d+) acc=(\d+) "
    r"draft=\[ ([-\d ]*)\] emit=\[ ([-\d ]*)\]$"
)


def raw_blocks():
    """The reference log read with a regex of our own: (req, pos, acc, draft, emit)."""
    out = []
    for line in (TRACES / "reference.vt.log").read_text().splitlines():
        m = LINE.match(line)
        if m:
            req, pos, _k, _ns, acc, draft, emit = m.groups()
            out.append(
                (
                    req,
                    int(pos),
                    int(acc),
                    [int(x) for x in draft.split()],
                    [int(x) for x in emit.split()],
                )
            )
    return out


def requests():
    return {
        r["req_id"]: r
        for r in map(json.loads, (TRACES / "reference.requests.jsonl").read_text().splitlines())
    }


def test_reference_trace_matches_its_raw_log():
    raw, reqs = raw_blocks(), requests()
    t = open_trace(TRACES / "reference.h5")
    assert len(t.blocks) == len(raw) == 139
    assert int(t.blocks.accepted.sum()) == sum(r[2] for r in raw) == 185
    key = sorted((req, pos - 1, acc) for req, pos, acc, _, _ in raw)
    got = sorted(
        (t.requests.req_id[r], int(p), int(a))
        for r, p, a in zip(t.blocks.request, t.blocks.position, t.blocks.accepted)
    )
    assert got == key
    # Every anchor is the sequence's token at the anchor position (pos - 1).
    for r, p, a in zip(t.blocks.request, t.blocks.position, t.blocks.anchor):
        req = reqs[t.requests.req_id[r]]
        assert a == (req["prompt_ids"] + req["output_ids"])[p]


def test_import_of_the_raw_log_equals_the_live_capture(tmp_path):
    out = tmp_path / "imported.h5"
    subprocess.run(
        [
            SPECTRACE,
            "import",
            "vt",
            str(TRACES / "reference.vt.log"),
            "-o",
            str(out),
            "--requests",
            str(TRACES / "reference.requests.jsonl"),
        ],
        check=True,
        capture_output=True,
    )
    a, b = open_trace(out), open_trace(TRACES / "reference.h5")
    for col in ("position", "anchor", "k", "proposed", "verified", "accepted", "emitted"):
        assert np.array_equal(getattr(a.blocks, col), getattr(b.blocks, col)), col


def test_vllm_trace_agrees_with_vllms_counters():
    info = json.loads(
        subprocess.run(
            [SPECTRACE, "info", "--format", "json", str(TRACES / "vllm.h5")],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    checks = info["meta"]["checks"]
    assert checks["status"] == "ok"
    assert checks["vllm"] == {
        "num_drafts": 139,
        "num_draft_tokens": 556,
        "num_accepted_tokens": 185,
        "num_accepted_tokens_per_pos": [90, 40, 30, 25],
    }
    rec = info["recorded"]
    assert (rec["blocks"], rec["verified_tokens"], rec["accepted_tokens"]) == (139, 556, 185)
    assert rec["per_position"] == [90 / 139, 40 / 139, 30 / 139, 25 / 139]
    assert info["blocks"] == 144 and info["unverified_blocks"] == 5  # final proposals


def test_reference_equals_vllm_on_the_bundled_models():
    r = subprocess.run(
        [
            SPECTRACE,
            "diff",
            "--format",
            "json",
            str(TRACES / "reference.h5"),
            str(TRACES / "vllm.h5"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout[-2000:]
    doc = json.loads(r.stdout)
    assert doc["agreement"]["paired_blocks"] == doc["agreement"]["exact_matches"] == 139
    assert doc["coverage"]["ours_coverage"] == doc["coverage"]["theirs_coverage"] == 1.0
    # One prompt loops on both engines alike: one warning for the pair, not one per side.
    assert [(f["kind"], f["severity"]) for f in doc["findings"]] == [
        ("degenerate_output", "warning")
    ]
    assert "both engines loop identically" in doc["findings"][0]["message"]


def test_bad_tokenizer_fails_fast_while_columns_are_read(tmp_path):
    # The diff reads block columns on a background thread from the start; an input error
    # raised meanwhile must still end the process at once with exit 2 (it once hung).
    bad = tmp_path / "tokenizer.json"
    bad.write_text("not json")
    for tok in (str(tmp_path / "missing"), str(bad)):
        r = subprocess.run(
            [
                SPECTRACE,
                "diff",
                str(TRACES / "reference.h5"),
                str(TRACES / "vllm.h5"),
                "--tokenizer",
                tok,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 2, r.stderr
        assert r.stderr.startswith(f"spectrace: error: {tok}"), r.stderr
