"""spectrace.tracer.cli: the ``spectrace`` command line (the composition root).

Only this subpackage reaches ``hooks``, ``tui`` and ``engine``, and only through imports inside
the command that needs them, so ``spectrace diff`` never loads textual, torch or vllm. The entry
point is :func:`spectrace.tracer.cli.main.main`; exit codes are :class:`ExitCode`.
"""

from .exit_codes import ExitCode

__all__ = ["ExitCode"]
