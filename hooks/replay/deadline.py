"""Run a command under a deadline: ``python -m spectrace.hooks.replay.deadline S -- CMD ...``.

``spectrace replay --engine cmd --timeout S`` runs its engine command through this wrapper
under ``spectrace capture`` (whose stderr parser owns the child it starts): past S seconds
CMD's whole process group gets SIGTERM, then SIGKILL :data:`KILL_GRACE` s later
(:func:`spectrace.hooks.child.run_until`, as ``capture vllm --timeout`` does), and the
wrapper exits :data:`TIMEOUT_STATUS` (124); otherwise it exits with CMD's status. CMD
inherits the wrapper's stdin, stdout and stderr, so its ``VT_SPEC_TRACE`` lines reach the
capture unchanged.
"""

from __future__ import annotations

import os
import sys

from spectrace.hooks.child import KILL_GRACE, TIMEOUT_STATUS, run_until


def wrap(cmd: list[str], seconds: float) -> list[str]:
    """CMD run through this wrapper with a deadline of ``seconds`` (> 0)."""
    return [sys.executable, "-m", __name__, repr(float(seconds)), "--", *cmd]


def main(argv: list[str] | None = None) -> int:
    """``S -- CMD ...``: run CMD, stop it after S seconds; returns the exit status."""
    args = sys.argv[1:] if argv is None else argv
    seconds, cmd = float(args[0]), args[1:]
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]
    status, _ = run_until(cmd, dict(os.environ), timeout=seconds, kill_grace=KILL_GRACE)
    return status


__all__ = ["TIMEOUT_STATUS", "main", "wrap"]

if __name__ == "__main__":
    sys.exit(main())
