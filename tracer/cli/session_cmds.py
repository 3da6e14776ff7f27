"""``spectrace demo`` and ``spectrace view``: the commands that run a whole session."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..errors import InputError
from .options import tokenizer_option


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
@click.option("--force", is_flag=True, help="Replace the traces and logs of an earlier demo.")
def demo(out_dir: str, max_tokens: int, k: int, force: bool) -> None:
    """Run real vLLM and the reference engine on the bundled models, then diff them."""
    from ..store.paths import check_outputs, partial_path
    from .demo import run_demo

    out = Path(out_dir)
    written = {
        "reference trace": out / "reference.h5",
        "vLLM trace": out / "vllm.h5",
        "reference log": out / "reference.vt.log",
        "reference requests": out / "reference.requests.jsonl",
        "reference capture log": out / "reference.capture.log",
        "vLLM capture log": out / "vllm.capture.log",
    }
    check_outputs(written, {}, force=force, traces=("reference trace", "vLLM trace"))
    for p in written.values():  # --force: the demo's own captures refuse existing files
        p.unlink(missing_ok=True)
        partial_path(p).unlink(missing_ok=True)
    sys.exit(run_demo(out, max_tokens=max_tokens, k=k))


@click.command()
@click.argument("ours")
@click.argument("theirs", required=False)
@tokenizer_option
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
    if app.failure is not None:  # bad input met while viewing: the CLI's one line, exit 2
        raise app.failure
    if app.return_code:
        sys.exit(app.return_code)
