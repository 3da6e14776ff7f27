"""Opening one HDF5 trace file for reading, with one-line reasons when it cannot be."""

from __future__ import annotations

import re
from pathlib import Path

import h5py

from ..errors import InputError, TraceFormatError

#: A ``VT_SPEC_TRACE`` line at the start of a line of a file's head (a README that names the
#: format is not a log).
_VT_LINE = re.compile(rb"(?m)^[ \t]*\[\s*(?:SPECTRACE|spec-[a-z_-]+)\s*\]")


def open_h5(path: Path) -> h5py.File:
    """Open one trace file for reading (no HDF5 file lock: a writer may hold it open).

    Raises:
        InputError: ``path`` is a directory, not a regular file, or does not exist.
        TraceFormatError: not a readable HDF5 file (truncated, or a VT log: says which).
    """
    if path.is_dir():
        raise InputError(f"{path}: is a directory, not a trace file")
    if path.exists() and not path.is_file():  # a FIFO or device: h5py would block on it
        raise InputError(f"{path}: not a regular file (a pipe or a device), not a trace file")
    try:
        return h5py.File(path, "r", locking=False)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise TraceFormatError(f"{path}: {_unreadable(path, exc)}") from None


def _unreadable(path: Path, exc: OSError) -> str:
    """Why h5py cannot open ``path``, in the user's words where we can tell."""
    m = re.search(r"truncated file: eof = (\d+).*stored_eof = (\d+)", str(exc))
    if m:
        return f"truncated HDF5 file ({m.group(1)} of {m.group(2)} bytes; a copy cut short?)"
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        head = b""
    if _VT_LINE.search(head):  # a line that starts with a tag, not a text naming the format
        return (
            "a VT_SPEC_TRACE log, not a trace file: convert it with "
            "`spectrace import vt LOG -o TRACE.h5`"
        )
    return f"not a readable HDF5 file ({short_reason(exc)})"


def short_reason(exc: BaseException) -> str:
    """The first line of an exception message, at most 120 characters."""
    return str(exc).splitlines()[0][:120]
