"""The one output module: diagnostics on stderr, data on stdout, a rich console for reports.

stdout carries data only; diagnostics go to stderr as one line prefixed ``spectrace:``. Used by
the CLI, the demo, the capture runners and the vLLM plugin. Loads rich only inside
:func:`console`, so the plugin and the capture runners stay light.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

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


def finite(doc: Any) -> Any:
    """``doc`` with every non-finite float (NaN, +-inf; numpy's too) replaced by None, through
    dicts, lists and tuples (a tuple becomes a list, as JSON writes it); the rest as it is."""
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, dict):
        return {k: finite(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [finite(v) for v in doc]
    return doc


def json_text(doc: Any, default: Callable[[Any], Any] | None = None) -> str:
    """``doc`` as strict JSON (indent 2): a non-finite number is ``null``, never the bare
    ``NaN``/``Infinity`` that ``json.dumps`` writes by default and JSON parsers refuse.
    ``default`` converts what JSON has no type for (as ``json.dumps``'s)."""
    return json.dumps(finite(doc), indent=2, allow_nan=False, default=default)


def out_json(doc: Any, default: Callable[[Any], Any] | None = None) -> None:
    """Print a JSON document on stdout (``--format json``): strict JSON, see
    :func:`json_text`. Every command's JSON goes through here."""
    out(json_text(doc, default))


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
