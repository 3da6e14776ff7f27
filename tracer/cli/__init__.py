"""spectrace.tracer.cli: the ``spectrace`` command line (the composition root).

Only this subpackage (and the pytest fixtures of :mod:`spectrace.tracer.testing.plugin`)
reaches ``hooks``, ``tui`` and ``engine``, and only through imports inside the command that
needs them, so ``spectrace diff`` never loads textual, torch or vllm. The entry
point is :func:`spectrace.tracer.cli.main.main`; exit codes are :class:`ExitCode`.


  main.py        the click group ``cli`` and ``main()`` (errors -> one line + exit code)
  commands.py    the subcommands (``COMMANDS``), each importing what it needs when run
  exit_codes.py  :class:`ExitCode`
  output.py      ``say`` (stderr), ``out`` (stdout data), ``console`` (rich, on demand)
  report.py      the text report of ``info``, ``check`` and ``diff`` (rich tables)
  demo.py        ``spectrace demo`` (both engines in child processes, then the diff)

This ``__init__`` imports only :mod:`exit_codes`: ``hooks`` use :mod:`output` and
:class:`ExitCode` without loading click or the commands.
"""

from .exit_codes import ExitCode

__all__ = ["ExitCode"]
