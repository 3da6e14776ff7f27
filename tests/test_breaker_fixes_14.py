"""The fourteenth round (several files per side, export partitions, fixture positions, replay
folders), each defect with its clean twin. Every trace here is written by hand: one request
per data-parallel rank (prompt [1, 2], output [3, 4, 5], k=2, one block drafting [3, 4] from
anchor 2 at position 1, both accepted), so a clean pair of ranks has no finding at all.

1. ``check``/``diff`` of ranks read only rank 0's /meta for how the capture ended: a rank 1
   whose capture aborted, or whose counters disagreed with vLLM's, read as clean (exit 0).
2. A copy of one file saved under another ``dp_rank`` was accepted as two ranks when neither
   knows its prompts (a VT log imported without its requests file): every block counted twice.
   Its blocks, ``t_ns`` included, are the original's; two ranks' blocks never all are.
3. ``export`` gave every file its index as rank when one file lacked ``dp_rank``: the file
   whose /meta says ``dp_rank`` 0 was exported as rank 1.
4. ``export`` put the placeholder requests of a killed capture (blocks flushed before their
   request row) under ``rank=-1``, a rank no file has.
5. The fixture's ``positions=[-5, 20]`` dropped -5 silently (``[-5]``: "nothing selected").
6. ``replay --target DIR`` on a folder that is no model was exit 3, "a spectrace bug".
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import pyarrow.dataset as ds
import pytest
from inproc import run_inproc

from spectrace.tracer.gate import GateError, Selection
from spectrace.tracer.store import TraceWriter

ROOT = Path(__file__).resolve().parents[1]


def _rank(path: Path, rank: int | None, meta: dict | None = None, **kw) -> Path:
    """One rank's file (see the module docstring); ``kw``: ``rid``, ``prompt``, ``output``,
    ``anchor``, ``drafts`` instead of the defaults."""
    rid = kw.get("rid", f"q{rank}")
    drafts = list(kw.get("drafts", (3, 4)))
    m = {"k": 2, **({} if rank is None else {"dp_rank": rank}), **(meta or {})}
    with TraceWriter(path, m, flush_interval=0) as w:
        w.request(
            rid,
            prompt_ids=list(kw.get("prompt", (1, 2))),
            output_ids=list(kw.get("output", (3, 4, 5))),
            finish_reason="length",
        )
        w.add_block(rid, 0, 1, kw.get("anchor", 2), drafts, verified=drafts, accepted=2,
                    emitted=[3, 4, 5])  # fmt: skip
    return path


def _findings(*args) -> tuple[int, list[dict]]:
    r = run_inproc(*args, "--format", "json")
    return r.returncode, json.loads(r.stdout)["findings"] if r.stdout else []


# -- 1. a failed rank 1 ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "meta, says",
    [
        ({"aborted": "engine core died"}, "the capture aborted (run.dp1.h5: engine core died)"),
        (
            {"checks": {"status": "mismatch", "mismatch": ["num_drafts"]}},
            "differ from the engine's own counters (num_drafts of run.dp1.h5)",
        ),
    ],
    ids=["aborted", "counters"],
)
def test_a_failed_rank_1_fails_the_trace(tmp_path, meta, says):
    _rank(tmp_path / "run.dp0.h5", 0), _rank(tmp_path / "run.dp1.h5", 1, meta)
    bad = str(tmp_path / "run.dp*.h5")  # one trace of two files (a glob)
    code, found = _findings("check", bad)
    assert code == 1
    assert [f["kind"] for f in found] == ["capture_incomplete"]
    assert says in found[0]["message"]
    _rank(tmp_path / "ok.dp0.h5", 0), _rank(tmp_path / "ok.dp1.h5", 1)
    clean = str(tmp_path / "ok.dp*.h5")
    assert _findings("diff", clean, clean)[0] == 0
    code, found = _findings("diff", clean, bad)
    assert code == 1
    assert [(f["kind"], f["side"]) for f in found] == [("capture_incomplete", "theirs")]


def test_clean_ranks_pass(tmp_path):
    _rank(tmp_path / "run.dp0.h5", 0), _rank(tmp_path / "run.dp1.h5", 1)
    assert _findings("check", str(tmp_path / "run.dp*.h5")) == (0, [])


# -- 2. a copy under another rank, prompts unknown --------------------------------------------


def _copy_as_rank(src: Path, dst: Path, rank: int) -> Path:
    """``src`` copied to ``dst`` with /meta ``dp_rank`` set to ``rank``."""
    shutil.copyfile(src, dst)
    with h5py.File(dst, "r+") as f:
        meta = json.loads(f["meta"][()])
        del f["meta"]
        f["meta"] = json.dumps({**meta, "dp_rank": rank})
    return dst


def test_a_copy_under_another_rank_is_refused_without_prompts(tmp_path):
    a = _rank(tmp_path / "cp.dp0.h5", 0, rid="0", prompt=(), output=())
    b = _copy_as_rank(a, tmp_path / "cp.dp1.h5", 1)
    r = run_inproc("info", a, b)
    assert r.returncode == 2 and r.stdout == ""
    assert "request '0' in " in r.stderr and "a copy of one file, or two runs" in r.stderr


@pytest.mark.parametrize("other_work", [True, False], ids=["other-blocks", "same-blocks"])
def test_ranks_reusing_an_id_are_one_trace(tmp_path, other_work):
    """Two ranks numbering their requests from 0, prompts unknown: other blocks, or the same
    blocks recorded at other instants (two ranks serving one prompts file)."""
    kw = {"rid": "0", "prompt": (), "output": ()}
    a = _rank(tmp_path / "tw.dp0.h5", 0, **kw)
    b = _rank(
        tmp_path / "tw.dp1.h5", 1, **kw, **({"anchor": 7, "drafts": (8, 9)} if other_work else {})
    )
    r = run_inproc("info", a, b, "--format", "json")
    assert r.returncode == 0
    assert (json.loads(r.stdout)["requests"], json.loads(r.stdout)["blocks"]) == (2, 2)


# -- 3. and 4. export ranks ---------------------------------------------------------------------


def _exported(out: Path, table: str) -> list[tuple[int, str]]:
    t = ds.dataset(out / table, format="parquet", partitioning="hive").to_table()
    col = "req_id" if table == "requests" else "request"
    return sorted(zip(t.column("rank").to_pylist(), map(str, t.column(col).to_pylist())))


def test_export_keeps_the_dp_rank_a_file_records(tmp_path):
    _rank(tmp_path / "run.h5", 0)  # dp_rank 0
    _rank(tmp_path / "run.dp1.h5", None)  # no dp_rank: the smallest rank no file holds
    out = tmp_path / "out"
    assert run_inproc("export", str(tmp_path / "run*.h5"), "-o", out).returncode == 0
    assert _exported(out, "requests") == [(0, "q0"), (1, "qNone")]
    twin = tmp_path / "twin"
    _rank(tmp_path / "t.h5", 0), _rank(tmp_path / "t.dp1.h5", 1)
    assert run_inproc("export", str(tmp_path / "t*.h5"), "-o", twin).returncode == 0
    assert _exported(twin, "requests") == [(0, "q0"), (1, "q1")]


def _killed(path: Path, requests_flushed: int) -> Path:
    """A capture of 3 requests (r0 r1 r2, one block each) whose writer was killed after
    flushing every block but only the first ``requests_flushed`` request rows."""
    with TraceWriter(path, {"k": 2, "dp_rank": 0}, flush_interval=0) as w:
        for i in range(3):
            w.request(f"r{i}", prompt_ids=[1, 2], output_ids=[3, 4, 5], finish_reason="length")
            w.add_block(f"r{i}", 0, 1, 2, [3, 4], verified=[3, 4], accepted=2, emitted=[3, 4, 5])
    partial = path.with_name(path.name + ".partial")
    path.rename(partial)
    with h5py.File(partial, "r+") as f:
        f.attrs["status"] = "recording"
        for name in list(f["requests"]):
            f["requests"][name].resize((requests_flushed,))
    return partial


def test_export_gives_placeholder_requests_their_blocks_rank(tmp_path):
    killed = _killed(tmp_path / "killed.h5", 1)
    out = tmp_path / "out"
    assert run_inproc("export", killed, "-o", out).returncode == 0
    assert _exported(out, "requests") == [(0, "?1"), (0, "?2"), (0, "r0")]
    assert {rank for rank, _ in _exported(out, "blocks")} == {0}
    twin = tmp_path / "twin"
    assert run_inproc("export", _killed(tmp_path / "twin.h5", 3), "-o", twin).returncode == 0
    assert _exported(twin, "requests") == [(0, "r0"), (0, "r1"), (0, "r2")]


# -- 5. fixture positions -----------------------------------------------------------------------


@pytest.mark.parametrize("positions", [[-5], [-5, 20], {3, -1}])
def test_a_negative_position_in_a_list_is_refused(positions):
    with pytest.raises(GateError, match="positions must be >= 0"):
        Selection.of(None, positions)


def test_a_list_of_positions_selects_them():
    assert Selection.of(None, [20, 30]).positions == frozenset({20, 30})


# -- 6. replay of a folder that is no model -------------------------------------------------


def test_replay_of_a_folder_that_is_no_model_is_bad_input(tmp_path):
    folder = tmp_path / "notmodel"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    ref = ROOT / "traces" / "reference.h5"
    for option in ("--target", "--draft"):
        out = tmp_path / f"x{option}.h5"
        r = run_inproc("replay", ref, "-o", out, option, folder, "--positions", "1",
                       "--requests", "0")  # fmt: skip
        assert r.returncode == 2, r.stderr
        want = f"spectrace: error: {option} {folder}: not a model folder transformers can load ("
        assert r.stderr.strip().startswith(want) and len(r.stderr.strip().splitlines()) == 1
        assert not out.exists()
    bundled = ROOT / "engine" / "models"
    out = tmp_path / "ok.h5"
    r = run_inproc("replay", ref, "-o", out, "--target", bundled / "target", "--draft",
                   bundled / "draft", "--positions", "1", "--requests", "0")  # fmt: skip
    assert r.returncode == 0 and out.exists()
