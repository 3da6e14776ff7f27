"""Run an engine command and record its drafts while it runs (``spectrace capture``).

* :func:`capture_command` (our engine): runs CMD with ``VT_SPEC_TRACE=1`` (unless the variable
  is already set), parses its stderr live with :class:`VtTraceParser`, forwards every stderr
  byte to our stderr, and writes the trace as it goes (flushed every second, so a crash of
  either process keeps what was flushed).
* :func:`capture_vllm` (upstream vLLM): runs CMD with ``SPECTRACE_OUT`` set; spectrace's vLLM
  plugin (:mod:`spectrace.hooks.vllm`) records inside the engine processes. This side only
  runs the command and reports which trace files appeared.

Both return CMD's exit status (``128+N`` when a signal N killed it, 130 after Ctrl-C, which is
forwarded to CMD as SIGINT). Diagnostics are one line on stderr prefixed ``spectrace:``.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

from spectrace.tracer.cli.exit_codes import ExitCode
from spectrace.tracer.cli.output import say
from spectrace.tracer.errors import InputError, SpectraceError
from spectrace.tracer.store import TraceWriter, open_trace

from .vllm.paths import ENV_OUT, written_traces
from .vt.level import ENV_VAR, trace_level
from .vt.parser import DEFAULT_ENGINE, SOURCE, VtTraceParser
from .vt.requests import read_requests

__all__ = ["capture_command", "capture_vllm", "run_forwarding", "summarize_traces"]

# Seconds a Ctrl-C'd child gets to stop by itself before SIGINT is forwarded (a terminal
# Ctrl-C already reached it: the same process group), and after SIGTERM before a kill.
_INTERRUPT_GRACE = 0.5
_KILL_GRACE = 10.0


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode  # -N: killed by signal N


def _exit_meta(returncode: int | None) -> dict:
    """/meta items describing how CMD ended (``exit_status``, ``killed_by_signal``)."""
    if returncode is None:
        return {"exit_status": None}
    items: dict = {"exit_status": _exit_status(returncode)}
    if returncode < 0:
        items["killed_by_signal"] = -returncode
    return items


def _start(cmd: list[str], env: dict, **kw) -> subprocess.Popen:
    if not cmd:
        raise InputError("no command given (spectrace capture -o OUT -- CMD ...)")
    try:
        return subprocess.Popen(cmd, env=env, **kw)
    except OSError as exc:
        raise InputError(f"{cmd[0]}: cannot run this command ({exc.strerror or exc})") from None


class _SignalForwarder:
    """While active, Ctrl-C never raises in spectrace (it could land mid-record and lose a
    block): the first SIGINT is forwarded to CMD after a short grace (a terminal's Ctrl-C
    reaches CMD by itself, being in the same process group), a second one kills CMD.
    SIGTERM is forwarded at once. Only the main thread can own the handlers; elsewhere this
    is a no-op."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.count = 0
        self.terminated = False
        self._old = None
        self._old_term = None
        self._timer: threading.Timer | None = None

    @property
    def interrupted(self) -> bool:
        """True once a SIGINT or SIGTERM arrived."""
        return self.count > 0 or self.terminated

    @property
    def status(self) -> int:
        """The exit status that reports the signal: 143 after SIGTERM, else 130."""
        return 128 + signal.SIGTERM if self.terminated else ExitCode.INTERRUPT

    def __enter__(self) -> _SignalForwarder:
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


def _stop(proc: subprocess.Popen) -> None:
    """Terminate the child, then kill it if it does not exit."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=_KILL_GRACE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------------------------------
# Our engine: VT_SPEC_TRACE on stderr
# ------------------------------------------------------------------------------------------


class _Forwarder:
    """Copies the child's stderr lines to ours byte for byte (stops quietly if ours closes).
    With ``trace_lines=False`` only lines that are not trace lines pass (quiet captures)."""

    def __init__(self, trace_lines: bool = True) -> None:
        self._out = getattr(sys.stderr, "buffer", None)
        self.ok = True
        self.trace_lines = trace_lines

    def write(self, raw: bytes, is_trace: bool = False) -> None:
        if not self.ok or (is_trace and not self.trace_lines):
            return
        try:
            if self._out is not None:
                self._out.write(raw)
                self._out.flush()
            else:  # a text-only stderr (e.g. a test's capture object)
                sys.stderr.write(raw.decode("utf-8", "replace"))
                sys.stderr.flush()
        except (OSError, ValueError):
            self.ok = False  # our stderr is gone; keep recording anyway


def _pump(proc: subprocess.Popen, parser: VtTraceParser, fwd: _Forwarder, log) -> None:
    # A buffered pipe's readline returns each line as soon as the child has written it
    # (reads return what is available), without a syscall per byte.
    for raw in iter(proc.stderr.readline, b""):
        if fwd.trace_lines:
            fwd.write(raw)
        if log is not None:
            log.write(raw)
            log.flush()  # the raw log survives a kill like the trace does
        is_trace = parser.feed_line(raw.decode("utf-8", "replace"))
        if not fwd.trace_lines:
            fwd.write(raw, is_trace)


def capture_command(
    cmd: list[str],
    out: str | os.PathLike,
    requests_path: str | os.PathLike | None = None,
    strict: bool = False,
    meta: dict | None = None,
    log_path: str | os.PathLike | None = None,
    forward_trace_lines: bool = True,
) -> int:
    """Run CMD, record its ``VT_SPEC_TRACE`` stderr lines into OUT, return its exit status.

    Args:
        cmd: the command and its arguments (no shell).
        out: the trace file (``.h5``; ``.h5.partial`` while recording).
        requests_path: JSONL that CMD writes (``req_id``, ``prompt_ids``, ``output_ids``,
            ``finish_reason``); read after CMD exits to fill /requests and resolve the
            anchors of first blocks (patched into the closed file). A missing, bad or stale
            (older than CMD) file is a warning: the trace keeps those anchors ``-1``.
        strict: stop at the first malformed/edited line or broken invariant: CMD is
            terminated, the ``.partial`` file keeps what was recorded, ParseError is raised.
        meta: extra /meta items (``method``, ``k``, ``target_model``, ...).
        log_path: also write CMD's raw stderr bytes to this file (for ``import vt``).
        forward_trace_lines: False forwards only CMD's other stderr lines (quiet test runs).
    Returns:
        CMD's exit status (``128+N`` if signal N killed it; 130 after Ctrl-C).
    Raises:
        InputError: CMD cannot be started, or OUT or the log cannot be created.
        ParseError: strict mode.
    """
    env = dict(os.environ)
    env.setdefault(ENV_VAR, "1")
    level = trace_level(env[ENV_VAR])
    if level == 0:
        say(f"warning: {ENV_VAR}={env[ENV_VAR]!r} prints only the scheduler probes, no drafts")
    writer = TraceWriter(
        out,
        {
            "source": SOURCE,
            "engine": DEFAULT_ENGINE,
            "command": shlex.join(cmd),
            "trace_level": level,
            **(meta or {}),
        },
    )
    log = None
    started = time.time()
    try:
        log = open(log_path, "wb") if log_path is not None else None
        proc = _start(cmd, env, stderr=subprocess.PIPE)
    except (InputError, OSError) as exc:
        writer.close(complete=False)
        writer.partial_path.unlink(missing_ok=True)  # nothing was recorded
        if log is not None:
            log.close()
        if isinstance(exc, InputError):
            raise
        raise InputError(f"{log_path}: cannot write the log ({exc.strerror or exc})") from None
    parser = VtTraceParser(
        writer, strict=strict, source_name=f"{Path(cmd[0]).name} stderr", trace_level=level or None
    )
    try:
        interrupted = _run_parsing(proc, parser, writer, log, forward_trace_lines)
    finally:
        if log is not None:
            log.close()
    status = interrupted if interrupted else _exit_status(proc.returncode)
    _finish_capture(parser, writer, requests_path, proc.returncode, interrupted, started)
    return status


def _run_parsing(
    proc: subprocess.Popen,
    parser: VtTraceParser,
    writer: TraceWriter,
    log,
    forward_trace_lines: bool = True,
) -> int:
    """Pump CMD's stderr into the parser until EOF; returns 0, or the exit status that
    reports a Ctrl-C (130) or a SIGTERM (143) received meanwhile."""
    try:
        with _SignalForwarder(proc) as sigint:
            # After Ctrl-C too: CMD's last lines.
            _pump(proc, parser, _Forwarder(forward_trace_lines), log)
            proc.wait()
        return sigint.status if sigint.interrupted else 0
    except BaseException as exc:  # strict ParseError or a bug: keep what was recorded
        _stop(proc)
        parser.abort()
        writer.update_meta(
            **_exit_meta(proc.returncode), aborted=f"{type(exc).__name__}: {exc}"[:300]
        )
        writer.close(complete=False)
        if isinstance(exc, SpectraceError):
            say(f"partial trace kept in {writer.partial_path}")
        raise


def _read_fresh_requests(path: str | os.PathLike, started: float):
    """The requests CMD wrote; a file older than CMD is a previous run's (wrong anchors)."""
    p = Path(path)
    if p.exists() and p.stat().st_mtime < started - 1.0:  # 1 s: coarse file-system clocks
        raise InputError(f"{p}: requests file is older than the command (not rewritten)")
    return read_requests(p)


def _finish_capture(
    parser: VtTraceParser,
    writer: TraceWriter,
    requests_path: str | os.PathLike | None,
    returncode: int,
    interrupted: int,
    started: float,
) -> None:
    items: dict = {**_exit_meta(returncode), "interrupted": bool(interrupted)}
    if requests_path is not None:
        try:
            parser.set_requests(_read_fresh_requests(requests_path, started))
        except InputError as exc:
            items["requests_error"] = str(exc)
            say(f"warning: {exc}; first-block anchors stay unknown (-1)")
    stats = parser.finish()
    writer.update_meta(**items)
    path = writer.close(complete=True)
    patched = len(parser.late_patches)
    how = f"killed by signal {-returncode}" if returncode < 0 else f"exit status {returncode}"
    late = f", {patched} anchors resolved from the requests file" if patched else ""
    say(
        f"{stats.summary('captured')} -> {path}{late}; command {how}"
        f"{' (interrupted)' if interrupted else ''}"
    )


# ------------------------------------------------------------------------------------------
# Upstream vLLM: the plugin records, we run and report
# ------------------------------------------------------------------------------------------


def run_forwarding(cmd: list[str], env: dict) -> int:
    """Run CMD with inherited stdin/stdout/stderr; forward Ctrl-C as SIGINT.

    Returns:
        CMD's exit status (``128+N`` if killed by signal N, 130 after Ctrl-C).
    Raises:
        InputError: CMD cannot be started.
    """
    proc = _start(cmd, env)
    with _SignalForwarder(proc) as sigint:
        returncode = proc.wait()
    return sigint.status if sigint.interrupted else _exit_status(returncode)


def capture_vllm(cmd: list[str], out: str | os.PathLike) -> int:
    """Run a vLLM script with spectrace's plugin recording to OUT; report what it wrote.

    Args:
        cmd: the command (e.g. ``python script.py``); its Python must have spectrace
            installed so vLLM loads the plugin (entry point ``vllm.general_plugins``).
        out: the trace file the plugin writes (it may add ``OUT.dpN.h5`` for DP ranks).
    Returns:
        CMD's exit status (``128+N`` if killed by signal N, 130 after Ctrl-C).
    Raises:
        InputError: CMD cannot be started.
    """
    out = Path(out).resolve()
    started = time.time() - 1.0  # mtime granularity
    status = run_forwarding(cmd, {**os.environ, ENV_OUT: str(out)})
    files = written_traces(out, since=started)
    say(summarize_traces(files, out) + f"; command exit status {status}")
    return status


def summarize_traces(files: list[Path], out: Path) -> str:
    """One line: which trace files exist and how many blocks/requests they hold."""
    if not files:
        return (
            f"warning: no trace was written to {out} (is spectrace installed in the "
            f"command's Python environment, so vLLM loads its plugin?)"
        )
    names = ", ".join(str(p) for p in files)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # .partial files: said below instead
            with open_trace(files) as t:
                nb, nr, status = len(t.blocks), len(t.requests), t.status
    except SpectraceError as exc:
        return f"wrote {names} (unreadable: {exc})"
    partial = " (not closed cleanly)" if status != "complete" else ""
    return f"wrote {names}: {nb} blocks of {nr} requests{partial}"
