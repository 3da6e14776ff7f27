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


# -- 6. a VT line whose accepted count contradicts its own emitted ids -----------------------

LOG = ROOT / "traces" / "reference.vt.log"
REQS = ROOT / "traces" / "reference.requests.jsonl"
# Line 20 is request 0's first block: ns=3 acc=2 draft=[318 351 372 63] emit=[318 351 385].
LINE20 = "[SPECTRACE] req=0 pos=11 k=4 ns=3 acc=2 draft=[ 318 351 372 63 ] emit=[ 318 351 385 ]"


def _vt_import(tmp_path: Path, name: str, line20: str, requests: bool) -> Path:
    lines = LOG.read_text().splitlines(keepends=True)
    assert lines[19].rstrip("\n") == LINE20
    lines[19] = line20 + "\n"
    log, out = tmp_path / f"{name}.vt.log", tmp_path / f"{name}.h5"
    log.write_text("".join(lines))
    args = ["import", "vt", log, "-o", out] + (["--requests", REQS] if requests else [])
    assert run_inproc(*args).returncode == 0
    return out


def _errors(*args) -> tuple[int, dict[str, dict]]:
    import json

    r = run_inproc(*args, "--format", "json")
    doc = json.loads(r.stdout)
    return r.returncode, {f["kind"]: f for f in doc["findings"] if f["severity"] == "error"}


def test_acceptance_one_too_high_without_the_requests_file_is_named(tmp_path):
    """acc=3 with 3 emitted ids (ns=3): imported without outputs, every block's end was
    taken for a trimmed request end, and the import's own count was left to a check that
    needs the outputs: exit 0. Now: 3 emitted != 3 + 1 on a block that is not its
    request's last: acceptance_bookkeeping (1 block), exit 1; the bundled log is the twin."""
    bad = _vt_import(tmp_path, "acc", LINE20.replace("acc=2", "acc=3"), requests=False)
    code, errors = _errors("check", bad)
    assert code == 1 and list(errors) == ["acceptance_bookkeeping"]
    ev = errors["acceptance_bookkeeping"]["evidence"]
    assert (ev["blocks"], ev["emitted_count_mismatch"]) == (1, 1)
    assert ev["import_lines"] == {"acc != ns-1": 1, "emit != draft": 1}
    assert errors["acceptance_bookkeeping"]["request"] == "0"
    clean = _vt_import(tmp_path, "clean", LINE20, requests=False)
    assert _errors("check", clean) == (0, {})
    assert _errors("diff", clean, bad)[0] == 1


def test_emitted_ids_contradicting_the_accepted_drafts_are_named(tmp_path):
    """emit[1] = 999 where draft[1] = 351 was accepted: the import counted 1 ``emit !=
    draft`` line, and no detector reads the emitted ids (the outputs hold 351): exit 0.
    Now acceptance_bookkeeping says what the import read, and (since round 19) names the
    block: its emitted 999 is not the output's 351 at its position."""
    bad = _vt_import(tmp_path, "emit", LINE20.replace("318 351 385", "318 999 385"), True)
    code, errors = _errors("check", bad)
    assert code == 1 and list(errors) == ["acceptance_bookkeeping"]
    f = errors["acceptance_bookkeeping"]
    assert f["evidence"]["blocks"] == 1 and f["evidence"]["import_lines"] == {"emit != draft": 1}
    assert f["evidence"]["emitted_ids_mismatch"] == 1
    assert f["evidence"]["first_line"] == (
        f"{tmp_path / 'emit.vt.log'}:20: emit != draft: req=0 pos=11: emit[:acc] [318, 999] "
        "differs from draft[:acc] [318, 351]"
    )
    clean = _vt_import(tmp_path, "clean", LINE20, requests=True)
    assert _errors("diff", clean, clean) == (0, {})
    assert _errors("diff", clean, bad)[0] == 1


def test_validate_checks_the_emitted_ids_against_the_accepted_ones(tmp_path):
    """vllm.h5's block 60 accepted 1 (proposed and verified [63, ...]; emitted [63, 821]):
    emitted[0] set to 64 contradicts the accepted draft; validate said valid."""
    import shutil

    import h5py

    path = tmp_path / "v.h5"
    shutil.copy(ROOT / "traces" / "vllm.h5", path)
    with h5py.File(path, "r+") as f:
        b = f["blocks"]
        assert (b["accepted"][60], b["verified"][60][0], b["emitted"][60][0]) == (1, 63, 63)
        row = b["emitted"][60]
        row[0] = 64
        b["emitted"][60] = row
    r = run_inproc("validate", path)
    assert r.returncode == 1
    assert r.stdout.strip() == (
        f"{path}: emitted ids are not the accepted verified ids (emitted[:accepted]) at row 60 "
        "(field=blocks/emitted, value=1)"
    )
    assert run_inproc("validate", ROOT / "traces" / "vllm.h5").returncode == 0


# -- 7. --max-errors and drafts never verified ------------------------------------------------


def test_max_errors_does_not_tolerate_drafts_never_verified(tmp_path):
    """Request 0's first proposal never installed (line 6, ``installed=0``): one block
    proposed and never verified, unverified_drafts (error). ``--max-errors 1`` passed it
    (exit 0) as if it were an error in what was recorded; it is missing work, as a dead
    engine is. Twins: ``--ignore unverified_drafts`` accepts it; the bundled log passes."""
    lines = LOG.read_text().splitlines(keepends=True)
    assert lines[5] == "[spec-install] req=0 installed=4 lookahead=4\n"
    lines[5] = lines[5].replace("installed=4", "installed=0")
    log, bad = tmp_path / "ni.vt.log", tmp_path / "ni.h5"
    log.write_text("".join(lines))
    assert run_inproc("import", "vt", log, "-o", bad, "--requests", REQS).returncode == 0
    import json

    for cmd in (("check", bad), ("diff", REF, bad)):
        r = run_inproc(*cmd, "--max-errors", "1", "--format", "json")
        assert r.returncode == 1, cmd
        assert json.loads(r.stdout)["gate"]["problems"] == [
            "missing work (unverified_drafts): --max-errors tolerates none; --ignore KIND does"
        ]
    assert run_inproc("check", bad, "--ignore", "unverified_drafts").returncode == 0
    clean = tmp_path / "clean.h5"
    assert run_inproc("import", "vt", LOG, "-o", clean, "--requests", REQS).returncode == 0
    assert run_inproc("diff", REF, clean, "--max-errors", "1").returncode == 0


# -- 8. a request's first blocks lost --------------------------------------------------------


def test_blocks_lost_at_a_requests_start_are_missing_work(tmp_path):
    """Lines 20 and 44 are request 0's first two blocks (VT ``pos`` is the anchor's
    position + 1: anchors at 10 and 13; its prompt holds 10 ids). Without them its first
    block is line 68's, ``pos=16``: it drafts from position 15, although a draft model
    drafts at every step from the first output token, at position 10. The chain check
    started at the first recorded block: exit 0. Twin: the bundled log."""
    lines = LOG.read_text().splitlines(keepends=True)
    assert lines[19].startswith("[SPECTRACE] req=0 pos=11 ")
    assert lines[43].startswith("[SPECTRACE] req=0 pos=14 ")
    log, bad = tmp_path / "head.vt.log", tmp_path / "head.h5"
    log.write_text("".join(x for i, x in enumerate(lines) if i not in (19, 43)))
    assert run_inproc("import", "vt", log, "-o", bad, "--requests", REQS).returncode == 0
    code, errors = _errors("check", bad)
    assert code == 1 and list(errors) == ["capture_incomplete"]
    ev = errors["capture_incomplete"]["evidence"]
    assert ev["head_gaps"] == 1
    assert ev["first_head_gap"] == (
        "request 0: its first block drafts from position 15; its first output token is at "
        "position 10"
    )
    assert _errors("diff", REF, bad)[0] == 1
    clean = tmp_path / "clean.h5"
    assert run_inproc("import", "vt", LOG, "-o", clean, "--requests", REQS).returncode == 0
    assert _errors("check", clean) == (0, {})


# -- 9. an n-gram request's first or last block lost ------------------------------------------


@pytest.mark.parametrize("lost, req", [("first", "0"), ("last", "0"), ("last", "2")])
def test_a_block_lost_at_either_end_of_a_request_is_missing_work(tmp_path, lost, req):
    """The bundled n-gram log without request 0's first (or last) ``[SPECTRACE]`` line,
    diffed against the whole log: on identical content the same drafter drafts from the
    same anchors, and only gaps inside the chain were looked at (exit 0). Before its first
    block the engine stepped from the first output token (``len(prompt)``) without drafting
    where theirs drafted; after its last block's reach (anchor + accepted + 1: its next
    step's anchor) it did not draft where theirs did: request 2's last two blocks are at
    29 (ns=1) and 30, so without the last its reach, 30, is where theirs drafted (request
    0's last, at 26, lies past its reach 23: that loss was named before). The twin (the
    whole log against itself, both orders clean) is tests/test_verdicts.py's healthy n-gram
    pair."""
    from test_verdicts import diff_json, first_error, ngram_blocks, ngram_trace

    b = [p for r, p, _ in ngram_blocks() if r == req]
    n = len(b)
    drop = 0 if lost == "first" else n - 1
    ours = ngram_trace(tmp_path, lost, lambda r, nth: r == req and nth == drop)
    rc, doc = diff_json(ours, ngram_trace(tmp_path, "all"))
    f = first_error(rc, doc, "unverified_drafts")
    # first: named at the block after the span it skipped (its second); last: at its
    # last block left (the one before the lost one).
    want = b[1] if lost == "first" else b[n - 2]
    assert (f["side"], f["request"], f["position"]) == ("ours", req, want)
    ev = f["evidence"]
    if lost == "first":
        assert (ev["skipped_anchors"], ev["requests_stopping"]) == (1, [])
    else:
        assert (ev["skipped_anchors"], ev["requests_stopping"]) == (0, [req])


# -- 10. an n-gram replay through the cmd engine ----------------------------------------------


def test_an_ngram_replay_through_cmd_keeps_its_empty_proposals(tmp_path):
    """8 positions of each of the 5 requests, n-gram: the in-process reference engine
    proposes nothing at 10 of the 40 (no match in the prefix; first: request 0, position
    28). Through the cmd contract the same engine prints no block there, which was
    "engine left no block at 10 of 40 replayed positions" (exit 3). Now those sites are
    empty proposals, as in the reference replay, and the two replays agree. The draft
    model twin (it drafts everywhere) runs as before."""
    from spectrace.tracer.store import open_trace

    ours, theirs = tmp_path / "ng.h5", tmp_path / "ng.cmd.h5"
    r = run_inproc("replay", REF, "-o", ours, "--engine", "reference", "--vs", "cmd",
                   "--method", "ngram", "--positions", "8")  # fmt: skip
    assert r.returncode == 0, r.stderr
    for path in (ours, theirs):
        b = open_trace(path).blocks
        assert (len(b), int((b.k == 0).sum())) == (40, 10)
        assert b.position[b.k == 0][0] == 28
    twin = tmp_path / "dm.h5"
    r = run_inproc("replay", REF, "-o", twin, "--engine", "cmd", "--positions", "2")
    assert r.returncode == 0, r.stderr
