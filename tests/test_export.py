"""``spectrace export``, the Python API (``spectrace.open`` / ``spectrace.diff``) and the
documented DuckDB queries (issue 14 items 2 and 3): the Parquet export round-trips, and the
queries reproduce ``spectrace info`` and ``spectrace diff`` figures exactly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from inproc import run_inproc, run_process

import spectrace
from spectrace.tracer import schema
from spectrace.tracer.export import BLOCK_FIELDS, read_parquet
from spectrace.tracer.export_sql import PAIR_FIGURES, RUN_FIGURES, RUN_TOTALS
from spectrace.tracer.store import TraceWriter, open_trace

ROOT = Path(__file__).resolve().parents[1]
REF, VLLM = ROOT / "traces" / "reference.h5", ROOT / "traces" / "vllm.h5"

duckdb = pytest.importorskip("duckdb")
pytest.importorskip("pyarrow")


_run, _run_process = run_inproc, run_process


def _json(*args) -> dict:
    r = _run(*args, "--format", "json")
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


def _perturbed(out: Path) -> Path:
    """reference.h5 with slot 2 of every third block's proposal set to id 7 (a bug twin)."""
    t = open_trace(REF)
    r = t.requests
    with TraceWriter(out, dict(t.meta), flush_interval=0) as w:
        for i in range(len(r)):
            w.request(r.req_id[i], r.prompt_ids[i], r.output_ids[i], r.finish_reason[i])
        cols = {c.name: getattr(t.blocks, c.name) for c in schema.BLOCK_COLUMNS if not c.derived}
        prop = cols["proposed"].copy()
        prop[::3, 2] = 7
        cols["proposed"] = cols["verified"] = prop
        w.add_blocks(cols)
    return out


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("export")
    bad = _perturbed(d / "bad.h5")
    out = d / "out"
    r = _run_process("export", REF, VLLM, bad, "-o", out)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [
        f"spectrace: exported 422 blocks and 15 requests of 3 run(s) (reference, vllm, bad) "
        f"to {out} (parquet)"
    ]
    return out, bad


def _query(sql: str, out: Path, **params) -> list[dict]:
    cur = duckdb.connect().execute(sql.format(out=out), params)
    names = [c[0] for c in cur.description]
    return [dict(zip(names, row)) for row in cur.fetchall()]


def test_export_layout_is_hive_partitioned(exported):
    out, _ = exported
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*.parquet"))
    assert files == [
        f"{t}/run={run}/rank=0/part-0.parquet"
        for t in ("blocks", "requests")
        for run in ("bad", "reference", "vllm")
    ]


def test_duckdb_reproduces_info_per_run_and_rank(exported):
    out, bad = exported
    rows = {r["run"]: r for r in _query(RUN_FIGURES, out)}
    for run, path in (("reference", REF), ("vllm", VLLM), ("bad", bad)):
        info = _json("info", path)
        row = rows[run]
        assert row["rank"] == 0 and row["blocks"] == info["blocks"]
        rec = info["recorded"]
        got = {k: row[k] for k in ("verified_tokens", "accepted_tokens", "acceptance_rate")}
        got["blocks"] = row["verified_blocks"]
        got["mean_acceptance_length"] = row["mean_acceptance_length"]
        got["per_position"] = row["per_position"]
        assert got == {k: rec[k] for k in got}


@pytest.mark.parametrize(
    "ours, theirs", [("reference", "vllm"), ("vllm", "reference"), ("reference", "bad")]
)
def test_duckdb_reproduces_diff_figures(exported, ours, theirs):
    out, bad = exported
    paths = {"reference": REF, "vllm": VLLM, "bad": bad}
    d = _json("diff", paths[ours], paths[theirs])
    (row,) = _query(PAIR_FIGURES, out, ours=ours, theirs=theirs)
    agr, cov = d["agreement"], d["coverage"]
    keys = ("paired_blocks", "exact_matches", "exact_match_rate", "per_position")
    assert {k: row[k] for k in keys} == {k: agr[k] for k in keys}
    assert row["per_position_blocks"] == agr["per_position_blocks"]
    assert row["ours_on_matched_content"] == cov["ours_on_matched_content"]
    assert row["theirs_on_matched_content"] == cov["theirs_on_matched_content"]
    if theirs == "bad":  # the bug twin: 47 of 139 blocks (every third) differ in slot 2
        assert (row["exact_matches"], row["per_position"][2]) == (92, 92 / 139)


def test_parquet_round_trips_every_column(exported):
    out, _ = exported
    back = read_parquet(out, "blocks")
    back = back.filter(_is_run(back, "vllm"))
    t = spectrace.open(VLLM)
    mine = t.blocks_arrow()
    assert back.schema.names == mine.schema.names == [f[0] for f in BLOCK_FIELDS]
    for name in mine.schema.names:
        a, c = back.column(name).to_pylist(), mine.column(name).to_pylist()
        if name in ("draft_margin", "target_margin"):  # NaN (unknown) != NaN
            a, c = np.array(a, np.float32), np.array(c, np.float32)
            assert np.array_equal(a, c, equal_nan=True), name
        else:
            assert a == c, name
    b = t.trace.blocks  # and each column against the reader's numpy column
    for name in ("request", "step", "position", "anchor", "k", "num_verified", "accepted"):
        assert back.column(name).to_pylist() == getattr(b, name).tolist(), name
    assert back.column("proposed").to_pylist() == [
        row[:k].tolist() for row, k in zip(b.proposed, b.k)
    ]
    assert back.column("emitted").to_pylist() == [
        row[:n].tolist() if n >= 0 else None for row, n in zip(b.emitted, b.num_emitted)
    ]
    margins = np.array(back.column("draft_margin").to_pylist(), dtype=np.float32)
    assert np.array_equal(margins, schema.pad_to(b.draft_margin, 4, np.nan), equal_nan=True)
    reqs = read_parquet(out, "requests")
    reqs = reqs.filter(_is_run(reqs, "vllm"))
    assert reqs.to_pylist() == t.requests_arrow().to_pylist()


def _is_run(table, run: str):
    import pyarrow.compute as pc

    return pc.equal(table.column("run"), run)


def test_api_diff_is_the_typed_result():
    r = spectrace.diff(REF, VLLM)
    assert type(r).__name__ == "DiffResult" and r.diverged is False
    assert (r.agreement.paired_blocks, r.agreement.exact_matches) == (139, 139)
    t = spectrace.open(REF)
    df = t.blocks_df()
    assert len(df) == 139 and int(df.accepted.sum()) == 185  # info: 185 accepted
    assert t.info()["blocks"] == 139 and t.run == "reference"


def test_api_and_export_import_no_pyarrow_or_pandas():
    code = (
        "import sys, spectrace, spectrace.tables, spectrace.tracer.export, "
        "spectrace.tracer.cli.main; "
        "print(sorted(m for m in ('pyarrow', 'pandas', 'duckdb') if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"


def test_jsonl_and_csv_exports(tmp_path):
    r = _run("export", REF, "--format", "jsonl", "-o", tmp_path / "j")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in (tmp_path / "j" / "blocks.jsonl").read_text().splitlines()]
    assert len(rows) == 139 and sum(x["accepted"] for x in rows) == 185
    assert rows[0]["proposed"] == [318, 351, 372, 63] and rows[0]["draft_margin"] == [None] * 4
    r = _run("export", REF, "--format", "csv", "-o", tmp_path / "c")
    assert r.returncode == 0, r.stderr
    lines = (tmp_path / "c" / "requests.csv").read_text().splitlines()
    assert lines[0] == "run,rank,request,req_id,prompt_ids,output_ids,finish_reason"
    assert len(lines) == 6


def test_export_refuses_to_overwrite_and_force_replaces_only_an_export(tmp_path):
    out = tmp_path / "o"
    assert _run("export", REF, "-o", out).returncode == 0
    r = _run("export", REF, "-o", out)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"spectrace: error: {out}: the output (-o) exists; pass --force to overwrite it"
    ]
    assert _run("export", VLLM, "-o", out, "--force").returncode == 0
    assert sorted(p.name for p in (out / "blocks").iterdir()) == ["run=vllm"]
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    r = _run("export", REF, "-o", other, "--force")
    assert r.returncode == 2 and (other / "notes.txt").read_text() == "keep"
    r = _run("export", REF, REF, "-o", tmp_path / "twice")
    assert r.returncode == 2 and "both run 'reference'" in r.stderr
    r = _run("export", REF, "--run", "a/b", "-o", tmp_path / "twice")
    assert r.stderr.splitlines() == [
        "spectrace: error: run name 'a/b': use letters, digits, '.', '_' and '-' only"
    ]
    assert not (tmp_path / "twice").exists() and not (tmp_path / "twice.partial").exists()


def _write(path: Path, requests, blocks, meta=None) -> Path:
    """A small trace: requests (req_id, prompt, output), blocks (req_id, position, proposed)."""
    with TraceWriter(path, {"engine": "t", "k": 3, **(meta or {})}, flush_interval=0) as w:
        for rid, prompt, out in requests:
            w.request(rid, prompt, out, "length")
        for i, (rid, pos, prop) in enumerate(blocks):
            w.add_block(rid, i, pos, 0, prop, verified=prop, accepted=0, emitted=[1], t_ns=0)
    return path


def test_duckdb_pairing_matches_diff_on_an_awkward_pair(tmp_path):
    # a duplicate prompt (paired in order), content that diverges at index 6, a request
    # without output ids (every position comparable), one without a partner, a position
    # recorded twice (the first block counts) and a k mismatch
    ours = _write(
        tmp_path / "ours.h5",
        [
            ("a0", [1, 2], [3, 4, 5, 6, 7, 8]),
            ("a1", [1, 2], [3, 4, 9, 9, 9, 9]),
            ("a2", [7], []),
            ("a3", [5, 5], [1, 1, 1]),
        ],
        [
            ("a0", 2, [4, 5, 6]),
            ("a0", 5, [7, 8, 1]),
            ("a0", 6, [8, 1, 1]),
            ("a1", 2, [4, 9, 9]),
            ("a1", 2, [0, 0, 0]),
            ("a1", 4, [9, 9]),
            ("a2", 9, [1, 2, 3]),
            ("a3", 2, [1, 1, 1]),
        ],
    )
    theirs = _write(
        tmp_path / "theirs.h5",
        [("b0", [1, 2], [3, 4, 5, 6, 0, 0]), ("b1", [1, 2], [3, 4, 9, 9, 9, 9]), ("b2", [7], [8])],
        [
            ("b0", 2, [4, 5, 6]),
            ("b0", 5, [0, 0, 1]),
            ("b0", 6, [0, 1, 1]),
            ("b1", 2, [4, 9, 8]),
            ("b1", 4, [9, 9, 9]),
            ("b2", 9, [1, 2, 3]),
        ],
    )
    out = tmp_path / "x"
    from spectrace.tracer.export import block_columns, request_columns, write_parquet

    for name, path in (("ours", ours), ("theirs", theirs)):
        t = open_trace(path)
        write_parquet(block_columns(t, name), "blocks", out)
        write_parquet(request_columns(t, name), "requests", out)
    d = spectrace.diff(ours, theirs).to_json()
    (row,) = _query(PAIR_FIGURES, out, ours="ours", theirs="theirs")
    agr, cov = d["agreement"], d["coverage"]
    keys = ("paired_blocks", "exact_matches", "exact_match_rate", "per_position")
    assert {k: row[k] for k in keys} == {k: agr[k] for k in keys}
    assert row["per_position_blocks"] == agr["per_position_blocks"]
    assert row["ours_on_matched_content"] == cov["ours_on_matched_content"]
    assert row["theirs_on_matched_content"] == cov["theirs_on_matched_content"]
    # by hand: a0/b0 differ at index 6, so positions 2 and 5 pair (6 does not); a1/b1 pair
    # at 2 (first block) and 4 (k 2 vs 3); a2/b2 at 9 (a2 has no output ids): 5 paired,
    # exact at a0:2 and a2:9 only
    assert (row["paired_blocks"], row["exact_matches"]) == (5, 2)


def test_ranks_of_one_run_are_partitions(tmp_path):
    for rank in (0, 1):
        _write(
            tmp_path / f"run.dp{rank}.h5",
            [(f"r{rank}", [1, 2], [3, 4])],
            [(f"r{rank}", 2, [4, 5, 6])],
            {"dp_rank": rank},
        )
    _write(  # a second run of two ranks, with different acceptance per rank
        tmp_path / "other.dp0.h5", [("x", [1], [2, 3, 4])], [("x", 1, [3, 4, 9])], {"dp_rank": 0}
    )
    with TraceWriter(tmp_path / "other.dp1.h5", {"engine": "t", "k": 3, "dp_rank": 1}) as w:
        w.request("y", [1], [2, 3, 4, 5], "length")
        w.add_block("y", 0, 1, 2, [3, 4, 5], verified=[3, 4, 5], accepted=2, emitted=[3, 4, 5])
        w.add_block("y", 1, 4, 5, [6, 7, 8])  # never verified
    out = tmp_path / "x"
    r = _run("export", tmp_path / "run.dp*.h5", tmp_path / "other.dp*.h5", "-o", out)
    assert r.returncode == 0, r.stderr
    back = read_parquet(out, "blocks")
    back = back.filter(_is_run(back, "run"))
    assert back.column("rank").to_pylist() == [0, 1]
    assert back.column("request").to_pylist() == [0, 1]
    assert back.column("req_id").to_pylist() == ["r0", "r1"]
    rows = _query(RUN_FIGURES, out)
    assert [(x["run"], x["rank"], x["blocks"]) for x in rows] == [
        ("other", 0, 1),
        ("other", 1, 2),
        ("run", 0, 1),
        ("run", 1, 1),
    ]
    for row in _query(RUN_TOTALS, out):  # all ranks of a run: info of its files as one trace
        info = _json("info", tmp_path / f"{row['run']}.dp*.h5")
        assert row["blocks"] == info["blocks"]
        rec = info["recorded"]
        assert (row["verified_blocks"], row["accepted_tokens"]) == (
            rec["blocks"],
            rec["accepted_tokens"],
        )
        assert row["per_position"] == rec["per_position"]
        assert row["acceptance_rate"] == rec["acceptance_rate"]


def test_parquet_without_pyarrow_is_one_line_and_exit_2(tmp_path):
    code = (
        "import sys; sys.modules['pyarrow'] = None; "
        "from spectrace.tracer.cli.main import main; "
        f"main(['export', {str(REF)!r}, '-o', {str(tmp_path / 'o')!r}])"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        "spectrace: error: pyarrow is not installed: the Parquet export and the table views "
        "need it (pip install 'spectrace[export]')"
    ]
    assert list(tmp_path.iterdir()) == []  # the .partial folder is removed
