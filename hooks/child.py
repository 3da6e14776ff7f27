"""The captured command as a child process: start it, forward Ctrl-C/SIGTERM, stop it at a
timeout, and describe how it ended (the ``meta["capture"]`` record of
:data:`spectrace.tracer.schema.CAPTURE_END`). Used by :mod:`spectrace.hooks.capture`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from spectrace.tracer.cli.exit_codes import ExitCode
from spectrace.tracer.errors import InputError

from .watchdog import GRACE

__all__ = [
    "KILL_GRACE",
    "TIMEOUT_STATUS",
    "SignalForwarder",
    "capture_end",
    "exit_meta",
    "exit_status",
    "run_forwarding",
    "run_until",
    "start",
    "stop",
    "stop_group",
]

# Seconds a Ctrl-C'd child gets to stop by itself before SIGINT is forwarded (a terminal
# Ctrl-C already reached it: the same process group), and after SIGTERM before a kill.
_INTERRUPT_GRACE = 0.5
KILL_GRACE = 10.0
#: Exit status after ``--timeout`` stopped CMD (the convention of coreutils ``timeout``).
TIMEOUT_STATUS = 124
#: Seconds between two looks of the watchdog (``run_until(watch=...)``).
WATCH_POLL = 0.5


def exit_status(returncode: int) -> int:
    """The shell's exit status for a Popen returncode (``-N``, killed by signal N: 128+N)."""
    return 128 - returncode if returncode < 0 else returncode  # -N: killed by signal N


def capture_end(
    returncode: int | None,
    *,
    interrupted: int | None = None,
    timed_out: int | None = None,
    error: str | None = None,
) -> dict:
    """The ``meta["capture"]`` record (see :data:`spectrace.tracer.schema.CAPTURE_END`).

    Args:
        returncode: CMD's Popen returncode (``-N``: signal N), None if it never ran.
        interrupted: the signal spectrace received and forwarded (SIGINT/SIGTERM), or None.
        timed_out: the last signal ``--timeout`` sent (SIGTERM or SIGKILL), or None.
        error: why spectrace stopped CMD itself (strict parse error, a bug), or None.
    Returns:
        ``{"ended": str | None, "exit_status": int | None, "signal": int | None}``.
    """
    status = None if returncode is None else exit_status(returncode)
    sig = -returncode if returncode is not None and returncode < 0 else None
    ended: str | None
    if error is not None:
        ended = "capture-failed"
    elif timed_out is not None:
        ended, sig = "timeout", timed_out
    elif interrupted is not None:
        ended, sig = "interrupted", interrupted
    elif returncode is None:
        ended = None
    elif sig is not None:
        ended = "engine-signal"
    else:
        ended = "clean" if status == 0 else "engine-exit"
    rec: dict = {"ended": ended, "exit_status": status, "signal": sig}
    if error is not None:
        rec["error"] = error
    return rec


def exit_meta(returncode: int | None, interrupted: int | None = None, **kw) -> dict:
    """/meta items describing how CMD ended: ``capture`` (:func:`capture_end`) and the
    older keys ``exit_status``, ``killed_by_signal``, ``interrupted`` (kept for readers)."""
    items: dict = {
        "capture": capture_end(returncode, interrupted=interrupted, **kw),
        "exit_status": None if returncode is None else exit_status(returncode),
        "interrupted": interrupted is not None,
    }
    if returncode is not None and returncode < 0:
        items["killed_by_signal"] = -returncode
    return items


def start(cmd: list[str], env: dict, **kw) -> subprocess.Popen:
    if not cmd:
        raise InputError("no command given (spectrace capture -o OUT -- CMD ...)")
    try:
        return subprocess.Popen(cmd, env=env, **kw)
    except OSError as exc:
        raise InputError(f"{cmd[0]}: cannot run this command ({exc.strerror or exc})") from None


class SignalForwarder:
    """While active, Ctrl-C never raises in spectrace (it could land mid-record and lose a
    block): the first SIGINT is forwarded to CMD after a short grace (a terminal's Ctrl-C
    reaches CMD by itself, being in the same process group), a second one kills CMD.
    SIGTERM is forwarded at once. Only the main thread can own the handlers; elsewhere this
    is a no-op."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.count = 0
        self.terminated = False
        # The handlers replaced on entry (signal.signal's return), restored on exit.
        self._old: Any = None
        self._old_term: Any = None
        self._timer: threading.Timer | None = None

    @property
    def interrupted(self) -> bool:
        """True once a SIGINT or SIGTERM arrived."""
        return self.count > 0 or self.terminated

    @property
    def status(self) -> int:
        """The exit status that reports the signal: 143 after SIGTERM, else 130."""
        return 128 + signal.SIGTERM if self.terminated else ExitCode.INTERRUPT

    @property
    def signal(self) -> int | None:
        """The signal received (SIGTERM wins over SIGINT), None before any."""
        if self.terminated:
            return int(signal.SIGTERM)
        return int(signal.SIGINT) if self.count else None

    def __enter__(self) -> SignalForwarder:
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._on_sigint)
            # SIGTERM (timeout, CI, a service manager) is forwarded at once; the trace is
            # then finished and renamed like after a normal exit.
            self._old_term = signal.signal(signal.SIGTERM, self._on_sigterm)
        return self

    def __exit__(self, *exc) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
        if self._old_term is not None:
            signal.signal(signal.SIGTERM, self._old_term)
        if self._timer is not None:
            self._timer.cancel()

    def _on_sigterm(self, signum, frame) -> None:
        self.terminated = True
        self._send(signal.SIGTERM)

    def _on_sigint(self, signum, frame) -> None:
        self.count += 1
        if self.count == 1:
            self._timer = threading.Timer(_INTERRUPT_GRACE, self._send, (signal.SIGINT,))
            self._timer.daemon = True
            self._timer.start()
        else:
            self._send(signal.SIGKILL)

    def _send(self, sig: int) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:  # it exited in between
                pass


def stop(proc: subprocess.Popen) -> None:
    """Terminate the child, then kill it if it does not exit."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=KILL_GRACE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_forwarding(cmd: list[str], env: dict) -> int:
    """Run CMD with inherited stdin/stdout/stderr; forward Ctrl-C as SIGINT.

    Returns:
        CMD's exit status (``128+N`` if killed by signal N, 130 after Ctrl-C).
    Raises:
        InputError: CMD cannot be started.
    """
    return run_until(cmd, env)[0]


def run_until(
    cmd: list[str],
    env: dict,
    timeout: float | None = None,
    kill_grace: float = KILL_GRACE,
    watch: Callable[[int], dict | None] | None = None,
) -> tuple[int, dict]:
    """Run CMD like :func:`run_forwarding`; past ``timeout`` seconds stop its whole process
    group (:func:`stop_group`: CMD runs in a session of its own then, so engine-core
    children go too).

    Args:
        watch: polled every :data:`WATCH_POLL` s with CMD's pid; a dict it returns (a dead
            engine core, :class:`spectrace.hooks.watchdog.EngineCoreWatch`) gives CMD
            :data:`spectrace.hooks.watchdog.GRACE` s to exit, then stops its group.
    Returns:
        (exit status, :func:`capture_end` record); the status is :data:`TIMEOUT_STATUS`
        after a timeout; after the watchdog, ``128+N`` for an engine core killed by
        signal N (else 1), and the record is the engine core's (:func:`_watchdog_end`).
    """
    proc = start(cmd, env, start_new_session=timeout is not None or watch is not None)
    timed_out, died = None, None
    with SignalForwarder(proc) as sigint:
        try:
            returncode, died = _wait_watching(proc, timeout, watch)
            if died is not None:
                stop_group(proc, kill_grace)  # its group: the worker closes the trace
            returncode = proc.wait()
        except subprocess.TimeoutExpired:
            timed_out = stop_group(proc, kill_grace)
            returncode = proc.returncode
    if died is not None:
        return _watchdog_end(died, returncode)
    record = capture_end(returncode, interrupted=sigint.signal, timed_out=timed_out)
    if timed_out is not None:
        record["timeout_s"] = timeout
        return TIMEOUT_STATUS, record
    return (sigint.status if sigint.interrupted else exit_status(returncode)), record


def _wait_watching(
    proc: subprocess.Popen, timeout: float | None, watch: Callable[[int], dict | None] | None
) -> tuple[int | None, dict | None]:
    """Wait for CMD; returns (returncode, None), or (None, the watch's dict) once the watch
    saw a dead engine core and CMD did not exit within the grace.

    Raises:
        subprocess.TimeoutExpired: ``timeout`` seconds passed.
    """
    if watch is None:
        return proc.wait(timeout=timeout), None
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise subprocess.TimeoutExpired(proc.args, timeout or 0)
        try:
            return proc.wait(timeout=WATCH_POLL if left is None else min(WATCH_POLL, left)), None
        except subprocess.TimeoutExpired:
            pass
        died = watch(proc.pid)
        if died is not None:
            try:
                return proc.wait(timeout=GRACE), None  # it noticed and exited by itself
            except subprocess.TimeoutExpired:
                return None, died


def _watchdog_end(died: dict, returncode: int | None) -> tuple[int, dict]:
    """Exit status and ``meta["capture"]`` record after the watchdog stopped CMD because its
    engine core died: ``ended`` ``engine-signal`` (the engine core's signal) or
    ``engine-exit``, with ``engine_core`` (pid, signal, exit code) and ``watchdog``."""
    sig = died.get("signal")
    status = 128 + sig if sig else (died.get("exit_code") or 1)
    record = {
        "ended": "engine-signal" if sig else "engine-exit",
        "exit_status": status,
        "signal": sig,
        "engine_core": died,
        "watchdog": (
            f"vLLM's EngineCore (pid {died['pid']}) died "
            f"{f'of signal {sig}' if sig else 'without shutting down'}; spectrace stopped "
            f"the hung command"
        ),
        "command_exit_status": None if returncode is None else exit_status(returncode),
    }
    return status, record


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def stop_group(proc: subprocess.Popen, grace: float) -> int:
    """SIGTERM to CMD's process group; SIGKILL to what is left of it after ``grace`` s.

    Returns:
        The last signal sent (SIGTERM when everything exited within the grace).
    """
    pgid = proc.pid  # start_new_session: CMD leads its own group
    last = signal.SIGTERM
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    # Wait for the whole group: an engine core may still be closing its trace file.
    while time.monotonic() < deadline and (proc.poll() is None or _group_alive(pgid)):
        time.sleep(0.05)
    if proc.poll() is None or _group_alive(pgid):
        last = signal.SIGKILL
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    proc.wait()
    return int(last)
