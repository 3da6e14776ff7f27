"""Progress bars for long commands, on stderr when it is a terminal, never on a pipe.

The interface every long command and library function shares is a plain callback,
:data:`ProgressCallback` ``(done, total) -> None``: ``done`` units so far (bytes read, blocks
written, steps run), ``total`` the units expected (None when unknown: a spinner). Library
code (``hooks/``, headless ``tracer/``) only calls such a callback and never imports this
module or rich; a CLI command owns the display::

    with progress(os.path.getsize(log), "import vt") as cb:
        import_log(log, out, progress=cb)

Off (the callback does nothing) when stderr is not a TTY, ``TERM=dumb``, or
``SPECTRACE_PROGRESS=0``. The bar is transient (it is gone when the command ends) and never
writes to stdout, so data and ``spectrace:`` lines read as without it; rich is imported only
when a bar is shown.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

#: ``callback(done, total)``: units done so far; units expected, None when unknown.
ProgressCallback = Callable[[int, "int | None"], None]


def _noop(done: int, total: int | None = None) -> None:
    """The callback when no bar is shown."""


def enabled(stream=None) -> bool:
    """Whether a bar is shown on ``stream`` (default stderr): a TTY, ``TERM`` not ``dumb``,
    ``SPECTRACE_PROGRESS`` not ``0``."""
    s = sys.stderr if stream is None else stream
    try:
        tty = s.isatty()
    except (AttributeError, ValueError):  # closed or not a file
        return False
    if os.environ.get("SPECTRACE_PROGRESS", "") == "0" or os.environ.get("TERM") == "dumb":
        return False
    return bool(tty)


@contextmanager
def progress(total: int | None, label: str, *, stream=None) -> Iterator[ProgressCallback]:
    """A progress bar labelled ``label`` on stderr for the ``with`` block.

    Args:
        total: units expected (None: unknown, a spinner); a callback's own ``total``
            replaces it.
        label: what runs, e.g. ``import vt LOG``.
        stream: where the bar goes (default stderr); no bar unless it is a TTY.
    Yields:
        The :data:`ProgressCallback` to hand to the work (a no-op without a bar).
    """
    if not enabled(stream):
        yield _noop
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
    )
    con = Console(file=sys.stderr if stream is None else stream)
    with Progress(*columns, console=con, transient=True) as bar:
        task = bar.add_task(label, total=total)

        def update(done: int, new_total: int | None = None) -> None:
            bar.update(task, completed=done, total=total if new_total is None else new_total)

        yield update


__all__ = ["ProgressCallback", "enabled", "progress"]
