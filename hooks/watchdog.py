"""The ``capture vllm`` watchdog: notice a vLLM EngineCore process that died.

vLLM V1 runs its EngineCore (and, on one device, the model runner that writes the trace) in a
child process of the script. When that process is killed (SIGKILL, the OOM killer), the
front end waits for it for ever. The watchdog lets ``capture vllm`` end such a run:

* **Engine-core side** (:func:`announce_engine_core`, :func:`engine_core_stopping`, called by
  :mod:`spectrace.hooks.vllm.engine_core`): with :data:`ENV_WATCH` set, the engine-core
  process writes the file ``engine-core-PID`` in that directory when its scheduler is built,
  and removes it when ``EngineCore.shutdown`` begins (a clean stop).
* **Capture side** (:class:`EngineCoreWatch`, polled by :func:`spectrace.hooks.child.run_until`):
  an announced process that no longer runs (gone, or a zombie its parent never reaped)
  while its file is still there died without shutting down. Its exit code is read from
  ``/proc/PID/stat`` while it is a zombie (Linux), so the record can name the signal.

Standard library only (the engine-core side runs inside vLLM's processes).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

#: Directory where engine-core processes announce themselves (set by ``capture vllm``).
ENV_WATCH = "SPECTRACE_WATCH_DIR"
_PREFIX = "engine-core-"
#: Seconds the command gets to exit by itself after its engine core died.
GRACE = 2.0


def _marker(pid: int) -> Path | None:
    d = os.environ.get(ENV_WATCH)
    return Path(d) / f"{_PREFIX}{pid}" if d else None


def announce_engine_core() -> None:
    """Engine-core process: say that this process runs an EngineCore (no-op without
    :data:`ENV_WATCH`; never raises)."""
    m = _marker(os.getpid())
    if m is not None:
        with contextlib.suppress(OSError):
            m.write_text(str(os.getpid()))


def engine_core_stopping() -> None:
    """Engine-core process: a clean shutdown began; the watchdog stops watching it."""
    m = _marker(os.getpid())
    if m is not None:
        m.unlink(missing_ok=True)


def _proc_state(pid: int) -> tuple[str, int | None] | None:
    """``(state, exit_code)`` of process ``pid`` from ``/proc/PID/stat`` (exit_code is
    field 52, a ``wait`` status, meaningful for a zombie), or None when there is no such
    process or no /proc."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # fields 3.. (the name may hold spaces)
    code = int(fields[49]) if len(fields) > 49 else None
    return fields[0], code


def _alive(pid: int) -> tuple[bool, int | None]:
    """Whether ``pid`` still runs, and its ``wait`` status when it is a zombie."""
    state = _proc_state(pid)
    if state is not None:
        return state[0] not in ("Z", "X"), state[1]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False, None
    except PermissionError:
        return True, None
    return True, None


class EngineCoreWatch:
    """Capture side: which announced engine-core processes died without shutting down.

    Args:
        directory: the :data:`ENV_WATCH` directory handed to the command.
        command_pid: the command's own pid (an engine core in that very process, vLLM's
            in-process mode, ends with it and is not watched).
    """

    def __init__(self, directory: str | os.PathLike, command_pid: int | None = None) -> None:
        self.directory = Path(directory)
        self.command_pid = command_pid

    def dead(self) -> dict | None:
        """The first dead engine core: ``{"pid": int, "signal": int | None, "exit_code":
        int | None}`` (signal and exit code when it was still a zombie), else None."""
        for m in sorted(self.directory.glob(f"{_PREFIX}*")):
            try:
                pid = int(m.name[len(_PREFIX) :])
            except ValueError:
                continue
            if pid == self.command_pid:
                continue
            alive, status = _alive(pid)
            if alive or not m.exists():  # running, or it began a clean shutdown meanwhile
                continue
            sig = status & 0x7F if status else None
            code = (status >> 8) & 0xFF if status is not None and not sig else None
            return {"pid": pid, "signal": sig or None, "exit_code": code}
        return None
