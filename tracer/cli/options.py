"""Options and helpers shared by the ``spectrace`` subcommands: ``--format``, ``--tokenizer``,
``--strict``, ``--force``, ``--meta`` and the verdict exit."""

from __future__ import annotations

import json
import sys
from typing import NoReturn

import click

from .exit_codes import ExitCode

#: ``--format text|json``, shared by the commands that print a result.
format_option = click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True
)
#: ``--tokenizer PATH``, shared by the commands that decode ids.
tokenizer_option = click.option(
    "--tokenizer",
    type=click.Path(),
    help="tokenizer.json (or its directory) to decode ids; default: from the trace.",
)
strict_option = click.option(
    "--strict",
    is_flag=True,
    help="Fail on the first malformed line or a requests file that does not match the log.",
)
#: ``--force``, shared by the commands that write files (never lets an output be an input).
force_option = click.option(
    "--force", is_flag=True, help="Overwrite existing output files (never an input file)."
)


def exit_verdict(failed: bool) -> NoReturn:
    """Exit 1 (:attr:`ExitCode.DIVERGENCE`) when ``failed``, else 0: the status CI reads."""
    sys.exit(ExitCode.DIVERGENCE if failed else ExitCode.OK)


def parse_meta(items: tuple[str, ...]) -> dict[str, object]:
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


def meta_callback(ctx: click.Context, param: click.Parameter, items: tuple[str, ...]) -> dict:
    return parse_meta(items)


#: ``--meta KEY=VALUE`` (repeatable) and ``--strict``, shared by ``import vt`` and ``capture vt``.
meta_option = click.option(
    "--meta",
    "meta",
    multiple=True,
    metavar="KEY=VALUE",
    callback=meta_callback,
    help="Extra trace metadata KEY=VALUE (repeatable), e.g. engine=vllm.cpp method=dspark k=8 "
    "tokenizer=PATH.",
)
