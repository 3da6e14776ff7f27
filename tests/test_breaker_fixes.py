"""A new user's breakages, each with its clean twin (issue: the tester's items 1-5).

1. garbage inputs to ``import llama-dump`` / ``import golden`` are input errors (exit 2);
   duplicated or out-of-order dump steps are the file's counted problems;
2. an unknown ``--request`` is bad usage (exit 2, one line); a ``--positions`` that selects
   nothing fails the gate ("nothing selected"), CLI and fixture alike (the fixture's
   ``(A, None)`` is ``A:``);
3. an explicit ``--min-agreement`` fails ``0/0`` against a vanilla run; a passing gate with
   differing blocks never says "no divergence";
4. ``replay --engine cmd --timeout`` stops the command; a failing engine exits 3;
5. an empty selection says so (not "different jobs" / "never drafted from the same anchor").

The hand-built pair is tests/test_gate_cli.py's (k=3): request ``a``/``A`` pairs 5 agreeing
blocks at positions 2, 6, 10, 14, 18; ``b``/``B`` pairs 2 differing blocks (slot 2) at 2, 14.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_gate_cli import OUTPUT, _trace, fixture_problems, run_cli

from spectrace.hooks.importers.llama_dump import import_dump
from spectrace.hooks.replay import deadline
from spectrace.tracer.errors import ParseError
from spectrace.tracer.gate import GateError, Selection
from spectrace.tracer.store import TraceWriter

DATA = Path(__file__).parent / "data_importers"
DUMP, REQS = DATA / "llama_spec_dump.jsonl", DATA / "llama.requests.jsonl"
GOLDEN = DATA / "golden_small.json"
SPECTRACE = [sys.executable, "-m", "spectrace.tracer"]


@pytest.fixture
def pair(tmp_path):
    return _trace(tmp_path / "ours.h5", "ab", True), _trace(tmp_path / "theirs.h5", "AB", False)


def _one_error_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.startswith("spectrace: error:")]
    assert len(lines) == 1, err
    return lines[0]


# -- 1. importers ----------------------------------------------------------------------------


def test_llama_dump_without_a_step_is_an_input_error(tmp_path, capsys):
    src = tmp_path / "l0.jsonl"
    src.write_text('{"a":1}\n')
    code, out, err = run_cli(capsys, "import", "llama-dump", src, "--requests", REQS, "-o",
                             tmp_path / "l0.h5")  # fmt: skip
    assert code == 2
    assert _one_error_line(err) == (
        f"spectrace: error: {src}: no LLAMA_SPEC_DUMP step object (step, seq, n_draft, "
        f"n_accepted, pmin_drop, pos) in 1 line(s) (first problem at {src}:1: not a count "
        "(field=step, value=None))"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["l0.jsonl"]  # no trace, no .partial
    # twin: one readable step imports
    src.write_text(DUMP.read_text().splitlines()[0] + "\n")
    code, _, err = run_cli(capsys, "import", "llama-dump", src, "--requests", REQS, "-o",
                           tmp_path / "l1.h5")  # fmt: skip
    assert code == 0, err
    assert "imported 1 blocks of 3 requests" in err


def _clean_lines() -> list[str]:
    lines = DUMP.read_text().splitlines()
    return lines[:4] + lines[5:6]  # steps 1/seq 0, 1/1, 2/0, 2/1, 3/0: every one placed


def test_llama_dump_duplicated_step_is_a_problem_of_the_file(tmp_path):
    lines = _clean_lines()
    src = tmp_path / "dup.jsonl"
    src.write_text("\n".join(lines + [lines[0]]) + "\n")  # step 1 of seq 0 again, line 6
    stats = import_dump(src, tmp_path / "d.h5", REQS)
    assert list(stats.problems.classes) == ["duplicate_step"]
    c = stats.problems.classes["duplicate_step"]
    assert (c.count, c.where) == (1, f"{src}:6")
    assert c.what == "step 1 of seq 0 again (a duplicated step line) (field=step, value=1)"
    assert (stats.steps, stats.blocks) == (5, 5)  # left out, not placed twice
    with pytest.raises(ParseError) as e:
        import_dump(src, tmp_path / "s.h5", REQS, strict=True)
    assert str(e.value) == f"{src}:6: {c.what}"
    # twin
    clean = tmp_path / "clean.jsonl"
    clean.write_text("\n".join(lines) + "\n")
    stats = import_dump(clean, tmp_path / "c.h5", REQS, strict=True)
    assert stats.problems.total == 0 and stats.blocks == 5


def test_llama_dump_steps_out_of_order_are_counted_and_placed_in_step_order(tmp_path):
    from spectrace.tracer.store import open_trace

    l0, l1, l2, l3, l5 = _clean_lines()
    src = tmp_path / "order.jsonl"
    src.write_text("\n".join([l0, l1, l3, l5, l2]) + "\n")  # seq 0: steps 1, 3, 2
    stats = import_dump(src, tmp_path / "o.h5", REQS)
    c = stats.problems.classes["step_order"]
    assert list(stats.problems.classes) == ["step_order"]
    assert (c.count, c.where) == (1, f"{src}:5")
    assert c.what == "step 2 of seq 0 after step 3 (field=step, value=2)"
    t = open_trace(tmp_path / "o.h5")
    # placed by step: a@2, b@3 (step 1), b@4, a@5 (step 2, file order), c@1 (step 3):
    # the clean file's placements, no accepted_mismatch
    req = [t.requests.req_id[r] for r in t.blocks.request]
    assert list(zip(req, t.blocks.position.tolist())) == [
        ("a", 2), ("b", 3), ("b", 4), ("a", 5), ("c", 1)
    ]  # fmt: skip


def test_golden_without_records_or_blocks_is_an_input_error(tmp_path, capsys):
    for name, doc, why in (
        ("g0.json", {"records": []}, ":1: not an oracle-capture golden (an empty 'records' list)"),
        (
            "g1.json",
            {"records": [{"prompt_token_ids": [1], "output_token_ids": [2], "blocks": []}]},
            ": not an oracle-capture golden: none of its 1 record(s) has a 'blocks' list "
            "with a block",
        ),
    ):
        src = tmp_path / name
        src.write_text(json.dumps(doc))
        code, _, err = run_cli(capsys, "import", "golden", src, "-o", tmp_path / "g.h5")
        assert code == 2
        assert _one_error_line(err) == f"spectrace: error: {src}{why}"
        assert not (tmp_path / "g.h5").exists() and not (tmp_path / "g.h5.partial").exists()
    code, _, err = run_cli(capsys, "import", "golden", GOLDEN, "-o", tmp_path / "g.h5")
    assert code == 0, err  # twin: the bundled golden


# -- 2. unknown requests, empty selections ---------------------------------------------------

UNKNOWN = "no request 'nosuch' (known: A, B, a, b) in ours.h5 or theirs.h5"


@pytest.mark.parametrize("cmd", ["diff", "check"])
def test_unknown_request_is_bad_usage(pair, capsys, cmd):
    args = pair if cmd == "diff" else pair[:1]
    code, out, err = run_cli(capsys, cmd, *args, "--request", "nosuch")
    known = UNKNOWN if cmd == "diff" else "no request 'nosuch' (known: a, b)"
    assert code == 2 and out == ""
    assert _one_error_line(err) == (
        f"spectrace: error: Invalid value for --request: {known} (see 'spectrace {cmd} --help')"
    )
    code, _, err = run_cli(capsys, cmd, *args, "--request", "a")  # twin
    assert code == 0, err


def test_fixture_unknown_request_raises(pair, spectrace_assert_drafts_match):
    with pytest.raises(GateError) as e:
        spectrace_assert_drafts_match(*pair, requests=["nosuch"])
    assert isinstance(e.value, ValueError) and str(e.value) == f"requests: {UNKNOWN}"
    assert fixture_problems(spectrace_assert_drafts_match, *pair, requests=["A"]) == []


NOTHING_1000 = (
    "nothing selected: positions 1000: leaves none of the 7 paired blocks "
    "(paired at positions 2..18)"
)


def test_positions_selecting_nothing_fail_the_gate(pair, capsys, spectrace_assert_drafts_match):
    code, out, _ = run_cli(capsys, "diff", *pair, "--positions", "1000:", "--format", "json")
    doc = json.loads(out)
    assert code == 1 and doc["reasons"] == [NOTHING_1000] and doc["diverged"] is True
    check = spectrace_assert_drafts_match
    for spec in (range(1000, 2000), (1000, None), slice(1000, None)):
        want = [NOTHING_1000.replace("1000:", "1000:2000" if isinstance(spec, range) else "1000:")]
        assert fixture_problems(check, *pair, positions=spec) == want
    # twins: a's blocks at 6, 10, 14, 18 all agree, CLI `5:` and fixture (5, None)
    code, _, err = run_cli(capsys, "diff", *pair, "--positions", "5:", "--request", "a")
    assert code == 0, err
    assert fixture_problems(check, *pair, positions=(5, None), requests=["a"]) == []
    assert fixture_problems(check, *pair, positions=(None, 3), requests=["a"]) == []


def test_positions_tuple_is_an_open_range_or_refused():
    assert Selection.of(positions=(1000, None)).positions == slice(1000, None)
    assert Selection.of(positions=(None, 7)).positions == slice(None, 7)
    # a 2-tuple is the range A:B like (A, None) and range(A, B), not the set {A, B}
    assert Selection.of(positions=(3, 7)).positions == slice(3, 7)
    assert Selection.of(positions=[3, 7]).positions == frozenset({3, 7})  # a list: those
    for bad, why in (
        ((-1, None), "positions: expected A:B with positions >= 0, e.g. 5:20 or 40: (got (-1, None))"),
        ((9, None, 3), "positions: None is not an int"),
        (range(9, 3), "positions: end 3 is before start 9 (got range(9, 3))"),
    ):  # fmt: skip
        with pytest.raises(GateError) as e:
            Selection.of(positions=bad)
        assert str(e.value) == why


def test_check_positions_selecting_nothing_fail(pair, capsys):
    code, out, _ = run_cli(capsys, "check", pair[0], "--positions", "1000:", "--format", "json")
    assert code == 1
    assert json.loads(out)["gate"] == {
        "passed": False,
        "problems": ["nothing selected: no block of the trace lies in positions 1000:"],
        "ignored": [],
    }
    code, out, _ = run_cli(capsys, "check", pair[0], "--positions", "0:3", "--format", "json")
    gate = json.loads(out)["gate"]
    assert code == 0 and gate == {"passed": True, "problems": [], "ignored": []}


# -- 3. explicit agreement against a vanilla run; the headline ------------------------------


def _vanilla(path) -> str:
    with TraceWriter(path, {"k": 0}, flush_interval=0) as w:
        for rid, prompt in (("a", [1, 2, 3]), ("b", [4, 5, 6])):
            w.request(rid, prompt_ids=prompt, output_ids=OUTPUT, finish_reason="length")
    return str(path)


def test_explicit_min_agreement_fails_a_vanilla_pair(
    pair, tmp_path, capsys, spectrace_assert_drafts_match
):
    ours, vanilla = pair[1], _vanilla(tmp_path / "vanilla.h5")
    code, out, _ = run_cli(capsys, "diff", ours, vanilla, "--min-agreement", "0.9",
                           "--format", "json")  # fmt: skip
    why = (
        "agreement 0/0 cannot meet 90.0%: no paired block (one side has no draft blocks: "
        "content_only)"
    )
    assert code == 1 and json.loads(out)["reasons"] == [why]
    check = spectrace_assert_drafts_match
    assert fixture_problems(check, ours, vanilla, min_agreement=0.9) == [why]
    # twins: the defaults keep the documented content_only pass; 0 asks for nothing
    for extra in ([], ["--min-agreement", "0"]):
        code, out, err = run_cli(capsys, "diff", ours, vanilla, *extra)
        assert code == 0, err
    assert fixture_problems(check, ours, vanilla) == []
    assert fixture_problems(check, ours, vanilla, min_agreement=0) == []


def test_headline_of_a_passing_gate_with_differing_blocks(pair, capsys):
    code, out, _ = run_cli(capsys, "diff", *pair, "--ignore", "draft_mismatch",
                           "--min-agreement", "0")  # fmt: skip
    assert code == 0
    headline = out.splitlines()[2]
    assert headline == "gate passed: 2 of 7 paired blocks differ (within the thresholds)"
    assert "no divergence" not in out
    code, out, _ = run_cli(capsys, "diff", *pair, "--request", "a", "--min-agreement", "0")
    assert code == 0 and out.splitlines()[2] == "no divergence on comparable blocks"  # twin


# -- 5. an empty selection says so ----------------------------------------------------------


def test_request_that_pairs_nothing_says_the_selection_left_nothing(tmp_path, capsys):
    ours = _trace(tmp_path / "ours.h5", "ab", False)
    with TraceWriter(tmp_path / "theirs.h5", {"k": 3}, flush_interval=0) as w:
        for rid, prompt in (("a", [1, 2, 3]), ("b", [4, 5, 6]), ("c", [7, 8, 9])):
            w.request(rid, prompt_ids=prompt, output_ids=OUTPUT, finish_reason="length")
    code, out, _ = run_cli(capsys, "diff", ours, tmp_path / "theirs.h5", "--request", "c",
                           "--max-errors", "9", "--format", "json")  # fmt: skip
    doc = json.loads(out)
    # ours lacks theirs' c (prompt [7, 8, 9]): missing work, which --max-errors never tolerates
    assert code == 1 and doc["reasons"] == [
        "nothing selected: request c is in no matched request pair",
        "missing work (requests_incomplete): --max-errors tolerates none; --ignore KIND does",
    ]
    (f,) = doc["findings"]
    assert (f["kind"], f["side"], f["request"]) == ("requests_incomplete", "ours", "c")


# -- 4. replay: --timeout stops the cmd engine; a failing engine exits 3 ---------------------


def test_deadline_wrapper_stops_a_command_and_passes_a_status_through():
    t0 = time.monotonic()
    assert deadline.main(["0.5", "--", "sh", "-c", "sleep 30"]) == 124
    assert time.monotonic() - t0 < 10
    assert deadline.main(["20", "--", "sh", "-c", "exit 7"]) == 7  # twins: in time
    assert deadline.main(["20", "--", "sh", "-c", "exit 0"]) == 0


def _replay(tmp_path, command, *extra):
    ref = _trace(tmp_path / "ref.h5", "ab", False)
    argv = [*SPECTRACE, "replay", ref, "-o", tmp_path / "r.h5", "--engine", "cmd",
            "--positions", "1", "--command", command, *extra]  # fmt: skip
    t0 = time.monotonic()
    run = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=60)
    return run, time.monotonic() - t0


def test_replay_cmd_timeout_and_failure_exit_3(tmp_path):
    run, took = _replay(tmp_path, "sh -c 'sleep 30; : {prompts} {requests}'", "--timeout", "1")
    assert run.returncode == 3 and took < 20, run.stderr
    assert _one_error_line(run.stderr) == (
        "spectrace: error: --engine cmd: sh ran longer than --timeout 1 s: stopped"
    )
    run, _ = _replay(tmp_path, "sh -c 'exit 1; : {prompts} {requests}'")
    assert run.returncode == 3
    assert _one_error_line(run.stderr) == "spectrace: error: --engine cmd: sh exited with status 1"
    run, _ = _replay(tmp_path, "sh -c ': {prompts}'")  # twin: a bad command is bad usage
    assert run.returncode == 2
    assert _one_error_line(run.stderr) == (
        "spectrace: error: --command: needs {requests} (where the engine writes its outputs)"
    )
