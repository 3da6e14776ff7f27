"""The exit codes of every spectrace command: the one thing an engine team's CI reads."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Process exit status of a spectrace command (and of the capture runners)."""

    OK = 0
    """The compared work agrees and nothing is missing (or the command simply succeeded)."""
    DIVERGENCE = 1
    """A divergence or an error-severity finding: the verdict CI acts on."""
    INPUT = 2
    """Bad usage or bad input: one ``spectrace: error: ...`` line names the file, line or field."""
    FAILURE = 3
    """Any other spectrace failure (typed :class:`~spectrace.tracer.errors.SpectraceError`)."""
    INTERRUPT = 130
    """Interrupted by Ctrl-C (128 + SIGINT, the shell convention). ``spectrace capture``
    forwards Ctrl-C and SIGTERM to its command and finishes the trace; it exits 130 after a
    Ctrl-C and 128 + SIGTERM after a SIGTERM."""
