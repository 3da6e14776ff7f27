"""The twentieth round of defects (fresh-user round 22, tools and edge inputs), each with its
clean twin; expected values derived by hand in the comments.

1. ``replay`` of a requests JSONL took a repeated request id, a JSON array line (exit 3), and
   float or bool token ids (truncated into other tokens), and wrote a trace ``validate``
   rejects, exit 0. Each is now bad input naming FILE:LINE.
2. ``replay`` of a data-parallel trace whose ranks reuse request ids merged the requests,
   exit 0; it is now refused (replay one rank at a time).
3. A glob over a run's rank files skipped a rank left as ``NAME.dpR.h5.partial`` (its writer
   died), so ``check`` saw a clean, smaller run; the glob now reads it, as a path does.
4. Rank files 0 and 2 of a run passed as one complete run; a rank below the highest without
   a file is ``capture_incomplete``.
5. ``spectrace_capture_cmd("python ...")`` ran the string character by character
   ("/: cannot run this command"); a string is now a ValueError that says to pass a list.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from inproc import run_inproc

from spectrace.tracer.store import TraceWriter, open_trace

REQ = {"prompt_ids": [1, 2, 3], "output_ids": [4, 5, 6, 7]}


def _jsonl(path: Path, *objs) -> Path:
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs))
    return path


def _replay(src: Path, tmp_path: Path):
    return run_inproc("replay", src, "-o", tmp_path / "out.h5", "--positions", "1")


# -- 1. a replay's requests JSONL --------------------------------------------------------------


@pytest.mark.parametrize(
    "lines, says",
    [
        (
            [{"req_id": "a", **REQ}, {"req_id": "a", **REQ}],
            "r.jsonl:2: request id 'a' given twice (first on line 1)",
        ),
        (["[1, 2]"], "r.jsonl:1: not a request object (list)"),
        (
            [{"req_id": "a", "prompt_ids": [1, 2.5], "output_ids": [4, 5]}],
            "r.jsonl:1: prompt_ids is not a list of integer token ids (2.5)",
        ),
        (
            [{"req_id": "a", "prompt_ids": [1, 2], "output_ids": [True, 5]}],
            "r.jsonl:1: output_ids is not a list of integer token ids (True)",
        ),
    ],
)
def test_bad_replay_requests_are_bad_input(tmp_path, lines, says):
    r = _replay(_jsonl(tmp_path / "r.jsonl", *lines), tmp_path)
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1] == f"spectrace: error: {tmp_path / says}"
    assert not (tmp_path / "out.h5").exists()


def test_distinct_requests_replay(tmp_path):
    # Two requests of 3 + 4 tokens; --positions 1: one position each (replayable: 3..5).
    r = _replay(
        _jsonl(tmp_path / "r.jsonl", {"req_id": "a", **REQ}, {"req_id": "b", **REQ}), tmp_path
    )
    assert r.returncode == 0, r.stderr
    t = open_trace(tmp_path / "out.h5")
    assert (len(t.requests), len(t.blocks)) == (2, 2)


# -- 2, 3, 4: data-parallel rank files ---------------------------------------------------------


def _rank(path: Path, rank: int, rid: str, complete: bool = True) -> Path:
    """One DP rank's file: request ``rid`` with prompt (1, 2, 10 + rank), one block at
    position 2 (anchor 10 + rank) proposing (4, 5), both accepted, output (4, 5, 6): the
    block reaches 2 + 2 + 1 = 5, the output's last position."""
    a = 10 + rank  # each rank its own prompt: the same one twice reads as a copied file
    w = TraceWriter(path, {"k": 2, "method": "draft_model", "dp_rank": rank}, flush_interval=0)
    w.request(rid, prompt_ids=[1, 2, a], output_ids=[4, 5, 6], finish_reason="length")
    w.add_block(rid, 0, 2, a, [4, 5], verified=[4, 5], accepted=2, emitted=[4, 5, 6])
    w.close(complete=complete)
    return path


def test_a_rank_trace_that_reuses_request_ids_is_not_replayed(tmp_path):
    _rank(tmp_path / "run.h5", 0, "0")
    _rank(tmp_path / "run.dp1.h5", 1, "0")
    r = run_inproc("replay", str(tmp_path / "run*.h5"), "-o", tmp_path / "out.h5")
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1].startswith(
        f"spectrace: error: {tmp_path / 'run*.h5'}: request id '0' is on two of its files"
    )


def test_a_rank_trace_with_distinct_ids_replays(tmp_path):
    _rank(tmp_path / "run.h5", 0, "a")
    _rank(tmp_path / "run.dp1.h5", 1, "b")
    r = run_inproc(
        "replay", str(tmp_path / "run*.h5"), "-o", tmp_path / "out.h5", "--positions", "1"
    )
    assert r.returncode == 0, r.stderr
    assert sorted(open_trace(tmp_path / "out.h5").requests.req_id) == ["a", "b"]


def _capture_kinds(*args) -> tuple[int, list[str], dict]:
    r = run_inproc(*args, "--format", "json")
    found = json.loads(r.stdout)["findings"]
    cap = [f for f in found if f["kind"] == "capture_incomplete"]
    return r.returncode, [f["kind"] for f in found], cap[0]["evidence"] if cap else {}


def test_a_glob_reads_a_rank_its_writer_left_partial(tmp_path):
    _rank(tmp_path / "run.h5", 0, "a")
    _rank(tmp_path / "run.dp1.h5", 1, "b", complete=False)  # run.dp1.h5.partial
    r = run_inproc("info", str(tmp_path / "run*.h5"), "--format", "json")
    assert json.loads(r.stdout)["requests"] == 2
    assert f"reading {tmp_path / 'run.dp1.h5.partial'}, matched as run.dp1.h5" in r.stderr
    code, kinds, ev = _capture_kinds("check", str(tmp_path / "run*.h5"))
    assert (code, kinds, ev["ended"]) == (1, ["capture_incomplete"], "capture-killed")


def test_a_glob_over_closed_ranks_reads_them_alone(tmp_path):
    _rank(tmp_path / "run.h5", 0, "a")
    _rank(tmp_path / "run.dp1.h5", 1, "b")
    assert _capture_kinds("check", str(tmp_path / "run*.h5")) == (0, [], {})


def test_a_rank_missing_below_the_highest_is_missing_work(tmp_path):
    _rank(tmp_path / "run.h5", 0, "a")
    _rank(tmp_path / "run.dp2.h5", 2, "c")
    code, kinds, ev = _capture_kinds("check", str(tmp_path / "run*.h5"))
    assert (code, kinds, ev["missing_ranks"]) == (1, ["capture_incomplete"], [1])


def test_ranks_without_a_gap_are_one_complete_run(tmp_path):
    for rank, rid in enumerate("abc"):
        _rank(tmp_path / ("run.h5" if not rank else f"run.dp{rank}.h5"), rank, rid)
    assert _capture_kinds("check", str(tmp_path / "run*.h5")) == (0, [], {})


# -- 5. the capture fixture's command ----------------------------------------------------------

VT = "[SPECTRACE] req=a pos=10 k=2 ns=2 acc=1 draft=[ 5 6 ] emit=[ 5 7 ]"


def test_a_capture_fixture_refuses_a_command_string(spectrace_capture_cmd):
    with pytest.raises(ValueError, match="cmd must be the command's argument list"):
        spectrace_capture_cmd(f"{sys.executable} -c pass")


def test_a_capture_fixture_runs_a_command_list(spectrace_capture_cmd):
    code = f"import sys; print({VT!r}, file=sys.stderr)"
    t = spectrace_capture_cmd([sys.executable, "-c", code])
    assert len(t.blocks) == 1
