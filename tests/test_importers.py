"""``spectrace import golden`` and ``spectrace import llama-dump`` (issue 14 item 1) on files
written by hand in the real formats (tests/data_importers/); every expected figure below is
derived by hand in the comments, not by the importer."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from inproc import run_inproc, run_process

from spectrace.hooks.importers.counters import check_status
from spectrace.hooks.importers.golden import import_golden
from spectrace.hooks.importers.llama_dump import import_dump
from spectrace.hooks.importers.placement import accepted_prefix, place
from spectrace.tracer.errors import InputError, ParseError
from spectrace.tracer.metrics import trace_summary
from spectrace.tracer.store import open_trace

DATA = Path(__file__).parent / "data_importers"
GOLDEN = DATA / "golden_small.json"
DUMP = DATA / "llama_spec_dump.jsonl"
REQS = DATA / "llama.requests.jsonl"


_run, _run_process = run_inproc, run_process


# -- the walk --------------------------------------------------------------------------------


def test_accepted_prefix_stops_at_a_mismatch_and_at_the_end():
    full = [1, 2, 3, 4]
    assert accepted_prefix([3, 9], full, 1) == 1  # full[2]=3 equal, full[3]=4 != 9
    assert accepted_prefix([4, 5, 6], full, 2) == 1  # full[3]=4, then the end
    assert accepted_prefix([7], full, 3) == 0  # nothing after the last token


def test_walk_places_until_an_anchor_mismatch():
    # full = prompt [1, 2] + output [3, 4, 5, 6]; first anchor at 2 (token 3)
    walk = place([1, 2, 3, 4, 5, 6], 2, [(3, [4, 9]), (5, [6]), (5, [6]), (6, [])])
    # block 0: acc 1 (4), next at 2+1+1=4 (token 5); block 1: acc 1 (6), 4+1+1=6 >= 6 so its
    # bonus falls past the end; block 2: position 6 is past the end right after block 1 was
    # cut there: the final proposal, drafted from the trimmed bonus; the walk ends
    assert [(b.index, b.position, b.accepted, b.past_end) for b in walk.placed] == [
        (0, 2, 1, False),
        (1, 4, 1, True),
    ]
    assert (walk.ended_at, walk.final) == ((2, "final_past_end"), 2)
    assert dict(walk.unplaced) == {"final_past_end": 1, "after_walk_end": 1}
    # past the end after the final proposal (anchored at 2, the last token): unexplained
    after = place([1, 2, 3], 2, [(3, [9]), (9, [])])
    assert [(b.position, b.final) for b in after.placed] == [(2, True)]
    assert (after.ended_at, after.final, dict(after.unplaced)) == (
        (1, "past_end"),
        0,
        {"past_end": 1},
    )
    clean = place([1, 2, 3, 4, 5, 6], 2, [(3, [4, 5]), (6, [])])  # the clean twin
    # block 1 is anchored at 5, the last token: the final proposal, never verified
    assert [(b.position, b.accepted, b.final) for b in clean.placed] == [
        (2, 2, False),
        (5, 0, True),
    ]
    assert clean.ended_at is None and not clean.unplaced


# -- golden ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def golden_trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("golden") / "g.h5"
    stats = import_golden(GOLDEN, out)
    return stats, open_trace(out)


def test_golden_placements_are_the_hand_derived_ones(golden_trace):
    stats, t = golden_trace
    b = t.blocks
    # record 0: full = [10,11,12, 20..27] (11 tokens); blocks at 3 (acc 2: 21,22; drafts
    # [21,22,99]), 6 (acc 2: 24,25), 9 (acc 1: 27 at 10; 28 would be at 11, past max_tokens=8:
    # its bonus is cut); the 4th block's position 9+1+1 = 11 is past the end.
    # record 1: full = [10,13, 30,31,32]; block at 2 (acc 1: 31), then anchor 99 != token 32.
    # record 2: full = [10,14,15, 50,51,52]; block at 3 (acc 1: 51), then drafts [53, "x"].
    # record 3: full = [10,16, 70,71,72]; block at 2 (acc 1: 71), then the final proposal
    # anchored at 4, the last token 72: unverified (accepted -1, nothing emitted).
    assert b.request.tolist() == [0, 0, 0, 1, 2, 3, 3]
    assert b.position.tolist() == [3, 6, 9, 2, 3, 2, 4]
    assert b.anchor.tolist() == [20, 23, 26, 30, 50, 70, 72]
    assert b.accepted.tolist() == [2, 2, 1, 1, 1, 1, -1]
    assert b.step.tolist() == [0, 1, 2, 0, 0, 0, 1]
    assert b.batch_row.tolist() == [0, 0, 0, 1, 2, 3, 3]
    assert b.emitted.tolist() == [
        [21, 22, 23, -1],
        [24, 25, 26, -1],
        [27, -1, -1, -1],
        [31, 32, -1, -1],
        [51, 52, -1, -1],
        [71, 72, -1, -1],
        [-1, -1, -1, -1],
    ]
    assert b.num_verified.tolist() == [3, 3, 3, 3, 3, 3, -1]  # -1: not recorded
    assert t.requests.finish_reason == ["length", "stop", "stop", "stop"]
    assert (stats.blocks, stats.placed, stats.past_max_tokens, stats.final) == (12, 7, 1, 1)
    assert dict(stats.unplaced) == {
        "final_past_end": 1,  # record 0's 4th block, drafted from the trimmed bonus
        "past_end": 1,  # record 3's 3rd block, after its final proposal
        "anchor_mismatch": 1,
        "after_walk_end": 1,
        "invalid_block": 1,
    }


def test_golden_counters_are_cross_checked(golden_trace):
    stats, t = golden_trace
    check = t.meta["checks"]["golden_counters"]
    # verified placed blocks (the final proposal left out): 6 blocks, 18 drafts, accepted
    # 2+2+1+1+1+1 = 8; per slot acc > 0: 6, > 1: 2, > 2: 0. The golden counts 9 accepted,
    # [6, 3, 0]: record 0's third block accepted 28 too, which max_tokens trimmed (of its 3
    # drafts 2 are past the end, slots 1 and 2).
    assert check["placed"] == {
        "drafts": 6,
        "draft_tokens": 18,
        "accepted_tokens": 8,
        "accepted_per_pos": [6, 2, 0],
    }
    assert check["golden"]["accepted_tokens"] == 9
    assert check["shortfall"] == {
        "drafts": 0,
        "draft_tokens": 0,
        "accepted_tokens": 1,
        "accepted_per_pos": [0, 1, 0],
    }
    assert check["equal"] is False and check["past_max_tokens"] == 1 and check["unplaced"] == 5
    assert (check["cut_drafts"], check["unexplained"]) == (2, [])
    assert t.meta["checks"]["status"] == "ok"
    assert "1 placed block(s) reach past max_tokens" in check["message"]
    assert t.meta["k"] == 3 and t.meta["target_model"] == "toy/target-1b"
    assert t.meta["golden"]["pin"] == "vllm==0.32.0" and t.meta["engine_version"] == "0.32.0"
    s = trace_summary(t)
    assert (s["blocks"], s["recorded"]["accepted_tokens"], s["verified_tokens"]) == (7, 8, 18)


def test_golden_final_proposals_are_not_counted(tmp_path):
    """A golden counting the final proposal as verified (7 drafts, 21 draft tokens) is short
    of a block vLLM never counts: mismatch; its twin is the bundled golden (6, 18: ok)."""
    doc = json.loads(GOLDEN.read_text())
    doc["metrics"]["vllm:spec_decode_num_drafts"] = 7
    doc["metrics"]["vllm:spec_decode_num_draft_tokens"] = 21
    src = tmp_path / "g.json"
    src.write_text(json.dumps(doc))
    stats = import_golden(src, tmp_path / "g.h5")
    assert stats.check["shortfall"]["drafts"] == 1
    assert check_status(stats.check) == {
        "status": "mismatch",
        "mismatch": ["drafts", "draft_tokens"],
    }
    assert check_status(import_golden(GOLDEN, tmp_path / "twin.h5").check) == {"status": "ok"}


def test_golden_problems_are_counted_with_their_first_line(golden_trace):
    stats, _ = golden_trace
    f = str(GOLDEN)
    # record 0's 4th block (line 27, past the end right after a block cut there) is its
    # final proposal: no problem. Record 3's 3rd block (line 59) follows its final proposal
    # at 4: position 5 is past the end, which nothing explains.
    assert stats.problems.lines() == [
        f"1 anchor_mismatch (first at {f}:37: anchor is not the token at position 4 (32): the "
        "walk ends (field=anchor, value=99))",
        f"1 invalid_block (first at {f}:48: not a list of token ids (field=drafts, value=[53, "
        "'x']))",
        f"1 past_end (first at {f}:59: position 5 is past the end of the output (5 tokens) "
        "(field=anchor, value=73))",
    ]


def test_golden_equal_counters_are_said_equal(tmp_path):
    # the clean twin: only record 0's first two blocks (acc 2, 2), counters that match them
    doc = json.loads(GOLDEN.read_text())
    doc["records"] = [doc["records"][0]]
    doc["records"][0]["blocks"] = doc["records"][0]["blocks"][:2]
    doc["metrics"] = {
        "vllm:spec_decode_num_drafts": 2,
        "vllm:spec_decode_num_draft_tokens": 6,
        "vllm:spec_decode_num_accepted_tokens": 4,
        "vllm:spec_decode_num_accepted_tokens_per_pos": [2, 2, 0],
    }
    src = tmp_path / "clean.json"
    src.write_text(json.dumps(doc, indent=1))
    stats = import_golden(src, tmp_path / "clean.h5", strict=True)
    assert stats.check["equal"] is True and stats.problems.total == 0
    assert stats.summary() == (
        f"imported 2 of 2 blocks of 1 requests from {src} (every block placed)"
    )


def test_golden_strict_fails_on_the_first_problem_and_leaves_nothing(tmp_path):
    out = tmp_path / "g.h5"
    r = _run_process("import", "golden", GOLDEN, "-o", out, "--strict")
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"spectrace: error: {GOLDEN}:37: anchor is not the token at position 4 (32): the walk "
        f"ends (field=anchor, value=99) (partial trace {out}.partial removed)"
    ]
    assert list(tmp_path.iterdir()) == []


def test_golden_cli_reports_and_refuses_to_overwrite(tmp_path):
    out = tmp_path / "g.h5"
    r = _run("import", "golden", GOLDEN, "-o", out)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0] == (
        f"spectrace: imported 7 of 12 blocks of 4 requests from {GOLDEN} (not placed: 1 "
        "anchor mismatch, 1 past end, 1 final past end, 1 invalid block, 1 after walk end; 1 "
        "past max_tokens (visible acceptance); 1 final proposal (never verified))"
    )
    # the counters differ only where max_tokens trimmed (accepted 9 vs 8): said, no warning
    assert len(lines) == 5 and lines[-1].startswith("spectrace: golden counters vs")
    r = _run("import", "golden", GOLDEN, "-o", out)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"spectrace: error: {out}: the output (-o) exists; pass --force to overwrite it"
    ]


@pytest.mark.parametrize(
    "text, line",
    [
        ('{"records": [\n  {"prompt": 1,}\n]}', "2: not JSON (Expecting property name"),
        ('{"metrics": {}}', "1: not an oracle-capture golden (no 'records' list)"),
        ("", " empty golden JSON file"),
    ],
)
def test_golden_unreadable_files_are_input_errors(tmp_path, text, line):
    src = tmp_path / "bad.json"
    src.write_text(text)
    with pytest.raises(InputError) as e:
        import_golden(src, tmp_path / "o.h5")
    assert str(e.value).startswith(f"{src}:{line}")
    assert not (tmp_path / "o.h5.partial").exists()


# -- llama.cpp LLAMA_SPEC_DUMP --------------------------------------------------------------


@pytest.fixture(scope="module")
def dump_trace(tmp_path_factory):
    out = tmp_path_factory.mktemp("llama") / "l.h5"
    stats = import_dump(DUMP, out, REQS)
    return stats, open_trace(out)


def test_dump_steps_are_placed_per_sequence(dump_trace):
    _, t = dump_trace
    b = t.blocks
    # seq 0 serves a (full [1,2,5..10]) then c (full [1,30,31,32]); seq 1 serves b
    # (full [1,3,4,20..23]). a: 2 (acc 2) -> 5 (acc 2) -> 8 = end; c: 1. b: 3 -> 4 -> 6.
    assert [t.requests.req_id[r] for r in b.request] == ["a", "b", "a", "b", "c", "b"]
    assert b.position.tolist() == [2, 3, 5, 4, 1, 6]
    assert b.anchor.tolist() == [5, 20, 8, 21, 30, 23]
    assert b.step.tolist() == [1, 1, 2, 2, 3, 4]
    # k = n_draft + pmin_drop; the trimmed drafts are -1 in proposed, absent from verified
    assert b.k.tolist() == [3, 3, 3, 2, 3, 1]
    assert b.num_verified.tolist() == [3, 2, 3, 2, 1, 1]
    assert b.accepted.tolist() == [2, 0, 2, 1, 1, 0]
    assert b.proposed.tolist() == [
        [6, 7, 50],
        [29, 22, -1],
        [9, 10, 12],
        [22, 40, -1],
        [31, -1, -1],
        [99, -1, -1],
    ]
    assert b.emitted[:, :3].tolist()[:2] == [[6, 7, 8], [21, -1, -1]]


def test_dump_margins_are_top1_minus_top2_log_probability(dump_trace):
    _, t = dump_trace
    m = t.blocks.draft_margin
    # ln(0.8/0.1) = ln 8, ln(0.5/0.25) = ln 2, a tie 0.4/0.4 = 0; one candidate: unknown
    assert m[0].tolist() == pytest.approx([math.log(8), math.log(2), 0.0], abs=1e-6)
    assert np.isnan(m[1:]).all()


def test_dump_counts_and_problems(dump_trace):
    stats, t = dump_trace
    assert (stats.lines, stats.steps, stats.blocks) == (7, 7, 6)
    assert (stats.trimmed_blocks, stats.trimmed_drafts, stats.margins) == (2, 3, 3)
    assert dict(stats.unplaced) == {"unknown_seq": 1}
    assert list(stats.problems.classes) == ["bad_json", "acc_label", "unknown_seq"]
    assert stats.problems.classes["acc_label"].where == f"{DUMP}:8"
    assert stats.problems.classes["unknown_seq"].where == f"{DUMP}:7"
    s = trace_summary(t)
    # verified 3+2+3+2+1+1 = 12, accepted 2+0+2+1+1+0 = 6, proposed 3+3+3+2+3+1 = 15
    assert (s["proposed_tokens"], s["verified_tokens"]) == (15, 12)
    assert s["recorded"]["accepted_tokens"] == 6
    assert s["recorded"]["per_position"] == [4 / 6, 2 / 6, 0.0]
    assert t.meta["k"] == 3 and t.meta["source"] == "llama-spec-dump"


def test_dump_clean_twin_has_no_problem(tmp_path):
    lines = DUMP.read_text().splitlines()
    src = tmp_path / "clean.jsonl"
    src.write_text("\n".join(lines[:4] + lines[5:6]) + "\n")  # the readable, placed steps
    stats = import_dump(src, tmp_path / "c.h5", REQS, strict=True)
    assert stats.problems.total == 0 and stats.blocks == 5


def test_dump_strict_names_the_line(tmp_path):
    with pytest.raises(ParseError) as e:
        import_dump(DUMP, tmp_path / "l.h5", REQS, strict=True)
    assert str(e.value).startswith(f"{DUMP}:5: not JSON (")
    assert list(tmp_path.iterdir()) == []
    r = _run("import", "llama-dump", DUMP, "--requests", REQS, "-o", tmp_path / "l.h5")
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[0] == (
        f"spectrace: imported 6 blocks of 3 requests from {DUMP} (7 steps; 3 drafts trimmed "
        "by p_min in 2 blocks; 3 draft margins; not placed: 1 unknown seq)"
    )


def test_golden_drafts_shortfall_names_the_unplaced_blocks(tmp_path):
    # the golden counted 10 drafts; the walk placed 6 verified blocks
    doc = json.loads(GOLDEN.read_text())
    doc["metrics"]["vllm:spec_decode_num_drafts"] = 10
    src = tmp_path / "g.json"
    src.write_text(json.dumps(doc))
    stats = import_golden(src, tmp_path / "g.h5")
    assert stats.check["shortfall"]["drafts"] == 4  # 10 counted - 6 placed and verified
    assert stats.check["message"].endswith("; 5 golden block(s) were not placed")


def test_golden_blocks_out_of_call_order_are_counted(tmp_path):
    doc = json.loads(GOLDEN.read_text())
    blocks = doc["records"][0]["blocks"]
    blocks[1]["call"], blocks[2]["call"] = 2, 1  # calls 0, 2, 1, 3: the third block is out
    src = tmp_path / "g.json"
    src.write_text(json.dumps(doc, indent=2))
    stats = import_golden(src, tmp_path / "g.h5")
    c = stats.problems.classes["call_order"]
    assert (c.count, c.what) == (1, "call 1 after call 2 (field=call, value=1)")
    assert stats.placed == 7  # the walk is the file order's: the same placements
