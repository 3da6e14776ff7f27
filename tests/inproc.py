"""Run the ``spectrace`` CLI from tests: in this process (a process start costs seconds on a
busy machine) or as the installed command. Test modules import it by name (``tests/`` is on
``sys.path`` under pytest's default import mode)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import warnings
from types import SimpleNamespace

from spectrace.tracer.cli.main import main

SPECTRACE = os.path.join(os.path.dirname(sys.executable), "spectrace")


def run_inproc(*args) -> SimpleNamespace:
    """``spectrace ARGS`` in this process: ``returncode``, ``stdout``, ``stderr`` as a
    subprocess would give them."""
    out, err = io.StringIO(), io.StringIO()
    saved = warnings.showwarning
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main([str(a) for a in args])
                code = 0
            except SystemExit as exc:
                code = int(exc.code or 0)
    finally:
        warnings.showwarning = saved
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def run_process(*args) -> subprocess.CompletedProcess:
    """The installed ``spectrace`` command itself."""
    return subprocess.run([SPECTRACE, *map(str, args)], capture_output=True, text=True, timeout=120)
