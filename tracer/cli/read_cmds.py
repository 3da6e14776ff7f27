"""The commands that read traces: ``schema``, ``info``, ``diff``, ``check``, ``validate``.

Each imports what it needs inside its body, so none loads textual, torch or vllm.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from . import output
from .options import (
    exit_verdict,
    format_option,
    gate_errors,
    gate_from_options,
    gate_options,
    tokenizer_option,
)


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

        output.out_json(SCHEMA)
        return
    from .. import schema as _schema

    output.out(_schema.describe())


@click.command()
@click.argument("trace", nargs=-1, required=True)
@format_option
def info(trace: tuple[str, ...], fmt: str) -> None:
    """Show a trace's metadata and acceptance figures.

    TRACE is one file, several files or a glob (one trace written by several processes).
    """
    from ..findings.summary import explained_summary
    from ..store import open_trace
    from . import report

    t = open_trace(list(trace))
    summary = explained_summary(t)
    if fmt == "json":
        output.out_json({"schema": "spectrace.info/1", **summary})
    else:
        report.print_info(output.console(), summary)


@click.command()
@click.argument("ours")
@click.argument("theirs", nargs=-1, required=True)
@format_option
@click.option(
    "--examples",
    default=5,
    show_default=True,
    type=click.IntRange(min=0),
    help="Divergent blocks to show as examples (0: every one).",
)
@click.option(
    "--by-request",
    is_flag=True,
    help="A table per matched request pair: paired blocks, exact share, first divergent "
    "block (decoded with a tokenizer), first error, acceptance on both sides.",
)
@gate_options()
@tokenizer_option
def diff(
    ours: str,
    theirs: tuple[str, ...],
    fmt: str,
    examples: int,
    by_request: bool,
    tokenizer: str | None,
    **gate: Any,
) -> None:
    """Align two traces per anchor and report where their drafts differ.

    OURS and THEIRS are trace files or globs (quote the glob). With several THEIRS, OURS
    is the golden: each run is diffed against it, one summary row per run (--format json:
    a spectrace.diff-runs/1 document with every run's result).

    --request, --positions, --min-agreement, --max-errors and --ignore judge the diff as
    the pytest fixture spectrace_assert_drafts_match does with the same arguments.

    Exit status: 0 when every comparable block agrees (or the thresholds are met), 1 on an
    error finding, a differing comparable block or nothing comparable (any run), 2 on bad
    input (a run that cannot be read: before any run is diffed, nothing on stdout).
    """
    from ..diff import open_pair
    from ..diff_result import RunsResult
    from ..gate import gated_diff
    from ..request_table import request_rows
    from ..store import open_trace
    from ..tokens import decoder_for
    from . import report

    sel, th = gate_from_options(**gate)
    results: list = []
    golden = open_trace(ours)  # opened once
    # Every run opens before any is diffed: an unreadable one is exit 2 at once, naming its
    # file, and stdout never carries a verdict that leaves a run out.
    opened = [open_trace(run) for run in theirs]
    for run in theirs:
        a, b = open_pair(golden, opened.pop(0))  # a run's columns go with its diff
        if _same_files(a.paths, b.paths):
            output.say(
                f"note: ours and theirs are the same file ({run}): the diff compares the "
                f"trace with itself and agrees by construction"
            )
        dec = decoder_for(tokenizer, a.meta, b.meta)
        with gate_errors():  # an unknown --request: exit 2
            al, r, _ = gated_diff(a, b, sel, th, examples=examples or None, decoder=dec)
        if by_request:
            r.by_request = request_rows(al, r, dec)
        results.append(r)
    doc = results[0] if len(results) == 1 else RunsResult.of(results)
    if fmt == "json":
        output.out_json(doc.to_json())
    elif len(results) == 1:
        report.print_diff(output.console(), results[0])
    else:
        report.print_runs(output.console(), results)
    exit_verdict(doc.diverged)


def _same_files(a: Sequence[Path], b: Sequence[Path]) -> bool:
    """True when both traces are read from the same files (symlinks and hard links too)."""
    if len(a) != len(b):
        return False
    try:
        return all(any(os.path.samefile(x, y) for y in b) for x in a)
    except OSError:
        return False


@click.command()
@click.argument("trace", nargs=-1, required=True)
@format_option
@gate_options(pairs=False)
@tokenizer_option
def check(trace: tuple[str, ...], fmt: str, tokenizer: str | None, **gate: Any) -> None:
    """Check one trace on its own: loops, constant or unverified drafts, bookkeeping,
    vocabulary range, verified vs proposed, anchors. Exit 1 on an error finding.

    --request and --positions keep the findings located there (a finding without a
    location always counts); --max-errors and --ignore set the threshold, as the pytest
    fixture's max_error_findings and ignore do.
    """
    from ..findings import check_trace
    from ..findings.summary import explained_summary
    from ..gate import check_gate
    from ..store import open_trace
    from ..tokens import decoder_for
    from ..verdict import ignored_errors
    from . import report

    sel, th = gate_from_options(**gate)
    t = open_trace(list(trace))
    with gate_errors():  # an unknown --request: exit 2
        found, problems = check_gate(check_trace(t, decoder_for(tokenizer, t.meta)), th, sel, t)
    summary = explained_summary(t)
    gated = not (sel.everything and th.default)
    ignored = ignored_errors(found, th.ignore)
    if fmt == "json":
        doc: dict[str, object] = {
            "schema": "spectrace.check/1",
            "findings": [f.to_json() for f in found],
        }
        if gated:
            doc["gate"] = {"passed": not problems, "problems": problems, "ignored": ignored}
        output.out_json({**doc, "summary": summary})
    else:
        con = output.console()
        report.print_findings(con, found)
        if gated:
            report.print_check_gate(con, problems, ignored)
        report.print_info(con, summary)
    exit_verdict(bool(problems))


@click.command("validate")
@click.argument("trace", nargs=-1, required=True)
@format_option
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
        output.out_json(doc, default=str)
    else:
        for path, problems in results:
            for p in problems:
                output.out(p.line())
            if not problems:
                output.out(f"{path}: valid")
    exit_verdict(any(problems for _, problems in results))
