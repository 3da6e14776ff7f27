"""The ``spectrace`` entry point: the click group :func:`cli` and :func:`main`.

The group gathers the subcommands of :mod:`commands` (the composition root: only they reach
``hooks``, ``tui`` and ``engine``, through imports inside the command that needs them, so
``spectrace diff`` never loads textual, torch or vllm). :func:`main` maps every failure to one
``spectrace: error: ...`` line on stderr and an :class:`ExitCode`.
"""

from __future__ import annotations

import os
import sys
import warnings

import click

from ..errors import InputError, SpectraceError
from ..pages import prefer_small_pages
from .commands import COMMANDS
from .exit_codes import ExitCode
from .output import say, show_warning


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="spectrace", prog_name="spectrace")
def cli() -> None:
    """spectrace: per-anchor draft-token tracer and differ for speculative decoding.

    \b
    Typical first steps:
      spectrace demo                 run vLLM and the reference engine, diff them
      spectrace info TRACE.h5        one trace's metadata and acceptance
      spectrace diff OURS.h5 THEIRS.h5
    """


for _command in COMMANDS:
    cli.add_command(_command)


#: The failures :func:`main` turns into an exit code; anything else is a bug, reported by
#: :func:`_internal_error` (exit 3; the traceback only with ``SPECTRACE_DEBUG=1``).
_HANDLED = (
    click.exceptions.Abort,
    KeyboardInterrupt,
    click.ClickException,
    SpectraceError,
    BrokenPipeError,
)


def _exit_code(exc: BaseException) -> ExitCode:
    """Say what went wrong in one line and return the exit code for ``exc`` (one of
    :data:`_HANDLED`)."""
    if isinstance(exc, (click.exceptions.Abort, KeyboardInterrupt)):
        say("interrupted")
        return ExitCode.INTERRUPT
    if isinstance(exc, click.UsageError):
        cmd = exc.ctx.command_path if exc.ctx else "spectrace"
        say(f"error: {exc.format_message()} (see '{cmd} --help')")
        return ExitCode.INPUT
    if isinstance(exc, click.ClickException):
        say(f"error: {exc.format_message()}")
        return ExitCode.INPUT
    if isinstance(exc, SpectraceError):
        say(f"error: {exc}")
        return ExitCode.INPUT if isinstance(exc, InputError) else ExitCode.FAILURE
    return ExitCode.OK  # BrokenPipeError: stdout's reader left, not spectrace's failure


def _internal_error(exc: Exception) -> ExitCode:
    """A bug, not a verdict: one line and exit 3, never 1 (which CI reads as "diverged")."""
    say(
        f"internal error: {type(exc).__name__}: {exc} (a spectrace bug; rerun with "
        f"SPECTRACE_DEBUG=1 for the traceback and report it)"
    )
    return ExitCode.FAILURE


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``spectrace``): runs :func:`cli` with ``argv`` (default
    ``sys.argv[1:]``) and exits with an :class:`ExitCode` (commands exit with their verdict)."""
    warnings.showwarning = show_warning
    prefer_small_pages()
    if not (sys.argv[1:] if argv is None else argv):
        say(
            f"error: no command given; commands: {', '.join(sorted(cli.commands))} "
            f"(see 'spectrace --help')"
        )
        sys.exit(ExitCode.INPUT)
    try:
        cli.main(args=argv, prog_name="spectrace", standalone_mode=False)
    except _HANDLED as exc:
        sys.exit(_exit_code(exc))
    except Exception as exc:
        if os.environ.get("SPECTRACE_DEBUG", "") not in ("", "0"):
            raise
        sys.exit(_internal_error(exc))
    sys.exit(ExitCode.OK)


if __name__ == "__main__":
    main()
