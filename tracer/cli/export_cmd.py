"""``spectrace export``: traces as flat blocks and requests tables (Parquet, CSV, JSONL)."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import click

from . import output
from .options import force_option
from .progress import progress

#: What an export folder may hold: ``--force`` replaces only a folder made of these.
_EXPORT_ENTRIES = {"blocks", "requests", "blocks.csv", "requests.csv"}
_EXPORT_ENTRIES |= {"blocks.jsonl", "requests.jsonl"}


@click.command("export")
@click.argument("trace", nargs=-1, required=True)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["parquet", "csv", "jsonl"]),
    default="parquet",
    show_default=True,
)
@click.option("-o", "--out", required=True, type=click.Path(file_okay=False), help="Output folder.")
@click.option(
    "--run",
    "runs",
    multiple=True,
    metavar="NAME",
    help="Run name of each TRACE, in order (default: the file name without .h5 and rank tag).",
)
@force_option
def export_cmd(trace: tuple[str, ...], fmt: str, out: str, runs: tuple[str, ...], force: bool):
    """Export traces as a blocks table and a requests table into folder OUT.

    Each TRACE (a file, several files or a quoted glob of one run's ranks) is one run, each
    of its files one rank. Parquet: OUT/blocks/run=R/rank=N/part-0.parquet and
    OUT/requests/..., hive-partitioned, what DuckDB, Spark or Trino read. CSV and JSONL:
    OUT/blocks.csv and OUT/requests.csv (.jsonl), with run and rank columns; list columns
    are JSON arrays.
    """
    from .. import export
    from ..errors import InputError
    from ..store import open_trace
    from ..store.paths import check_outputs

    if runs and len(runs) != len(trace):
        raise InputError(f"--run given {len(runs)} times for {len(trace)} traces")
    check_outputs({"-o": out}, {f"TRACE {t}": t for t in trace}, force=force, traces=())
    target = Path(out)
    if target.exists():
        _clear(target)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        with progress(2 * len(trace), f"export {fmt}") as cb:  # a bar on a TTY only
            names, counts = _write(trace, runs, fmt, partial, export, open_trace, cb)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    partial.rename(target)
    output.say(
        f"exported {counts[0]} blocks and {counts[1]} requests of {len(names)} run(s) "
        f"({', '.join(names)}) to {target} ({fmt})"
    )


def _clear(target: Path) -> None:
    """Remove an earlier export at ``target`` (``--force``); refuse any other folder."""
    from ..errors import InputError

    entries = {p.name for p in target.iterdir()} if target.is_dir() else {"?"}
    if not entries <= _EXPORT_ENTRIES:
        raise InputError(f"{target}: exists and is not an export folder; not overwritten")
    shutil.rmtree(target)


def _write(trace, runs, fmt: str, folder: Path, export, open_trace, cb) -> tuple[list, list]:
    names: list[str] = []
    counts = [0, 0]
    sinks = _Sinks(folder, fmt) if fmt != "parquet" else None
    try:
        for i, spec in enumerate(trace):
            t = open_trace(spec)
            with t:
                name = runs[i] if runs else export.run_name(t)
                names.append(name)
                export.check_run_names(names)
                blocks = export.block_columns(t, name)
                reqs = export.request_columns(t, name)
                counts[0] += len(t.blocks)
                counts[1] += len(t.requests)
            for j, (table, cols) in enumerate((("blocks", blocks), ("requests", reqs))):
                if sinks is None:
                    export.write_parquet(cols, table, folder)
                else:
                    sinks.write(table, export.plain_rows(cols))
                cb(2 * i + j + 1, 2 * len(trace))
    finally:
        if sinks is not None:
            sinks.close()
    return names, counts


class _Sinks:
    """The open CSV or JSONL files of one export (one per table)."""

    def __init__(self, folder: Path, fmt: str) -> None:
        self.fmt = fmt
        self.files = {
            t: open(folder / f"{t}.{fmt}", "w", newline="") for t in ("blocks", "requests")
        }
        self.writers: dict[str, csv.DictWriter] = {}

    def write(self, table: str, rows) -> None:
        fh = self.files[table]
        for row in rows:
            if self.fmt == "jsonl":
                fh.write(json.dumps(row) + "\n")
                continue
            w = self.writers.get(table)
            if w is None:
                w = self.writers[table] = csv.DictWriter(fh, fieldnames=list(row))
                w.writeheader()
            w.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in row.items()})

    def close(self) -> None:
        for fh in self.files.values():
            fh.close()
