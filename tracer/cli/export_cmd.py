"""``spectrace export``: traces as flat blocks and requests tables (Parquet, CSV, JSONL)."""

from __future__ import annotations

import csv
import json
import math
import os
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
    here = Path.cwd().resolve()
    if target.resolve() == here or target.resolve() in here.parents:
        # --force replaces the folder OUT whole: never the folder this runs in or one above
        raise InputError(f"{out}: the current folder or one above it; name a new folder")
    partial = target.with_name(target.name + ".partial")
    _refuse_inputs_inside(trace, (target, partial))
    for p in (target, partial):
        _check_replaceable(p, force)
    shutil.rmtree(partial, ignore_errors=True)
    try:
        partial.mkdir(parents=True)
    except OSError as exc:
        raise InputError(f"{partial}: cannot create the export folder ({exc.strerror})") from None
    try:
        with progress(2 * len(trace), f"export {fmt}") as cb:  # a bar on a TTY only
            names, counts = _write(trace, runs, fmt, partial, export, open_trace, cb)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if target.exists():  # --force: the earlier export goes only once the new one is whole
        shutil.rmtree(target)
    partial.rename(target)
    output.say(
        f"exported {counts[0]} blocks and {counts[1]} requests of {len(names)} run(s) "
        f"({', '.join(names)}) to {target} ({fmt})"
    )


def _refuse_inputs_inside(trace: tuple[str, ...], folders: tuple[Path, ...]) -> None:
    """Refuse an input trace file that lies inside the output folder or its ``.partial``:
    ``--force`` removes those folders whole, the input with them.

    Raises:
        InputError: naming the input file and the folder (or a TRACE that matches nothing).
    """
    import warnings

    from ..errors import InputError
    from ..store.paths import resolve_paths

    roots = [d.resolve() for d in folders]
    for spec in trace:
        with warnings.catch_warnings():  # the reader warns about a .partial once, later
            warnings.simplefilter("ignore")
            files = resolve_paths(spec)
        for f in files:
            inside = next((d for d, r in zip(folders, roots) if r in f.resolve().parents), None)
            if inside is not None:
                raise InputError(
                    f"{f}: the input TRACE lies inside the output folder {inside}, which the "
                    f"export replaces; choose another output path"
                )


def _check_replaceable(path: Path, force: bool) -> None:
    """Refuse to replace ``path`` (the output or its ``.partial``) unless it is absent, or an
    earlier export and ``--force`` is given (the output itself is checked by
    ``check_outputs``; a ``.partial`` a killed export left is named here)."""
    from ..errors import InputError

    if not path.exists() and not path.is_symlink():
        return
    if path.is_symlink():  # replacing a link's folder whole would be rmtree on a link
        raise InputError(
            f"{path}: a symbolic link (to {os.readlink(path)}); name the folder itself"
        )
    if not force:
        raise InputError(f"{path}: exists (an interrupted export?); pass --force to overwrite it")
    entries = {p.name for p in path.iterdir()} if path.is_dir() else {"?"}
    if not entries <= _EXPORT_ENTRIES:
        raise InputError(f"{path}: exists and is not an export folder; not overwritten")


def _write(trace, runs, fmt: str, folder: Path, export, open_trace, cb) -> tuple[list, list]:
    names: list[str] = []
    counts = [0, 0]
    sinks = _Sinks(folder, fmt, export.TABLES) if fmt != "parquet" else None
    try:
        for i, spec in enumerate(trace):
            t = open_trace(spec)
            with t:
                name = runs[i] if runs else export.run_name(t)
                names.append(name)
                export.check_run_names(names)
                ranks = export.file_ranks(t)
                blocks = export.block_columns(t, name)
                reqs = export.request_columns(t, name)
                counts[0] += len(t.blocks)
                counts[1] += len(t.requests)
            for j, (table, cols) in enumerate((("blocks", blocks), ("requests", reqs))):
                if sinks is None:
                    export.write_parquet(cols, table, folder, name, ranks)
                else:
                    sinks.write(table, export.plain_rows(cols))
                cb(2 * i + j + 1, 2 * len(trace))
    finally:
        if sinks is not None:
            sinks.close()
    return names, counts


class _Sinks:
    """The open CSV or JSONL files of one export (one per table); a CSV file has its header
    line even when no row follows (a consumer still learns the columns)."""

    def __init__(self, folder: Path, fmt: str, tables: dict) -> None:
        self.fmt = fmt
        self.files = {t: open(folder / f"{t}.{fmt}", "w", newline="") for t in tables}
        self.writers: dict[str, csv.DictWriter] = {}
        if fmt == "csv":
            for t, fields in tables.items():
                w = self.writers[t] = csv.DictWriter(self.files[t], [f[0] for f in fields])
                w.writeheader()

    def write(self, table: str, rows) -> None:
        fh = self.files[table]
        for row in rows:
            if self.fmt == "jsonl":
                fh.write(_json_line(row) + "\n")
                continue
            self.writers[table].writerow(
                {k: _json_value(v) if isinstance(v, list) else v for k, v in row.items()}
            )

    def close(self) -> None:
        for fh in self.files.values():
            fh.close()


def _json_line(row: dict) -> str:
    """One JSONL row: standard JSON even for an infinite margin (``1e999``, which JSON's
    number grammar allows and Python, DuckDB, Spark and JavaScript read as infinity;
    ``Infinity`` is no JSON). NaN is already None (:func:`export.plain_rows`)."""
    line = json.dumps(row)
    if "Infinity" not in line:  # the fast path: no float is infinite
        return line
    return "{" + ", ".join(f"{json.dumps(k)}: {_json_value(v)}" for k, v in row.items()) + "}"


def _json_value(v: object) -> str:
    if isinstance(v, float) and math.isinf(v):
        return "1e999" if v > 0 else "-1e999"
    if isinstance(v, list):
        return "[" + ", ".join(_json_value(x) for x in v) + "]"
    return json.dumps(v)
