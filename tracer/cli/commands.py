"""The ``spectrace`` subcommands: :data:`COMMANDS`, gathered from one module per family.

Every command imports what it needs inside its body, so ``spectrace --help`` and ``spectrace
diff`` load neither textual, torch nor vllm (nor numpy until a trace is opened); only
:mod:`main` attaches them to the group, so nothing here imports it back. Data goes to stdout
through :func:`output.out` / :func:`output.console`, diagnostics through :func:`output.say`;
verdicts exit with :class:`ExitCode`.
"""

from __future__ import annotations

import click

from .capture_cmds import capture
from .export_cmd import export_cmd
from .import_cmds import import_
from .inspect_cmd import inspect_draft_cmd
from .read_cmds import check, diff, info, schema, validate_cmd
from .replay_cmd import replay_cmd
from .session_cmds import demo, view

#: Every top-level command; :mod:`main` adds them to the group (help lists them sorted).
COMMANDS: tuple[click.Command, ...] = (
    demo,
    info,
    diff,
    check,
    validate_cmd,
    view,
    capture,
    import_,
    export_cmd,
    inspect_draft_cmd,
    schema,
    replay_cmd,
)
