"""The fixture's powers on the CLI: ``diff``/``check`` --request, --positions, --min-agreement,
--max-errors, --ignore (one gate, tracer/gate.py, also behind spectrace_assert_drafts_match),
--by-request, --examples 0, and ``diff GOLDEN RUN RUN...``.

The pair, built by hand (k=3, greedy, prompt + 20 output tokens 10..29, so positions 0..22):

* request ``a`` (theirs ``A``, prompt [1, 2, 3]): both sides draft the truth, accept 3 per
  block: anchors 2, 6, 10, 14, 18 on both sides -> 5 paired blocks, 5 agree.
* request ``b`` (theirs ``B``, prompt [4, 5, 6]): ours gets slot 2 wrong (999) and accepts 2
  per block: anchors 2, 5, 8, 11, 14, 17, 20; theirs accepts 3: anchors 2, 6, 10, 14, 18.
  They pair at 2 and 14 -> 2 paired blocks, both differing at slot 2.

So 7 paired blocks, 5 agree (71.4%). Acceptance (recorded, accepted / verified drafts): ``a``
15/15 on both sides; ``b`` ours 7 blocks x 2 = 14 of 21 (66.7%), theirs 15/15.
"""

from __future__ import annotations

import io
import json

import pytest

from spectrace.tracer.cli.main import main
from spectrace.tracer.store import TraceWriter

K = 3
OUTPUT = list(range(10, 30))


def _simulate(w, req_id, prompt, wrong_slot2):
    seq = prompt + OUTPUT
    w.request(req_id, prompt_ids=prompt, output_ids=OUTPUT, finish_reason="length")
    pos = len(prompt) - 1
    while pos + 1 < len(seq):
        d = [seq[pos + 1 + j] if pos + 1 + j < len(seq) else 0 for j in range(K)]
        if wrong_slot2:
            d[2] = 999
        acc = 0
        while acc < K and pos + 1 + acc < len(seq) and d[acc] == seq[pos + 1 + acc]:
            acc += 1
        w.add_block(req_id, 0, pos, seq[pos], d, verified=d, accepted=acc,
                    emitted=seq[pos + 1 : pos + 2 + acc])  # fmt: skip
        pos += acc + 1


def _trace(path, ids, wrong_b):
    with TraceWriter(path, {"k": K}, flush_interval=0) as w:
        _simulate(w, ids[0], [1, 2, 3], False)
        _simulate(w, ids[1], [4, 5, 6], wrong_b)
    return str(path)


@pytest.fixture
def pair(tmp_path):
    return _trace(tmp_path / "ours.h5", "ab", True), _trace(tmp_path / "theirs.h5", "AB", False)


def run_cli(capsys, *argv):
    """``spectrace ARGV`` in-process: (exit status, stdout, stderr)."""
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return e.value.code, out, err


def fixture_problems(check, ours, theirs, **kw) -> list[str]:
    """The fixture's verdict: [] when it passes, else the problems of its first line."""
    try:
        check(ours, theirs, **kw)
    except pytest.fail.Exception as exc:
        first = str(exc).splitlines()[0]
        return first.removeprefix("spectrace: drafts do not match: ").split("; ")
    return []


NOT_ALL = "drafts match in 5 of 7 paired blocks (71.4%), required 100.0%"
#: The pair's one error finding: draft_mismatch, at the first differing block selected.
ONE_ERROR = "1 error finding(s), at most 0 allowed"

# (CLI options, fixture arguments, paired, agreeing, the verdict's problems, where the
# draft_mismatch finding is): derived by hand from the module docstring. Positions 3:20 keep
# a's 6, 10, 14, 18 and b's 14 (differs); 3:14 keeps a's 6, 10; :3 both requests' 2.
CASES = [
    ([], {}, 7, 5, [NOT_ALL, ONE_ERROR], 2),
    (["--min-agreement", "0.7"], {"min_agreement": 0.7}, 7, 5, [ONE_ERROR], 2),
    (
        ["--min-agreement", "0.75"],
        {"min_agreement": 0.75},
        7,
        5,
        ["drafts match in 5 of 7 paired blocks (71.4%), required 75.0%", ONE_ERROR],
        2,
    ),
    (["--request", "a"], {"requests": ["a"]}, 5, 5, [], None),
    (["--request", "A"], {"requests": {"A"}}, 5, 5, [], None),
    (
        ["--request", "b", "--min-agreement", "0"],
        {"requests": ["b"], "min_agreement": 0.0},
        2,
        0,
        [ONE_ERROR],
        2,
    ),
    (
        ["--positions", "3:20", "--min-agreement", "0.8"],
        {"positions": range(3, 20), "min_agreement": 0.8},
        5,
        4,
        [ONE_ERROR],
        14,
    ),
    (["--positions", "3:14"], {"positions": slice(3, 14)}, 2, 2, [], None),
    (
        ["--positions", ":3"],
        {"positions": slice(None, 3)},
        2,
        1,
        ["drafts match in 1 of 2 paired blocks (50.0%), required 100.0%", ONE_ERROR],
        2,
    ),
]


@pytest.mark.parametrize("cli_args, kw, paired, agreeing, expect, at", CASES)
def test_cli_and_fixture_judge_alike(
    capsys, pair, spectrace_assert_drafts_match, cli_args, kw, paired, agreeing, expect, at
):
    code, out, err = run_cli(capsys, "diff", *pair, "--format", "json", *cli_args)
    doc = json.loads(out)
    problems = fixture_problems(spectrace_assert_drafts_match, *pair, **kw)
    assert code == (1 if problems else 0), err
    assert doc["diverged"] == bool(problems)
    if cli_args:  # a gate was given: the document says what it judged
        g = doc["gate"]
        assert (g["paired_blocks"], g["agreeing_blocks"]) == (paired, agreeing)
        assert g["problems"] == problems == doc["reasons"]
        assert g["passed"] == (not problems)
    else:  # no option: the document is today's, the gate agrees with diverged
        assert "gate" not in doc and "by_request" not in doc
        assert doc["agreement"]["paired_blocks"] == paired
        assert doc["agreement"]["exact_matches"] == agreeing
    assert problems == expect
    found = [(f["kind"], f["request"], f["position"]) for f in doc["findings"]]
    assert found == ([] if at is None else [("draft_mismatch", "b", at)])


def test_errors_counted_and_ignored_alike(capsys, pair, spectrace_assert_drafts_match):
    """Every error finding of the pair counts once on both; ignoring all of their kinds and
    tolerating 71.4% passes both; tolerating them with --max-errors passes both too."""
    _, out, _ = run_cli(capsys, "diff", *pair, "--format", "json", "--min-agreement", "0.7")
    doc = json.loads(out)
    kinds = sorted({f["kind"] for f in doc["findings"] if f["severity"] == "error"})
    n = sum(f["severity"] == "error" for f in doc["findings"])
    assert doc["gate"]["errors_counted"] == n
    ignore = [x for k in kinds for x in ("--ignore", k)]
    for cli_args, kw in (
        (ignore, {"ignore": set(kinds)}),
        (["--max-errors", str(n)], {"max_error_findings": n}),
    ):
        code, _, _ = run_cli(capsys, "diff", *pair, "--min-agreement", "0.7", *cli_args)
        assert code == 0
        assert fixture_problems(spectrace_assert_drafts_match, *pair, min_agreement=0.7, **kw) == []
    if n:
        code, _, _ = run_cli(capsys, "diff", *pair, "--min-agreement", "0.7", "--max-errors",
                             str(n - 1))  # fmt: skip
        assert code == 1
        problems = fixture_problems(
            spectrace_assert_drafts_match, *pair, min_agreement=0.7, max_error_findings=n - 1
        )
        assert problems == [f"{n} error finding(s), at most {n - 1} allowed"]


@pytest.mark.parametrize(
    "cli_args, kw, option",
    [
        (["--min-agreement", "1.5"], {"min_agreement": 1.5}, "--min-agreement"),
        (["--min-agreement", "-0.1"], {"min_agreement": -0.1}, "--min-agreement"),
        (["--max-errors", "-1"], {"max_error_findings": -1}, "--max-errors"),
        (["--ignore", "no_such_kind"], {"ignore": ["no_such_kind"]}, "--ignore"),
        (["--positions", "9:3"], {"positions": slice(None, None, 2)}, "--positions"),
        (["--positions", "x"], {"positions": ["x"]}, "--positions"),
    ],
)
def test_bad_thresholds_are_usage_errors(
    capsys, pair, spectrace_assert_drafts_match, cli_args, kw, option
):
    code, out, err = run_cli(capsys, "diff", *pair, *cli_args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and option in err, err
    with pytest.raises(ValueError):
        spectrace_assert_drafts_match(*pair, **kw)


def test_check_has_the_same_error_threshold(capsys, tmp_path):
    """One impossible block (accepted 5 with k=3, request r1 at position 4): check exits 1;
    --max-errors 1, --ignore impossible_values or --request r0 (the finding is in r1) pass;
    --positions 4:5 keeps it."""
    path = tmp_path / "bad.h5"
    with TraceWriter(path, {"k": K}, flush_interval=0) as w:
        w.request("r0", prompt_ids=[1, 2, 3], output_ids=[10, 11], finish_reason="length")
        w.request("r1", prompt_ids=[4, 5, 6], output_ids=[10, 11], finish_reason="length")
        w.add_block("r0", 0, 2, 3, [10, 11, 0], verified=[10, 11, 0], accepted=1,
                    emitted=[10, 11])  # fmt: skip
        w.add_block("r1", 0, 4, 11, [7, 7, 7], verified=[7, 7, 7], accepted=5, emitted=[7])
    code, out, _ = run_cli(capsys, "check", path, "--format", "json")
    doc = json.loads(out)
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    assert code == 1 and "gate" not in doc
    imp = [f for f in errors if f["kind"] == "impossible_values"]
    assert imp and imp[0]["request"] == "r1" and imp[0]["position"] == 4
    kinds = sorted({f["kind"] for f in errors})
    assert run_cli(capsys, "check", path, "--max-errors", str(len(errors)))[0] == 0
    ignore = [x for k in kinds for x in ("--ignore", k)]
    assert run_cli(capsys, "check", path, *ignore)[0] == 0
    code, out, _ = run_cli(capsys, "check", path, "--format", "json", "--positions", "4:5")
    assert code == 1 and json.loads(out)["gate"]["passed"] is False
    code, out, _ = run_cli(capsys, "check", path, "--format", "json", "--request", "r0")
    r0 = json.loads(out)
    assert all(f["request"] in (None, "r0") for f in r0["findings"])
    assert code == (1 if any(f["severity"] == "error" for f in r0["findings"]) else 0)


def test_by_request_rows_by_hand(capsys, pair, tmp_path):
    from tokenizers import Tokenizer, models

    tok = tmp_path / "tokenizer.json"  # token i decodes to t<i>, as tests/tui/conftest.py's
    Tokenizer(models.WordLevel({f"t{i}": i for i in range(1200)}, unk_token="t0")).save(str(tok))
    code, out, _ = run_cli(capsys, "diff", *pair, "--format", "json", "--by-request",
                           "--tokenizer", tok)  # fmt: skip
    rows = json.loads(out)["by_request"]
    assert code == 1
    a, b = rows
    assert (a["ours_req"], a["theirs_req"], a["paired_blocks"], a["exact_matches"]) == (
        "a",
        "A",
        5,
        5,
    )
    assert a["first_divergent_position"] is None and a["ours"] == [] and a["first_error"] is None
    assert (a["acceptance_ours"], a["acceptance_theirs"]) == (1.0, 1.0)
    assert (b["ours_req"], b["theirs_req"], b["paired_blocks"], b["exact_matches"]) == (
        "b",
        "B",
        2,
        0,
    )
    assert b["exact_match_rate"] == 0.0 and b["content_divergence"] is None
    # b's first divergent block: position 2, ours [10, 11, 999], theirs [10, 11, 12]
    assert (b["first_divergent_position"], b["first_divergent_slot"]) == (2, 2)
    assert b["ours"] == ["10:t10", "11:t11", "999:t999"]
    assert b["theirs"] == ["10:t10", "11:t11", "12:t12"]
    assert b["acceptance_ours"] == pytest.approx(14 / 21) and b["acceptance_theirs"] == 1.0
    code, text, _ = run_cli(capsys, "diff", *pair, "--by-request", "--tokenizer", tok)
    assert "per request (matched pairs)" in text and "b / B" in text and "66.7%" in text


def test_by_request_reuses_the_diffs_comparison_and_agrees_without_it(pair, monkeypatch):
    """The table reads the diff's own comparison (no second pass over the matrices); a
    result without one (rebuilt from JSON) compares again and gives the same rows."""
    from spectrace.tracer import request_table
    from spectrace.tracer.align import align
    from spectrace.tracer.diff import diff_traces, open_pair

    al = align(*open_pair(*pair))
    r = diff_traces(al)
    assert r.paired is not None and len(r.paired.ka) == 7  # the 7 paired blocks above

    def no_second_pass(_al):
        raise AssertionError("compared twice")

    with monkeypatch.context() as m:
        m.setattr(request_table, "compare_alignment", no_second_pass)
        reused = request_table.request_rows(al, r)
    r.paired = None
    again = request_table.request_rows(al, r)
    assert reused == again
    assert [(x.paired_blocks, x.exact_matches, x.first_divergent_slot) for x in again] == [
        (5, 5, None),
        (2, 0, 2),
    ]
    assert (again[1].ours, again[1].theirs) == ([10, 11, 999], [10, 11, 12])


def test_examples_zero_lists_every_divergent_block(capsys, pair):
    one = json.loads(run_cli(capsys, "diff", *pair, "--format", "json", "--examples", "1")[1])
    every = json.loads(run_cli(capsys, "diff", *pair, "--format", "json", "--examples", "0")[1])
    assert [e["position"] for e in one["examples"]] == [2]
    assert [(e["ours_req"], e["position"]) for e in every["examples"]] == [("b", 2), ("b", 14)]
    assert [e["ours"] for e in every["examples"]] == [[10, 11, 999], [22, 23, 999]]


def test_many_runs_one_row_each(capsys, pair):
    """GOLDEN = ours; run 1 = theirs (diverges), run 2 = ours itself (12 blocks pair with
    themselves: a's 5 and b's 7)."""
    import jsonschema

    from spectrace.tracer.diff_schema import SCHEMA

    ours, theirs = pair
    code, out, _ = run_cli(capsys, "diff", ours, theirs, ours, "--format", "json")
    doc = json.loads(out)
    assert code == 1 and doc["schema"] == "spectrace.diff-runs/1" and doc["diverged"]
    jsonschema.validate(doc, SCHEMA)
    r1, r2 = doc["runs"]
    assert (r1["files"], r1["diverged"], r1["paired_blocks"], r1["exact_matches"]) == (
        [theirs],
        True,
        7,
        5,
    )
    assert (r2["files"], r2["diverged"], r2["paired_blocks"], r2["exact_matches"]) == (
        [ours],
        False,
        12,
        12,
    )
    assert r2["first_error"] is None and r2["golden_acceptance"] == r2["run_acceptance"]
    # golden on matched content: a 15/15 + b 14/21 = 29/36; theirs 30/30
    assert r1["golden_acceptance"] == pytest.approx(29 / 36) and r1["run_acceptance"] == 1.0
    assert [r["schema"] for r in doc["results"]] == ["spectrace.diff/1"] * 2
    doc["results"][0]["findings"].append({"kind": "not_a_kind"})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, SCHEMA)
    code, text, _ = run_cli(capsys, "diff", ours, theirs, ours)
    assert code == 1 and "1 of 2 runs diverge" in text
    assert sum(line.count("DIVERGED") for line in text.splitlines()) == 1
    assert run_cli(capsys, "diff", ours, ours, ours)[0] == 0
    # The gate applies to each run: 71.4% passes --min-agreement 0.7 with errors ignored
    code, out, _ = run_cli(capsys, "diff", ours, theirs, ours, "--format", "json",
                           "--min-agreement", "0.7", "--max-errors", "99")  # fmt: skip
    assert code == 0 and [r["diverged"] for r in json.loads(out)["runs"]] == [False, False]


def test_two_argument_json_keeps_its_shape_and_validates(capsys, pair):
    import jsonschema

    from spectrace.tracer.diff_schema import SCHEMA

    doc = json.loads(run_cli(capsys, "diff", *pair, "--format", "json")[1])
    assert doc["schema"] == "spectrace.diff/1"
    assert list(doc)[-1] == "conventions"  # no gate or by_request key without the options
    jsonschema.validate(doc, SCHEMA)
    gated = json.loads(
        run_cli(capsys, "diff", *pair, "--format", "json", "--by-request", "--request", "a")[1]
    )
    jsonschema.validate(gated, SCHEMA)
    assert gated["gate"]["requests"] == ["a"] and len(gated["by_request"]) == 1


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_only_on_a_tty(monkeypatch):
    from spectrace.tracer.cli.progress import enabled, progress

    monkeypatch.delenv("SPECTRACE_PROGRESS", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    pipe = io.StringIO()
    with progress(10, "work", stream=pipe) as cb:
        cb(5, 10)
    assert pipe.getvalue() == "" and not enabled(pipe)
    tty = _Tty()
    assert enabled(tty)
    with progress(10, "work", stream=tty) as cb:
        cb(10, 10)
    assert "work" in tty.getvalue()
    monkeypatch.setenv("SPECTRACE_PROGRESS", "0")
    assert not enabled(_Tty())


def test_import_reports_bytes_read(tmp_path):
    """The importer's callback ends at (file size, file size) and never goes back."""
    from pathlib import Path

    from spectrace.hooks.vt.importer import import_log

    log = Path(__file__).resolve().parents[1] / "traces" / "reference.vt.log"
    calls: list[tuple[int, int | None]] = []
    import_log(log, tmp_path / "t.h5", progress=lambda done, total: calls.append((done, total)))
    size = log.stat().st_size
    assert calls[-1] == (size, size)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_default_gate_is_the_diff_verdict(tmp_path, pair):
    """With the defaults the gate fails exactly when the diff diverges, also where only an
    anchor differs (one block of theirs recorded with another anchor, same proposals)."""
    from spectrace.tracer.gate import gated_diff
    from spectrace.tracer.store import open_trace

    ours, theirs = pair
    odd = tmp_path / "odd.h5"
    with TraceWriter(odd, {"k": K}, flush_interval=0) as w:
        for req, prompt in (("A", [1, 2, 3]), ("B", [4, 5, 6])):
            seq = prompt + OUTPUT
            w.request(req, prompt_ids=prompt, output_ids=OUTPUT, finish_reason="length")
            for pos in (2, 6, 10, 14, 18):
                d = seq[pos + 1 : pos + 1 + K]
                anchor = 77 if (req, pos) == ("B", 10) else seq[pos]
                w.add_block(req, 0, pos, anchor, d, verified=d, accepted=K,
                            emitted=seq[pos + 1 : pos + 2 + K])  # fmt: skip
    for a, b in ((ours, theirs), (ours, ours), (theirs, odd), (theirs, theirs)):
        _, r, g = gated_diff(open_trace(a), open_trace(b))
        assert g.passed == (not r.diverged) and r.gate is None, (a, b)
    _, r, g = gated_diff(open_trace(theirs), open_trace(odd))
    assert r.diverged and (g.paired_blocks, g.agreeing_blocks) == (10, 9)


@pytest.mark.parametrize("given", ["-0", "0"])
def test_min_agreement_minus_zero_is_zero(capsys, pair, given):
    """-0 is 0 (it printed as -0.0%): 5 of 7 paired blocks agree (see the module docstring),
    so only the error findings fail the gate."""
    _, out, _ = run_cli(capsys, "diff", *pair, "--min-agreement", given)
    assert "(71.4%) >= 0.0%," in out and "-0.0%" not in out
    _, out, _ = run_cli(capsys, "diff", *pair, "--format", "json", "--min-agreement", given)
    assert repr(json.loads(out)["gate"]["min_agreement"]) == "0.0"
