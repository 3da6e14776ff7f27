"""Verdicts on missing work and impossible values (issue 11, items 1, 4 and 5).

Every bug-shaped case has a clean twin that exits 0 with no error finding. The cases are
built here: traces written with TraceWriter from hand-derived blocks, hand-written
VT_SPEC_TRACE logs in our engine's format (tests/data_verdicts/) and the bundled n-gram log
with lines removed. Expected kinds, first locations and evidence numbers are derived by hand
(or, for the n-gram log, by this file's own regex over the raw lines), never by the detectors.

The perfect k=2 drafter over prompt [1, 2, 3] and 12 output tokens (full length 15) drafts
from anchor positions 2, 5, 8, 11, accepting both drafts each time (3 tokens per block).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from spectrace.hooks.vt.importer import import_log
from spectrace.hooks.vt.requests import read_requests
from spectrace.tracer.store import TraceWriter, open_trace
from spectrace.tracer.testing.assertions import drafts_match_report

SPECTRACE = os.path.join(os.path.dirname(sys.executable), "spectrace")
HERE = Path(__file__).resolve().parent
DATA = HERE / "data_verdicts"
NGRAM_LOG = HERE / "hooks" / "data" / "engine_ngram.log"
NGRAM_REQ = HERE / "hooks" / "data" / "engine_ngram.requests.jsonl"
K = 2
PROMPTS = {"a": [1, 2, 3], "b": [4, 5, 6], "c": [7, 8, 9]}
OUTPUTS = {"a": list(range(100, 112)), "b": list(range(200, 212)), "c": list(range(300, 312))}


# ------------------------------------------------------------------------------ builders


def write_trace(path, requests, blocks, meta=None):
    """requests: {id: (output, finish)}; blocks: [(id, position, proposed, verified,
    accepted)] (emitted = the verified prefix + the next token of the sequence)."""
    with TraceWriter(path, meta={"engine": "test", "k": K, **(meta or {})}) as w:
        for rid, (out, fin) in requests.items():
            w.request(rid, prompt_ids=PROMPTS[rid], output_ids=out, finish_reason=fin)
        for step, (rid, pos, prop, ver, acc) in enumerate(blocks):
            seq = PROMPTS[rid] + OUTPUTS[rid]
            w.add_block(
                rid,
                step,
                pos,
                seq[pos] if pos < len(seq) else -1,
                prop,
                verified=ver,
                accepted=acc,
                emitted=seq[pos + 1 : pos + 2 + max(acc, 0)],
            )
    return path


def perfect_blocks(rid, positions=(2, 5, 8, 11)):
    """The perfect drafter's blocks of ``rid`` (both drafts verified and accepted)."""
    seq = PROMPTS[rid] + OUTPUTS[rid]
    return [(rid, p, seq[p + 1 : p + 3], seq[p + 1 : p + 3], 2) for p in positions]


def complete():
    return {r: (OUTPUTS[r], "length") for r in PROMPTS}


def clean_trace(path, meta=None):
    blocks = [b for r in PROMPTS for b in perfect_blocks(r)]
    return write_trace(path, complete(), blocks, {"exit_status": 0, **(meta or {})})


def run(*args):
    return subprocess.run([SPECTRACE, *args], capture_output=True, text=True)


def diff_json(ours, theirs):
    r = run("diff", str(ours), str(theirs), "--format", "json")
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    _valid(doc)
    return r.returncode, doc


def check_json(path):
    r = run("check", str(path), "--format", "json")
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def _valid(doc):
    """The diff document validates against the generated schema; no rate leaves [0, 1]
    unless an impossible_values error finding explains it."""
    jsonschema = pytest.importorskip("jsonschema")
    from spectrace.tracer.diff_schema import SCHEMA

    jsonschema.validate(doc, SCHEMA)
    for side in ("ours", "theirs"):
        for content in doc["acceptance"][side].values():
            for fig in content.values():
                for x in [fig["acceptance_rate"], *fig["per_position"]]:
                    assert x is None or 0 <= x <= 1


def errors(doc):
    return [f for f in doc["findings"] if f["severity"] == "error"]


def assert_clean(rc, doc):
    assert rc == 0 and not errors(doc), [(f["kind"], f["message"]) for f in doc["findings"]]


def first_error(rc, doc, kind):
    errs = errors(doc)
    assert rc == 1 and errs, doc["findings"]
    assert errs[0]["kind"] == kind, [(f["kind"], f["message"]) for f in errs]
    return errs[0]


# ----------------------------------------------------------------------- killed engine


@pytest.fixture
def clean(tmp_path):
    return clean_trace(tmp_path / "clean.h5")


def killed(path, meta):
    """The engine died: a completes, b aborted with no output, c aborted after 5 tokens
    (one block, at position 2)."""
    reqs = {"a": (OUTPUTS["a"], "length"), "b": ([], "abort"), "c": (OUTPUTS["c"][:5], "abort")}
    return write_trace(path, reqs, perfect_blocks("a") + perfect_blocks("c", (2,)), meta)


def _checks(status, mismatch):
    """/meta ``checks`` as the vLLM capture writes it (hooks/vllm/crosscheck.cross_check)."""
    totals = {"num_drafts": 12, "num_draft_tokens": 24, "num_accepted_tokens": 24}
    theirs = {**totals, "num_drafts": 13, "num_draft_tokens": 26} if mismatch else totals
    return {"checks": {"status": status, "trace": totals, "vllm": theirs, "mismatch": mismatch}}


def test_trace_that_disagrees_with_the_engines_counters_is_incomplete(tmp_path, clean):
    # vLLM counted 13 drafts, the file holds 12: a block was lost between the engine and disk.
    lost = clean_trace(
        tmp_path / "lost.h5", _checks("mismatch", ["num_drafts", "num_draft_tokens"])
    )
    rc, doc = check_json(lost)
    f = first_error(rc, doc, "capture_incomplete")
    assert f["evidence"]["counters_mismatch"] == ["num_drafts", "num_draft_tokens"]
    assert "engine's own counters (num_drafts, num_draft_tokens)" in f["message"]
    rc, doc = diff_json(clean, lost)
    assert first_error(rc, doc, "capture_incomplete")["side"] == "theirs"
    # Clean twin: the same trace whose counters agree, and one where none reached the writer.
    for i, twin in enumerate((_checks("ok", []), {"checks": {"status": "unavailable"}})):
        ok = clean_trace(tmp_path / f"ok{i}.h5", twin)
        assert_clean(*check_json(ok))
        assert_clean(*diff_json(clean, ok))


def test_capture_that_recorded_nothing_is_incomplete(tmp_path, clean):
    # A real capture of a command that prints no trace line: 0 blocks, 0 requests.
    out = tmp_path / "empty.h5"
    r = run("capture", "-o", str(out), "--", sys.executable, "-c", "print('hi')")
    assert r.returncode == 0 and "no [SPECTRACE] verify lines" in r.stderr
    rc, doc = check_json(out)
    f = first_error(rc, doc, "capture_incomplete")
    assert f["evidence"]["empty"] is True and f["evidence"]["ended"] == "clean"
    assert "recorded nothing" in f["message"]
    rc, doc = diff_json(out, clean)
    assert first_error(rc, doc, "capture_incomplete")["side"] == "ours"
    # Clean twin: a run without speculative decoding records its requests, not blocks.
    meta = {"capture": {"ended": "clean"}, "k": 0}
    vanilla = write_trace(tmp_path / "vanilla.h5", complete(), [], meta)
    rc, doc = check_json(vanilla)
    assert "capture_incomplete" not in [f["kind"] for f in doc["findings"]]


OLD_META = {"exit_status": 137, "killed_by_signal": 9, "interrupted": False}
NEW_META = {"capture": {"ended": "engine-signal", "exit_status": 137, "signal": 9}}


@pytest.mark.parametrize("meta", [OLD_META, NEW_META], ids=["exit_meta", "capture_object"])
def test_killed_engine_is_named_in_diff_check_and_assertion(tmp_path, clean, meta):
    bad = killed(tmp_path / "killed.h5", meta)
    rc, doc = diff_json(bad, clean)
    f = first_error(rc, doc, "capture_incomplete")
    assert f["side"] == "ours"
    assert (f["evidence"]["exit_status"], f["evidence"]["signal"]) == (137, 9)
    assert f["evidence"]["ended"] == "engine-signal"  # older writers' items read the same
    assert "signal 9" in f["message"]
    r = errors(doc)[1]  # then the requests: b (row 1) first, at its end of work 3 + 0
    assert r["kind"] == "requests_incomplete"
    assert (r["request"], r["position"]) == ("b", 3)
    ev = r["evidence"]
    assert (ev["aborted"], ev["empty_output"], ev["cut_short"], ev["requests"]) == (
        ["b", "c"],
        ["b"],
        [],
        2,
    )
    assert ev["first"] == {
        "request": "b",
        "finish_reason": "abort",
        "output_tokens": 0,
        "other_finish_reason": "length",
        "other_output_tokens": 12,
    }
    assert not doc["reasons"][0].startswith("no divergence")
    # Reversed: the clean trace is ours, the finding is on theirs.
    rc, doc = diff_json(clean, bad)
    assert first_error(rc, doc, "capture_incomplete")["side"] == "theirs"
    # check: single-trace evidence suffices (the exit status and the aborted requests).
    rc, doc = check_json(bad)
    assert [f["kind"] for f in errors(doc)] == ["capture_incomplete", "requests_incomplete"]
    assert errors(doc)[1]["evidence"]["aborted"] == ["b", "c"]
    # The pytest assertion fails and names it.
    msg = drafts_match_report(str(bad), str(clean))
    assert msg is not None and "first error finding: capture_incomplete" in msg


def test_clean_twins_of_the_killed_engine(tmp_path, clean):
    other = clean_trace(tmp_path / "other.h5", {"capture": {"ended": "clean", "exit_status": 0}})
    assert_clean(*diff_json(clean, other))
    assert_clean(*check_json(clean))
    assert_clean(*check_json(other))
    assert drafts_match_report(str(clean), str(other)) is None


def test_request_cut_short_on_one_side(tmp_path, clean):
    """c stops after 5 tokens (finish length) on ours while theirs generates 12: its work
    after position 3 + 5 is missing. A single trace cannot tell (check exits 0)."""
    reqs = {**complete(), "c": (OUTPUTS["c"][:5], "length")}
    blocks = perfect_blocks("a") + perfect_blocks("b") + perfect_blocks("c", (2,))
    short = write_trace(tmp_path / "short.h5", reqs, blocks, {"exit_status": 0})
    rc, doc = diff_json(short, clean)
    f = first_error(rc, doc, "requests_incomplete")
    assert (f["side"], f["request"], f["position"]) == ("ours", "c", 8)
    assert (f["evidence"]["cut_short"], f["evidence"]["aborted"]) == (["c"], [])
    assert f["evidence"]["first"]["output_tokens"] == 5
    assert f["evidence"]["first"]["other_output_tokens"] == 12
    assert_clean(*check_json(short))


def test_request_missing_on_one_side(tmp_path, clean):
    reqs = {r: v for r, v in complete().items() if r != "b"}
    fewer = write_trace(
        tmp_path / "fewer.h5", reqs, perfect_blocks("a") + perfect_blocks("c"), {"exit_status": 0}
    )
    rc, doc = diff_json(fewer, clean)
    f = first_error(rc, doc, "requests_incomplete")
    # Located at the absent request, by the id the other side gives it (no position).
    assert (f["side"], f["evidence"]["missing"], f["request"]) == ("ours", ["b"], "b")
    assert f["position"] is None


# ------------------------------------------------------------- drafting: asymmetric silence


def ngram_trace(tmp_path, name, drop=lambda req, nth: False):
    """Import the bundled n-gram log, without the [SPECTRACE] lines ``drop(req, nth)``
    selects (nth: 0-based index of that request's [SPECTRACE] lines)."""
    seen: dict[str, int] = {}
    kept = []
    for line in NGRAM_LOG.read_text().splitlines():
        m = re.match(r"\[SPECTRACE\] req=(\S+) pos=(\d+)", line)
        if m:
            nth = seen.get(m.group(1), 0)
            seen[m.group(1)] = nth + 1
            if drop(m.group(1), nth):
                continue
        kept.append(line)
    log = tmp_path / f"{name}.log"
    log.write_text("\n".join(kept) + "\n")
    out = tmp_path / f"{name}.h5"
    import_log(log, out, requests_path=NGRAM_REQ)
    return out


def ngram_blocks():
    """(req, anchor position, ns) of every [SPECTRACE] line of the bundled n-gram log."""
    pat = re.compile(r"^\[SPECTRACE\] req=(\S+) pos=(\d+) k=\d+ ns=(\d+)")
    return [
        (m.group(1), int(m.group(2)) - 1, int(m.group(3)))
        for line in NGRAM_LOG.read_text().splitlines()
        if (m := pat.match(line))
    ]


def test_two_identical_healthy_ngram_traces_are_clean(tmp_path):
    """Prompt-lookup stops proposing when matches run out (request 0 drafts last at 26 of
    34 positions): not a finding on either side, nor in check."""
    a, b = ngram_trace(tmp_path, "a"), ngram_trace(tmp_path, "b")
    assert_clean(*diff_json(a, b))
    assert_clean(*check_json(a))
    assert drafts_match_report(str(a), str(b)) is None


def test_request_whose_blocks_vanished(tmp_path):
    """Request 2's [SPECTRACE] lines removed: ours never drafts where theirs does."""
    first2 = min(p for r, p, _ in ngram_blocks() if r == "2")
    ours = ngram_trace(tmp_path, "no2", lambda req, nth: req == "2")
    theirs = ngram_trace(tmp_path, "all")
    rc, doc = diff_json(ours, theirs)
    f = first_error(rc, doc, "unverified_drafts")
    assert (f["side"], f["request"], f["position"]) == ("ours", "2", first2)
    assert f["evidence"]["requests_never_drafting"] == ["2"]
    assert f["evidence"]["requests_stopping"] == []
    assert "never draft" in f["message"]
    msg = drafts_match_report(str(ours), str(theirs))
    assert msg is not None and "first error finding: unverified_drafts" in msg


def test_request_that_stops_drafting_where_the_other_goes_on(tmp_path):
    """Request 1 keeps only its first two blocks on ours; theirs drafts on past them."""
    b1 = [(p, ns) for r, p, ns in ngram_blocks() if r == "1"]
    (p_last, ns_last), later = b1[1], b1[2:]
    assert any(p > p_last + ns_last for p, _ in later)  # the premise, from the raw log
    ours = ngram_trace(tmp_path, "stop1", lambda req, nth: req == "1" and nth >= 2)
    rc, doc = diff_json(ours, ngram_trace(tmp_path, "all"))
    f = first_error(rc, doc, "unverified_drafts")
    assert (f["side"], f["request"], f["position"]) == ("ours", "1", p_last)
    assert f["evidence"]["requests_stopping"] == ["1"]
    assert f["evidence"]["requests_never_drafting"] == []


# ------------------------------------------------------------ proposals never installed


def vt(tmp_path, name, requests_late=False):
    """Import tests/data_verdicts/NAME.log; ``requests_late`` feeds the requests file after
    the lines, as a capture does."""
    out = tmp_path / f"{name}.h5"
    req = DATA / "one_request.requests.jsonl"
    if not requests_late:
        import_log(DATA / f"{name}.log", out, requests_path=req)
        return out
    from spectrace.hooks.vt.parser import VtTraceParser
    from spectrace.hooks.vt.requests import read_requests

    with TraceWriter(out, meta={"engine": "vllm.cpp", "source": "vt_spec_trace"}) as w:
        p = VtTraceParser(w)
        for n, line in enumerate((DATA / f"{name}.log").read_text().splitlines(), 1):
            p.feed_line(line, n)
        p.set_requests(read_requests(req))
        p.finish()
    return out


@pytest.mark.parametrize(
    "log, late",
    [("never_installed", False), ("never_installed", True), ("never_scheduled", False)],
    ids=["import", "capture", "sched=0"],
)
def test_drafts_proposed_but_never_installed(tmp_path, log, late):
    """Every step proposes 2 drafts from anchors 3..11 and installs none ([spec-install]
    installed=0), or installs them and the next step schedules none ([spec-sched] sched=0):
    plain decode, 9 unverified blocks; the last one (anchor 11) is legitimately
    unverified."""
    bad, good = vt(tmp_path, log, late), vt(tmp_path, "installed")
    t = open_trace(bad)
    assert t.blocks.position.tolist() == list(range(3, 12))
    assert t.blocks.num_verified.tolist() == [-1] * 9
    assert t.blocks.proposed[0].tolist() == [101, 102]  # full[4], full[5]
    assert t.blocks.anchor.tolist() == [100 + a - 3 for a in range(3, 12)]
    rc, doc = diff_json(bad, good)
    f = first_error(rc, doc, "unverified_drafts")
    assert (f["side"], f["request"], f["position"]) == ("ours", "0", 3)
    assert f["evidence"]["unverified_blocks"] == 8
    rc, doc = check_json(bad)
    assert first_error(rc, doc, "unverified_drafts")["evidence"]["unverified_blocks"] == 8
    msg = drafts_match_report(str(bad), str(good))
    assert msg is not None and "first error finding: unverified_drafts" in msg


def test_installed_twin_is_clean(tmp_path):
    good = vt(tmp_path, "installed")
    t = open_trace(good)
    assert t.blocks.position.tolist() == [3, 6, 9]
    assert t.blocks.accepted.tolist() == [2, 2, 2]
    assert_clean(*diff_json(good, good))
    assert_clean(*check_json(good))


# ----------------------------------------------------------------------- trimmed drafts


def trimmed_trace(path):
    """Request a: proposes 2, the target verifies only the first: anchors 2, 4, ..., 12
    (each block accepts 1 and emits 2 tokens); b and c as the clean trace."""
    seq = PROMPTS["a"] + OUTPUTS["a"]
    a = [("a", p, seq[p + 1 : p + 3], seq[p + 1 : p + 2], 1) for p in range(2, 13, 2)]
    blocks = a + perfect_blocks("b") + perfect_blocks("c")
    return write_trace(path, complete(), blocks, {"exit_status": 0})


def test_drafts_trimmed_before_verification(tmp_path, clean):
    """Anchors 2, 4, 6, 8, 10 are trimmed with room for k drafts; anchor 12 (12 + 1 + 2 >=
    15) may be trimmed at the output's end and is not counted."""
    bad = trimmed_trace(tmp_path / "trimmed.h5")
    rc, doc = diff_json(bad, clean)
    f = first_error(rc, doc, "trimmed_drafts")
    assert (f["side"], f["request"], f["position"], f["slot"]) == ("ours", "a", 2, 1)
    ev = f["evidence"]
    assert (ev["blocks"], ev["verified_blocks"]) == (5, 6 + 4 + 4)
    assert (ev["proposed_tokens"], ev["verified_tokens"]) == (10, 5)
    assert (ev["first_k"], ev["first_num_verified"]) == (2, 1)
    assert doc["agreement"]["exact_matches"] == doc["agreement"]["paired_blocks"]  # 2, 8 agree
    rc, doc = check_json(bad)
    assert first_error(rc, doc, "trimmed_drafts")["evidence"]["blocks"] == 5
    msg = drafts_match_report(str(bad), str(clean))
    assert msg is not None and "first error finding: trimmed_drafts" in msg


def test_vt_log_whose_scheduler_trims_the_drafts(tmp_path):
    """trimmed.log: [spec-propose] 2 drafts per step, [spec-sched] have=2 -> sched=1, the
    [SPECTRACE] verifies 1 (acc=1, ns=2): anchors 3, 5, 7, 9, 11. Anchors 3..9 have room for
    k drafts (9 + 1 + 2 < 13); anchor 11 does not. Against installed.log (anchors 3, 6, 9)
    the paired blocks 3 and 9 agree on every verified slot."""
    bad, good = vt(tmp_path, "trimmed"), vt(tmp_path, "installed")
    t = open_trace(bad)
    assert t.blocks.position.tolist() == [3, 5, 7, 9, 11]
    assert t.blocks.k.tolist() == [2] * 5 and t.blocks.num_verified.tolist() == [1] * 5
    rc, doc = diff_json(bad, good)
    f = first_error(rc, doc, "trimmed_drafts")
    assert (f["side"], f["request"], f["position"], f["slot"]) == ("ours", "0", 3, 1)
    ev = f["evidence"]
    assert (ev["blocks"], ev["verified_blocks"], ev["proposed_tokens"]) == (4, 5, 8)
    assert ev["verified_tokens"] == 4
    assert [e["kind"] for e in errors(doc)] == ["trimmed_drafts"]
    assert (doc["agreement"]["paired_blocks"], doc["agreement"]["exact_matches"]) == (2, 2)
    assert first_error(*check_json(bad), "trimmed_drafts")["evidence"]["blocks"] == 4


# ---------------------------------------------------------------------- impossible values


def test_accepted_above_k(tmp_path, clean):
    """Block row 1 (request a, anchor 5) records accepted=3 with k=2 (2 verified)."""
    blocks = [b for r in PROMPTS for b in perfect_blocks(r)]
    blocks[1] = ("a", 5, blocks[1][2], blocks[1][3], 3)
    bad = write_trace(tmp_path / "acc.h5", complete(), blocks, {"exit_status": 0})
    rc, doc = diff_json(bad, clean)
    f = first_error(rc, doc, "impossible_values")
    assert (f["side"], f["request"], f["position"]) == ("ours", "a", 5)
    ev = f["evidence"]
    assert (ev["rule"], ev["column"], ev["value"], ev["limit"], ev["row"]) == (
        "accepted > k",
        "accepted",
        3,
        2,
        1,
    )
    # It also emitted 3 + 1 = 4 tokens, more than k + 1 = 3.
    assert ev["rules"] == {
        "accepted > k": 1,
        "accepted > num_verified": 1,
        "num_emitted > k + 1": 1,
    }
    # The diff's figures leave the block out: 11 blocks, 22 of 22 accepted, 100%.
    rec = doc["acceptance"]["ours"]["all_content"]["recorded"]
    assert (rec["blocks"], rec["accepted_tokens"], rec["acceptance_rate"]) == (11, 22, 1.0)
    rc, doc = check_json(bad)
    assert first_error(rc, doc, "impossible_values")["evidence"]["row"] == 1


@pytest.mark.parametrize(
    "row, block, rule, position",
    [
        (2, ("a", 8, None, None, 30000), "accepted > k", 8),
        (3, ("a", 11, None, None, -5), "accepted < -1", 11),
        (0, ("a", 40, None, None, 0), "position outside the sequence", 40),
    ],
)
def test_other_impossible_values(tmp_path, clean, row, block, rule, position):
    blocks = [b for r in PROMPTS for b in perfect_blocks(r)]
    rid, pos, _, _, acc = block
    blocks[row] = (rid, pos, blocks[row][2], blocks[row][3], acc)
    bad = write_trace(tmp_path / "bad.h5", complete(), blocks, {"exit_status": 0})
    rc, doc = diff_json(bad, clean)
    f = first_error(rc, doc, "impossible_values")
    assert (f["evidence"]["rule"], f["evidence"]["row"], f["position"]) == (rule, row, position)
    assert_clean(*diff_json(clean, clean))


# ---------------------------------------------------------------------- vanilla baselines


def test_spec_against_vanilla_with_identical_text_passes(tmp_path, clean):
    # k 0: what a vanilla run records (the vLLM hook without a speculative config; a VT
    # import of a log without drafts); an unknown method with k >= 1 is a speculative run.
    vanilla = write_trace(tmp_path / "vanilla.h5", complete(), [], {"exit_status": 0, "k": 0})
    rc, doc = diff_json(clean, vanilla)
    assert_clean(rc, doc)
    assert doc["diverged"] is False and doc["reasons"] == []
    f = doc["findings"][0]
    assert (f["kind"], f["severity"], f["side"]) == ("content_only", "info", "theirs")
    assert f["evidence"] == {"without_drafts": ["theirs"], "requests": 3, "identical": 3}
    text = run("diff", str(clean), str(vanilla))
    assert text.returncode == 0 and "no draft comparison was possible" in text.stdout
    # The verdict line itself says what was compared: content, not drafts.
    assert "no divergence in content (no drafts on one side: no draft comparison)" in text.stdout
    assert "no divergence on comparable blocks" not in text.stdout
    assert drafts_match_report(str(clean), str(vanilla)) is None
    rc, doc = diff_json(vanilla, clean)
    assert_clean(rc, doc)
    assert doc["findings"][0]["evidence"]["without_drafts"] == ["ours"]


def test_two_vanilla_runs_say_neither_side_drafted(tmp_path):
    a = write_trace(tmp_path / "a.h5", complete(), [], {"exit_status": 0, "k": 0})
    b = write_trace(tmp_path / "b.h5", complete(), [], {"exit_status": 0, "k": 0})
    rc, doc = diff_json(a, b)
    assert_clean(rc, doc)
    f = doc["findings"][0]
    assert (f["kind"], f["side"]) == ("content_only", "both")
    text = run("diff", str(a), str(b))
    assert text.returncode == 0
    assert "no divergence in content (no drafts on either side: no draft comparison)" in text.stdout
    assert "on one side" not in text.stdout


def test_spec_against_vanilla_with_other_text_diverges(tmp_path, clean):
    """c's output token 4 (position 3 + 4 = 7) differs on the vanilla side."""
    out = list(OUTPUTS["c"])
    out[4] = 999
    vanilla = write_trace(
        tmp_path / "vanilla.h5",
        {**complete(), "c": (out, "length")},
        [],
        {"exit_status": 0, "k": 0},
    )
    rc, doc = diff_json(clean, vanilla)
    f = first_error(rc, doc, "content_divergence")
    assert (f["request"], f["position"]) == ("c", 7)
    assert (f["evidence"]["ours_token"], f["evidence"]["theirs_token"]) == ([304], [999])
    assert "drafts do not match" in drafts_match_report(str(clean), str(vanilla))


# ------------------------------------------------------------ the reference engine, live


def capture_engine(tmp_path, name, wrap=()):
    """``spectrace capture vt`` around ``python -m spectrace.engine --method ngram``
    (optionally wrapped, e.g. in ``timeout``)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    req = tmp_path / f"{name}.requests.jsonl"
    out = tmp_path / f"{name}.h5"
    engine = [sys.executable, "-m", "spectrace.engine", "--method", "ngram", "--k", "4"]
    engine += ["--max-tokens", "64", "--requests-out", str(req), "--threads", "1"]
    r = run("capture", "vt", "-o", str(out), "--requests", str(req), "--", *wrap, *engine)
    return out, r


def test_live_ngram_run_is_clean_and_a_killed_one_is_not(tmp_path):
    """One healthy n-gram run (prompt-lookup stops proposing when matches run out) is clean
    against itself, in check and against a vanilla baseline of its outputs; the same run killed by SIGKILL after 2 s (the capture sees
    signal 9, whatever it had recorded by then) is named first in diff and check."""
    good, r = capture_engine(tmp_path, "ngram")
    assert r.returncode == 0, r.stderr[-2000:]
    assert_clean(*diff_json(good, good))
    assert_clean(*check_json(good))
    # A vanilla baseline of the same prompts: the run's outputs alone (its requests file,
    # written as a trace without blocks), as a non-speculative run would give them.
    vanilla = tmp_path / "vanilla.h5"
    with TraceWriter(vanilla, {"engine": "vanilla", "method": None}) as w:
        for r in read_requests(tmp_path / "ngram.requests.jsonl").values():
            w.request(r.req_id, r.prompt_ids, r.output_ids, r.finish_reason)
    rc, doc = diff_json(good, vanilla)
    assert_clean(rc, doc)
    assert [f["evidence"] for f in doc["findings"] if f["kind"] == "content_only"] == [
        {"without_drafts": ["theirs"], "requests": 5, "identical": 5}
    ]
    assert drafts_match_report(str(good), str(vanilla)) is None
    bad, r = capture_engine(tmp_path, "killed", ("timeout", "-s", "KILL", "2"))
    assert r.returncode == 137, r.stderr[-2000:]
    rc, doc = diff_json(bad, good)
    f = first_error(rc, doc, "capture_incomplete")
    assert (f["side"], f["evidence"]["signal"], f["evidence"]["exit_status"]) == ("ours", 9, 137)
    rc, doc = check_json(bad)
    assert first_error(rc, doc, "capture_incomplete")["evidence"]["signal"] == 9
    msg = drafts_match_report(str(bad), str(good))
    assert msg is not None and "first error finding: capture_incomplete" in msg
