"""``spectrace capture [vt|vllm] -o OUT -- CMD``: run an engine and record its drafts."""

from __future__ import annotations

import sys

import click

from .options import SECONDS, force_option, meta_option, out_option, strict_option


class _CaptureGroup(click.Group):
    """``spectrace capture [vllm] -o OUT -- CMD``: ``vt`` is the default subcommand."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or args[0] not in self.commands:
            if not (args and args[0] in ("--help", "-h")):
                args = ["vt", *args]
        return super().parse_args(ctx, args)


@click.group(cls=_CaptureGroup)
def capture() -> None:
    """Run an engine command and record its drafts.

    \b
      spectrace capture -o OUT.h5 -- CMD ...        our engine (VT_SPEC_TRACE on stderr)
      spectrace capture vllm -o OUT.h5 -- python SCRIPT ...   upstream vLLM (plugin)
    """


@capture.command("vt")
@out_option
@click.option(
    "--requests",
    "requests_path",
    type=click.Path(dir_okay=False),
    help="JSONL the command writes with req_id, prompt_ids, output_ids; "
    "read after the command exits.",
)
@strict_option
@click.option(
    "--log",
    "log_path",
    type=click.Path(dir_okay=False),
    help="Also keep CMD's raw stderr in this file (for `spectrace import vt`).",
)
@meta_option
@force_option
@click.argument("cmd", nargs=-1, required=True)
def capture_vt(
    out: str,
    requests_path: str | None,
    strict: bool,
    log_path: str | None,
    meta: dict[str, object],
    force: bool,
    cmd: tuple[str, ...],
) -> None:
    """Run CMD with VT_SPEC_TRACE=1 (unless set), parse its stderr live, forward it.

    Exits with CMD's exit status; how CMD ended is recorded in the trace (meta "capture").
    """
    from spectrace.hooks.capture import capture_command

    from ..store.paths import check_outputs

    check_outputs({"-o": out, "--log": log_path}, {"--requests": requests_path}, force=force)
    sys.exit(
        capture_command(
            list(cmd),
            out,
            requests_path=requests_path,
            strict=strict,
            log_path=log_path,
            meta=meta or None,
        )
    )


@capture.command("vllm")
@out_option
@click.option(
    "--timeout",
    type=SECONDS,
    metavar="SECONDS",
    help="Stop CMD (SIGTERM, SIGKILL 10 s later) when it runs longer; exit status 124.",
)
@force_option
@click.argument("cmd", nargs=-1, required=True)
def capture_vllm_cmd(out: str, timeout: float | None, force: bool, cmd: tuple[str, ...]) -> None:
    """Run CMD (a vLLM script) with spectrace's vLLM plugin recording to OUT.

    A watchdog ends the run when vLLM's EngineCore process dies without shutting down (vLLM
    itself would wait for ever): the traces are finished and the death is recorded.
    """
    from spectrace.hooks.capture import capture_vllm

    from ..store.paths import check_outputs

    check_outputs({"-o": out}, {}, force=force)
    if not force:
        _refuse_rank_files(out)
    sys.exit(capture_vllm(list(cmd), out, timeout=timeout))


def _refuse_rank_files(out: str) -> None:
    """The plugin writes DP rank r (r > 0) of ``-o OUT.h5`` to ``OUT.dp<r>.h5``
    (:func:`~spectrace.hooks.vllm.paths.rank_files`): an earlier capture's rank file there
    would be overwritten (or, left beside a new one-rank run, read with it as one trace by
    ``'OUT*.h5'``).

    Raises:
        InputError: naming the first such file (``.partial`` too).
    """
    from spectrace.hooks.vllm.paths import rank_files, trace_path

    from ..errors import InputError

    found = rank_files(out)
    if found:
        pattern = trace_path(out, 1).name.replace(".dp1.h5", ".dp<r>.h5")
        raise InputError(
            f"{found[0]}: a data-parallel rank file of an earlier capture to {out} exists (the "
            f"plugin writes rank r to {pattern}); pass --force to overwrite it"
        )
