"""The ``spectrace`` subcommands, each a small click command (the composition root's leaves).

Every command imports what it needs inside its body, so ``spectrace --help`` and ``spectrace
diff`` load neither textual, torch nor vllm (nor numpy until a trace is opened); only
:mod:`main` attaches them to the group (:data:`COMMANDS`), so nothing here imports it back.
Data goes to stdout through :func:`output.out` / :func:`output.console`, diagnostics through
:func:`output.say`; verdicts exit with :class:`ExitCode`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NoReturn

import click

from ..errors import InputError
from . import output
from .exit_codes import ExitCode

#: ``--format text|json``, shared by the commands that print a result.
_format_option = click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True
)
#: ``--tokenizer PATH``, shared by the commands that decode ids.
_tokenizer_option = click.option(
    "--tokenizer",
    type=click.Path(),
    help="tokenizer.json (or its directory) to decode ids; default: from the trace.",
)
_strict_option = click.option(
    "--strict",
    is_flag=True,
    help="Fail on the first malformed line or a requests file that does not match the log.",
)
#: ``--force``, shared by the commands that write files (never lets an output be an input).
_force_option = click.option(
    "--force", is_flag=True, help="Overwrite existing output files (never an input file)."
)


def _exit_verdict(failed: bool) -> NoReturn:
    """Exit 1 (:attr:`ExitCode.DIVERGENCE`) when ``failed``, else 0: the status CI reads."""
    sys.exit(ExitCode.DIVERGENCE if failed else ExitCode.OK)


def _parse_meta(items: tuple[str, ...]) -> dict[str, object]:
    """``KEY=VALUE`` options to a dict: VALUE is parsed as JSON when it is JSON, else text;
    keys typed as text in ``schema.META_TYPES`` keep the text as given (``engine_version=1.2``).

    Raises:
        click.BadParameter: not ``KEY=VALUE``, or a known key with a value of the wrong
            type (``--meta k=four``), named as ``--meta KEY``.
    """
    from .. import schema

    out: dict[str, object] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="--meta")
        value: object
        if schema.META_TYPES.get(key, ())[:1] == ("str",):
            value = text
        else:
            try:
                value = json.loads(text)
            except ValueError:
                value = text
        why = schema.meta_type_error(key, value)
        if why is not None:
            raise click.BadParameter(
                f"{why} (field={key}, value={text!r})", param_hint=f"--meta {key}"
            )
        out[key] = value
    return out


def _meta_callback(ctx: click.Context, param: click.Parameter, items: tuple[str, ...]) -> dict:
    return _parse_meta(items)


#: ``--meta KEY=VALUE`` (repeatable) and ``--strict``, shared by ``import vt`` and ``capture vt``.
_meta_option = click.option(
    "--meta",
    "meta",
    multiple=True,
    metavar="KEY=VALUE",
    callback=_meta_callback,
    help="Extra trace metadata KEY=VALUE (repeatable), e.g. engine=vllm.cpp method=dspark k=8 "
    "tokenizer=PATH.",
)


class _CaptureGroup(click.Group):
    """``spectrace capture [vllm] -o OUT -- CMD``: ``vt`` is the default subcommand."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or args[0] not in self.commands:
            if not (args and args[0] in ("--help", "-h")):
                args = ["vt", *args]
        return super().parse_args(ctx, args)


@click.command()
@click.option(
    "--diff",
    "diff_json",
    is_flag=True,
    help="Print the JSON Schema of `spectrace diff --format json` instead.",
)
def schema(diff_json: bool) -> None:
    """Print the trace store schema (HDF5, format 1.x)."""
    if diff_json:
        from ..diff_schema import SCHEMA

        output.out(json.dumps(SCHEMA, indent=2))
        return
    from .. import schema as _schema

    output.out(_schema.describe())


@click.command()
@click.argument("trace", nargs=-1, required=True)
@_format_option
def info(trace: tuple[str, ...], fmt: str) -> None:
    """Show a trace's metadata and acceptance figures.

    TRACE is one file, several files or a glob (one trace written by several processes).
    """
    from ..metrics import trace_summary
    from ..store import open_trace
    from . import report

    t = open_trace(list(trace))
    summary = trace_summary(t)
    if fmt == "json":
        output.out(json.dumps({"schema": "spectrace.info/1", **summary}, indent=2))
    else:
        report.print_info(output.console(), summary)


@click.command()
@click.argument("ours")
@click.argument("theirs")
@_format_option
@click.option(
    "--examples",
    default=5,
    show_default=True,
    type=click.IntRange(min=0),
    help="Divergent blocks to show as examples.",
)
@_tokenizer_option
def diff(ours: str, theirs: str, fmt: str, examples: int, tokenizer: str | None) -> None:
    """Align two traces per anchor and report where their drafts differ.

    OURS and THEIRS are trace files or globs (quote the glob). Exit status: 0 when every
    comparable block agrees, 1 on an error finding, a differing comparable block or nothing
    comparable, 2 on bad input.
    """
    from ..align import align
    from ..diff import diff_traces, open_pair
    from ..tokens import decoder_for
    from . import report

    a, b = open_pair(ours, theirs)
    dec = decoder_for(tokenizer, a.meta, b.meta)
    result = diff_traces(align(a, b), examples=examples, decoder=dec)
    if fmt == "json":
        output.out(json.dumps(result.to_json(), indent=2))
    else:
        report.print_diff(output.console(), result)
    _exit_verdict(result.diverged)


@click.command()
@click.argument("trace", nargs=-1, required=True)
@_format_option
@_tokenizer_option
def check(trace: tuple[str, ...], fmt: str, tokenizer: str | None) -> None:
    """Check one trace on its own: loops, constant or unverified drafts, bookkeeping,
    vocabulary range, verified vs proposed, anchors. Exit 1 on an error finding."""
    from ..findings import check_trace
    from ..metrics import trace_summary
    from ..store import open_trace
    from ..tokens import decoder_for
    from . import report

    t = open_trace(list(trace))
    found = check_trace(t, decoder_for(tokenizer, t.meta))
    summary = trace_summary(t)
    if fmt == "json":
        output.out(
            json.dumps(
                {
                    "schema": "spectrace.check/1",
                    "findings": [f.to_json() for f in found],
                    "summary": summary,
                },
                indent=2,
            )
        )
    else:
        con = output.console()
        report.print_findings(con, found)
        report.print_info(con, summary)
    _exit_verdict(any(f.severity == "error" for f in found))


@click.command("validate")
@click.argument("trace", nargs=-1, required=True)
@_format_option
def validate_cmd(trace: tuple[str, ...], fmt: str) -> None:
    """Check trace files in full (fsck): structure, meta types, column shapes and dtypes,
    checksums, value ranges, cross-column invariants (accepted <= num_verified <= k,
    num_emitted = accepted + 1, positions within the request, request indexes in range).

    One line per problem (its first row and a count). Exit status: 0 every file valid,
    1 a problem found, 2 a file that cannot be read as a trace.
    """
    import dataclasses

    from ..validate import validate

    results = validate(list(trace))
    if fmt == "json":
        doc = {
            "schema": "spectrace.validate/1",
            "files": [
                {
                    "file": str(path),
                    "valid": not problems,
                    "problems": [dataclasses.asdict(p) for p in problems],
                }
                for path, problems in results
            ],
        }
        output.out(json.dumps(doc, indent=2, default=str))
    else:
        for path, problems in results:
            for p in problems:
                output.out(p.line())
            if not problems:
                output.out(f"{path}: valid")
    _exit_verdict(any(problems for _, problems in results))


@click.command("inspect-draft")
@click.argument("ckpt_dir", type=click.Path())
@click.option(
    "--target",
    "target_dir",
    type=click.Path(),
    help="Target model folder (its config.json): vocabulary, layers, hidden size.",
)
@click.option(
    "--k",
    "k",
    type=int,
    default=None,
    help="Drafts per step to check against block_size (default: the config's).",
)
@_format_option
def inspect_draft_cmd(ckpt_dir: str, target_dir: str | None, k: int | None, fmt: str) -> None:
    """Check a DSpark draft checkpoint (config.json + safetensors headers, no weights).

    One verdict per line (ok, info, warn, ERROR): method and architecture, layout
    (sample_from_anchor), vocabularies and d2t/t2d, Markov head, confidence head, aux layers,
    q_proj, block size against k, own embed_tokens/lm_head, mask token. Exit 1 on an error.
    """
    from ..checkpoint import inspect_draft

    rep = inspect_draft(ckpt_dir, target_dir, k)
    if fmt == "json":
        output.out(json.dumps(rep.to_json(), indent=2))
    else:
        output.out(rep.text())
    _exit_verdict(bool(rep.errors))


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
@_strict_option
@_meta_option
@_force_option
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
    stats = import_log(log, out, requests_path=requests_path, strict=strict, meta=meta or None)
    output.say(stats.summary())
    for line in (stats.requests_warning(), stats.no_blocks_warning()):
        if line:
            output.say(f"warning: {line}")


@click.group(cls=_CaptureGroup)
def capture() -> None:
    """Run an engine command and record its drafts.

    \b
      spectrace capture -o OUT.h5 -- CMD ...        our engine (VT_SPEC_TRACE on stderr)
      spectrace capture vllm -o OUT.h5 -- python SCRIPT ...   upstream vLLM (plugin)
    """


@capture.command("vt")
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False))
@click.option(
    "--requests",
    "requests_path",
    type=click.Path(dir_okay=False),
    help="JSONL the command writes with req_id, prompt_ids, output_ids; "
    "read after the command exits.",
)
@_strict_option
@click.option(
    "--log",
    "log_path",
    type=click.Path(dir_okay=False),
    help="Also keep CMD's raw stderr in this file (for `spectrace import vt`).",
)
@_meta_option
@_force_option
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
@click.option("-o", "--out", required=True, type=click.Path(dir_okay=False))
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Stop CMD (SIGTERM, SIGKILL 10 s later) when it runs longer; exit status 124.",
)
@_force_option
@click.argument("cmd", nargs=-1, required=True)
def capture_vllm_cmd(out: str, timeout: float | None, force: bool, cmd: tuple[str, ...]) -> None:
    """Run CMD (a vLLM script) with spectrace's vLLM plugin recording to OUT."""
    from spectrace.hooks.capture import capture_vllm

    from ..store.paths import check_outputs

    check_outputs({"-o": out}, {}, force=force)
    sys.exit(capture_vllm(list(cmd), out, timeout=timeout))


@click.command()
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default="spectrace-demo",
    show_default=True,
    help="Directory for the traces and logs.",
)
@click.option("--max-tokens", default=64, show_default=True)
@click.option("--k", "k", default=4, show_default=True, help="num_speculative_tokens")
@click.option("--force", is_flag=True, help="Replace the traces and log of an earlier demo.")
def demo(out_dir: str, max_tokens: int, k: int, force: bool) -> None:
    """Run real vLLM and the reference engine on the bundled models, then diff them."""
    from ..store.paths import check_outputs, partial_path
    from .demo import run_demo

    out = Path(out_dir)
    written = {
        "reference trace": out / "reference.h5",
        "vLLM trace": out / "vllm.h5",
        "reference log": out / "reference.vt.log",
    }
    check_outputs(written, {}, force=force, traces=("reference trace", "vLLM trace"))
    for p in written.values():  # --force: the demo's own captures refuse existing files
        p.unlink(missing_ok=True)
        partial_path(p).unlink(missing_ok=True)
    sys.exit(run_demo(out, max_tokens=max_tokens, k=k))


@click.command()
@click.argument("ours")
@click.argument("theirs", required=False)
@_tokenizer_option
@click.option(
    "--follow",
    is_flag=True,
    help="Re-read the trace(s) as they grow (a .partial file still being written).",
)
@click.option(
    "--tab",
    "start_tab",
    type=click.Choice(["overview", "blocks", "charts"]),
    default="overview",
    show_default=True,
    help="Tab shown first.",
)
@click.option(
    "--analysis",
    type=click.Choice(["auto", "thread", "process", "off"]),
    default="auto",
    show_default=True,
    help="Where the whole-trace diff runs (auto: a child process for big traces).",
)
def view(
    ours: str,
    theirs: str | None,
    tokenizer: str | None,
    follow: bool,
    start_tab: str,
    analysis: str,
) -> None:
    """Browse a trace, or two aligned traces, in the terminal (press ? for every key).

    OURS and THEIRS are trace files or quoted globs; with only OURS the same views show one
    engine. Needs a terminal.
    """
    from spectrace.tui import make_app

    app = make_app(
        ours, theirs, tokenizer=tokenizer, follow=follow, analysis=analysis, start_tab=start_tab
    )
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise InputError("view needs a terminal (stdin and stdout must be a TTY)")
    app.run()
    if app.return_code:
        sys.exit(app.return_code)


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
    inspect_draft_cmd,
    schema,
)
