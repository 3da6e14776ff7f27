"""The sessions of this process: found by trace path (the scheduler hands its counters to the
session writing the same trace in one-process mode) and closed at exit. Standard library
only, so the engine core reaches it without loading the writer."""

from __future__ import annotations

import atexit
import threading
from pathlib import Path
from typing import Any, Protocol

from spectrace.tracer.cli.output import say


class _Closable(Protocol):
    path: Path
    counters: Any

    def close(self) -> Path | None: ...


_sessions: list[_Closable] = []
_lock = threading.Lock()
_atexit_registered = False


def add(session: _Closable) -> None:
    """Register a session; the first one also registers :func:`close_all` at exit."""
    global _atexit_registered
    with _lock:
        _sessions.append(session)
        if not _atexit_registered:
            atexit.register(close_all)
            _atexit_registered = True


def waiting_for_counters(path: Path) -> _Closable | None:
    """The latest session writing ``path`` that has no counters yet, or None."""
    with _lock:
        found = [s for s in _sessions if s.path == path and s.counters is None]
    return found[-1] if found else None


def close_all() -> None:
    """Close every session of this process (each runs its cross-check). Runs at exit."""
    with _lock:
        sessions = list(_sessions)
    for s in sessions:
        try:
            s.close()
        except Exception as exc:
            say(f"ERROR closing {s.path}: {type(exc).__name__}: {exc}")
