"""Typed errors. Every message is one line naming the file, line or field at fault.

The CLI maps :class:`InputError` to exit code 2 and other :class:`SpectraceError` to 3.
"""

from __future__ import annotations


class SpectraceError(Exception):
    """Base class of every error spectrace raises on purpose."""


class InputError(SpectraceError):
    """Bad user input: a missing, foreign, corrupt or unsupported file, or a bad argument."""


class TraceFormatError(InputError):
    """A file that is not a spectrace trace, or has an unsupported major version."""


class ParseError(InputError):
    """A malformed ``VT_SPEC_TRACE`` line in strict mode (message names file and line)."""
