"""The thirteenth round's second part (captures, imports, exports, replays), each defect
with its clean twin. Expected values derived by hand from the bundled traces
(``traces/README.md``: the reference log's 139 blocks, 5 requests of 64 output tokens) and
from the small inputs written here.

1. A request in the requests file that the log never shows (6 output tokens, no block)
   passed ``check``: ``capture_incomplete``.
2. ``export --run 007 --run 7``: hive readers typed ``run`` as an integer and merged the
   two runs. A run name that readers would type (a number, a date) is exit 2.
3. ``RUN_FIGURES`` counted the blocks ``info`` leaves out as impossible: the export marks
   them (``impossible``) and the query leaves them out.
4. ``capture`` searched its whole line buffer on every read (200 MB without a newline:
   230 s): each chunk is searched once; the lines read are the same.
5. ``replay --engine cmd``: a block printed twice, a record with another prompt and a block
   of a request never asked for passed (exit 0): exit 3.
6. A golden block drafting more than ``num_speculative_tokens`` passed (impossible_values
   now); a golden without counters whose block could not be placed passed (lost work:
   capture_incomplete); ``max_tokens: -1`` was taken without a word.
7. A requests file's ``finish_reason: 5`` was stored as ``"5"``: exit 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from inproc import run_inproc
from replay_fake import replay_fake

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"
REFERENCE = TRACES / "reference.h5"
LOG, REQUESTS = TRACES / "reference.vt.log", TRACES / "reference.requests.jsonl"


def _findings(*args) -> tuple[int, dict[str, dict]]:
    r = run_inproc(*args, "--format", "json")
    return r.returncode, {f["kind"]: f for f in json.loads(r.stdout)["findings"]}


# -- 1. a request the log never shows ------------------------------------------------------


def test_a_request_absent_from_the_log_is_missing_work(tmp_path):
    reqs = tmp_path / "req.jsonl"
    extra = {"req_id": "9", "prompt_ids": [5, 6, 7], "output_ids": [8, 9, 10, 11, 12, 13]}
    reqs.write_text(REQUESTS.read_text() + json.dumps(extra) + "\n")
    out = tmp_path / "t.h5"
    args = ("--meta", "method=draft_model")
    assert run_inproc("import", "vt", LOG, "-o", out, "--requests", reqs, *args).returncode == 0
    rc, found = _findings("check", out)
    assert rc == 1
    assert (
        "1 request emitted 2 or more tokens without a block"
        in (found["capture_incomplete"]["message"])
    )
    assert "(first: request 9)" in found["capture_incomplete"]["message"]


def test_clean_twin_every_request_of_the_file_in_the_log(tmp_path):
    out = tmp_path / "t.h5"
    args = ("--requests", REQUESTS, "--meta", "method=draft_model")
    assert run_inproc("import", "vt", LOG, "-o", out, *args).returncode == 0
    rc, found = _findings("check", out)
    assert rc == 0 and "capture_incomplete" not in found


# -- 2. run names that readers would type --------------------------------------------------


@pytest.mark.parametrize("name", ["007", "20261203", "2026-12-03", "inf", "Epoch"])
def test_a_run_name_readers_would_type_is_bad_input(tmp_path, name):
    r = run_inproc("export", REFERENCE, "--run", name, "-o", tmp_path / "out")
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1] == (
        f"spectrace: error: run name {name!r}: DuckDB and pyarrow would read it back as a number "
        f"or a date, not the string it is (hive partitioning infers a key's type from its "
        f"folder names): start it with a letter, e.g. --run run-{name}"
    )
    assert not (tmp_path / "out").exists()


def test_clean_twin_run_names_starting_with_a_letter_read_back_as_strings(tmp_path):
    pa_ds = pytest.importorskip("pyarrow.dataset")
    out = tmp_path / "out"
    args = ("--run", "r007", "--run", "r7", "-o", out)
    assert run_inproc("export", REFERENCE, REFERENCE, *args).returncode == 0
    t = pa_ds.dataset(out / "blocks", format="parquet", partitioning="hive").to_table()
    assert str(t.schema.field("run").type) == "string"
    runs = t.column("run").to_pylist()
    assert (runs.count("r007"), runs.count("r7")) == (139, 139)


# -- 3. RUN_FIGURES leaves impossible blocks out -------------------------------------------


def test_run_figures_leave_out_what_info_leaves_out(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    pytest.importorskip("pyarrow")
    from spectrace.tracer.export_sql import RUN_FIGURES

    lines = REQUESTS.read_text().splitlines()
    first = json.loads(lines[0])
    first["output_ids"] = first["output_ids"][:20]  # request 0's blocks past 30: impossible
    reqs = tmp_path / "short.jsonl"
    reqs.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    trace, out = tmp_path / "short.h5", tmp_path / "out"
    assert run_inproc("import", "vt", LOG, "-o", trace, "--requests", reqs).returncode == 0
    info = json.loads(run_inproc("info", trace, "--format", "json").stdout)
    assert run_inproc("export", trace, "--run", "short", "-o", out).returncode == 0
    (row,) = duckdb.sql(RUN_FIGURES.replace("{out}", str(out))).fetchall()
    rec = info["recorded"]
    assert row[2:6] == (139, rec["blocks"], rec["verified_tokens"], rec["accepted_tokens"])
    assert rec["blocks"] < 139  # some blocks were left out: the twin below has none
    left_out = duckdb.sql(
        f"SELECT count(*) FROM read_parquet('{out}/blocks/*/*/*.parquet') WHERE impossible"
    ).fetchall()
    assert left_out == [(info["left_out_blocks"],)]


def test_clean_twin_the_bundled_trace_has_no_impossible_block(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    pytest.importorskip("pyarrow")
    from spectrace.tracer.export_sql import RUN_FIGURES

    out = tmp_path / "out"
    assert run_inproc("export", REFERENCE, "--run", "ref", "-o", out).returncode == 0
    (row,) = duckdb.sql(RUN_FIGURES.replace("{out}", str(out))).fetchall()
    assert row[2:6] == (139, 139, 556, 185)  # traces/README.md: 185/556 on 139 blocks


# -- 4. capture's line reader ---------------------------------------------------------------


def test_stderr_lines_joins_a_long_line_and_splits_across_reads():
    from spectrace.hooks.capture import _stderr_lines

    code = (
        "import sys, time; w = sys.stderr.buffer\n"
        "w.write(b'a' * 200000); w.flush(); time.sleep(0.1)\n"
        "w.write(b'b\\nc'); w.flush(); time.sleep(0.1)\n"
        "w.write(b'd\\n\\ne'); w.flush()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE)
    lines = list(_stderr_lines(proc))
    proc.wait()
    assert lines == [b"a" * 200000 + b"b\n", b"cd\n", b"\n", b"e"]


# -- 5. a replayed cmd engine's inconsistent record -----------------------------------------

_FAKE_ENGINE = """
import json, sys
prompts, requests, mode = sys.argv[1], sys.argv[2], sys.argv[3]
with open(requests, "w") as out:
    for line in open(prompts):
        d = json.loads(line)
        n, prompt = len(d["prompt_ids"]), d["prompt_ids"]
        block = (f"[SPECTRACE] req={d['id']} pos={n + 1} k=2 ns=1 acc=0 draft=[ 5 6 ] "
                 f"emit=[ 7 ]")
        print(block, file=sys.stderr)
        if mode == "twice" and d["id"] == "1":
            print(block, file=sys.stderr)
        if mode == "prompt" and d["id"] == "1":
            prompt = prompt[:-1]
        out.write(json.dumps({"req_id": d["id"], "prompt_ids": prompt,
                              "output_ids": [4, 7]}) + "\\n")
    if mode == "unasked":
        print("[SPECTRACE] req=99 pos=3 k=2 ns=1 acc=0 draft=[ 5 6 ] emit=[ 7 ]",
              file=sys.stderr)
        out.write(json.dumps({"req_id": "99", "prompt_ids": [1, 2], "output_ids": [4, 7]})
                  + "\\n")
"""


def _replay_fake(tmp_path: Path, mode: str):
    """Replay a 3-token prompt + 4-token output: 3 positions (3, 4, 5: sites 0, 1, 2)."""
    return replay_fake(tmp_path, _FAKE_ENGINE, mode)


@pytest.mark.parametrize(
    ("mode", "error"),
    [
        ("twice", "'s trace lines: the log has 1 block at a position its request had passed"),
        (
            "prompt",
            "engine's requests record for site 1 (request a position 4) holds another prompt "
            "than the prefix it was given (3 tokens, not 4)",
        ),
        (
            "unasked",
            "engine drafted for 1 request(s) it was not given (first: id 99): its trace is not "
            "this replay's",
        ),
    ],
)
def test_a_replayed_engines_inconsistent_record_failed(tmp_path, mode, error):
    r, out = _replay_fake(tmp_path, mode)
    assert (r.returncode, r.stdout) == (3, ""), r.stderr
    assert error in r.stderr.splitlines()[-1]
    assert not out.exists()


def test_clean_twin_a_consistent_engine_replays(tmp_path):
    r, out = _replay_fake(tmp_path, "ok")
    assert r.returncode == 0, r.stderr
    assert out.exists()


# -- 6. goldens ----------------------------------------------------------------------------


def _golden(tmp_path: Path, k: int, blocks: list, metrics: bool = True, **extra) -> Path:
    """One record: prompt [10, 11, 12], output [20 .. 25] (positions 3 .. 8, a stop before
    max_tokens); ``blocks`` as (anchor, drafts)."""
    doc = {
        "oracle_version": 3,
        "pin": "vllm==0.32.0",
        "num_speculative_tokens": k,
        "max_tokens": 8,
        **extra,
        "records": [
            {
                "prompt_token_ids": [10, 11, 12],
                "output_token_ids": list(range(20, 26)),
                "blocks": [
                    {"call": i, "req_row": 0, "anchor": a, "drafts": d}
                    for i, (a, d) in enumerate(blocks)
                ],
            }
        ],
    }
    if metrics:  # the counters of the two blocks below: 2 drafts, 6 tokens, 2 + 1 accepted
        doc["metrics"] = {
            "vllm:spec_decode_num_drafts": 2,
            "vllm:spec_decode_num_draft_tokens": 6,
            "vllm:spec_decode_num_accepted_tokens": 3,
            "vllm:spec_decode_num_accepted_tokens_per_pos": [2, 1, 0],
        }
    path = tmp_path / "golden.json"
    path.write_text(json.dumps(doc))
    return path


# anchor 20 at position 3 accepts 21, 22 (2); the next anchor is 23 at position 6 (accepts 24,
# then 98 is not 25): its bonus 25 at 8 ends the output, which the two blocks cover whole
_BLOCKS = [(20, [21, 22, 99]), (23, [24, 98, 97])]


def test_a_golden_block_wider_than_k_is_impossible(tmp_path):
    out = tmp_path / "g.h5"
    assert run_inproc("import", "golden", _golden(tmp_path, 2, _BLOCKS), "-o", out).returncode == 0
    rc, found = _findings("check", out)
    assert rc == 1
    assert found["impossible_values"]["message"].startswith(
        "trace: 2 blocks hold values no engine can produce (first: block 0, request 0 at "
        "position 3: k > /meta k, k=3, limit 2)"
    )


def test_clean_twin_a_golden_block_as_wide_as_k(tmp_path):
    out = tmp_path / "g.h5"
    assert run_inproc("import", "golden", _golden(tmp_path, 3, _BLOCKS), "-o", out).returncode == 0
    rc, found = _findings("check", out)
    assert rc == 0 and "impossible_values" not in found


def test_an_unplaced_golden_block_without_counters_is_lost_work(tmp_path):
    blocks = [_BLOCKS[0], (77, [24, 98, 97])]  # 77 is not the token at position 6 (23)
    out = tmp_path / "g.h5"
    golden = _golden(tmp_path, 3, blocks, metrics=False)
    assert run_inproc("import", "golden", golden, "-o", out).returncode == 0
    rc, found = _findings("check", out)
    assert rc == 1
    assert (
        f"first: {golden}:1: anchor is not the token at position 6 (23): the walk ends"
        in found["capture_incomplete"]["message"]
    )


def test_clean_twin_a_golden_without_counters_placed_whole(tmp_path):
    out = tmp_path / "g.h5"
    golden = _golden(tmp_path, 3, _BLOCKS, metrics=False)
    assert run_inproc("import", "golden", golden, "-o", out).returncode == 0
    rc, found = _findings("check", out)
    assert rc == 0 and "capture_incomplete" not in found


def test_a_golden_max_tokens_below_one_is_a_problem(tmp_path):
    golden = _golden(tmp_path, 3, _BLOCKS, max_tokens=-1)
    r = run_inproc("import", "golden", golden, "-o", tmp_path / "g.h5", "--strict")
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1] == (
        f"spectrace: error: {golden}:1: not a token limit (field=max_tokens, value=-1)"
    )
    r = run_inproc("import", "golden", golden, "-o", tmp_path / "lenient.h5")
    assert r.returncode == 0 and "1 invalid_meta" in r.stderr
    r = run_inproc("import", "golden", _golden(tmp_path, 3, _BLOCKS), "-o", tmp_path / "ok.h5")
    assert r.returncode == 0 and "invalid_meta" not in r.stderr  # twin: max_tokens 8


# -- 7. a requests file's finish_reason -----------------------------------------------------


def test_a_finish_reason_that_is_no_string_is_bad_input(tmp_path):
    lines = REQUESTS.read_text().splitlines()
    first = {**json.loads(lines[0]), "finish_reason": 5}
    reqs = tmp_path / "req.jsonl"
    reqs.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    r = run_inproc("import", "vt", LOG, "-o", tmp_path / "t.h5", "--requests", reqs)
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1] == (
        f"spectrace: error: {reqs}:1: finish_reason must be a string (field=finish_reason, value=5)"
    )
    first["finish_reason"] = "length"  # twin
    reqs.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    r = run_inproc("import", "vt", LOG, "-o", tmp_path / "ok.h5", "--requests", reqs)
    assert r.returncode == 0, r.stderr
