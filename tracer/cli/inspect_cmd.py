"""``spectrace inspect-draft``: a draft checkpoint's verdicts."""

from __future__ import annotations

import click

from . import output
from .options import exit_verdict, format_option


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
    type=click.IntRange(min=1),
    default=None,
    help="Drafts per step to check against block_size (default: the config's).",
)
@format_option
def inspect_draft_cmd(ckpt_dir: str, target_dir: str | None, k: int | None, fmt: str) -> None:
    """Check a DSpark draft checkpoint (config.json + safetensors headers, no weights).

    One verdict per line (ok, info, warn, ERROR): method and architecture, layout
    (sample_from_anchor), vocabularies and d2t/t2d, Markov head, confidence head, aux layers,
    q_proj, block size against k, own embed_tokens/lm_head, mask token. Exit 1 on an error.
    """
    from ..checkpoint import inspect_draft

    rep = inspect_draft(ckpt_dir, target_dir, k)
    if fmt == "json":
        output.out_json(rep.to_json())
    else:
        output.out(rep.text())
    exit_verdict(bool(rep.errors))
