"""A fourth new user's breakages, each with its clean twin.

1. ``export --force`` removed the earlier export before reading the inputs, so a bad input
   lost it; an ``-o`` that cannot be created was an internal error (exit 3); a folder
   ``OUT.partial`` was removed without ``--force``; a table with no row was a CSV file
   without its header line and no Parquet file at all (the run vanished from the dataset);
2. ``validate`` called the importers' own traces invalid: a request's last block cut at the
   end of its output records fewer emitted tokens than ``accepted + 1``;
3. ``inspect-draft`` on a malformed safetensors header or shard index, or a config whose
   size field is not an integer (``"vocab_size": "big"``), was an internal error; a
   truncated weight file passed (only headers are read); ``--k 0`` and ``--k -1`` passed;
4. ``--meta engine=`` stored an empty engine (blank in ``info``, unknown in ``diff``), and
   a key given twice kept the last silently;
5. ``diff GOLDEN RUN... BAD`` diffed the runs before it found BAD unreadable;
6. the fixture took one string as its characters (``requests="01"`` selected requests 0
   and 1);
7. a trace of an older major format said "upgrade spectrace"; the viewer explained a
   request only one side has as "accepted a different number of drafts earlier";
8. a complete file whose ``flushed_rows`` attribute is below its rows was read cut to that
   count without a word (``validate``: valid), and a negative one was an internal error;
9. ``validate`` called a file without a status, or with one no writer writes, valid (every
   reader takes it for a file still being written);
10. ``spectrace_regression`` passed a run that stopped drafting (or started) against its
    golden when the outputs were the same (the diff's ``content_only`` pair), and kept the
    first file of a trace of several as the golden (never matched again); the fixtures
    took no list of files (TypeError);
11. an empty trace argument (``info ''``) read as the current folder ("is a directory");
12. ``spectrace_assert_drafts_match`` and ``spectrace_regression`` imported a log given to
    them beside it, replacing a ``LOG.h5`` already there (the user's own trace);
13. ``export --format jsonl`` wrote an infinite margin as ``Infinity``, which is no JSON.
"""

from __future__ import annotations

import csv
import json
import shutil
import struct
from pathlib import Path

import h5py
import pytest
from inproc import run_inproc

from spectrace.tracer.store import TraceWriter, open_trace
from spectrace.tracer.testing.assertions import drafts_match_report

ROOT = Path(__file__).resolve().parents[1]
REF, VLLM = ROOT / "traces" / "reference.h5", ROOT / "traces" / "vllm.h5"
GOLDEN = ROOT / "tests" / "data_importers" / "golden_small.json"
DUMP = ROOT / "tests" / "data_importers" / "llama_spec_dump.jsonl"
DUMP_REQS = ROOT / "tests" / "data_importers" / "llama.requests.jsonl"
DRAFT = ROOT / "engine" / "models" / "draft"

#: The blocks and requests columns, as README's export tables list them.
BLOCK_HEADER = (
    "run,rank,block,request,req_id,step,position,anchor,k,proposed,num_verified,verified,"
    "accepted,accepted_recomputed,num_emitted,emitted,t_ns,batch_row,batch_size,"
    "proposal_source,draft_margin,target_margin,impossible"
)
REQUEST_HEADER = "run,rank,request,req_id,prompt_ids,output_ids,finish_reason"


def _error(err: str) -> str:
    """The one ``spectrace: error:`` line of stderr (and no traceback)."""
    assert "Traceback" not in err, err
    lines = [x for x in err.splitlines() if x.startswith("spectrace: error:")]
    assert len(lines) == 1, err
    return lines[0]


def _trace(path: Path, req: str = "q", blocks: int = 1) -> Path:
    """Request ``req``: prompt [1, 2], output [3, 4, 5]; ``blocks`` blocks anchored at 2
    (anchor 3, drafts [4, 5], both accepted) and, for 2, at 4 (anchor 5, never verified)."""
    with TraceWriter(path, {"k": 2}, flush_interval=0) as w:
        w.request(req, prompt_ids=[1, 2], output_ids=[3, 4, 5], finish_reason="length")
        if blocks:
            w.add_block(req, 0, 2, 3, [4, 5], verified=[4, 5], accepted=2, emitted=[4, 5, 6])
        if blocks > 1:
            w.add_block(req, 1, 4, 5, [6, 7])
    return path


# -- 1. export ----------------------------------------------------------------------------------


def _csv_rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_a_failed_forced_export_keeps_the_earlier_one(tmp_path):
    a, out = _trace(tmp_path / "a.h5"), tmp_path / "out"
    assert run_inproc("export", a, "-o", out, "--format", "csv").returncode == 0
    bad = tmp_path / "bad.h5"
    bad.write_text("not hdf5\n")
    r = run_inproc("export", a, bad, "-o", out, "--format", "csv", "--force")
    assert r.returncode == 2
    assert _error(r.stderr).startswith(f"spectrace: error: {bad}: not a readable HDF5 file")
    rows = _csv_rows(out / "blocks.csv")
    assert [(x["run"], x["req_id"], x["position"], x["proposed"]) for x in rows] == [
        ("a", "q", "2", "[4, 5]")
    ]
    assert not (tmp_path / "out.partial").exists()


def test_a_forced_export_replaces_the_earlier_one(tmp_path):
    a, b, out = _trace(tmp_path / "a.h5"), _trace(tmp_path / "b.h5", "r", 2), tmp_path / "out"
    assert run_inproc("export", a, "-o", out, "--format", "csv").returncode == 0
    assert run_inproc("export", b, "-o", out, "--format", "csv", "--force").returncode == 0
    rows = _csv_rows(out / "blocks.csv")
    assert [(x["run"], x["req_id"], x["position"], x["accepted"]) for x in rows] == [
        ("b", "r", "2", "2"),
        ("b", "r", "4", "-1"),
    ]


def test_an_output_that_cannot_be_created_is_bad_input(tmp_path):
    a = _trace(tmp_path / "a.h5")
    (tmp_path / "file").write_text("x")
    r = run_inproc("export", a, "-o", tmp_path / "file" / "out", "--format", "csv")
    assert r.returncode == 2
    want = f"spectrace: error: {tmp_path}/file/out.partial: cannot create the export folder ("
    assert _error(r.stderr).startswith(want)


def test_an_output_in_new_folders_is_created(tmp_path):
    a = _trace(tmp_path / "a.h5")
    r = run_inproc("export", a, "-o", tmp_path / "new" / "deeper" / "out", "--format", "csv")
    assert r.returncode == 0, r.stderr
    assert len(_csv_rows(tmp_path / "new" / "deeper" / "out" / "requests.csv")) == 1


def test_a_partial_folder_is_not_removed_without_force(tmp_path):
    a, out = _trace(tmp_path / "a.h5"), tmp_path / "out"
    (tmp_path / "out.partial").mkdir()
    (tmp_path / "out.partial" / "notes.txt").write_text("mine")
    for extra in ((), ("--force",)):
        r = run_inproc("export", a, "-o", out, "--format", "csv", *extra)
        assert r.returncode == 2
        assert (tmp_path / "out.partial" / "notes.txt").read_text() == "mine"
    assert not out.exists()


def test_a_killed_exports_partial_is_replaced_with_force(tmp_path):
    a, out = _trace(tmp_path / "a.h5"), tmp_path / "out"
    (tmp_path / "out.partial").mkdir()
    (tmp_path / "out.partial" / "blocks.csv").write_text("half a")
    r = run_inproc("export", a, "-o", out, "--format", "csv")
    assert r.returncode == 2 and "out.partial: exists" in _error(r.stderr)
    assert run_inproc("export", a, "-o", out, "--format", "csv", "--force").returncode == 0
    assert len(_csv_rows(out / "blocks.csv")) == 1 and not (tmp_path / "out.partial").exists()


def test_a_table_without_rows_keeps_its_csv_header(tmp_path):
    e, out = _trace(tmp_path / "e.h5", blocks=0), tmp_path / "out"
    assert run_inproc("export", e, "-o", out, "--format", "csv").returncode == 0
    assert (out / "blocks.csv").read_text().splitlines() == [BLOCK_HEADER]
    lines = (out / "requests.csv").read_text().splitlines()
    assert lines == [REQUEST_HEADER, 'e,0,0,q,"[1, 2]","[3, 4, 5]",length']


def test_a_table_with_rows_has_the_same_header(tmp_path):
    a, out = _trace(tmp_path / "a.h5"), tmp_path / "out"
    assert run_inproc("export", a, "-o", out, "--format", "csv").returncode == 0
    lines = (out / "blocks.csv").read_text().splitlines()
    assert lines[0] == BLOCK_HEADER and len(lines) == 2


def test_a_run_without_blocks_stays_in_the_parquet_dataset(tmp_path):
    pytest.importorskip("pyarrow")
    from spectrace.tracer.export import read_parquet

    e, a, out = _trace(tmp_path / "e.h5", blocks=0), _trace(tmp_path / "a.h5"), tmp_path / "o"
    assert run_inproc("export", e, a, "-o", out).returncode == 0
    for table in ("blocks", "requests"):
        for run in ("e", "a"):
            assert (out / table / f"run={run}" / "rank=0" / "part-0.parquet").is_file()
    blocks = read_parquet(out, "blocks")
    assert blocks.column("run").to_pylist() == ["a"]
    assert read_parquet(out, "requests").column("run").to_pylist() == ["a", "e"]


# -- 2. validate on the importers' traces -------------------------------------------------------


def test_validate_takes_the_golden_import(tmp_path):
    # golden_small's first request: prompt of 3, 8 outputs (positions 3..10); its third
    # placed block is anchored at 9: 1 accepted visible (27 at 10), the bonus cut, 1 emitted.
    # The last block is record 3's final proposal at 4, its last token: unverified.
    out = tmp_path / "g.h5"
    assert run_inproc("import", "golden", GOLDEN, "-o", out).returncode == 0
    t = open_trace(out)
    assert (int(t.blocks.position[2]), int(t.blocks.num_emitted[2])) == (9, 1)
    assert (int(t.blocks.position[6]), int(t.blocks.accepted[6])) == (4, -1)
    r = run_inproc("validate", out)
    assert (r.returncode, r.stdout) == (0, f"{out}: valid\n")


def test_validate_takes_the_llama_dump_import(tmp_path):
    out = tmp_path / "l.h5"
    r = run_inproc("import", "llama-dump", DUMP, "--requests", DUMP_REQS, "-o", out)
    assert r.returncode == 0, r.stderr
    r = run_inproc("validate", out)
    assert (r.returncode, r.stdout) == (0, f"{out}: valid\n")


@pytest.mark.parametrize(
    "position, anchor, accepted, emitted, valid",
    [
        (4, 5, 0, [], True),  # the last token: the bonus is past the output
        (3, 4, 1, [5], True),  # one accepted draft reaches the end, the bonus is cut
        (3, 4, 0, [], False),  # the output goes on after it: one token must be emitted
        (2, 3, 2, [4, 5], True),  # 2 accepted fill 3..4; the bonus at 5 is cut
        (2, 3, 2, [4], False),  # one emitted ends at 3: the output goes on
        (3, 4, 0, [5, 6], False),  # more than accepted + 1, at the end or not
    ],
)
def test_a_cut_block_is_valid_only_at_the_end_of_the_output(
    tmp_path, position, anchor, accepted, emitted, valid
):
    # prompt [1, 2] + output [3, 4, 5]: positions 0..4, the last at 4. The drafts are the
    # sequence's next tokens (9 past its end), so that the accepted ones are what a step
    # emits (validate checks emitted[:accepted] too).
    seq = [1, 2, 3, 4, 5]
    drafts = [seq[i] if i < len(seq) else 9 for i in (position + 1, position + 2)]
    p = tmp_path / "t.h5"
    with TraceWriter(p, {"k": 2}, flush_interval=0) as w:
        w.request("q", prompt_ids=[1, 2], output_ids=[3, 4, 5], finish_reason="length")
        w.add_block("q", 0, position, anchor, drafts, verified=drafts, accepted=accepted,
                    emitted=emitted)  # fmt: skip
    r = run_inproc("validate", p)
    if valid:
        assert (r.returncode, r.stdout) == (0, f"{p}: valid\n")
    else:
        assert r.returncode == 1
        want = f"{p}: num_emitted != accepted + 1 at row 0 (field=blocks/num_emitted, value="
        assert r.stdout == f"{want}{len(emitted)})\n"


# -- 3. inspect-draft on broken weight files ----------------------------------------------------


def _ckpt(tmp_path: Path, header: object) -> Path:
    d = tmp_path / "ck"
    d.mkdir()
    shutil.copy(DRAFT / "config.json", d / "config.json")
    raw = json.dumps(header).encode()
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    return d


@pytest.mark.parametrize(
    "header, what",
    [
        ([1, 2], "not a safetensors file (the header is not a JSON object)"),
        ({"w": 5}, "not a safetensors header: tensor 'w' (field=dtype, value=5)"),
        (
            {"w": {"dtype": "F32", "shape": [2]}},
            "not a safetensors header: tensor 'w' (field=data_offsets, value=None)",
        ),
        (
            {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}},
            "not a safetensors header: tensor 'w' (field=data_offsets, value=[0])",
        ),
        (
            {"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}},
            "not a safetensors header: tensor 'w' (field=data_offsets, value=[8, 0])",
        ),
        (
            {"w": {"dtype": "F32", "shape": ["a"], "data_offsets": [0, 0]}},
            "not a safetensors header: tensor 'w' (field=shape, value=['a'])",
        ),
    ],
)
def test_a_malformed_safetensors_header_is_bad_input(tmp_path, header, what):
    d = _ckpt(tmp_path, header)
    r = run_inproc("inspect-draft", d)
    assert r.returncode == 2
    assert _error(r.stderr) == f"spectrace: error: {d}/model.safetensors: {what}"


@pytest.mark.parametrize("index", ["[1]", '{"weight_map": [1]}', '{"weight_map": {"w": 3}}'])
def test_a_malformed_shard_index_is_bad_input(tmp_path, index):
    d = _ckpt(tmp_path, {})
    (d / "model.safetensors.index.json").write_text(index)
    r = run_inproc("inspect-draft", d)
    assert r.returncode == 2
    want = f"spectrace: error: {d}/model.safetensors.index.json: unreadable index ("
    assert _error(r.stderr).startswith(want)


def test_a_truncated_weight_file_is_bad_input(tmp_path):
    d = tmp_path / "draft"
    shutil.copytree(DRAFT, d)
    raw = (d / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    name, end = max(
        ((k, v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"),
        key=lambda kv: kv[1],
    )
    assert 8 + n + end == len(raw)  # the bundled file ends with its last tensor
    (d / "model.safetensors").write_bytes(raw[:-1])
    r = run_inproc("inspect-draft", d)
    assert r.returncode == 2
    assert _error(r.stderr) == (
        f"spectrace: error: {d}/model.safetensors: truncated: tensor {name!r} ends at byte "
        f"{len(raw)}, the file has {len(raw) - 1}"
    )


def test_the_whole_weight_file_inspects_clean(tmp_path):
    d = tmp_path / "draft"
    shutil.copytree(DRAFT, d)
    r = run_inproc("inspect-draft", d)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1] == "verdict: 0 errors, 0 warnings"


@pytest.mark.parametrize(
    "edit, field, value",
    [
        ({"vocab_size": "2048"}, "vocab_size", "'2048'"),
        ({"hidden_size": [64]}, "hidden_size", "[64]"),
        ({"num_hidden_layers": True}, "num_hidden_layers", "True"),
        ({"text_config": {"vocab_size": 2048.5}}, "text_config.vocab_size", "2048.5"),
    ],
)
def test_a_config_size_that_is_no_integer_is_bad_input(tmp_path, edit, field, value):
    for side in ("draft", "target"):  # the checkpoint's config, then --target's
        d = tmp_path / side
        shutil.copytree(DRAFT, d)
        cfg = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**cfg, **edit}))
    r = run_inproc("inspect-draft", tmp_path / "draft")
    key = field.split(".")[-1]
    want = f"{tmp_path}/draft/config.json: {key} is not an integer (field={field}, value={value})"
    assert r.returncode == 2 and _error(r.stderr) == f"spectrace: error: {want}"
    shutil.rmtree(tmp_path / "draft")
    shutil.copytree(DRAFT, tmp_path / "draft")
    r = run_inproc("inspect-draft", tmp_path / "draft", "--target", tmp_path / "target")
    want = want.replace("/draft/", "/target/")
    assert r.returncode == 2 and _error(r.stderr) == f"spectrace: error: {want}"


def test_a_config_with_unknown_sizes_inspects(tmp_path):
    d = tmp_path / "draft"
    shutil.copytree(DRAFT, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "head_dim": None}))
    r = run_inproc("inspect-draft", d, "--target", DRAFT)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("k, code", [("0", 2), ("-1", 2), ("1", 0), ("4", 0)])
def test_k_must_be_a_positive_draft_count(k, code):
    r = run_inproc("inspect-draft", ROOT / "engine" / "models" / "dspark", "--k", k)
    assert r.returncode == code, r.stdout + r.stderr
    if code == 2:
        assert f"Invalid value for '--k': {k} is not in the range x>=1" in _error(r.stderr)


# -- 4. --meta ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "meta, what",
    [
        (["engine="], "--meta engine: an empty value (field=engine, value='')"),
        (["method= "], "--meta method: an empty value (field=method, value=' ')"),
        (["engine=a", "engine=b"], "--meta engine: 'engine' given twice"),
    ],
)
def test_meta_empty_or_twice_is_bad_usage(tmp_path, meta, what):
    out = tmp_path / "g.h5"
    args = [x for m in meta for x in ("--meta", m)]
    r = run_inproc("import", "golden", GOLDEN, "-o", out, *args)
    assert r.returncode == 2
    assert _error(r.stderr).startswith(f"spectrace: error: Invalid value for {what}")
    assert not out.exists() and not Path(f"{out}.partial").exists()


def test_meta_of_distinct_keys_is_recorded(tmp_path):
    out = tmp_path / "g.h5"
    r = run_inproc("import", "golden", GOLDEN, "-o", out, "--meta", "engine=a", "--meta", "x=")
    assert r.returncode == 0, r.stderr
    meta = open_trace(out).meta
    assert (meta["engine"], meta["x"]) == ("a", "")  # an untyped key keeps any text


# -- 5. diff GOLDEN RUN... with an unreadable run -----------------------------------------------


def test_an_unreadable_run_stops_the_diff_before_any_run_is_diffed(tmp_path, monkeypatch):
    from spectrace.tracer import gate

    calls = []
    real = gate.gated_diff
    monkeypatch.setattr(gate, "gated_diff", lambda *a, **k: calls.append(1) or real(*a, **k))
    bad = tmp_path / "bad.h5"
    bad.write_text("not hdf5\n")
    r = run_inproc("diff", REF, VLLM, bad)
    assert (r.returncode, r.stdout, calls) == (2, "", [])
    assert _error(r.stderr).startswith(f"spectrace: error: {bad}: not a readable HDF5 file")


def test_readable_runs_are_each_diffed(monkeypatch):
    from spectrace.tracer import gate

    calls = []
    real = gate.gated_diff
    monkeypatch.setattr(gate, "gated_diff", lambda *a, **k: calls.append(1) or real(*a, **k))
    r = run_inproc("diff", REF, VLLM, VLLM, "--format", "json")
    assert (r.returncode, len(calls)) == (0, 2)
    doc = json.loads(r.stdout)
    assert [(x["paired_blocks"], x["exact_matches"]) for x in doc["runs"]] == [(139, 139)] * 2


# -- 6. the fixture's string arguments ----------------------------------------------------------


def test_one_request_string_is_one_id():
    # ours' ids are 0..4: "01" is none of them (it selected requests "0" and "1").
    with pytest.raises(ValueError, match=r"no request '01' \(known: "):
        drafts_match_report(REF, VLLM, requests="01")


def test_string_arguments_mean_what_the_options_mean():
    # request 0 pairs 30 blocks at positions 10..; positions 10:11 keep only position 10.
    assert drafts_match_report(REF, VLLM, requests="0") is None
    assert drafts_match_report(REF, VLLM, ignore="near_ties") is None
    got = drafts_match_report(REF, VLLM, positions="0:10")
    assert got is not None and "nothing selected: positions 0:10 leaves none" in got
    assert drafts_match_report(REF, VLLM, positions="10:11") is None
    with pytest.raises(ValueError, match="positions"):
        drafts_match_report(REF, VLLM, positions="10")


# -- 7. messages --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "version, advice", [("0.9", "an older format"), ("2.0", "upgrade spectrace")]
)
def test_an_unsupported_major_version_says_which_way(tmp_path, version, advice):
    p = _trace(tmp_path / "t.h5")
    with h5py.File(p, "a") as f:
        f.attrs["format_version"] = version
    r = run_inproc("info", p)
    assert r.returncode == 2
    assert _error(r.stderr) == (
        f"spectrace: error: {p}: trace format version {version} is not supported; this "
        f"spectrace reads 1.x ({advice}) (field=format_version)"
    )


def test_a_newer_minor_version_reads(tmp_path):
    p = _trace(tmp_path / "t.h5")
    with h5py.File(p, "a") as f:
        f.attrs["format_version"] = "1.9"
    assert run_inproc("info", p).returncode == 0


def _explained(a: Path, b: Path) -> list[str]:
    from spectrace.tui.fmt import explain
    from spectrace.tui.model import ViewModel

    vm = ViewModel(open_trace(a, lazy_requests=True), open_trace(b, lazy_requests=True))
    vm.load_requests()
    vm.load_index()
    vm.load_divergence()
    out = []
    for i, p in enumerate(vm.pairs):
        rows = vm.rows(i)
        win = vm.window(rows, 0)
        out += [explain(win, j, p, None, rows.divergence) for j in range(len(rows))]
    return out


def test_the_viewer_explains_a_request_only_one_side_has(tmp_path):
    # ours: one request of another prompt, no block; theirs: _trace's one block at 2.
    empty, one = tmp_path / "e.h5", _trace(tmp_path / "a.h5")
    with TraceWriter(empty, {"k": 2}, flush_interval=0) as w:
        w.request("z", prompt_ids=[7], output_ids=[8], finish_reason="length")
    assert _explained(empty, one) == [
        "Position 2, anchor 3. Only theirs drafted from here (2 drafts, 2 accepted): no "
        "request of ours matches this one, so there is nothing to compare."
    ]


def test_the_viewer_explains_a_skipped_position_of_a_matched_request(tmp_path):
    # prompt [1, 2] + output [3, 4, 5, 6, 7]: ours accepts both drafts at 2 (next anchor at
    # 5, never drafted); theirs rejects at 2 and drafts again at 3, which ours skipped.
    a, b = tmp_path / "a.h5", tmp_path / "b.h5"
    for path, blocks in (
        (a, [(2, 3, [4, 5], 2, [4, 5, 6])]),
        (b, [(2, 3, [9, 9], 0, [4]), (3, 4, [5, 6], 2, [5, 6, 7])]),
    ):
        with TraceWriter(path, {"k": 2}, flush_interval=0) as w:
            w.request("q", prompt_ids=[1, 2], output_ids=[3, 4, 5, 6, 7], finish_reason="stop")
            for step, (pos, anchor, drafts, acc, emitted) in enumerate(blocks):
                w.add_block("q", step, pos, anchor, drafts, verified=drafts, accepted=acc,
                            emitted=emitted)  # fmt: skip
    got = _explained(a, b)
    assert len(got) == 2
    assert got[1] == (
        "Position 3, anchor 4. Only theirs drafted from here (2 drafts, 2 accepted): ours "
        "accepted a different number of drafts earlier and skipped this position, so there "
        "is nothing to compare."
    )


# -- 8. the announced row count of a complete file ----------------------------------------------


def _announced(tmp_path: Path, value: int) -> Path:
    p = shutil.copy(REF, tmp_path / "t.h5")  # 139 blocks, complete, no flushed_rows
    with h5py.File(p, "a") as f:
        f["blocks"].attrs["flushed_rows"] = value
    return Path(p)


def test_a_complete_file_announcing_fewer_rows_is_damaged(tmp_path):
    p = _announced(tmp_path, 10)
    want = (
        f"{p}: flushed_rows attribute below the 139 block rows of a complete file "
        f"(field=/blocks.flushed_rows, value=10)"
    )
    r = run_inproc("info", p)
    assert r.returncode == 2 and _error(r.stderr) == f"spectrace: error: {want}"
    v = run_inproc("validate", p)
    assert (v.returncode, v.stdout) == (1, want + "\n")


def test_a_negative_announced_count_is_damaged(tmp_path):
    p = _announced(tmp_path, -5)
    r = run_inproc("check", p)
    assert r.returncode == 2
    want = f"spectrace: error: {p}: expected an integer >= 0 (field=/blocks.flushed_rows, value=-5)"
    assert _error(r.stderr) == want


@pytest.mark.parametrize("value", [139, 500])
def test_a_complete_file_announcing_its_rows_reads_whole(tmp_path, value):
    p = _announced(tmp_path, value)
    r = run_inproc("info", p, "--format", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["blocks"] == 139
    assert run_inproc("validate", p).stdout == f"{p}: valid\n"


# -- 9. a file status no writer writes ----------------------------------------------------------


@pytest.mark.parametrize("status, shown", [(None, ""), ("weird", ", value='weird'")])
def test_validate_reports_an_unknown_status(tmp_path, status, shown):
    p = _trace(tmp_path / "t.h5")
    with h5py.File(p, "a") as f:
        if status is None:
            del f.attrs["status"]
        else:
            f.attrs["status"] = status
    r = run_inproc("validate", p)
    want = f"{p}: unknown file status (expected recording or complete) (field=status{shown})\n"
    assert (r.returncode, r.stdout) == (1, want)


@pytest.mark.parametrize("status", ["recording", "complete"])
def test_validate_takes_the_writers_statuses(tmp_path, status):
    p = _trace(tmp_path / "t.h5")
    with h5py.File(p, "a") as f:
        f.attrs["status"] = status
    r = run_inproc("validate", p)
    assert (r.returncode, r.stdout) == (0, f"{p}: valid\n")


# -- 10. regression goldens and runs without drafts ---------------------------------------------


def _regression(tmp_path: Path, golden: Path, obtained: Path) -> str | None:
    """What ``spectrace_regression.check(obtained)`` fails with against ``golden`` (None:
    it passes)."""
    from spectrace.tracer.testing.plugin import Regression

    reg = Regression(tmp_path / "goldens" / "test_x.h5", regen=False)
    reg.golden.parent.mkdir()
    shutil.copyfile(golden, reg.golden)
    try:
        reg.check(obtained)
    except pytest.fail.Exception as exc:
        return str(exc)
    return None


@pytest.mark.parametrize("golden_blocks, obtained_blocks", [(1, 0), (0, 1)])
def test_a_run_that_stops_or_starts_drafting_is_not_its_golden(
    tmp_path, golden_blocks, obtained_blocks
):
    # the same request and output on both sides; one side has _trace's block at 2.
    g = _trace(tmp_path / "g.h5", blocks=golden_blocks)
    o = _trace(tmp_path / "o.h5", blocks=obtained_blocks)
    got = _regression(tmp_path, g, o)
    assert got is not None
    # /meta k 2 without a method: a speculative run (breaker 11), so the side without a
    # block lost its drafts (the obtained run is ours, the golden theirs).
    side = "ours" if obtained_blocks == 0 else "theirs"
    assert got.splitlines()[0] == (
        f"spectrace: drafts do not match: {side} has no draft blocks: nothing to compare; "
        "1 error finding(s), at most 0 allowed"
    )
    assert (tmp_path / "goldens" / "test_x.obtained.h5").is_file()


@pytest.mark.parametrize("blocks", [0, 1])
def test_a_run_like_its_golden_passes(tmp_path, blocks):
    g, o = _trace(tmp_path / "g.h5", blocks=blocks), _trace(tmp_path / "o.h5", "r", blocks)
    assert _regression(tmp_path, g, o) is None


def test_a_trace_of_several_files_is_no_golden(tmp_path):
    from spectrace.tracer.testing.plugin import Regression

    a, b = _trace(tmp_path / "run.dp0.h5", "a"), _trace(tmp_path / "run.dp1.h5", "b")
    reg = Regression(tmp_path / "goldens" / "test_x.h5", regen=False)
    with pytest.raises(pytest.fail.Exception) as exc:
        reg.check([str(a), str(b)])
    assert str(exc.value) == (
        f"spectrace: a regression golden is one trace file; this trace has 2 ({a}, {b}): "
        f"check each rank on its own"
    )
    assert not reg.golden.exists()


def test_a_trace_of_one_file_becomes_the_golden(tmp_path):
    from spectrace.tracer.testing.plugin import Regression

    a = _trace(tmp_path / "run.h5")
    reg = Regression(tmp_path / "goldens" / "test_x.h5", regen=False)
    with pytest.raises(pytest.fail.Exception, match="golden trace written"):
        reg.check(a)
    assert reg.golden.read_bytes() == a.read_bytes()
    reg.check(a)  # the second run passes


def test_the_fixtures_take_a_list_of_rank_files(tmp_path, spectrace_assert_drafts_match):
    a, b = _trace(tmp_path / "run.dp0.h5", "a"), _trace(tmp_path / "run.dp1.h5", "b")
    spectrace_assert_drafts_match([a, b], [str(a), str(b)])  # passes: no exception


def test_the_fixtures_take_a_glob_of_rank_files(tmp_path, spectrace_assert_drafts_match):
    _trace(tmp_path / "run.dp0.h5", "a"), _trace(tmp_path / "run.dp1.h5", "b")
    spectrace_assert_drafts_match(str(tmp_path / "run.dp*.h5"), tmp_path / "run.dp0.h5",
                                  requests=["a"])  # fmt: skip


# -- 11. an empty trace argument ----------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [("info", ""), ("check", " "), ("validate", ""), ("diff", REF, ""), ("export", "", "-o", "x")],
)
def test_an_empty_trace_path_is_named_as_such(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    r = run_inproc(*args)
    assert r.returncode == 2
    assert _error(r.stderr) == "spectrace: error: an empty trace path; name the trace file"


def test_a_trace_path_in_the_current_folder_reads(tmp_path, monkeypatch):
    _trace(tmp_path / "t.h5")
    monkeypatch.chdir(tmp_path)
    r = run_inproc("info", "t.h5", "--format", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["blocks"] == 1


# -- 12. the fixtures import a log into the test's tmp dir --------------------------------------


def _log_beside_a_trace(tmp_path: Path) -> tuple[Path, Path]:
    src = tmp_path / "src"
    src.mkdir()
    log = src / "run.vt.log"
    shutil.copyfile(ROOT / "traces" / "reference.vt.log", log)
    mine = src / "run.vt.log.h5"
    shutil.copyfile(VLLM, mine)  # the user's own trace under the name an import would take
    return log, mine


def test_the_drafts_fixture_imports_a_log_elsewhere(tmp_path, spectrace_assert_drafts_match):
    log, mine = _log_beside_a_trace(tmp_path)
    spectrace_assert_drafts_match(log, log)  # the log against itself: passes
    assert mine.read_bytes() == VLLM.read_bytes()
    assert sorted(p.name for p in log.parent.iterdir()) == ["run.vt.log", "run.vt.log.h5"]
    assert (tmp_path / "spectrace-ours" / "run.vt.log.h5").is_file()


def test_the_regression_fixture_imports_a_log_elsewhere(tmp_path, spectrace_regression):
    log, mine = _log_beside_a_trace(tmp_path)
    spectrace_regression.golden = tmp_path / "goldens" / "g.h5"
    with pytest.raises(pytest.fail.Exception, match="golden trace written"):
        spectrace_regression.check(log)
    assert mine.read_bytes() == VLLM.read_bytes()
    assert sorted(p.name for p in log.parent.iterdir()) == ["run.vt.log", "run.vt.log.h5"]


def test_the_fixtures_open_a_trace_in_place(tmp_path, spectrace_assert_drafts_match):
    spectrace_assert_drafts_match(REF, VLLM)
    assert not (tmp_path / "spectrace-ours" / "reference.h5.h5").exists()


# -- 13. JSONL is standard JSON -----------------------------------------------------------------


def _strict(line: str) -> dict:
    def refuse(token):
        raise ValueError(f"not JSON: {token}")

    return json.loads(line, parse_constant=refuse)


def _margins_trace(path: Path, req: str, margins: list[float], target: float) -> Path:
    with TraceWriter(path, {"k": 2}, flush_interval=0) as w:
        w.request(req, prompt_ids=[1, 2], output_ids=[3, 4, 5], finish_reason="length")
        w.add_block(req, 0, 2, 3, [4, 5], verified=[4, 5], accepted=2, emitted=[4, 5, 6],
                    draft_margin=margins, target_margin=target)  # fmt: skip
    return path


def test_an_infinite_margin_is_a_json_number(tmp_path):
    inf = float("inf")
    t = _margins_trace(tmp_path / "t.h5", "q", [inf, 0.5], -inf)
    assert run_inproc("export", t, "-o", tmp_path / "o", "--format", "jsonl").returncode == 0
    line = (tmp_path / "o" / "blocks.jsonl").read_text().splitlines()[0]
    assert '"draft_margin": [1e999, 0.5], "target_margin": -1e999, "impossible": false}' in line
    row = _strict(line)
    assert (row["draft_margin"], row["target_margin"]) == ([inf, 0.5], -inf)


def test_finite_margins_are_written_as_json_writes_them(tmp_path):
    # a request id that spells the word takes the careful path: the same text
    t = _margins_trace(tmp_path / "t.h5", "Infinity", [0.25, float("nan")], 2.0)
    assert run_inproc("export", t, "-o", tmp_path / "o", "--format", "jsonl").returncode == 0
    line = (tmp_path / "o" / "blocks.jsonl").read_text().splitlines()[0]
    row = _strict(line)
    assert line == json.dumps(row)
    assert (row["req_id"], row["draft_margin"], row["target_margin"]) == (
        "Infinity",
        [0.25, None],
        2.0,
    )
