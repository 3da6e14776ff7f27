"""No clobbering, no leftovers (issue 12 item 3): every writing command refuses an output that
is an input (after resolving symlinks and relative paths) or that exists without --force, with
one ``spectrace: error:`` line and exit 2; failed imports remove their own ``.partial``; a
trace name reads its ``.partial`` only when the trace itself does not exist, and says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spectrace.tracer.errors import InputError
from spectrace.tracer.store import open_trace
from spectrace.tracer.store.paths import check_outputs

SPECTRACE = os.path.join(os.path.dirname(sys.executable), "spectrace")
PY = sys.executable
LOG = "[SPECTRACE] req=a pos=10 k=2 ns=2 acc=1 draft=[ 5 6 ] emit=[ 5 7 ]\n"


def _run(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [SPECTRACE, *map(str, args)], capture_output=True, text=True, timeout=60, cwd=cwd
    )


def _refused(r: subprocess.CompletedProcess, line: str) -> None:
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [f"spectrace: error: {line}"]


@pytest.fixture
def log(tmp_path) -> Path:
    p = tmp_path / "in.log"
    p.write_text(LOG)
    return p


# -- outputs equal to inputs ---------------------------------------------------------------------


def test_import_onto_its_own_log_is_refused_and_the_log_kept(tmp_path, log):
    r = _run("import", "vt", log, "-o", log)
    _refused(r, f"{log}: the output (-o) is the input LOG; choose another output path")
    assert log.read_text() == LOG
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.log"]


def test_relative_and_symlinked_outputs_are_resolved(tmp_path, log):
    (tmp_path / "sub").mkdir()
    r = _run("import", "vt", "in.log", "-o", "sub/../in.log", cwd=tmp_path)
    _refused(r, "sub/../in.log: the output (-o) is the input LOG; choose another output path")
    (tmp_path / "link.h5").symlink_to(log)
    r = _run("import", "vt", log, "-o", tmp_path / "link.h5")
    _refused(
        r, f"{tmp_path / 'link.h5'}: the output (-o) is the input LOG; choose another output path"
    )
    assert log.read_text() == LOG


def test_output_whose_partial_is_the_input_is_refused(tmp_path):
    # The writer records x.h5.partial first: it would truncate this log.
    src = tmp_path / "x.h5.partial"
    src.write_text(LOG)
    r = _run("import", "vt", src, "-o", tmp_path / "x.h5")
    _refused(
        r, f"{tmp_path / 'x.h5'}: the output (-o) is the input LOG; choose another output path"
    )
    assert src.read_text() == LOG


def test_import_onto_its_requests_file_is_refused(tmp_path, log):
    req = tmp_path / "r.jsonl"
    req.write_text(json.dumps({"req_id": "a", "prompt_ids": [1] * 10, "output_ids": [5]}) + "\n")
    before = req.read_text()
    r = _run("import", "vt", log, "-o", req, "--requests", req)
    _refused(r, f"{req}: the output (-o) is the input --requests; choose another output path")
    assert req.read_text() == before


def test_capture_log_equal_to_trace_is_refused_before_running(tmp_path):
    marker = tmp_path / "ran"
    cmd = [PY, "-c", f"open({str(marker)!r}, 'w')"]
    x = tmp_path / "x.h5"
    _refused(
        _run("capture", "-o", x, "--log", x, "--", *cmd), f"{x}: -o and --log name the same file"
    )
    _refused(
        _run("capture", "-o", x, "--requests", x, "--", *cmd),
        f"{x}: the output (-o) is the input --requests; choose another output path",
    )
    assert not marker.exists() and sorted(p.name for p in tmp_path.iterdir()) == []


def test_capture_log_equal_to_requests_is_refused(tmp_path):
    r = _run(
        "capture",
        "-o",
        "x.h5",
        "--log",
        "r.jsonl",
        "--requests",
        "./r.jsonl",
        "--",
        PY,
        "-V",
        cwd=tmp_path,
    )
    _refused(r, "r.jsonl: the output (--log) is the input --requests; choose another output path")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# -- existing outputs ----------------------------------------------------------------------------


def test_existing_trace_needs_force(tmp_path, log):
    out = tmp_path / "t.h5"
    out.write_bytes(b"an earlier trace")
    _refused(
        _run("import", "vt", log, "-o", out),
        f"{out}: the output (-o) exists; pass --force to overwrite it",
    )
    assert out.read_bytes() == b"an earlier trace"
    r = _run("import", "vt", log, "-o", out, "--force")  # the clean twin
    assert r.returncode == 0, r.stderr
    assert len(open_trace(out).blocks) == 1


def test_existing_partial_needs_force(tmp_path, log):
    partial = tmp_path / "t.h5.partial"
    partial.write_bytes(b"a killed capture's file")
    _refused(
        _run("import", "vt", log, "-o", tmp_path / "t.h5"),
        f"{partial}: a partial trace of an earlier run exists (its writer was killed or still "
        f"runs); pass --force to overwrite it",
    )
    assert partial.read_bytes() == b"a killed capture's file"


def test_capture_existing_log_and_vllm_trace_need_force(tmp_path):
    (tmp_path / "run.log").write_text("old log")
    _refused(
        _run("capture", "-o", tmp_path / "t.h5", "--log", tmp_path / "run.log", "--", PY, "-V"),
        f"{tmp_path / 'run.log'}: the output (--log) exists; pass --force to overwrite it",
    )
    (tmp_path / "v.h5").write_text("old trace")
    _refused(
        _run("capture", "vllm", "-o", tmp_path / "v.h5", "--", PY, "-V"),
        f"{tmp_path / 'v.h5'}: the output (-o) exists; pass --force to overwrite it",
    )
    assert (tmp_path / "run.log").read_text() == "old log"
    assert not (tmp_path / "t.h5").exists() and not (tmp_path / "t.h5.partial").exists()


def test_demo_refuses_an_earlier_demo_without_force(tmp_path):
    (tmp_path / "reference.h5").write_text("earlier")
    _refused(
        _run("demo", "--out", tmp_path),
        f"{tmp_path / 'reference.h5'}: the output (reference trace) exists; "
        f"pass --force to overwrite it",
    )
    assert (tmp_path / "reference.h5").read_text() == "earlier"


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("reference.requests.jsonl", "reference requests"),
        ("reference.capture.log", "reference capture log"),
        ("vllm.capture.log", "vLLM capture log"),
    ],
)
def test_demo_refuses_every_file_of_an_earlier_demo(tmp_path, name, label):
    # The demo writes these too (breaker 12: it overwrote them without --force).
    (tmp_path / name).write_text("earlier")
    _refused(
        _run("demo", "--out", tmp_path),
        f"{tmp_path / name}: the output ({label}) exists; pass --force to overwrite it",
    )
    assert (tmp_path / name).read_text() == "earlier"


def test_check_outputs_clean_twin(tmp_path):
    (tmp_path / "in.log").write_text(LOG)
    (tmp_path / "old.h5").write_text("x")
    # New outputs, options not given, stdin as input and --force on an existing output pass.
    check_outputs({"-o": tmp_path / "new.h5", "--log": None}, {"LOG": tmp_path / "in.log"})
    check_outputs({"-o": tmp_path / "new.h5"}, {"LOG": "-", "--requests": None})
    check_outputs({"-o": tmp_path / "old.h5"}, {"LOG": tmp_path / "in.log"}, force=True)
    with pytest.raises(InputError, match=r"in\.log: the output \(-o\) is the input LOG"):
        check_outputs({"-o": tmp_path / "in.log"}, {"LOG": tmp_path / "in.log"}, force=True)


# -- leftovers -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content,what",
    [
        (b"", "empty log (no lines)"),
        (b"\x89HDF\r\n\x1a\n\x00\x00\x00\x00binary\n", "binary file, not a VT_SPEC_TRACE text log"),
        (
            b"INFO loading model\nINFO done\n",
            "no VT_SPEC_TRACE line in 2 lines (is this our engine's stderr, run with "
            "VT_SPEC_TRACE=1?)",
        ),
    ],
)
def test_non_log_is_an_input_error_without_leftovers(tmp_path, content, what):
    src = tmp_path / "x.log"
    src.write_bytes(content)
    out = tmp_path / "t.h5"
    r = _run("import", "vt", src, "-o", out)
    _refused(r, f"{src}: {what} (partial trace {tmp_path / 't.h5.partial'} removed)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.log"]


def test_bad_requests_file_leaves_nothing(tmp_path, log):
    req = tmp_path / "r.jsonl"
    req.write_text("{not json\n")
    r = _run("import", "vt", log, "-o", tmp_path / "t.h5", "--requests", req)
    assert r.returncode == 2 and r.stderr.startswith(f"spectrace: error: {req}:1: not JSON")
    assert len(r.stderr.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.log", "r.jsonl"]


def test_info_prefers_the_trace_over_a_leftover_partial(tmp_path, log):
    out = tmp_path / "t.h5"
    assert _run("import", "vt", log, "-o", out).returncode == 0
    (tmp_path / "t.h5.partial").write_bytes(b"garbage a dead writer left")
    r = _run("info", out, "--format", "json")
    assert r.returncode == 0 and r.stderr == ""
    assert json.loads(r.stdout)["files"] == [str(out)]


def test_info_says_when_it_reads_the_partial(tmp_path, log):
    out = tmp_path / "t.h5"
    assert _run("import", "vt", log, "-o", out).returncode == 0
    out.rename(tmp_path / "t.h5.partial")
    r = _run("info", out, "--format", "json")
    assert r.returncode == 0
    assert (
        f"{out}: no such file; reading {out}.partial instead (its writer is still running, "
        f"was killed or stopped on an error: info's capture row says which)"
    ) in r.stderr
    assert json.loads(r.stdout)["files"] == [f"{out}.partial"]


def test_meta_k_must_be_an_integer(tmp_path, log):
    r = _run("import", "vt", log, "-o", tmp_path / "t.h5", "--meta", "k=four")
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        "spectrace: error: Invalid value for --meta k: expected an integer (field=k, "
        "value='four') (see 'spectrace import vt --help')"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.log"]
