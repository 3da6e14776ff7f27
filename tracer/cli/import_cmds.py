"""``spectrace import KIND``: convert an engine's trace output into a trace file."""

from __future__ import annotations

import click

from . import output
from .options import force_option, meta_option, strict_option
from .progress import progress


@click.group("import")
def import_() -> None:
    """Convert an engine's trace output into a spectrace trace file."""


@import_.command("vt")
@click.argument("log", type=click.Path(dir_okay=False))
@click.option(
    "-o", "--out", required=True, type=click.Path(dir_okay=False), help="Output trace file (.h5)."
)
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
