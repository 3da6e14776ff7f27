"""The pytest plugin, driven through pytester as an engine team's CI would use it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent

# A tiny greedy spec-decode simulator the generated test modules share (conftest).
CONFTEST = '''
from spectrace.tracer.store import TraceWriter

PROMPT = [1, 2, 3]
OUTPUT = list(range(10, 30))


def make(path, drafter, output=OUTPUT, req_id="r0", skip=0):
    """skip: plain decode steps before the first draft (the first anchor moves by skip)."""
    seq = PROMPT + output
    with TraceWriter(path, {"k": 3}, flush_interval=0) as w:
        w.request(req_id, prompt_ids=PROMPT, output_ids=output, finish_reason="length")
        pos = len(PROMPT) - 1 + skip
        while pos + 1 < len(seq):
            d = drafter(pos)
            acc = 0
            while acc < 3 and pos + 1 + acc < len(seq) and d[acc] == seq[pos + 1 + acc]:
                acc += 1
            w.add_block(req_id, 0, pos, seq[pos], d, verified=d, accepted=acc,
                        emitted=seq[pos + 1: pos + 2 + acc])
            pos += acc + 1
    return path


def good(pos):
    truth = PROMPT + OUTPUT
    return [truth[pos + 1 + j] if pos + 1 + j < len(truth) else 0 for j in range(3)]


def bad_slot2(pos):
    d = good(pos)
    return d[:2] + [999]
'''


@pytest.fixture
def tester(pytester):
    pytester.makeconftest(CONFTEST)
    return pytester


def test_matching_drafts_pass(tester):
    tester.makepyfile("""
        from conftest import make, good
        def test_it(tmp_path, spectrace_assert_drafts_match):
            a = make(tmp_path / "a.h5", good, req_id="ours-1")
            b = make(tmp_path / "b.h5", good, req_id="theirs-7")
            spectrace_assert_drafts_match(a, b)
    """)
    tester.runpytest_subprocess("-q").assert_outcomes(passed=1)


def test_failure_text_names_block_finding_and_command(tester):
    tester.makepyfile("""
        from conftest import make, good, bad_slot2
        def test_it(tmp_path, spectrace_assert_drafts_match):
            a = make(tmp_path / "a.h5", bad_slot2)
            b = make(tmp_path / "b.h5", good)
            spectrace_assert_drafts_match(a, b)
    """)
    r = tester.runpytest_subprocess("-q")
    r.assert_outcomes(failed=1)
    # Ours accepts 2 per block (slot 2 is wrong): anchors 2, 5, 8, ..., 20; theirs accepts 3:
    # anchors 2, 6, 10, 14, 18. They pair at 2 and 14, and differ in slot 2 at both.
    r.stdout.fnmatch_lines(
        [
            "spectrace: drafts do not match: drafts match in 0 of 2 paired blocks (0.0%), "
            "required 100.0%; 1 error finding(s), at most 0 allowed",
            "  first divergent block: request r0, position 2, slot 2",
            "    ours:   [10, 11, 999]",
            "    theirs: [10, 11, 12]",
            "  first error finding: draft_mismatch: proposals differ at matched anchors in 2 of 2 "
            "paired blocks (100%), from slot 0 in 0% of them, with no shift or mapping pattern",
            "  inspect: spectrace view */a.h5 */b.h5",
        ]
    )


def test_tolerances_and_ignores(tester):
    tester.makepyfile("""
        from conftest import make, good, bad_slot2
        def test_it(tmp_path, spectrace_assert_drafts_match):
            a = make(tmp_path / "a.h5", bad_slot2)
            b = make(tmp_path / "b.h5", good)
            spectrace_assert_drafts_match(a, b, min_agreement=0.0, ignore={"draft_mismatch"})
            spectrace_assert_drafts_match(a, a, positions=range(5, 9))
    """)
    tester.runpytest_subprocess("-q").assert_outcomes(passed=1)


def test_no_vacuous_pass_when_content_diverged_first(tester):
    tester.makepyfile("""
        from conftest import make, good, OUTPUT
        def test_it(tmp_path, spectrace_assert_drafts_match):
            # Theirs decodes one token before drafting, and it differs from ours: the only
            # position both could draft from is gone.
            other = [99] + OUTPUT[1:]
            a = make(tmp_path / "a.h5", good)
            b = make(tmp_path / "b.h5", good, output=other, skip=1)
            spectrace_assert_drafts_match(a, b, max_error_findings=5)
    """)
    r = tester.runpytest_subprocess("-q")
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines(
        [
            "spectrace: drafts do not match: no comparable blocks: the content diverged at "
            "position 3 before any block both engines drafted from",
        ]
    )


def test_a_golden_named_like_another_tests_obtained_trace_fails(tester):
    """test_x[a]'s mismatch writes test_x_a.obtained.h5, test_x[a.obtained]'s golden: a
    regressed engine would overwrite that golden and pass there (breaker 12)."""
    tester.makepyfile(
        test_engine="""
        import pytest
        from conftest import make, good
        @pytest.mark.parametrize("case", ["a", "a.obtained"])
        def test_x(case, tmp_path, spectrace_regression):
            spectrace_regression.check(make(tmp_path / "run.h5", good))
    """
    )
    r = tester.runpytest_subprocess("-q", "-p", "no:randomly")
    r.stdout.fnmatch_lines(
        [
            "*spectrace: test_engine.py::test_x?a.obtained? and test_engine.py::test_x?a? have "
            "one golden trace *test_x_a.obtained.h5; give the tests (or their parameters) names "
            "that stay distinct (a test owns its golden NAME.h5 and the NAME.obtained.h5 a "
            "mismatch writes)"
        ]
    )
    assert not (tester.path / "test_engine" / "test_x_a.obtained.h5").exists()


@pytest.mark.parametrize("where", ["one worker", "two workers"])
def test_two_tests_of_one_golden_fail_under_xdist(tester, where):
    """test_x[a/b] and test_x[a_b] both map to test_x_a_b.h5: under pytest-xdist the second
    one claimed fails as it does in one process, whichever worker ran the first (breaker 14:
    the claims were per worker process); the twin with distinct names passes both."""
    tester.makepyfile(
        test_engine="""
        import pytest
        from conftest import make, good
        @pytest.mark.parametrize("case", [
            pytest.param("a/b", marks=pytest.mark.xdist_group("one")),
            pytest.param("a_b", marks=pytest.mark.xdist_group("two")),
        ])
        def test_x(case, tmp_path, spectrace_regression):
            spectrace_regression.check(make(tmp_path / "run.h5", good))
    """
    )
    # loadgroup: each group on a worker of its own (the two idle workers take one each).
    dist = ["-n", "2", "--dist", "loadgroup" if where == "two workers" else "loadfile"]
    tester.runpytest_subprocess("-q", "-p", "no:randomly", "--spectrace-regen", "-n", "0")
    r = tester.runpytest_subprocess("-q", "-p", "no:randomly", *dist)
    r.stdout.fnmatch_lines(["*spectrace: test_engine.py::test_x?a* have one golden trace *"])
    outcomes = r.parseoutcomes()
    assert outcomes.get("errors", 0) >= 1 and "failed" not in outcomes
    clean = tester.path / "test_engine.py"
    clean.write_text(clean.read_text().replace('"a_b"', '"c"'))
    tester.runpytest_subprocess("-q", "-p", "no:randomly", "--spectrace-regen", "-n", "0")
    ok = tester.runpytest_subprocess("-q", "-p", "no:randomly", *dist)
    assert ok.parseoutcomes().get("errors", 0) == 0 and ok.ret == 0


def test_golden_cycle(tester, monkeypatch):
    tester.makepyfile(
        test_engine="""
        import os
        from conftest import make, good, bad_slot2
        def test_drafts(tmp_path, spectrace_regression):
            drafter = bad_slot2 if os.environ.get("BROKEN") else good
            spectrace_regression.check(make(tmp_path / "run.h5", drafter,
                                            req_id=str(os.getpid())))
    """
    )
    golden = tester.path / "test_engine" / "test_drafts.h5"
    obtained = tester.path / "test_engine" / "test_drafts.obtained.h5"
    r = tester.runpytest_subprocess("-q")  # 1. missing golden: written, fails
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines(["*golden trace written: *test_engine/test_drafts.h5; re-run*"])
    assert golden.exists()
    # 2. same drafts, new request id: pass
    tester.runpytest_subprocess("-q").assert_outcomes(passed=1)
    monkeypatch.setenv("BROKEN", "1")
    r = tester.runpytest_subprocess("-q")  # 3. drafts moved: obtained written, fails
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines(
        [
            "*drafts do not match*",
            "*obtained trace: *test_drafts.obtained.h5",
            "*accept it with --spectrace-regen",
        ]
    )
    assert obtained.exists()
    r = tester.runpytest_subprocess("-q", "--spectrace-regen")  # 4. regen: rewritten, fails
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines(["*golden trace rewritten (--spectrace-regen)*"])
    tester.runpytest_subprocess("-q").assert_outcomes(passed=1)  # 5. the new golden holds
    assert not obtained.exists()


def test_loading_the_plugin_is_light():
    code = (
        "import sys, time; t = time.perf_counter(); import spectrace.tracer.pytest_plugin; "
        "dt = time.perf_counter() - t; "
        "print(sorted(m for m in ('torch', 'vllm', 'textual', 'h5py', 'numpy') "
        "if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"


def test_entry_point_module_exposes_the_whole_plugin():
    """pytest registers ``spectrace.tracer.pytest_plugin`` (named by the pytest11 entry point)
    and finds hooks and fixtures by attribute: it must carry every one of ``testing.plugin``'s."""
    from spectrace.tracer import pytest_plugin
    from spectrace.tracer.testing import plugin

    names = {n for n in vars(plugin) if n.startswith(("spectrace_", "pytest_"))}
    assert names == {
        "pytest_addoption",
        "spectrace_load",
        "spectrace_assert_drafts_match",
        "spectrace_regression",
        "spectrace_capture_cmd",
        "spectrace_capture_vllm",
    }
    assert all(getattr(pytest_plugin, n) is getattr(plugin, n) for n in names)


def test_log_loads_through_the_parser(tester):
    log = ROOT / "tests" / "hooks" / "data" / "vt_sync_dflash.log"
    req = ROOT / "tests" / "hooks" / "data" / "vt_sync_dflash.requests.jsonl"
    tester.makepyfile(f"""
        def test_it(spectrace_load):
            t = spectrace_load({str(log)!r}, requests={str(req)!r})
            assert t.meta["source"] == "vt_spec_trace" and len(t.blocks) > 0
    """)
    tester.runpytest_subprocess("-q").assert_outcomes(passed=1)


GUIDE_TEST = """
import sys

def test_drafts_match_upstream(tmp_path, spectrace_capture_cmd, spectrace_assert_drafts_match):
    requests = tmp_path / "requests.jsonl"
    ours = spectrace_capture_cmd(
        [sys.executable, "-m", "spectrace.engine", "--method", "draft_model", "--k", "4",
         "--max-tokens", "64", "--requests-out", requests, *FAULT], requests=requests)
    spectrace_assert_drafts_match(ours, "{golden}")
"""


def test_reference_engine_against_the_real_vllm_golden(pytester):
    """The README's CI test, verbatim: our engine vs the golden captured from real vLLM."""
    golden = ROOT / "traces" / "vllm.h5"
    pytester.makepyfile(test_ci="FAULT = []\n" + GUIDE_TEST.format(golden=golden))
    pytester.runpytest_subprocess("-q").assert_outcomes(passed=1)
    # Break the engine: the failure names the block and the bug class.
    pytester.makepyfile(
        test_ci='FAULT = ["--fault", "layout_shift"]\n' + GUIDE_TEST.format(golden=golden)
    )
    r = pytester.runpytest_subprocess("-q")
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines(
        [
            "spectrace: drafts do not match: drafts match in 0 of * paired blocks (0.0%)*",
            "  first divergent block: request 0, position 10, slot 0",
            "  first error finding: layout_shift: draft layout shifted by 1 slot: ours[[]i[]] "
            "equals theirs[[]i+1[]]*",
            "  inspect: spectrace view */test_drafts_match_upstream0/ours.h5 */traces/vllm.h5",
        ]
    )
