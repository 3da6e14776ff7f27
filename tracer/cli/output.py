"""The one output module: diagnostics on stderr, data on stdout, a rich console for reports.

stdout carries data only; diagnostics go to stderr as one line prefixed ``spectrace:``. Used by
the CLI, the demo, the capture runners and the vLLM plugin. Loads rich only inside
:func:`console`, so the plugin and the capture runners stay light.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.console import Console


def say(msg: str) -> None:
    """Print one diagnostic line to stderr, prefixed ``spectrace:``, and flush it. Control
    characters (a request id's newline or terminal escape, read from a trace or a log) are
    written as their escapes: the line stays one line and cannot drive the terminal."""
    try:
        print(f"spectrace: {one_line(msg)}", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr closed (interpreter exit, a reader gone)
        pass


def one_line(text: str) -> str:
    """``text`` with each unprintable character (``\\n``, ``\\t``, ``\\x1b``...) as its
    Python escape; printable text, any script, as it is."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """A :data:`warnings.showwarning` replacement: one ``spectrace: warning: ...`` line."""
    say(f"warning: {message}")


def stdout_to_devnull() -> None:
    """stdout's reader left (``spectrace diff ... | head``): send the rest to /dev/null so
    the command still exits with its own status (a verdict, not a write error)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def out(text: str) -> None:
    """Print a data document (JSON, schema text) on stdout."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        stdout_to_devnull()


def console() -> Console:
    """A rich Console on stdout: colour only on a TTY and never with NO_COLOR."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            stdout_to_devnull()  # rich would exit 1, which here means "diverged"

    # Piped or redirected, rich would lay tables out for 80 columns and cut numbers short
    # ("2092746/31…"): data on stdout is never truncated, so give it room (COLUMNS wins).
    piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return _Console(
        no_color=bool(os.environ.get("NO_COLOR")),
        highlight=False,
        soft_wrap=True,
        width=160 if piped else None,
    )
