"""Options and helpers shared by the ``spectrace`` subcommands: ``--format``, ``--tokenizer``,
``--strict``, ``--force``, ``--meta`` and the verdict exit."""

from __future__ import annotations

import contextlib
import json
import math
import sys
from collections.abc import Iterator
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


class Seconds(click.ParamType):
    """A positive, finite duration in seconds (float). NaN and infinity are bad usage: no
    clock reaches them, so a timeout of either would silently never fire."""

    name = "seconds"

    def convert(self, value, param, ctx) -> float:
        x = click.FloatRange(min=0, min_open=True).convert(value, param, ctx)
        if not math.isfinite(x):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return x


#: The type of every ``--timeout`` option.
SECONDS = Seconds()


def exit_verdict(failed: bool) -> NoReturn:
    """Exit 1 (:attr:`ExitCode.DIVERGENCE`) when ``failed``, else 0: the status CI reads."""
    sys.exit(ExitCode.DIVERGENCE if failed else ExitCode.OK)


def parse_meta(items: tuple[str, ...]) -> dict[str, object]:
    """``KEY=VALUE`` options to a dict: VALUE is parsed as JSON when it is JSON, else text;
    keys typed as text in ``schema.META_TYPES`` keep the text as given (``engine_version=1.2``).

    Raises:
        click.BadParameter: not ``KEY=VALUE``, a key given twice, an empty value of a text
            key (``--meta engine=``) or a known key with a value of the wrong type
            (``--meta k=four``), named as ``--meta KEY``.
    """
    from .. import schema

    out: dict[str, object] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="--meta")
        if key in out:  # the last one winning would hide a typo'd command line
            raise click.BadParameter(f"{key!r} given twice", param_hint=f"--meta {key}")
        value: object
        if schema.META_TYPES.get(key, ())[:1] == ("str",):
            if not text.strip():  # '' is no engine name: leave the key out for unknown
                raise click.BadParameter(
                    f"an empty value (field={key}, value={text!r}); leave --meta {key} out "
                    f"when it is unknown",
                    param_hint=f"--meta {key}",
                )
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


#: CLI option of each :class:`~spectrace.tracer.gate.GateError` field.
_GATE_OPTION = {
    "min_agreement": "--min-agreement",
    "max_errors": "--max-errors",
    "ignore": "--ignore",
    "positions": "--positions",
    "requests": "--request",
}


def _selection_options(f, pairs: bool):
    what = "paired blocks (and findings)" if pairs else "findings"
    f = click.option(
        "--positions",
        metavar="A:B",
        help=f"Only {what} at anchor positions A <= p < B (tokens; either end may be left out).",
    )(f)
    return click.option(
        "--request",
        "requests",
        multiple=True,
        metavar="ID",
        help="Only this request (our or their id; repeatable)."
        if pairs
        else "Only the findings of this request (repeatable).",
    )(f)


def gate_options(*, pairs: bool = True):
    """``--request ID`` (repeatable), ``--positions A:B``, ``--min-agreement F`` (with
    ``pairs``: a diff), ``--max-errors N`` and ``--ignore KIND`` (repeatable): the arguments
    of the fixture ``spectrace_assert_drafts_match`` (see :mod:`spectrace.tracer.gate`)."""

    def wrap(f):
        f = click.option(
            "--ignore",
            multiple=True,
            metavar="KIND",
            help="A finding kind not counted (still listed; repeatable).",
        )(f)
        f = click.option(
            "--max-errors",
            type=int,
            default=0,
            show_default=True,
            help="Most error findings tolerated (ignored kinds not counted).",
        )(f)
        if pairs:
            f = click.option(
                "--min-agreement",
                type=float,
                default=None,
                metavar="F",
                help="Least share (0..1) of paired blocks whose anchor and proposals agree "
                "[default: 1.0; given, a pair with no paired block fails].",
            )(f)
        return _selection_options(f, pairs)

    return wrap


def gate_from_options(
    requests: tuple[str, ...],
    positions: str | None,
    max_errors: int,
    ignore: tuple[str, ...],
    min_agreement: float | None = None,
):
    """The :class:`~spectrace.tracer.gate.Selection` and ``Thresholds`` of the options
    (``min_agreement`` None: the option was not given).

    Raises:
        click.BadParameter: a value the gate refuses, named by its option (exit 2).
    """
    from ..gate import Selection, Thresholds, parse_positions

    with gate_errors():
        pos = parse_positions(positions) if positions is not None else None
        return Selection.of(requests, pos), Thresholds(min_agreement, max_errors, frozenset(ignore))


@contextlib.contextmanager
def gate_errors() -> Iterator[None]:
    """Turn a :class:`~spectrace.tracer.gate.GateError` (a bad threshold, an unknown
    ``--request``) into ``click.BadParameter`` named by its option: one line, exit 2."""
    from ..gate import GateError

    try:
        yield
    except GateError as exc:
        raise click.BadParameter(exc.what, param_hint=_GATE_OPTION[exc.field]) from None


#: ``-o/--out FILE``: the trace file a command writes (capture, import, replay).
out_option = click.option(
    "-o", "--out", required=True, type=click.Path(dir_okay=False), help="Output trace file (.h5)."
)
