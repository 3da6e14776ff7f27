"""The fifteenth round: replay options that nothing of the run reads were silently ignored,
and an unusable --tokenizer was found only after the replays had run.

1. ``--fault`` with a first engine other than the reference engine, ``--command`` without
   the cmd engine, ``--margins`` without vllm, ``--timeout`` with the reference engine alone
   and ``--tokenizer`` with one engine were ignored (exit 0): the user believed in a run they
   did not get. Each is now a usage error (exit 2) before anything runs.
2. ``--tokenizer /nonexistent`` with two engines was read after both replays (minutes):
   now bad input (exit 2) before the first replay, and no trace is written.

Each case has its clean twin: the same option where it applies runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from inproc import run_inproc

ROOT = Path(__file__).resolve().parent.parent
REF = ROOT / "traces" / "reference.h5"
TOKENIZER = ROOT / "engine" / "models" / "target"
ONE = ("--positions", "1", "--requests", "0")  # one replayed position: seconds


@pytest.mark.parametrize(
    "args, says",
    [
        (("--engine", "cmd", "--command", "x {requests}", "--fault", "layout_shift"),
         "--fault plants a fault in the reference engine, and the first engine is cmd"),
        (("--command", "echo {requests}"),
         "--command is the cmd engine's command, and no engine is cmd"),
        (("--no-margins",), "--margins/--no-margins is for the vllm engine, and none replays"),
        (("--timeout", "5"), "--timeout stops a vllm or cmd engine, and none replays"),
        (("--tokenizer", str(TOKENIZER)),
         "--tokenizer decodes the diff of two replays, and one engine replays here"),
    ],
)  # fmt: skip
def test_an_option_nothing_reads_is_a_usage_error(tmp_path, args, says):
    out = tmp_path / "r.h5"
    r = run_inproc("replay", REF, "-o", out, *args, *ONE)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr
    assert not out.exists()


def test_an_unusable_tokenizer_is_refused_before_any_replay(tmp_path):
    out = tmp_path / "r.h5"
    missing = tmp_path / "nowhere"
    r = run_inproc("replay", REF, "-o", out, "--engine", "reference", "--engine", "reference",
                   "--tokenizer", missing, *ONE)  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == f"spectrace: error: {missing}: no tokenizer.json found"
    assert not out.exists() and not (tmp_path / "r.reference.h5").exists()


def test_the_options_where_they_apply_run(tmp_path):
    """The clean twins: a fault in the reference engine and a tokenizer for two replays."""
    out = tmp_path / "r.h5"
    r = run_inproc("replay", REF, "-o", out, "--engine", "reference", "--engine", "reference",
                   "--tokenizer", TOKENIZER, *ONE)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert out.exists() and (tmp_path / "r.reference.h5").exists()
    out2 = tmp_path / "f.h5"
    r = run_inproc("replay", REF, "-o", out2, "--fault", "layout_shift", *ONE)
    assert r.returncode == 0, r.stderr
    assert out2.exists()


# -- 3. one rank's uninstalled drafts hid another rank's lost tail ---------------------------


def _rank(path: Path, rank: int, meta: dict, output: tuple[int, ...]) -> Path:
    """One DP rank's file of a draft-model run: request ``q{rank}``, prompt (1, 2), one
    block at position 1 (anchor 2) proposing (3, 4), both accepted, and ``output``."""
    from spectrace.tracer.store import TraceWriter

    rid = f"q{rank}"
    with TraceWriter(path, {"k": 2, "method": "draft_model", "dp_rank": rank, **meta},
                     flush_interval=0) as w:  # fmt: skip
        w.request(rid, prompt_ids=[1, 2], output_ids=list(output), finish_reason="length")
        w.add_block(rid, 0, 1, 2, [3, 4], verified=[3, 4], accepted=2, emitted=[3, 4, 5])
    return path


UNINSTALLED = {"import": {"joins": {"not_installed": 1}}}


@pytest.mark.parametrize("rank1_output, lost", [((3, 4, 5, 6, 7, 8), True), ((3, 4, 5), False)])
def test_a_rank_with_uninstalled_drafts_does_not_hide_another_ranks_lost_tail(
    tmp_path, rank1_output, lost
):
    """Rank 0's import saw drafts never installed (its requests may end without blocks);
    rank 1's request goes on 3 tokens past the position its one block reaches (1 + 2 + 1 =
    4, its last token is at 7): blocks lost at rank 1's end. The twin ends at position 4."""
    _rank(tmp_path / "run.dp0.h5", 0, UNINSTALLED, (3, 4, 5, 6, 7, 8))
    _rank(tmp_path / "run.dp1.h5", 1, {}, rank1_output)
    r = run_inproc("check", str(tmp_path / "run.dp*.h5"), "--format", "json")
    import json

    capture = [f for f in json.loads(r.stdout)["findings"] if f["kind"] == "capture_incomplete"]
    says = "request q1: its last block, at position 1, reaches position 4; its output goes on to position 7"
    assert bool(capture) == lost, r.stdout
    if lost:
        assert r.returncode == 1 and says in capture[0]["message"]


# -- 4. the fixture's requests=0 ------------------------------------------------------------


def test_an_integer_request_is_that_request_id():
    """``requests=0`` raised TypeError (an int is not iterable); it is request id "0", as
    ``--request 0`` (the bundled traces' ids are 0..4; request 0 matches), and an id neither
    trace has is the fixture's ValueError."""
    from spectrace.tracer.testing.assertions import drafts_match_report

    vllm = ROOT / "traces" / "vllm.h5"
    assert drafts_match_report(REF, vllm, requests=0) is None
    with pytest.raises(ValueError, match=r"no request '7' \(known: "):
        drafts_match_report(REF, vllm, requests=7)


# -- 5. --request unknown to one of several runs --------------------------------------------


def _one(path: Path, rid: str, prompt: list[int]) -> Path:
    from spectrace.tracer.store import TraceWriter

    with TraceWriter(path, {"k": 2}, flush_interval=0) as w:
        w.request(rid, prompt_ids=prompt, output_ids=[3, 4, 5], finish_reason="length")
        w.add_block(rid, 0, 1, 2, [3, 4], verified=[3, 4], accepted=2, emitted=[3, 4, 5])
    return path


def test_an_unknown_request_names_the_pair_of_several_runs(tmp_path):
    """Request y is c.h5's only; gated against the golden a.h5, run b.h5 lacks it: the
    line names that pair (it listed only the known ids, as if every run lacked y). The twin:
    request x, which the golden and both runs (b.h5 twice) hold, passes."""
    a, b = _one(tmp_path / "a.h5", "x", [1, 2]), _one(tmp_path / "b.h5", "x", [1, 2])
    c = _one(tmp_path / "c.h5", "y", [9, 9])
    r = run_inproc("diff", a, b, c, "--request", "y")
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "spectrace: error: Invalid value for --request: no request 'y' (known: x) in a.h5 or "
        "b.h5 (see 'spectrace diff --help')"
    )
    r = run_inproc("diff", a, b, b, "--request", "x")
    assert r.returncode == 0, r.stderr
