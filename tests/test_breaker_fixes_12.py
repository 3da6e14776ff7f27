"""The twelfth round of defects a fresh user found, each with its clean twin.

1. Rank files of two runs (another target model, draft model or vLLM version) were read as
   one trace: only engine, method and k were compared. Now every /meta item a run's ranks
   share (``structure.RUN_KEYS``) must agree: exit 2.
2. A rank file copied under another rank number (the same requests, the same prompts)
   passed as a rank: its requests counted twice. Ranked files sharing a request id with the
   same prompt are a copy: exit 2. Twin: engines that number each rank's requests from 0
   reuse ids with other prompts: one run.
3. ``replay 'r/run*.h5' -o r/run.dp1.h5 --force`` overwrote the rank file it read: an
   input glob is an input in each file it matches.
4. ``export -o . --force`` was an internal error (and would replace the folder it runs in):
   exit 2 naming it.
5. ``spectrace.open(None)`` raised a bare TypeError and a bytes path read as byte values.
(The pytest plugin's golden/obtained collision and the demo's files are tested beside
their kin: tests/test_pytest_plugin.py, tests/test_no_clobber.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from inproc import run_inproc

from spectrace.tracer.store import TraceWriter


def _rank(path: Path, rank: int, prompt: list[int], **meta) -> Path:
    base = {"engine": "vllm", "method": "draft_model", "k": 2, "dp_rank": rank}
    with TraceWriter(path, {**base, "target_model": "/m/target", **meta}, flush_interval=0) as w:
        w.request("0", prompt_ids=prompt, output_ids=[7, 8, 9], finish_reason="length")
        w.add_block("0", 0, len(prompt), 7, [8, 9], accepted=2, emitted=[8, 9, 10])
    return path


@pytest.mark.parametrize(
    "meta",
    [{"target_model": "/other/target"}, {"draft_model": "/d"}, {"engine_version": "0.99"}],
)
def test_rank_files_of_two_runs_are_bad_input(tmp_path, meta):
    _rank(tmp_path / "run.dp0.h5", 0, [1, 2])
    _rank(tmp_path / "run.dp1.h5", 1, [3, 4], **meta)
    r = run_inproc("check", tmp_path / "run.dp*.h5")
    assert r.returncode == 2
    assert "files of different runs given as one trace" in r.stderr
    assert next(iter(meta)) in r.stderr


def test_a_rank_copied_under_another_number_is_bad_input(tmp_path):
    _rank(tmp_path / "run.dp0.h5", 0, [1, 2])
    _rank(tmp_path / "run.dp1.h5", 1, [1, 2])
    r = run_inproc("check", tmp_path / "run.dp*.h5")
    assert r.returncode == 2
    assert (
        f"request '0' in {tmp_path / 'run.dp0.h5'} and {tmp_path / 'run.dp1.h5'}: a copy of "
        "one file, or two runs" in r.stderr
    )


def test_clean_twin_ranks_that_reuse_request_ids_are_one_run(tmp_path):
    _rank(tmp_path / "run.dp0.h5", 0, [1, 2])
    _rank(tmp_path / "run.dp1.h5", 1, [3, 4])
    r = run_inproc("info", tmp_path / "run.dp*.h5", "--format", "json")
    assert r.returncode == 0, r.stderr


def test_an_output_matched_by_an_input_glob_is_refused(tmp_path):
    # replay 'r/run*.h5' -o r/run.dp1.h5 --force overwrote the rank file it read.
    from spectrace.tracer.errors import InputError
    from spectrace.tracer.store.paths import check_outputs

    for rank in (0, 1):
        _rank(tmp_path / f"run.dp{rank}.h5", rank, [1, 2 + rank])
    ref = str(tmp_path / "run*.h5")
    with pytest.raises(InputError) as e:
        check_outputs({"-o": tmp_path / "run.dp1.h5"}, {"REF": ref}, force=True)
    assert str(e.value) == (
        f"{tmp_path / 'run.dp1.h5'}: the output (-o) is the input REF; choose another output path"
    )
    check_outputs({"-o": tmp_path / "replay.h5"}, {"REF": ref}, force=True)  # twin


def test_export_never_replaces_the_current_folder(tmp_path, monkeypatch):
    vllm = Path(__file__).resolve().parents[1] / "traces" / "vllm.h5"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("mine")
    for out in (".", ".."):
        r = run_inproc("export", vllm, "-o", out, "--force")
        assert r.returncode == 2
        assert r.stderr == (
            f"spectrace: error: {out}: the current folder or one above it; name a new folder\n"
        )
    assert (tmp_path / "keep.txt").read_text() == "mine"
    assert run_inproc("export", vllm, "-o", "out").returncode == 0  # twin
    assert (tmp_path / "out" / "blocks").is_dir()


def test_the_api_names_a_spec_of_the_wrong_type():
    import spectrace
    from spectrace.tracer.errors import InputError

    vllm = Path(__file__).resolve().parents[1] / "traces" / "vllm.h5"
    for bad, why in (
        (None, "expected a trace path, glob or list of them, got NoneType"),
        ([vllm, 3], "expected a trace path or glob, got int: 3"),
    ):
        with pytest.raises(InputError) as e:
            spectrace.open(bad)
        assert str(e.value) == why
    # twin: a bytes path is a path (os.fsdecode), not a list of byte values
    assert len(spectrace.open(str(vllm).encode()).trace.blocks) == 144


def test_runs_that_diverge_without_an_error_say_why():
    # diff GOLDEN RUN RUN with a selection that leaves nothing: every row DIVERGED, first
    # error "-", and no reason anywhere (one THEIRS prints it). The bundled pair pairs
    # 139 blocks at positions 10..75.
    traces = Path(__file__).resolve().parents[1] / "traces"
    ref, vllm = traces / "reference.h5", traces / "vllm.h5"
    r = run_inproc("diff", ref, vllm, vllm, "--positions", "0:5")
    assert r.returncode == 1
    why = (
        f"run {vllm}: nothing selected: positions 0:5 leaves none of the 139 paired blocks "
        "(paired at positions 10..75)"
    )
    assert r.stdout.count(why) == 2
    ok = run_inproc("diff", ref, vllm, vllm)  # twin: both runs agree, no reason lines
    assert ok.returncode == 0 and f"run {vllm}:" not in ok.stdout


def test_the_api_refuses_a_closed_trace():
    import spectrace
    from spectrace.tracer.errors import InputError

    vllm = Path(__file__).resolve().parents[1] / "traces" / "vllm.h5"
    t = spectrace.open(vllm)
    assert spectrace.diff(t, vllm).diverged is False  # twin: an open trace diffs
    t.trace.close()
    with pytest.raises(InputError) as e:
        spectrace.diff(t, vllm)
    assert str(e.value) == f"{vllm}: the trace is closed; open it again"
