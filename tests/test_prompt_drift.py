"""Content drift (issue 11 item 3): requests whose prompts differ but share most of their
tokens are paired by similarity and named (``prompt_drift``), never compared block by block.
Expected values are derived by hand from the prompts written here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from spectrace.tracer.align import align
from spectrace.tracer.diff import diff_traces
from spectrace.tracer.similar import longest_common_run, prompt_drift
from spectrace.tracer.store import TraceWriter, open_trace

SPECTRACE = os.path.join(os.path.dirname(sys.executable), "spectrace")
K = 2
USER = list(range(100, 112))  # the user text: 12 tokens
OUTPUT = list(range(10, 18))  # 8 output tokens
# Request "chat": a template around USER. Ours 15 tokens, theirs 17.
CHAT_OURS = [5, 6] + USER + [7]
CHAT_THEIRS = [8, 9, 9, 9] + USER + [7]
# Request "sys": a shared head, another tail. Ours 21 tokens, theirs 22.
SYS_OURS = list(range(40, 60)) + [50]
SYS_THEIRS = list(range(40, 60)) + [60, 61]


def write(path, prompts: dict[str, list[int]]) -> None:
    """One request per prompt, drafts always right (k=2): blocks at every third position."""
    with TraceWriter(path, {"k": K, "engine": path.stem}, flush_interval=0) as w:
        for rid, prompt in prompts.items():
            seq = prompt + OUTPUT
            w.request(rid, prompt_ids=prompt, output_ids=OUTPUT, finish_reason="length")
            pos, step = len(prompt) - 1, 0
            while pos + 1 < len(seq):
                drafts = (seq[pos + 1 : pos + 1 + K] + [0, 0])[:K]
                acc = min(K, len(seq) - pos - 1)
                w.add_block(
                    rid,
                    step,
                    pos,
                    seq[pos],
                    drafts,
                    verified=drafts,
                    accepted=acc,
                    emitted=seq[pos + 1 : pos + 2 + acc],
                )
                pos, step = pos + acc + 1, step + 1


def run(*args):
    return subprocess.run([SPECTRACE, *args], capture_output=True, text=True)


def test_measures_by_hand():
    x, y = np.array(CHAT_OURS), np.array(CHAT_THEIRS)
    # USER + [7] (13 tokens) starts at 2 in ours, at 4 in theirs.
    assert longest_common_run(x, y) == (13, 2, 4)
    d = prompt_drift(0, 0, x, y)
    assert d is not None
    assert (d.first_difference, d.ours_len, d.theirs_len) == (0, 15, 17)
    # Tail from the end: 7, 111..100 (13 tokens), then 6 vs 9.
    assert (d.common_prefix, d.common_suffix, d.common_run) == (0, 13, 13)
    d = prompt_drift(0, 0, np.array(SYS_OURS), np.array(SYS_THEIRS))
    assert d is not None
    assert (d.first_difference, d.common_prefix, d.common_suffix, d.common_run) == (20, 20, 0, 20)
    assert (d.run_ours, d.run_theirs) == (0, 0)
    # A prefix: ours [40..59], theirs one token longer: differs at 20 (ours ends).
    d = prompt_drift(0, 0, np.array(SYS_OURS[:20]), np.array(SYS_THEIRS[:21]))
    assert d is not None and (d.first_difference, d.common_prefix, d.common_suffix) == (20, 20, 0)
    # Equal prompts and prompts sharing 7 tokens (< 8) are not drift.
    assert prompt_drift(0, 0, x, x) is None
    assert prompt_drift(0, 0, np.array(USER[:7] + [1]), np.array(USER[:7] + [2])) is None
    # 8 common tokens of 20: below half the shorter prompt.
    short = USER[:8]
    assert prompt_drift(0, 0, np.array(short + [1] * 12), np.array(short + [2] * 12)) is None


def test_drifted_prompts_are_named(tmp_path):
    write(tmp_path / "a.h5", {"chat": CHAT_OURS, "sys": SYS_OURS, "other": [1, 2, 3]})
    write(tmp_path / "b.h5", {"chat": CHAT_THEIRS, "sys": SYS_THEIRS, "x": [4, 5, 6]})
    al = align(open_trace(tmp_path / "a.h5"), open_trace(tmp_path / "b.h5"))
    assert al.pairs == 0
    assert [(d.req_a, d.req_b) for d in al.drift] == [(0, 0), (1, 1)]
    assert al.unmatched_a.tolist() == [2] and al.unmatched_b.tolist() == [2]
    r = diff_traces(al)
    assert r.diverged
    f = r.findings[0]
    assert (f.kind, f.severity, f.request, f.position) == ("prompt_drift", "error", "chat", 0)
    ev = f.evidence
    assert ev["requests"] == 2
    assert ev["first"] == {
        "ours_request": "chat",
        "theirs_request": "chat",
        "first_difference": 0,
        "ours_len": 15,
        "theirs_len": 17,
        "common_prefix": 0,
        "common_suffix": 13,
        "common_run": 13,
        "run_ours": 2,
        "run_theirs": 4,
    }
    assert (ev["ours_before"], ev["ours_after"]) == ([5, 6], [])
    assert (ev["theirs_before"], ev["theirs_after"]) == ([8, 9, 9, 9], [])
    assert ev["pairs"][1]["first_difference"] == 20
    assert r.reasons == [
        "1 error finding, first: prompt_drift",
        "no request of ours matches one of theirs exactly; 2 pairs of similar prompts differ "
        "(prompt_drift): their drafts are not compared, the contexts differ",
    ]
    assert r.agreement.paired_blocks == 0
    # No "absent" request: the drifted ones are present, with another prompt.
    assert not [x for x in r.findings if x.kind == "requests_incomplete"]


def test_drift_cli_exit_and_schema(tmp_path):
    import jsonschema

    write(tmp_path / "a.h5", {"chat": CHAT_OURS})
    write(tmp_path / "b.h5", {"chat": CHAT_THEIRS})
    out = run("diff", str(tmp_path / "a.h5"), str(tmp_path / "b.h5"))
    assert out.returncode == 1, out.stderr
    assert "prompt_drift" in out.stdout
    text = " ".join(out.stdout.split())  # rich wraps long lines
    assert (
        "1 request pair shares most of the prompt but not all of it (first: ours chat vs "
        "theirs chat: the prompts differ from token 0; 15 vs 17 tokens, common prefix 0, "
        "suffix 13, a common run of 13 (87% of the shorter) at ours 2 / theirs 4): a chat "
        "template, system prompt or truncation differs; their drafts are not compared (the "
        "contexts differ)"
    ) in text
    assert "1 paired by similar prompts (prompt_drift, not compared)" in out.stdout
    js = run("diff", "--format", "json", str(tmp_path / "a.h5"), str(tmp_path / "b.h5"))
    assert js.returncode == 1
    doc = json.loads(js.stdout)
    schema = json.loads(run("schema", "--diff").stdout)
    jsonschema.validate(doc, schema)
    assert doc["findings"][0]["kind"] == "prompt_drift"


def test_drift_decoded_with_a_tokenizer(tmp_path):
    write(tmp_path / "a.h5", {"chat": CHAT_OURS})
    write(tmp_path / "b.h5", {"chat": CHAT_THEIRS})
    tok = os.path.join(os.path.dirname(__file__), "..", "engine", "models", "target")
    js = run(
        "diff",
        "--format",
        "json",
        "--tokenizer",
        tok,
        str(tmp_path / "a.h5"),
        str(tmp_path / "b.h5"),
    )
    f = json.loads(js.stdout)["findings"][0]
    assert "; decoded: ours '" in f["message"] and "' + common + '" in f["message"]
    assert [x.split(":")[0] for x in f["evidence"]["theirs_before"]] == ["8", "9", "9", "9"]


def test_clean_twin_same_prompts(tmp_path):
    prompts = {"chat": CHAT_OURS, "sys": SYS_OURS}
    write(tmp_path / "a.h5", prompts)
    write(tmp_path / "b.h5", prompts)
    al = align(open_trace(tmp_path / "a.h5"), open_trace(tmp_path / "b.h5"))
    assert al.drift == [] and al.pairs == 2
    r = diff_traces(al)
    assert not r.diverged and not r.findings
    out = run("diff", str(tmp_path / "a.h5"), str(tmp_path / "b.h5"))
    assert out.returncode == 0 and "prompt_drift" not in out.stdout


def test_unrelated_prompts_stay_different_jobs(tmp_path):
    # 7 shared tokens (below DRIFT_MIN_TOKENS = 8): not drift, the old verdict stands.
    write(tmp_path / "a.h5", {"r": USER[:7] + [1, 1]})
    write(tmp_path / "b.h5", {"r": USER[:7] + [2, 2]})
    r = diff_traces(align(open_trace(tmp_path / "a.h5"), open_trace(tmp_path / "b.h5")))
    assert r.reasons == [
        "no request of ours matches one of theirs (compare the prompts): the traces are of "
        "different jobs"
    ]
    assert not r.findings


def test_shared_system_prompt_pairs_by_the_user_text():
    # 40 requests: one 30-token system prompt, then a 12-token user text of its own. Theirs
    # wraps each in a 3-token chat template and lists them in reverse: each pairs with its
    # own user text (the shared system prompt's 8-grams are in every prompt: ignored).
    from spectrace.tracer.similar import match_drift

    system = list(range(500, 530))
    users = [[1000 + 12 * r + t for t in range(12)] for r in range(40)]
    ours = [np.array(system + u) for u in users]
    theirs = [np.array([7, 7] + system + u + [9]) for u in reversed(users)]
    got = match_drift(ours, theirs, np.arange(40), np.arange(40))
    assert [(d.req_a, d.req_b) for d in got] == [(r, 39 - r) for r in range(40)]
    d = got[0]
    # ours 42 tokens, theirs 45; all of ours is inside theirs from token 2 on.
    assert (d.ours_len, d.theirs_len, d.common_run, d.run_ours, d.run_theirs) == (42, 45, 42, 0, 2)
    assert (d.first_difference, d.common_prefix, d.common_suffix) == (0, 0, 0)


def test_duplicate_prompts_pair_up_in_order():
    # 20 samples of one prompt on each side (best-of-n), theirs under a template: 20 pairs,
    # in order, though the prompt's 8-grams are in 20 requests (one distinct prompt).
    from spectrace.tracer.similar import match_drift

    ours = [np.array(USER)] * 20
    theirs = [np.array([5] + USER + [6])] * 20
    got = match_drift(ours, theirs, np.arange(20), np.arange(20))
    assert [(d.req_a, d.req_b) for d in got] == [(r, r) for r in range(20)]
    assert (got[0].common_run, got[0].run_ours, got[0].run_theirs) == (12, 0, 1)
