"""Run an engine command and record its drafts while it runs (``spectrace capture``).

* :func:`capture_command` (our engine): runs CMD with ``VT_SPEC_TRACE=1`` (unless the variable
  is already set), parses its stderr live with :class:`VtTraceParser`, forwards every stderr
  byte to our stderr, and writes the trace as it goes (flushed every second, so a crash of
  either process keeps what was flushed).
* :func:`capture_vllm` (upstream vLLM): runs CMD with ``SPECTRACE_OUT`` set; spectrace's vLLM
  plugin (:mod:`spectrace.hooks.vllm`) records inside the engine processes. This side only
  runs the command and reports which trace files appeared.

Both return CMD's exit status (``128+N`` when a signal N killed it, 130 after Ctrl-C, which is
forwarded to CMD as SIGINT; 124 when ``capture vllm --timeout`` stopped it). How CMD ended is
recorded in ``meta["capture"]`` (:data:`spectrace.tracer.schema.CAPTURE_END`). A capture that
fails (strict parse error, a bug), is interrupted or is killed keeps its ``.partial`` file: CMD's
stderr is gone once read, so the blocks before the failure exist nowhere else (an import, whose
log stays on disk, removes its own). Diagnostics are one line on stderr prefixed ``spectrace:``.
"""

from __future__ import annotations

import os
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from spectrace.tracer.cli.output import say
from spectrace.tracer.errors import InputError, SpectraceError
from spectrace.tracer.schema import PARTIAL_SUFFIX
from spectrace.tracer.store import TraceWriter, open_trace
from spectrace.tracer.store.amend import amend_meta

from .child import (
    KILL_GRACE,
    SignalForwarder,
    capture_end,
    exit_meta,
    exit_status,
    run_forwarding,
    run_until,
    start,
    stop,
)
from .vllm.paths import ENV_OUT, written_traces
from .vt.importer import UNKNOWN_META, with_note
from .vt.level import ENV_VAR, trace_level
from .vt.parser import VtTraceParser
from .vt.requests import read_requests
from .watchdog import ENV_WATCH, EngineCoreWatch

__all__ = ["capture_command", "capture_vllm", "run_forwarding", "summarize_traces"]

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


#: Seconds the stderr pipe may stay silent after CMD exited before the capture stops reading
#: it: a process CMD started (a daemon, ``sleep &``, a child left behind by a SIGTERM'd
#: shell) may hold it open for ever, and the capture must still finish and say how CMD ended.
DRAIN_S = 2.0


def _stderr_lines(proc: subprocess.Popen, drain_s: float = DRAIN_S):
    """CMD's stderr, line by line (bytes, the newline kept; a last line without one too),
    until EOF, or until CMD has exited and the pipe stayed silent for ``drain_s`` seconds
    (then one warning line; what was read is kept). Reads whatever is available (no
    syscall per byte). Only each new chunk is searched for newlines and a long line's
    pieces are joined once, so a line of any length costs time linear in its bytes."""
    assert proc.stderr is not None  # started with stderr=PIPE
    fd = proc.stderr.fileno()
    pending: list[bytes] = []  # the pieces of the line read so far (no newline yet)
    quiet_since = None
    while True:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            quiet_since = None
            start = 0
            while (nl := chunk.find(b"\n", start)) >= 0:
                piece = chunk[start : nl + 1]
                yield b"".join([*pending, piece]) if pending else piece
                pending, start = [], nl + 1
            if start < len(chunk):
                pending.append(chunk[start:])
        elif proc.poll() is not None:
            now = time.monotonic()
            quiet_since = quiet_since or now
            if now - quiet_since >= drain_s:
                say(
                    f"warning: the command exited but a process it started still holds its "
                    f"stderr open; stopped reading it {drain_s:g} s later"
                )
                break
    if pending:
        yield b"".join(pending)


def _pump(proc: subprocess.Popen, parser: VtTraceParser, fwd: _Forwarder, log) -> None:
    for raw in _stderr_lines(proc):
        if fwd.trace_lines:
            fwd.write(raw)
        if log is not None:
            log.write(raw)
            log.flush()  # the raw log survives a kill like the trace does
        is_trace = parser.feed_line(raw.decode("utf-8", "surrogateescape"))
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
            (older than CMD) file, or one that does not match the log, is a warning (an
            error in strict mode): the trace keeps those anchors ``-1``.
        strict: stop at the first malformed/edited line or broken invariant: CMD is
            terminated, the ``.partial`` file is kept (the blocks before that line, /meta
            ``capture`` ended ``capture-failed``), ParseError is raised.
        meta: extra /meta items (``method``, ``k``, ``target_model``, ...).
        log_path: also write CMD's raw stderr bytes to this file (for ``import vt``).
        forward_trace_lines: False forwards only CMD's other stderr lines (quiet test runs).
    Returns:
        CMD's exit status (``128+N`` if signal N killed it; 130 after Ctrl-C).
    Raises:
        InputError: CMD cannot be started, or OUT or the log cannot be created; strict mode:
            the requests file is missing, bad or does not match the log.
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
            **UNKNOWN_META,  # as `import vt` of its log: the lines name no engine or method
            "command": shlex.join(cmd),
            "trace_level": level,
            "capture": capture_end(None),  # ended: None until CMD ends (a killed capture)
            **(meta or {}),
        },
    )
    log = None
    started = time.time()
    try:
        log = open(log_path, "wb") if log_path is not None else None
        proc = start(cmd, env, stderr=subprocess.PIPE)
    except (InputError, OSError) as exc:
        writer.discard()  # nothing was recorded
        if log is not None:
            log.close()
        if isinstance(exc, InputError):
            raise
        raise InputError(f"{log_path}: cannot write the log ({exc.strerror or exc})") from None
    parser = VtTraceParser(
        writer, strict=strict, source_name=f"{Path(cmd[0]).name} stderr", trace_level=level or None
    )
    try:
        sig = _run_parsing(proc, parser, writer, log, forward_trace_lines)
    finally:
        if log is not None:
            log.close()
    _finish_capture(parser, writer, requests_path, proc.returncode, sig, started)
    return 128 + sig if sig else exit_status(proc.returncode)


def _run_parsing(
    proc: subprocess.Popen,
    parser: VtTraceParser,
    writer: TraceWriter,
    log,
    forward_trace_lines: bool = True,
) -> int | None:
    """Pump CMD's stderr into the parser until EOF; returns the signal spectrace received
    meanwhile (SIGINT after Ctrl-C, SIGTERM), None when none did.

    On an exception (strict ParseError, a bug) CMD is stopped and the ``.partial`` file is
    kept (:func:`_keep_failed`); on a KeyboardInterrupt/SystemExit too."""
    try:
        with SignalForwarder(proc) as sigint:
            # After Ctrl-C too: CMD's last lines.
            _pump(proc, parser, _Forwarder(forward_trace_lines), log)
            proc.wait()
        return sigint.signal
    except BaseException as exc:
        stop(proc)
        parser.abort()
        why = f"{type(exc).__name__}: {exc}"[:300]
        if isinstance(exc, Exception):
            raise _keep_failed(writer, exc, proc.returncode) from None
        # KeyboardInterrupt/SystemExit outside the forwarder: keep what was recorded.
        writer.update_meta(
            **exit_meta(proc.returncode, interrupted=int(signal.SIGINT)), aborted=why
        )
        writer.close(complete=False)
        say(f"partial trace kept in {writer.partial_path}")
        raise


def _keep_failed(
    writer: TraceWriter, exc: Exception, returncode: int | None, sig: int | None = None
) -> Exception:
    """Close a failed capture's ``.partial`` file without completing it, /meta ``capture``
    ended ``capture-failed`` with the error; return the error to raise, which names the kept
    file (:func:`~.vt.importer.with_note`: `` (partial trace FILE kept)``)."""
    why = (str(exc) if isinstance(exc, SpectraceError) else f"{type(exc).__name__}: {exc}")[:300]
    writer.update_meta(**exit_meta(returncode, interrupted=sig, error=why), aborted=why)
    return with_note(exc, f"partial trace {writer.close(complete=False)} kept")


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
    sig: int | None,
    started: float,
) -> None:
    """Read the requests file, finish the parse, close OUT; say one summary line (plus one
    warning line each for a requests problem and a trace without blocks). In strict mode a
    requests problem keeps the ``.partial`` file (:func:`_keep_failed`) and raises InputError."""
    items: dict = exit_meta(returncode, interrupted=sig)
    try:
        if requests_path is not None:
            _apply_requests(parser, requests_path, started, items)
        stats = parser.finish()
    except Exception as exc:
        raise _keep_failed(writer, exc, returncode, sig) from None
    writer.update_meta(**items)
    path = writer.close(complete=True)
    patched = len(parser.late_patches)
    how = f"killed by signal {-returncode}" if returncode < 0 else f"exit status {returncode}"
    late = f", {patched} anchors resolved from the requests file" if patched else ""
    say(
        f"{stats.summary('captured')} -> {path}{late}; command {how}"
        f"{' (interrupted)' if sig else ''}"
    )
    for line in (stats.requests_warning(), stats.no_blocks_warning()):
        if line:
            say(f"warning: {line}")


def _apply_requests(
    parser: VtTraceParser, requests_path: str | os.PathLike, started: float, items: dict
) -> None:
    try:
        requests = _read_fresh_requests(requests_path, started)
    except InputError as exc:
        if parser.strict:
            raise
        items["requests_error"] = str(exc)
        say(f"warning: {exc}; first-block anchors stay unknown (-1)")
        return
    parser.set_requests(requests, source=str(requests_path))


# ------------------------------------------------------------------------------------------
# Upstream vLLM: the plugin records, we run and report
# ------------------------------------------------------------------------------------------


def capture_vllm(
    cmd: list[str],
    out: str | os.PathLike,
    timeout: float | None = None,
    kill_grace: float = KILL_GRACE,
    extra_env: dict[str, str] | None = None,
) -> int:
    """Run a vLLM script with spectrace's plugin recording to OUT; report what it wrote.

    Args:
        cmd: the command (e.g. ``python script.py``); its Python must have spectrace
            installed so vLLM loads the plugin (entry point ``vllm.general_plugins``).
        out: the trace file the plugin writes (it may add ``OUT.dpN.h5`` for DP ranks).
        timeout: seconds after which CMD's process group gets SIGTERM, then SIGKILL after
            ``kill_grace`` seconds (a hung engine); None: wait. Independently, a watchdog
            (:mod:`spectrace.hooks.watchdog`) stops CMD's group the same way when vLLM's
            EngineCore process died without shutting down (vLLM then hangs).
        extra_env: variables set for CMD on top of this process's environment (replay's
            ``SPECTRACE_MARGINS``), which is left as it is.
    Returns:
        CMD's exit status (``128+N`` if killed by signal N, 130 after Ctrl-C),
        :data:`TIMEOUT_STATUS` (124) after a timeout, or after the watchdog ``128+N`` for an
        EngineCore killed by signal N (1 when the signal is unknown); 1 when CMD exited 0
        but no trace file appeared (the plugin never loaded: missing work).
    Raises:
        InputError: CMD cannot be started.
    """
    out = Path(out).resolve()
    started = time.time() - 1.0  # mtime granularity
    with tempfile.TemporaryDirectory(prefix="spectrace-watch-") as watch_dir:
        env = {**os.environ, **(extra_env or {}), ENV_OUT: str(out), ENV_WATCH: watch_dir}
        status, record = run_until(
            cmd, env, timeout, kill_grace, watch=lambda pid: EngineCoreWatch(watch_dir, pid).dead()
        )
    files = written_traces(out, since=started)
    _record_end(files, record, group_stopped=record["ended"] == "timeout" or "watchdog" in record)
    if record["ended"] == "timeout":
        then = ", then SIGKILL" if record["signal"] == signal.SIGKILL else ""
        say(f"timeout: the command ran longer than {timeout:g} s; sent it SIGTERM{then}")
    if "watchdog" in record:
        say(f"watchdog: {record['watchdog']}")
    say(summarize_traces(files, out) + f"; command exit status {status}")
    if not files and status == 0:
        # Missing work: a CI step reading only this exit status must not pass.
        say("error: the command exited 0 but recorded no trace: exit status 1")
        return 1
    return status


def _record_end(files: list[Path], record: dict, group_stopped: bool) -> None:
    """Add ``meta["capture"]`` to the trace files CMD wrote. A ``.partial`` file is amended
    only when CMD's whole process group is known to be gone (its writer may live on)."""
    for f in files:
        if f.name.endswith(PARTIAL_SUFFIX) and not group_stopped:
            continue
        # The watchdog's reason goes in "aborted" too: what stopped the capture early.
        extra = {"aborted": record["watchdog"]} if "watchdog" in record else {}
        try:
            amend_meta(f, capture=record, **extra)
        except InputError as exc:
            say(f"warning: {exc}")


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
