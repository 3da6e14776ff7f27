"""``spectrace replay``: drive an engine to draft from every chosen position of reference
sequences (:mod:`spectrace.hooks.replay`), and with ``--vs`` diff two engines' replays."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from . import output
from .options import SECONDS, exit_verdict, force_option, format_option, tokenizer_option
from .progress import progress

#: The drafters a replay runs (``--method``).
METHODS = ("draft_model", "ngram")

ENGINE_CHOICE = click.Choice(["reference", "vllm", "cmd"])


def vs_path(out: str, engine: str) -> Path:
    """Default ``--vs-out``: OUT with ``.ENGINE`` before its suffix (r.h5 -> r.vllm.h5)."""
    p = Path(out)
    return p.with_name(f"{p.stem}.{engine}{p.suffix or '.h5'}")


@click.command("replay")
@click.argument("ref", type=click.Path(dir_okay=False))
@click.option(
    "--engine", "engines", multiple=True, type=ENGINE_CHOICE, help="Engine (twice: diff both)."
)
@click.option(
    "-o", "--out", required=True, type=click.Path(dir_okay=False), help="Replay trace (.h5)."
)
@click.option("--vs", "vs", type=ENGINE_CHOICE, help="Also replay with this engine and diff.")
@click.option(
    "--vs-out",
    type=click.Path(dir_okay=False),
    help="Trace of the --vs engine (default OUT.ENGINE.h5).",
)
@click.option("--positions", default="all", show_default=True, help="all | blocks | N per request.")
@click.option(
    "--requests",
    "requests",
    multiple=True,
    metavar="ID",
    help="Only these request ids (repeatable).",
)
@click.option(
    "--blocks-of",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="--positions blocks: also where this trace drafted.",
)
@click.option(
    "--method",
    type=click.Choice(METHODS),
    default=None,
    help="Drafter (default: REF's /meta method where it is one of these, else draft_model).",
)
@click.option(
    "--k",
    type=click.IntRange(min=1),
    default=None,
    help="Drafts per block (default: REF's /meta k, else 4).",
)
@click.option(
    "--target", type=click.Path(file_okay=False), help="Target model folder (default: bundled)."
)
@click.option(
    "--draft", type=click.Path(file_okay=False), help="Draft model folder (default: bundled)."
)
@click.option(
    "--fault",
    "faults",
    multiple=True,
    metavar="NAME",
    help="Reference engine (the first --engine): plant a fault.",
)
@click.option(
    "--command",
    "command",
    help="--engine cmd: the engine command ({prompts}, {requests}: the JSONL paths).",
)
@click.option(
    "--margins/--no-margins",
    default=None,
    help="vLLM: record drafter margins (default: on for CPU).",
)
@click.option(
    "--timeout", "timeout_s", type=SECONDS, help="vllm/cmd: stop the engine after S seconds."
)
@format_option
@tokenizer_option
@force_option
def replay_cmd(
    ref,
    engines,
    out,
    vs,
    vs_out,
    positions,
    requests,
    blocks_of,
    method,
    k,
    target,
    draft,
    faults,
    command,
    margins,
    timeout_s,
    fmt,
    tokenizer,
    force,
) -> None:
    """Replay REF's sequences (a trace, or a requests JSONL with prompt_ids and output_ids):
    one block per (request, position), drafted from the reference prefix, with acceptance
    recomputed against the reference (teacher-forced). With --vs ENGINE (or a second
    --engine) the second engine replays too and the two replays are diffed (exit as diff).

    An engine that fails (vllm/cmd: a non-zero exit status, or stopped by --timeout) gives
    no trace to judge and is not bad input: one line and exit 3.
    """
    from spectrace.hooks.replay.options import EngineOptions
    from spectrace.hooks.replay.positions import parse_positions

    from ..store.paths import check_outputs

    names = list(engines) or ["reference"]
    if vs:
        names.append(vs)
    if len(names) > 2:
        raise click.UsageError("at most two engines (--engine twice, or --engine and --vs)")
    _check_applies(names, faults, command, tokenizer, margins, timeout_s)
    from ..tokens import Decoder

    decoder = Decoder(tokenizer) if tokenizer else None  # bad input before minutes of replay
    try:
        where = parse_positions(positions)
    except ValueError as exc:
        raise click.BadParameter(f"{positions!r}: {exc}", param_hint="--positions") from None
    outs = (
        {"-o": out}
        if len(names) == 1
        else {"-o": out, "--vs-out": vs_out or vs_path(out, names[1])}
    )
    check_outputs(
        outs,
        {"REF": ref, **{f"--blocks-of {p}": p for p in blocks_of}},
        force=force,
        traces=tuple(outs),
    )
    from spectrace.engine.loader import bundled_model_dir  # defaults: the bundled models

    method, k = _configured(ref, method, k)
    base = EngineOptions(
        method=method,
        k=k,
        target=Path(target) if target else bundled_model_dir("target"),
        draft=Path(draft) if draft else bundled_model_dir("draft"),
        command=shlex.split(command or ""),
        margins=margins,
        timeout_s=timeout_s,
    )
    paths = [str(p) for p in outs.values()]
    run = [
        (name, path, list(faults) if n == 0 else [])
        for n, (name, path) in enumerate(zip(names, paths))
    ]
    for name, path, planted in run:
        opts = EngineOptions(**{**base.__dict__, "faults": planted})
        _replay_one(ref, path, name, opts, where, list(requests) or None, blocks_of)
    if len(paths) == 2:
        _diff(paths[0], paths[1], fmt, decoder)


def _configured(ref: str, method: str | None, k: int | None) -> tuple[str, int]:
    """``--method`` and ``--k``, each taken where not given from REF's /meta (a trace; a
    requests JSONL has none) when it records a method this replay runs and a k >= 1, else
    ``draft_model`` and 4; a line on stderr says what REF set other than those."""
    meta: dict = {}
    if (method is None or k is None) and not str(ref).endswith(".jsonl"):
        from ..store import open_trace

        meta = open_trace(ref).meta
    took = []  # what REF's /meta set other than the defaults (those need no line)
    if method is None:
        method = meta.get("method") if meta.get("method") in METHODS else None
        took += [f"method {method}"] if method not in (None, "draft_model") else []
    if k is None:
        mk = meta.get("k")
        k = mk if type(mk) is int and mk >= 1 else None
        took += [f"k {k}"] if k not in (None, 4) else []
    if took:
        output.say(f"replay: {' and '.join(took)} from {ref}'s /meta (--method, --k choose)")
    return method or "draft_model", k or 4


def _check_applies(names: list[str], faults, command, tokenizer, margins, timeout_s) -> None:
    """Refuse an option that nothing of this replay would read (a silently ignored option
    makes a user believe a run they did not get).

    Raises:
        click.UsageError: --fault when the first engine is not the reference engine,
            --command without the cmd engine, --margins without vllm, --timeout with the
            reference engine alone, --tokenizer when one engine replays (there is no diff to
            decode).
    """
    if faults and names[0] != "reference":
        raise click.UsageError(
            f"--fault plants a fault in the reference engine, and the first engine is {names[0]}"
        )
    if command and "cmd" not in names:
        raise click.UsageError("--command is the cmd engine's command, and no engine is cmd")
    if margins is not None and "vllm" not in names:
        raise click.UsageError("--margins/--no-margins is for the vllm engine, and none replays")
    if timeout_s is not None and set(names) == {"reference"}:
        raise click.UsageError("--timeout stops a vllm or cmd engine, and none replays")
    if tokenizer and len(names) == 1:
        raise click.UsageError(
            "--tokenizer decodes the diff of two replays, and one engine replays here"
        )


def _replay_one(ref, path, name, opts, where, requests, blocks_of) -> None:
    """One engine's replay, with a progress line on a TTY and a summary line after it."""
    from spectrace.hooks.replay.run import Runner, replay

    runner: Runner | None = None
    if name == "reference":  # the composition root wires the engine in (hooks never import it)
        from spectrace.engine.replay import replay_reference

        runner = replay_reference
    with progress(None, f"replay {name}") as show:  # a bar on a TTY only
        r = replay(ref, path, name, opts, where, requests, blocks_of, show, runner)
    output.say(
        f"replay {name}: {r.sites} positions in {r.wall_s:.1f} s, {r.anchor_mismatches} "
        f"where the target sampled another anchor; wrote {r.path}"
    )


def _diff(ours: str, theirs: str, fmt: str, decoder) -> None:
    """Print the diff of the two replays (as ``spectrace diff``) and exit with its verdict."""
    from ..align import align
    from ..diff import diff_traces, open_pair
    from ..tokens import decoder_for
    from . import report

    a, b = open_pair(ours, theirs)
    result = diff_traces(align(a, b), decoder=decoder or decoder_for(None, a.meta, b.meta))
    if fmt == "json":
        output.out_json(result.to_json())
    else:
        report.print_diff(output.console(), result)
    exit_verdict(result.diverged)
