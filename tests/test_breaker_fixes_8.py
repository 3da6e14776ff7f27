"""The eighth new user's defects (importers, capture, the pytest plugin), each with its twin.

1. A golden whose spec-decode counters are floats (``5.0``: how Prometheus exports a
   counter) was read as having no counters at all ("the golden has no spec-decode
   counters"), so a golden short of its own draft counter passed ``check`` (exit 0); a
   counter that is no count (``"3"``, ``true``) was dropped the same silent way. Integral
   floats are counts now, and any other value is bad input naming the file, line and field.
2. The pytest fixtures wrote every capture of a test to ``tmp_path/ours.h5`` (and every
   log import to ``LOG.h5``): a second capture replaced the first one's file, so the
   failure's ``spectrace view`` line named one file twice (the second run against itself)
   and a regression golden taken from the first trace copied the second run's file. A
   second capture or import of one name now writes ``NAME-2.h5``.
3. Naming the plugin as its module docstring offers (``pytest_plugins =
   ["spectrace.tracer.pytest_plugin"]`` in a conftest, or ``-p spectrace.tracer.pytest_plugin``)
   stopped pytest before any test: the ``pytest11`` entry point had already registered that
   module as ``spectrace`` ("Plugin already registered under a different name"). The entry
   point now names a module that only lists the plugin in ``pytest_plugins``.
4. ``replay --engine cmd`` (and vllm) whose engine exited 0 but drafted at only some of the
   positions exited 2, bad input, though the input was sound: the engine dropped its work.
   It is an engine failure now (exit 3, as a failed or timed-out engine), with how many
   positions lack a block.
5. ``capture`` never finished while a process the command started held its stderr open
   (``sleep &`` in a script, a daemon, the child of a shell that SIGTERM killed): it read
   the pipe until EOF, so even a forwarded SIGTERM left it hanging and the exit status and
   the trace's end record were never written. It now stops reading once the command has
   exited and the pipe stayed silent for 2 s (one warning line), keeping every line read.
6. ``capture vllm -o run.h5`` checked only ``run.h5`` (and its ``.partial``): the plugin
   writes DP rank r to ``run.dp<r>.h5``, so an earlier capture's rank file was overwritten
   without ``--force`` (or, beside a new one-rank run, read with it by ``'run*.h5'``). Such
   a rank file is now refused like ``-o`` itself (exit 2, naming it).
7. ``replay`` of a reference whose capture was killed (or never closed, or lost lines)
   said nothing: the replay covered only what the reference recorded. It now warns, with
   the reasons ``capture_incomplete`` gives.
8. ``spectrace_regression`` named goldens after the test with ``/``, ``[`` and ``]``
   replaced, so ``test_x[a/b]`` and ``test_x[a_b]`` (or ``test_x[1]`` and ``test_x_1``)
   shared one golden: the second was judged against the first's trace (and ``--spectrace-
   regen`` let the last overwrite the others). The second such test now fails, naming both.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
from inproc import SPECTRACE, run_inproc
from replay_fake import replay_fake

from spectrace.hooks.replay.positions import read_references
from spectrace.tracer.store import TraceWriter, open_trace

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data_importers" / "golden_small.json"
LOG = ROOT / "traces" / "reference.vt.log"

# -- 1. golden counters written as floats, or not as counts ------------------------------------


def _golden(tmp_path: Path, metrics: dict) -> Path:
    """The bundled golden with its ``metrics`` replaced, on one line (line 1)."""
    doc = json.loads(GOLDEN.read_text())
    doc["metrics"] = metrics
    src = tmp_path / "g.json"
    src.write_text(json.dumps(doc) + "\n")
    return src


def _check_errors(path: Path) -> tuple[int, list[str]]:
    r = run_inproc("check", path, "--format", "json")
    doc = json.loads(r.stdout)
    return r.returncode, [f["kind"] for f in doc["findings"] if f["severity"] == "error"]


# The bundled golden's walk places 6 verified blocks of 18 drafts, 8 accepted, per slot
# [6, 2, 0] (test_importers derives them).
_FLOATS_SHORT = {
    "vllm:spec_decode_num_drafts": 9.0,  # 3 drafts more than the golden's blocks hold
    "vllm:spec_decode_num_draft_tokens": 27.0,
    "vllm:spec_decode_num_accepted_tokens": 9.0,
    "vllm:spec_decode_num_accepted_tokens_per_pos": [6.0, 3.0, 0.0],
}


def test_float_counters_short_of_the_blocks_are_missing_work(tmp_path):
    out = tmp_path / "g.h5"
    r = run_inproc("import", "golden", _golden(tmp_path, _FLOATS_SHORT), "-o", out)
    assert r.returncode == 0
    with h5py.File(out) as f:
        checks = json.loads(f["meta"][()])["checks"]
    assert (checks["status"], checks["mismatch"]) == ("mismatch", ["drafts", "draft_tokens"])
    assert checks["golden_counters"]["golden"]["drafts"] == 9
    assert _check_errors(out) == (1, ["capture_incomplete"])


def test_float_counters_equal_to_the_blocks_pass_check(tmp_path):
    """Twin: the bundled golden's own counters (6 drafts, 18 draft tokens) as floats."""
    metrics = {**_FLOATS_SHORT, "vllm:spec_decode_num_drafts": 6.0}
    metrics["vllm:spec_decode_num_draft_tokens"] = 18.0
    out = tmp_path / "g.h5"
    assert run_inproc("import", "golden", _golden(tmp_path, metrics), "-o", out).returncode == 0
    with h5py.File(out) as f:
        checks = json.loads(f["meta"][()])["checks"]
    assert checks["status"] == "ok"
    assert _check_errors(out) == (0, [])


def test_a_counter_that_is_no_count_is_bad_input(tmp_path):
    for value in ("5", True, -1, 2.5):
        src = _golden(tmp_path, {**_FLOATS_SHORT, "vllm:spec_decode_num_drafts": value})
        out = tmp_path / "g.h5"
        r = run_inproc("import", "golden", src, "-o", out)
        assert (r.returncode, r.stdout) == (2, "")
        assert r.stderr == (
            f"spectrace: error: {src}:1: metrics field 'vllm:spec_decode_num_drafts' is not a "
            f"count (value {value!r})\n"
        )
        assert not out.exists() and not Path(f"{out}.partial").exists()


def test_a_per_position_counter_that_is_no_list_of_counts_is_bad_input(tmp_path):
    bad = {**_FLOATS_SHORT, "vllm:spec_decode_num_accepted_tokens_per_pos": [4, "3", 2]}
    r = run_inproc("import", "golden", _golden(tmp_path, bad), "-o", tmp_path / "g.h5")
    assert r.returncode == 2
    assert "'vllm:spec_decode_num_accepted_tokens_per_pos' is not a count" in r.stderr


# -- 2. a second capture or import of one name in a test -----------------------------------------


def _engine(log: Path) -> list[str]:
    """A command that prints LOG on its stderr, as our engine prints its trace lines."""
    return [sys.executable, "-c", f"import sys; sys.stderr.write(open({str(log)!r}).read())"]


def _blocks_in(log: Path) -> int:
    return sum(line.startswith("[SPECTRACE]") for line in log.read_text().splitlines())


def _blocks_on_disk(path: Path) -> int:
    with h5py.File(path, "r", locking=False) as f:  # the fixture's Trace holds it open
        return len(f["blocks/position"])


def _first_lines(tmp_path: Path, n: int) -> Path:
    cut = tmp_path / "cut.log"
    cut.write_text("".join(LOG.read_text().splitlines(keepends=True)[:n]))
    return cut


def test_a_second_capture_keeps_the_first_ones_file(tmp_path, spectrace_capture_cmd):
    cut = _first_lines(tmp_path, 300)
    whole, part = _blocks_in(LOG), _blocks_in(cut)
    assert (whole, part) == (139, 60)  # the bundled log's 139 blocks; 60 in its 300 lines
    first = spectrace_capture_cmd(_engine(LOG))
    second = spectrace_capture_cmd(_engine(cut))
    assert (first.paths, second.paths) == ([tmp_path / "ours.h5"], [tmp_path / "ours-2.h5"])
    assert _blocks_on_disk(tmp_path / "ours.h5") == whole
    assert _blocks_on_disk(tmp_path / "ours-2.h5") == part


def test_one_capture_writes_its_name(tmp_path, spectrace_capture_cmd):
    """Twin: one capture per name is NAME.h5, as documented."""
    t = spectrace_capture_cmd(_engine(LOG), name="mine")
    assert t.paths == [tmp_path / "mine.h5"]
    assert _blocks_on_disk(tmp_path / "mine.h5") == 139


def test_two_logs_of_one_name_load_as_two_traces(tmp_path, spectrace_load):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shutil.copy(LOG, tmp_path / "a" / "run.log")
    shutil.copy(_first_lines(tmp_path, 300), tmp_path / "b" / "run.log")
    first = spectrace_load(tmp_path / "a" / "run.log")
    second = spectrace_load(tmp_path / "b" / "run.log")
    assert first.paths == [tmp_path / "run.log.h5"]
    assert second.paths == [tmp_path / "run.log-2.h5"]
    assert (_blocks_on_disk(first.paths[0]), _blocks_on_disk(second.paths[0])) == (139, 60)


# -- 3. the plugin named in a conftest or with -p -------------------------------------------------

_USES_A_FIXTURE = """
def test_it(spectrace_load):
    assert callable(spectrace_load)
"""


@pytest.mark.parametrize(
    ("conftest", "args"),
    [
        ('pytest_plugins = ["spectrace.tracer.pytest_plugin"]\n', ()),
        (None, ("-p", "spectrace.tracer.pytest_plugin")),
    ],
    ids=["conftest", "dash-p"],
)
def test_the_plugin_named_by_its_module_runs_the_tests(pytester, conftest, args):
    if conftest:
        pytester.makeconftest(conftest)
    pytester.makepyfile(_USES_A_FIXTURE)
    r = pytester.runpytest_subprocess("-q", *args)
    assert r.ret == 0, r.stderr.str()
    r.assert_outcomes(passed=1)


def test_the_plugin_loads_by_its_entry_point_alone(pytester):
    """Twin: no conftest, no -p: the entry point alone gives the fixtures, and
    ``-p no:spectrace`` still keeps them out (the fixture is then unknown: an error)."""
    pytester.makepyfile(_USES_A_FIXTURE)
    pytester.runpytest_subprocess("-q").assert_outcomes(passed=1)
    pytester.runpytest_subprocess("-q", "-p", "no:spectrace").assert_outcomes(errors=1)


# -- 4. a replayed engine that drafts at only some positions -----------------------------------

_FAKE_ENGINE = """
import json, sys
prompts, requests, skip = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(requests, "w") as out:
    for line in open(prompts):
        d = json.loads(line)
        n = len(d["prompt_ids"])
        if d["id"] not in skip:
            print(f"[SPECTRACE] req={d['id']} pos={n + 1} k=2 ns=1 acc=0 draft=[ 5 6 ] "
                  f"emit=[ 7 ]", file=sys.stderr)
        out.write(json.dumps({"req_id": d["id"], "prompt_ids": d["prompt_ids"],
                              "output_ids": [4, 7]}) + "\\n")
"""


def _replay_fake(tmp_path: Path, *skip: str):
    """Replay a 3-token prompt + 4-token output: 3 positions (3, 4, 5: sites 0, 1, 2)."""
    return replay_fake(tmp_path, _FAKE_ENGINE, *skip)


def test_an_engine_that_skips_a_position_failed(tmp_path):
    r, out = _replay_fake(tmp_path, "1")
    assert (r.returncode, r.stdout) == (3, "")
    assert r.stderr.splitlines()[-1] == (
        "spectrace: error: engine left no block at 1 of 3 replayed positions (first: request "
        "a position 4, site 1): its drafts there are missing"
    )
    assert not out.exists()


def test_an_engine_that_drafts_every_position_replays(tmp_path):
    """Twin: the same engine drafting at all 3 positions: 3 blocks, at 3, 4 and 5."""
    r, out = _replay_fake(tmp_path)
    assert r.returncode == 0, r.stderr
    with h5py.File(out) as f:
        assert [int(x) for x in f["blocks/position"][()]] == [3, 4, 5]


# -- 5. a process the command left behind holds its stderr -------------------------------------


def _capture_leaving(tmp_path: Path, script: str) -> tuple[subprocess.CompletedProcess, Path]:
    """``spectrace capture`` of ``sh -c SCRIPT`` ($1: the pid file, $2: the 300-line log);
    the process SCRIPT leaves behind is killed afterwards (by the pid it wrote)."""
    out, pid_file = tmp_path / "t.h5", tmp_path / "pid"
    cmd = ["sh", "-c", script, "sh", str(pid_file), str(_first_lines(tmp_path, 300))]
    err = tmp_path / "stderr"
    try:
        with open(err, "w") as fh:  # a file, not a pipe: the sleeper holds what it inherits
            rc = subprocess.run(
                [SPECTRACE, "capture", "-o", str(out), "--", *cmd],
                stdout=subprocess.DEVNULL,
                stderr=fh,
                timeout=60,  # on main the capture waited for the 600 s sleeper: a hang
            ).returncode
    finally:
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    run = subprocess.CompletedProcess(cmd, rc, "", err.read_text())
    return run, out


def test_a_left_behind_process_holding_stderr_does_not_hold_the_capture(tmp_path):
    run, out = _capture_leaving(tmp_path, 'cat "$2" >&2; sleep 600 & echo $! > "$1"; exit 0')
    assert run.returncode == 0, run.stderr
    assert (
        "spectrace: warning: the command exited but a process it started still holds its "
        "stderr open; stopped reading it 2 s later"
    ) in run.stderr.splitlines()
    assert _blocks_on_disk(out) == 60  # every block of the 300 lines it printed


def test_lines_a_left_behind_process_prints_soon_are_captured(tmp_path):
    """Twin: a child that prints the log 0.5 s after the command exited (then exits):
    all 60 blocks are captured, with no warning."""
    run, out = _capture_leaving(tmp_path, '(sleep 0.5; cat "$2" >&2) & echo $! > "$1"; exit 0')
    assert run.returncode == 0, run.stderr
    assert "holds its stderr open" not in run.stderr
    assert _blocks_on_disk(out) == 60


# -- 6. capture vllm and an earlier capture's rank files --------------------------------------


def test_an_earlier_rank_file_is_not_overwritten_without_force(tmp_path):
    for name in ("run.dp1.h5", "run.dp1.h5.partial"):
        earlier = tmp_path / name
        earlier.write_bytes(b"an earlier capture's rank 1")
        r = run_inproc("capture", "vllm", "-o", tmp_path / "run.h5", "--", "true")
        assert (r.returncode, r.stdout) == (2, "")
        assert r.stderr == (
            f"spectrace: error: {earlier}: a data-parallel rank file of an earlier capture to "
            f"{tmp_path / 'run.h5'} exists (the plugin writes rank r to run.dp<r>.h5); pass "
            f"--force to overwrite it\n"
        )
        assert earlier.read_bytes() == b"an earlier capture's rank 1"
        earlier.unlink()


def test_a_capture_beside_other_files_runs(tmp_path):
    """Twin: files that are no rank of -o (another stem, no digits) do not stop it, nor
    does a rank file with --force: the command runs (``true``: exit status 0)."""
    for name in ("runx.dp1.h5", "run.dpx.h5", "run.h5.log"):
        (tmp_path / name).write_bytes(b"x")
    r = run_inproc("capture", "vllm", "-o", tmp_path / "run.h5", "--", "true")
    assert r.returncode == 0, r.stderr
    (tmp_path / "run.dp1.h5").write_bytes(b"x")
    r = run_inproc("capture", "vllm", "-o", tmp_path / "run.h5", "--force", "--", "true")
    assert r.returncode == 0, r.stderr


# -- 7. replaying a reference whose capture is missing work --------------------------------------


def _reference_with(tmp_path: Path, **meta) -> Path:
    """The bundled reference's first two requests (no block) under ``meta``."""
    src = open_trace(ROOT / "traces" / "reference.h5")
    out = tmp_path / "ref.h5"
    with TraceWriter(out, {"k": 4, "method": "draft_model", **meta}, flush_interval=0) as w:
        for i in range(2):
            w.request(
                str(src.requests.req_id[i]),
                prompt_ids=[int(x) for x in src.requests.prompt_ids[i]],
                output_ids=[int(x) for x in src.requests.output_ids[i]],
                finish_reason="length",
            )
    return out


def test_a_killed_reference_is_said_to_be_missing_work(tmp_path, capsys):
    killed = {"ended": "engine-signal", "exit_status": 137, "signal": 9}
    refs, _ = read_references(_reference_with(tmp_path, capture=killed))
    assert [r.req_id for r in refs] == ["0", "1"]
    assert capsys.readouterr().err == (
        f"spectrace: warning: {tmp_path / 'ref.h5'}: the reference's capture is missing work "
        f"(ended engine-signal; the engine was killed by signal 9): only the sequences it "
        f"recorded are replayed\n"
    )


def test_a_cleanly_ended_reference_replays_without_a_word(tmp_path, capsys):
    """Twin: the same requests from a capture that ended clean (exit status 0)."""
    clean = {"ended": "clean", "exit_status": 0, "signal": None}
    refs, _ = read_references(_reference_with(tmp_path, capture=clean))
    assert [r.req_id for r in refs] == ["0", "1"]
    assert capsys.readouterr().err == ""


# -- 8. two tests whose golden names coincide ----------------------------------------------------

_REGRESSION = """
import pytest

@pytest.mark.parametrize("which", [{ids}])
def test_reg(which, spectrace_regression):
    spectrace_regression.check({trace!r})
"""


def test_two_tests_of_one_golden_name_are_refused(pytester):
    trace = str(ROOT / "traces" / "reference.h5")
    pytester.makepyfile(test_g=_REGRESSION.format(ids='"a/b", "a_b"', trace=trace))
    r = pytester.runpytest_subprocess("-q")
    r.assert_outcomes(failed=1, errors=1)  # a/b: its golden written; a_b: refused
    r.stdout.fnmatch_lines(
        [
            "*spectrace: test_g.py::test_reg[[]a_b[]] and test_g.py::test_reg[[]a/b[]] have one "
            "golden trace *test_g/test_reg_a_b.h5; give the tests*"
        ]
    )
    assert sorted(p.name for p in (pytester.path / "test_g").iterdir()) == ["test_reg_a_b.h5"]


def test_tests_of_distinct_golden_names_each_have_theirs(pytester):
    """Twin: ids "a" and "b": two goldens, written on the first run, passing on the next."""
    trace = str(ROOT / "traces" / "reference.h5")
    pytester.makepyfile(test_g=_REGRESSION.format(ids='"a", "b"', trace=trace))
    pytester.runpytest_subprocess("-q").assert_outcomes(failed=2)
    names = sorted(p.name for p in (pytester.path / "test_g").iterdir())
    assert names == ["test_reg_a.h5", "test_reg_b.h5"]
    pytester.runpytest_subprocess("-q").assert_outcomes(passed=2)
