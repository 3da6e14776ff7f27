"""``spectrace import KIND``: convert an engine's trace output into a trace file."""

from __future__ import annotations

import click

from . import output
from .options import force_option, meta_option, out_option, strict_option
from .progress import progress

#: ``--strict`` of the file importers (golden, llama-dump).
strict_file_option = click.option(
    "--strict",
    is_flag=True,
    help="Fail on the first problem (exit 2, FILE:LINE) instead of counting it.",
)


@click.group("import")
def import_() -> None:
    """Convert an engine's trace output into a spectrace trace file."""


@import_.command("vt")
@click.argument("log", type=click.Path(dir_okay=False))
@out_option
@click.option(
    "--requests",
    "requests_path",
    type=click.Path(dir_okay=False),
    help="JSONL with req_id, prompt_ids, output_ids per request.",
)
@strict_option
@meta_option
@force_option
def import_vt(
    log: str,
    out: str,
    requests_path: str | None,
    strict: bool,
    meta: dict[str, object],
    force: bool,
) -> None:
    """Import our engine's VT_SPEC_TRACE stderr log (LOG, '-' for stdin).

    An empty log, a binary file or one without any trace line is an input error (exit 2).
    """
    from spectrace.hooks.vt.importer import import_log

    from ..store.paths import check_outputs

    check_outputs({"-o": out}, {"LOG": log, "--requests": requests_path}, force=force)
    with progress(None, f"import vt {log}") as cb:
        stats = import_log(
            log, out, requests_path=requests_path, strict=strict, meta=meta or None, progress=cb
        )
    output.say(stats.summary())
    for line in (stats.requests_warning(), stats.no_blocks_warning()):
        if line:
            output.say(f"warning: {line}")


def _say_problems(problems) -> None:
    """One warning line per problem class (count, first location)."""
    for line in problems.lines():
        output.say(f"warning: {line}")


@import_.command("golden")
@click.argument("file", type=click.Path(dir_okay=False))
@out_option
@strict_file_option
@meta_option
@force_option
def import_golden(file: str, out: str, strict: bool, meta: dict[str, object], force: bool) -> None:
    """Import an oracle-capture JSON golden (FILE) of a parity gate.

    Blocks are placed as the gate does: the first anchor at position len(prompt), acceptance
    the longest draft prefix equal to the following tokens, the next anchor at p + acc + 1; a
    block whose anchor differs or lies past the end ends its request's walk. Prints how many
    blocks were placed and why the rest were not, and the golden's counters against the
    placed totals.
    """
    from spectrace.hooks.importers.counters import check_status
    from spectrace.hooks.importers.golden import import_golden as run

    from ..store.paths import check_outputs

    check_outputs({"-o": out}, {"FILE": file}, force=force)
    stats = run(file, out, strict=strict, meta=meta or None)
    output.say(stats.summary())
    assert stats.problems is not None and stats.check is not None
    _say_problems(stats.problems)
    check = stats.check  # a difference max_tokens trimming explains is no warning
    ok = check["equal"] or check_status(check) == {"status": "ok"}
    output.say(("" if ok else "warning: ") + check["message"])


@import_.command("llama-dump")
@click.argument("file", type=click.Path(dir_okay=False))
@out_option
@click.option(
    "--requests",
    "requests_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="JSONL with req_id, seq (default: req_id), prompt_ids, output_ids per request.",
)
@strict_file_option
@meta_option
@force_option
def import_llama_dump(
    file: str,
    out: str,
    requests_path: str,
    strict: bool,
    meta: dict[str, object],
    force: bool,
) -> None:
    """Import llama.cpp's LLAMA_SPEC_DUMP JSONL (FILE: one object per verification step).

    Steps are placed per sequence on the requests file's prompt + output ids (first anchor
    at len(prompt), the next at p + n_accepted + 1); pmin_drop drafts are kept as proposed
    but not verified, the top-1 minus top-2 log-probability as each slot's draft margin.
    """
    from spectrace.hooks.importers.llama_dump import import_dump

    from ..store.paths import check_outputs

    check_outputs({"-o": out}, {"FILE": file, "--requests": requests_path}, force=force)
    stats = import_dump(file, out, requests_path, strict=strict, meta=meta or None)
    output.say(stats.summary())
    assert stats.problems is not None
    _say_problems(stats.problems)
