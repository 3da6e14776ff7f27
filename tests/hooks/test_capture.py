"""spectrace capture: live parsing of a child's stderr, forwarding, exit status, Ctrl-C,
crash safety (kill -9 of spectrace itself), and the vLLM-plugin variant."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from spectrace.hooks.capture import capture_command, capture_vllm
from spectrace.hooks.vllm.paths import written_traces
from spectrace.hooks.vt.importer import import_log
from spectrace.hooks.vt.level import trace_level
from spectrace.tracer.errors import InputError, ParseError
from spectrace.tracer.store import TraceWarning, TraceWriter, open_trace

SPECTRACE = os.path.join(os.path.dirname(sys.executable), "spectrace")
PY = sys.executable


def _block(i: int, req: str = "a") -> str:
    # Request `req`: prompt of 10 tokens; block i verifies [i, 99] at pos 10+2i, emits [i, 7].
    return f"[SPECTRACE] req={req} pos={10 + 2 * i} k=2 ns=2 acc=1 draft=[ {i} 99 ] emit=[ {i} 7 ]"


# The children print with the same formula (block(i) == _block(i)).
_PREAMBLE = """import os, sys, time, json
def err(s):
    print(s, file=sys.stderr, flush=True)
def block(i, req="a"):
    return f"[SPECTRACE] req={req} pos={10 + 2 * i} k=2 ns=2 acc=1 draft=[ {i} 99 ] emit=[ {i} 7 ]"
"""


def _child(tmp_path: Path, body: str, name: str = "child.py") -> Path:
    p = tmp_path / name
    p.write_text(_PREAMBLE + textwrap.dedent(body))
    return p


def _spectrace(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([SPECTRACE, *args], capture_output=True, text=True, timeout=60, **kw)


def test_forwards_stderr_and_returns_exit_status(tmp_path):
    child = _child(
        tmp_path,
        """
        print("to stdout", flush=True)
        err("vllm.cpp: request a has outgrown the draft speculative context (4096 tokens)")
        for i in range(3):
            err(block(i))
        err("env VT_SPEC_TRACE=" + os.environ["VT_SPEC_TRACE"])
        reqs = {"req_id": "a", "prompt_ids": list(range(100, 110)),
                "output_ids": [0, 7, 1, 7, 2, 7]}
        open(sys.argv[1], "w").write(json.dumps(reqs) + "\\n")
        sys.exit(3)
    """,
    )
    out, reqs, log = tmp_path / "t.h5", tmp_path / "r.jsonl", tmp_path / "raw.log"
    env = {k: v for k, v in os.environ.items() if k != "VT_SPEC_TRACE"}
    r = _spectrace(
        "capture",
        "-o",
        str(out),
        "--requests",
        str(reqs),
        "--log",
        str(log),
        "--",
        PY,
        str(child),
        str(reqs),
        env=env,
    )
    assert r.returncode == 3
    assert r.stdout == "to stdout\n"
    lines = r.stderr.splitlines()
    expected = [
        "vllm.cpp: request a has outgrown the draft speculative context (4096 tokens)",
        _block(0),
        _block(1),
        _block(2),
        "env VT_SPEC_TRACE=1",
    ]
    assert lines[:5] == expected  # every line forwarded, trace lines too, in order
    assert len(lines) == 6 and lines[5].startswith(
        "spectrace: captured 3 blocks of 1 request from python"
    )
    assert lines[5].endswith(
        f"-> {out}, 1 anchors resolved from the requests file; command exit status 3"
    )
    assert log.read_text().splitlines() == expected
    t = open_trace(out)
    assert t.status == "complete"
    assert t.blocks.position.tolist() == [9, 11, 13]
    assert t.blocks.anchor.tolist() == [109, 7, 7]  # the first one patched after exit
    assert t.requests.finish_reason == [""]
    assert t.meta["exit_status"] == 3 and t.meta["trace_level"] == 1
    assert t.meta["capture"] == {"ended": "engine-exit", "exit_status": 3, "signal": None}
    assert t.meta["command"].endswith(f"{child} {reqs}")
    # The raw log imports to the same blocks.
    import_log(log, tmp_path / "u.h5", requests_path=reqs, strict=True)
    assert open_trace(tmp_path / "u.h5").blocks.anchor.tolist() == [109, 7, 7]


def test_keeps_the_users_trace_level(tmp_path, capfd):
    child = _child(
        tmp_path,
        """
        err("level " + os.environ["VT_SPEC_TRACE"])
        err("[spec-phase-dev] pre=1.00ms fwd=2.00ms select=3.00ms walk=4.00ms")
        err("[spec-phase] pre=0.50ms backbone=0.25ms sample=9.00ms logits=9")
    """,
    )
    os.environ["VT_SPEC_TRACE"] = "2"
    try:
        assert capture_command([PY, str(child)], tmp_path / "t.h5") == 0
    finally:
        del os.environ["VT_SPEC_TRACE"]
    err = capfd.readouterr().err
    assert err.startswith("level 2\n")
    t = open_trace(tmp_path / "t.h5")
    assert t.meta["trace_level"] == 2
    assert t.phases()["level"].tolist() == [2] * 7


@pytest.mark.parametrize(
    "value,level",
    [
        (None, 0),
        ("", 0),
        ("0", 0),
        ("01", 0),
        ("1", 1),
        ("3", 3),
        ("yes", 1),
        ("-1", 1),
        (" 2x", 2),
    ],
)
def test_trace_level_latch(value, level):
    assert trace_level(value) == level


def test_command_that_cannot_start(tmp_path):
    with pytest.raises(InputError, match=r"^/nonexistent/engine: cannot run this command"):
        capture_command(["/nonexistent/engine"], tmp_path / "t.h5")
    assert list(tmp_path.iterdir()) == []  # no empty trace left behind
    r = _spectrace("capture", "-o", str(tmp_path / "t.h5"), "--", "/nonexistent/engine")
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        "spectrace: error: /nonexistent/engine: cannot run this command (No such file or directory)"
    ]


def test_missing_requests_file_is_a_warning(tmp_path, capfd):
    child = _child(tmp_path, "err(block(0))\nsys.exit(0)\n")
    assert (
        capture_command([PY, str(child)], tmp_path / "t.h5", requests_path=tmp_path / "nope.jsonl")
        == 0
    )
    err = capfd.readouterr().err.splitlines()
    assert err[1] == (
        f"spectrace: warning: {tmp_path / 'nope.jsonl'}: no such requests file; "
        f"first-block anchors stay unknown (-1)"
    )
    t = open_trace(tmp_path / "t.h5")
    assert t.blocks.anchor.tolist() == [-1]
    assert "no such requests file" in t.meta["requests_error"]


def test_stale_requests_file_is_ignored(tmp_path, capfd):
    stale = tmp_path / "r.jsonl"
    stale.write_text('{"req_id": "a", "prompt_ids": [1], "output_ids": []}\n')
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    child = _child(tmp_path, "err(block(0))\n")
    assert capture_command([PY, str(child)], tmp_path / "t.h5", requests_path=stale) == 0
    assert f"{stale}: requests file is older than the command" in capfd.readouterr().err
    t = open_trace(tmp_path / "t.h5")
    assert t.blocks.anchor.tolist() == [-1] and t.requests.prompt_ids[0].tolist() == []


def test_strict_stops_the_command_and_keeps_what_it_captured(tmp_path):
    """A strict capture stopped by a malformed line keeps its ``.partial`` (CMD's stderr is
    gone: the block before that line exists nowhere else), marked ``capture-failed``."""
    child = _child(
        tmp_path,
        """
        err(block(0))
        err("[SPECTRACE] req=a pos=x")
        time.sleep(30)
    """,
    )
    partial = tmp_path / "t.h5.partial"
    t0 = time.monotonic()
    why = f"{Path(PY).name} stderr:2: malformed trace line: pos=x is not an integer"
    with pytest.raises(ParseError) as e:
        capture_command([PY, str(child)], tmp_path / "t.h5", strict=True)
    assert str(e.value) == f"{why} (partial trace {partial} kept)"
    assert time.monotonic() - t0 < 15  # the child was terminated, not waited for
    assert sorted(p.name for p in tmp_path.iterdir()) == ["child.py", "t.h5.partial"]
    t = open_trace(partial)
    assert len(t.blocks) == 1 and int(t.blocks.position[0]) == 9  # block(0): pos=10, anchor 9
    assert t.meta["capture"]["ended"] == "capture-failed"
    assert t.meta["capture"]["error"] == why and t.meta["aborted"] == why


def _signalled(tmp_path, sig: int, on_signal: str) -> tuple[subprocess.Popen, str]:
    """Capture a child that prints block 0, then waits; send ``sig`` to spectrace only (it
    must forward it); the child runs ``on_signal`` (Python lines) in its handler. Returns the
    process and the stderr that followed block 0."""
    handler = "".join(f"\n            {line.strip()}" for line in on_signal.strip().splitlines())
    child = _child(
        tmp_path,
        f"""
        import signal
        def stop(*_):{handler}
        signal.signal({int(sig)}, stop)
        err(block(0))
        time.sleep(30)
    """,
    )
    proc = subprocess.Popen(
        [SPECTRACE, "capture", "-o", str(tmp_path / "t.h5"), "--", PY, str(child)],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr.readline().strip() == _block(0)
    proc.send_signal(sig)
    return proc, proc.stderr.read()


def test_sigint_is_forwarded_and_exit_is_130(tmp_path):
    proc, rest = _signalled(
        tmp_path,
        signal.SIGINT,
        """
        err("child: stopping")
        err(block(1))
        sys.exit(1)
    """,
    )
    assert proc.wait(timeout=20) == 130
    assert rest.splitlines()[:2] == ["child: stopping", _block(1)]
    t = open_trace(tmp_path / "t.h5")
    assert len(t.blocks) == 2 and t.meta["interrupted"] is True and t.meta["exit_status"] == 1
    assert t.meta["capture"] == {"ended": "interrupted", "exit_status": 1, "signal": 2}


def test_sigterm_is_forwarded_and_the_trace_is_finished(tmp_path):
    """`timeout` and CI stop with SIGTERM: the child gets it, every block is kept and the
    trace is renamed as after a normal exit; the status reports the signal (143)."""
    proc, rest = _signalled(
        tmp_path,
        signal.SIGTERM,
        """
        err(block(1))
        sys.exit(0)
    """,
    )
    assert proc.wait(timeout=20) == 143
    assert _block(1) in rest.splitlines() and "spectrace: captured 2 blocks" in rest
    t = open_trace(tmp_path / "t.h5")  # the final name: no .partial left
    assert len(t.blocks) == 2 and t.meta["interrupted"] is True


def _flushed_blocks(out: Path) -> int:
    # Peek at the file being written (read-only; a read racing a flush just retries).
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TraceWarning)
            with open_trace(out) as t:
                return len(t.blocks)
    except Exception:
        return 0


def test_kill_9_of_spectrace_keeps_every_flushed_block(tmp_path):
    """Every block flushed (background flush, 1 s) before a SIGKILL of spectrace survives."""
    pidfile, marker = tmp_path / "child.pid", tmp_path / "printed"
    n = 12
    child = _child(
        tmp_path,
        f"""
        open({str(pidfile)!r}, "w").write(str(os.getpid()))
        for i in range({n}):
            err(block(i))
            time.sleep(0.02)
        open({str(marker)!r}, "w").write("done")
        time.sleep(60)
    """,
    )
    out = tmp_path / "t.h5"
    proc = subprocess.Popen(
        [SPECTRACE, "capture", "-o", str(out), "--", PY, str(child)], stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 20
        while not marker.exists():
            assert time.monotonic() < deadline, "child did not print its blocks"
            time.sleep(0.05)
        while _flushed_blocks(out) < n:  # the background flush runs every second
            assert time.monotonic() < deadline, "the blocks were never flushed"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if pidfile.exists():
            try:
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert not out.exists()
    with pytest.warns(TraceWarning, match="not closed cleanly"):
        t = open_trace(out)  # resolves to t.h5.partial
    assert t.status == "recording"
    assert t.blocks.position.tolist() == [9 + 2 * i for i in range(n)]
    assert t.blocks.verified[:, 0].tolist() == list(range(n))
    assert t.meta["capture"] == {"ended": None, "exit_status": None, "signal": None}
    r = _spectrace("info", str(out))  # the killed capture, said in the text table
    assert "capture killed or still running (the file was never finished)" in r.stdout
    # Missing work, not silence: check and diff (against itself, closed) exit 1.
    closed = tmp_path / "closed.h5"
    with TraceWriter(closed, dict(t.meta, capture={"ended": "clean"}), flush_interval=0) as w:
        for i in range(n):
            w.add_block("a", 0, 10 + 2 * i, i, [i, 99], verified=[i, 99], accepted=1)
    for args, side in ((["check", str(out)], "trace"), (["diff", str(out), str(closed)], "ours")):
        r = _spectrace(*args, "--format", "json")
        assert r.returncode == 1, (args, r.stdout[-1500:], r.stderr[-1500:])
        (f,) = [f for f in json.loads(r.stdout)["findings"] if f["kind"] == "capture_incomplete"]
        assert f["evidence"]["ended"] == "capture-killed" and f["side"] == side
        assert "the trace file was never closed" in f["message"]
    twin = _spectrace("check", str(closed), "--format", "json")  # the same blocks, closed
    assert twin.returncode == 0, twin.stdout[-1500:]
    assert [f["kind"] for f in json.loads(twin.stdout)["findings"]] == []


# -- vLLM ---------------------------------------------------------------------------------------


def test_capture_vllm_sets_out_and_reports_files(tmp_path, capfd, monkeypatch):
    # A stand-in for a vLLM script whose plugin writes OUT and a DP-rank sibling.
    child = _child(
        tmp_path,
        """
        from spectrace.tracer.store import TraceWriter
        out = os.environ["SPECTRACE_OUT"]
        assert os.path.isabs(out)
        for rank, path, n in ((0, out, 2), (1, out[:-3] + ".dp1.h5", 1)):
            with TraceWriter(path, {"k": 2, "dp_rank": rank}, flush_interval=0) as w:
                for i in range(n):
                    w.add_block("r" + str(i), 0, 5, 1, [2, 3])
        print("generated", flush=True)
        sys.exit(4)
    """,
    )
    (tmp_path / "other.h5").write_text("not ours")
    monkeypatch.chdir(tmp_path)
    status = capture_vllm([PY, str(child)], "run.h5")
    assert status == 4
    cap = capfd.readouterr()
    assert cap.out == "generated\n"
    assert cap.err.splitlines() == [
        f"spectrace: wrote {tmp_path / 'run.dp1.h5'}, {tmp_path / 'run.h5'}: 3 blocks of "
        f"3 requests; command exit status 4"
    ]  # r0 is in both files
    assert written_traces(tmp_path / "run.h5") == [tmp_path / "run.dp1.h5", tmp_path / "run.h5"]


def test_capture_vllm_without_plugin_output_fails(tmp_path, capfd):
    """A command that exits 0 without the plugin recording anything (spectrace not in its
    Python) captured nothing: exit 1, not the command's 0. The twin with a trace is
    :func:`test_capture_vllm_sets_out_and_reports_files` (the command's own status kept)."""
    child = _child(tmp_path, "sys.exit(0)\n")
    assert capture_vllm([PY, str(child)], tmp_path / "run.h5") == 1
    err = capfd.readouterr().err.splitlines()
    assert err[0].startswith(f"spectrace: warning: no trace was written to {tmp_path / 'run.h5'}")
    assert err[0].endswith("; command exit status 0")
    assert err[1:] == [
        "spectrace: error: the command exited 0 but recorded no trace: exit status 1"
    ]


def test_capture_vllm_without_plugin_output_keeps_a_failing_status(tmp_path):
    child = _child(tmp_path, "sys.exit(5)\n")
    assert capture_vllm([PY, str(child)], tmp_path / "run.h5") == 5


def test_capture_vllm_forwards_sigint(tmp_path):
    child = _child(
        tmp_path,
        """
        import signal
        def stop(*_):
            print("child: stopping", flush=True)
            sys.exit(1)
        signal.signal(signal.SIGINT, stop)
        print("ready", flush=True)
        time.sleep(30)
    """,
    )
    proc = subprocess.Popen(
        [SPECTRACE, "capture", "vllm", "-o", str(tmp_path / "run.h5"), "--", PY, str(child)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGINT)  # to spectrace only: it must forward it
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 130
    assert out == "child: stopping\n"
    assert err.startswith("spectrace: warning: no trace was written")
    assert err.rstrip().endswith("command exit status 130")


# -- how the command ended (issue 12 item 5) ---------------------------------------------------


def test_engine_killed_by_sigkill_is_recorded_and_shown(tmp_path):
    child = _child(
        tmp_path,
        """
        import signal
        err(block(0))
        os.kill(os.getpid(), signal.SIGKILL)
    """,
    )
    out = tmp_path / "t.h5"
    r = _spectrace("capture", "-o", str(out), "--", PY, str(child))
    assert r.returncode == 137
    assert r.stderr.splitlines()[-1].endswith(f"-> {out}; command killed by signal 9")
    t = open_trace(out)
    assert t.status == "complete" and len(t.blocks) == 1
    assert t.meta["capture"] == {"ended": "engine-signal", "exit_status": 137, "signal": 9}
    assert t.meta["killed_by_signal"] == 9 and t.meta["exit_status"] == 137  # older keys
    info = _spectrace("info", str(out))
    assert "command KILLED by signal 9 (exit status 137)" in info.stdout


def test_clean_exit_is_recorded(tmp_path):
    child = _child(tmp_path, "err(block(0))\n")
    assert capture_command([PY, str(child)], tmp_path / "t.h5", forward_trace_lines=False) == 0
    t = open_trace(tmp_path / "t.h5")
    assert t.meta["capture"] == {"ended": "clean", "exit_status": 0, "signal": None}
    assert "command exited cleanly (exit status 0)" in _spectrace("info", str(t.paths[0])).stdout


def test_capture_without_blocks_warns(tmp_path):
    out = tmp_path / "t.h5"
    r = _spectrace("capture", "-o", str(out), "--", "echo", "hi")
    assert r.returncode == 0 and r.stdout == "hi\n"
    lines = r.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("spectrace: captured 0 blocks of 0 requests")
    assert lines[1] == (
        "spectrace: warning: echo stderr: no [SPECTRACE] verify lines, so the trace has no "
        "blocks (was VT_SPEC_TRACE set, and does this command run our engine with drafts?)"
    )
    assert open_trace(out).meta["capture"]["ended"] == "clean"


def test_capture_requests_mismatch_warns_or_fails_strict(tmp_path):
    child = _child(
        tmp_path,
        """
        err(block(0))
        reqs = {"req_id": "zz", "prompt_ids": [1] * 10, "output_ids": [0, 7]}
        open(sys.argv[1], "w").write(json.dumps(reqs) + "\\n")
    """,
    )
    out, reqs = tmp_path / "t.h5", tmp_path / "r.jsonl"
    args = ["capture", "-o", str(out), "--requests", str(reqs), "--", PY, str(child), str(reqs)]
    r = _spectrace(*args)
    text = (
        f"{reqs}: does not match {Path(PY).name} stderr: 1 of 1 log requests are not in it "
        f"(first: req=a); 1 of its 1 requests are not in the log (first: req=zz)"
    )
    assert r.returncode == 0 and r.stderr.splitlines()[-1] == f"spectrace: warning: {text}"
    assert open_trace(out).meta["import"]["requests_check"]["missing"] == 1
    out.unlink()
    r = _spectrace(*args[:5], "--strict", *args[5:])
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1] == (
        f"spectrace: error: {text} (partial trace {out}.partial kept)"
    )
    assert not out.exists()
    kept = open_trace(f"{out}.partial")  # the captured block is not lost
    assert len(kept.blocks) == 1 and kept.meta["capture"]["ended"] == "capture-failed"


# -- capture vllm --timeout ----------------------------------------------------------------------

# A stand-in for a hung vLLM script: the "plugin" writes one block to SPECTRACE_OUT, flushes it,
# then the script hangs. ON_TERM decides what SIGTERM does.
_HUNG = """
import signal
from spectrace.tracer.store import TraceWriter
w = TraceWriter(os.environ["SPECTRACE_OUT"], {{"k": 2, "engine": "vllm"}}, flush_interval=0)
w.add_block("r0", 0, 5, 1, [2, 3])
w.flush()
{on_term}
print("ready", flush=True)
time.sleep(60)
"""


def test_timeout_stops_a_hung_command_and_finishes_the_trace(tmp_path, capfd):
    # The script closes its trace on SIGTERM, like vLLM's shutdown path.
    on_term = "signal.signal(signal.SIGTERM, lambda *a: (w.close(), sys.exit(143)))"
    child = _child(tmp_path, _HUNG.format(on_term=on_term))
    out = tmp_path / "run.h5"
    t0 = time.monotonic()
    assert capture_vllm([PY, str(child)], out, timeout=2) == 124
    assert time.monotonic() - t0 < 8
    err = capfd.readouterr().err.splitlines()
    assert err == [
        "spectrace: timeout: the command ran longer than 2 s; sent it SIGTERM",
        f"spectrace: wrote {out}: 1 blocks of 1 requests; command exit status 124",
    ]
    t = open_trace(out)
    assert t.status == "complete" and len(t.blocks) == 1
    assert t.meta["capture"] == {
        "ended": "timeout",
        "exit_status": 143,
        "signal": 15,
        "timeout_s": 2,
    }


def test_timeout_kills_a_command_that_ignores_sigterm(tmp_path, capfd):
    child = _child(tmp_path, _HUNG.format(on_term="signal.signal(signal.SIGTERM, signal.SIG_IGN)"))
    out = tmp_path / "run.h5"
    assert capture_vllm([PY, str(child)], out, timeout=1.5, kill_grace=1) == 124
    err = capfd.readouterr().err.splitlines()
    assert err[0] == (
        "spectrace: timeout: the command ran longer than 1.5 s; sent it SIGTERM, then SIGKILL"
    )
    assert not out.exists()
    with pytest.warns(TraceWarning):
        t = open_trace(out)  # the .partial the killed writer left, readable
    assert len(t.blocks) == 1
    assert t.meta["capture"] == {
        "ended": "timeout",
        "exit_status": 137,
        "signal": 9,
        "timeout_s": 1.5,
    }


def test_cli_timeout_exits_124(tmp_path):
    child = _child(tmp_path, "time.sleep(60)\n")
    out = tmp_path / "run.h5"
    t0 = time.monotonic()
    r = _spectrace("capture", "vllm", "--timeout", "1", "-o", str(out), "--", PY, str(child))
    assert r.returncode == 124 and time.monotonic() - t0 < 8
    assert r.stderr.splitlines()[0] == (
        "spectrace: timeout: the command ran longer than 1 s; sent it SIGTERM"
    )


def test_no_timeout_clean_twin(tmp_path, capfd):
    child = _child(tmp_path, _HUNG.format(on_term="w.close(); sys.exit(0)"))
    out = tmp_path / "run.h5"
    assert capture_vllm([PY, str(child)], out, timeout=30) == 0
    t = open_trace(out)
    assert t.meta["capture"] == {"ended": "clean", "exit_status": 0, "signal": None}
