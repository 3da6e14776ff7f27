"""A trace as two flat tables (blocks, requests) for engines that query files: Parquet
(pyarrow, imported only inside the functions that need it), CSV and JSONL.

Layout of an export folder ``OUT`` (``spectrace export``)::

    OUT/blocks/run=<run>/rank=<rank>/part-0.parquet      (or OUT/blocks.csv, blocks.jsonl)
    OUT/requests/run=<run>/rank=<rank>/part-0.parquet    (or OUT/requests.csv, requests.jsonl)

Hive partitioning: every TRACE argument is one **run**, every file of it one **rank**. The
run is named by ``--run`` or else the trace's first file name without its suffixes and a
trailing rank tag (``run.dp1.h5`` -> ``run``); the rank is the file's ``dp_rank`` from
/meta, else its index among the run's files. Arrow schemas: :data:`BLOCKS_SCHEMA_DOC`.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from . import schema
from .errors import InputError
from .findings import TraceData
from .findings.values import impossible_rows
from .metrics import recompute_accepted
from .store import Trace

if TYPE_CHECKING:
    import pyarrow as pa

#: Blocks table: (column, Arrow type, meaning). ``run`` and ``rank`` are the hive partition
#: keys (directory names in Parquet, columns in CSV/JSONL and in memory).
BLOCK_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("run", "string", "run name (partition key)"),
    ("rank", "int32", "data-parallel rank of the file (partition key)"),
    ("block", "int64", "row of the block in its trace (record order)"),
    ("request", "int32", "row of the block's request in the run's requests table"),
    ("req_id", "string", "the request's engine id"),
    ("step", "int32", "engine step that proposed the block"),
    ("position", "int32", "anchor position in prompt + output (tokens)"),
    ("anchor", "int32", "anchor token id (-1 unknown)"),
    ("k", "int16", "proposed drafts"),
    ("proposed", "list<int32>", "the k proposed ids (-1: an id the engine did not keep)"),
    ("num_verified", "int16", "drafts the target verified (-1 unknown)"),
    ("verified", "list<int32>", "the num_verified verified ids; null when unknown"),
    ("accepted", "int16", "accepted drafts as recorded (-1 unknown)"),
    ("accepted_recomputed", "int16", "longest draft prefix the output took (-1 unknown)"),
    ("num_emitted", "int16", "tokens emitted (accepted + 1; -1 unknown)"),
    ("emitted", "list<int32>", "the num_emitted emitted ids; null when unknown"),
    ("t_ns", "int64", "wall-clock time recorded (ns since the epoch)"),
    ("batch_row", "int16", "row in the proposing step's batch (-1 unknown)"),
    ("batch_size", "int16", "rows in that batch (-1 unknown)"),
    ("proposal_source", "int8", "1 drafter output, 0 copy of verified, -1 unknown"),
    ("draft_margin", "list<float32>", "k drafter top-1 minus top-2 margins (NaN unknown)"),
    ("target_margin", "float32", "target top-1 minus top-2 margin at the anchor (NaN unknown)"),
    ("impossible", "bool", "values no engine produces (impossible_values): info leaves it out"),
)
#: Requests table, same conventions.
REQUEST_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("run", "string", "run name (partition key)"),
    ("rank", "int32", "data-parallel rank of the file (partition key)"),
    ("request", "int32", "row of the request in the run's requests table"),
    ("req_id", "string", "engine request id"),
    ("prompt_ids", "list<int32>", "prompt token ids"),
    ("output_ids", "list<int32>", "output token ids (trimmed at stop/max_tokens)"),
    ("finish_reason", "string", "length | stop | abort | unfinished | ''"),
)
TABLES = {"blocks": BLOCK_FIELDS, "requests": REQUEST_FIELDS}
PARTITION_KEYS = ("run", "rank")
_RANK_TAG = re.compile(r"[._-](dp|rank|tp)[._-]?\d+$")


def run_name(trace: Trace) -> str:
    """The default run name of a trace: its first file's name without ``.h5``/``.partial``
    and a trailing rank tag (``.dp1``, ``-rank0``), made safe for a directory name."""
    name = trace.paths[0].name if trace.paths else "run"
    for suffix in (".partial", ".h5", ".hdf5"):
        name = name[: -len(suffix)] if name.endswith(suffix) else name
    name = _RANK_TAG.sub("", name)
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "run"


def file_ranks(trace: Trace) -> list[int]:
    """Per file of ``trace``, its rank: its /meta ``dp_rank`` (an int, not another file's);
    a file without one takes the smallest rank no file holds, in file order."""
    ranks: list[int | None] = []
    for m in trace.metas:
        r = m.get("dp_rank")
        ok = isinstance(r, int) and not isinstance(r, bool) and r not in ranks
        ranks.append(int(r) if ok else None)  # type: ignore[arg-type]
    taken = {r for r in ranks if r is not None}
    free = (n for n in range(len(ranks) + len(taken)) if n not in taken)
    return [r if r is not None else next(free) for r in ranks]


@dataclass
class Ragged:
    """A list column without Python lists: row i is ``values[offsets[i]:offsets[i + 1]]``,
    null where ``valid`` is False (Arrow's list layout, built by one mask over a matrix).

    Attributes:
        values: the cells of every row, concatenated ([total], the matrix's dtype).
        offsets: int64 [n + 1] row starts; valid: bool [n], or None when every row is.
    """

    values: np.ndarray
    offsets: np.ndarray
    valid: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @classmethod
    def from_matrix(
        cls, mat: np.ndarray, n: np.ndarray, valid: np.ndarray | None = None, fill=schema.PAD
    ) -> Ragged:
        """Row i of ``mat`` [rows, w] cut to ``max(n[i], 0)`` cells; a matrix narrower than
        that (a column an older file lacks) is padded with ``fill``."""
        lengths = np.maximum(n.astype(np.int64), 0)
        mat = schema.pad_to(mat, max(int(lengths.max(initial=0)), mat.shape[1]), fill)
        keep = np.arange(mat.shape[1]) < lengths[:, None]
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(mat[keep], offsets, valid)

    def tolist(self) -> list:
        """The rows as Python lists (None for a null row)."""
        vals, off = self.values.tolist(), self.offsets.tolist()
        rows: list = [vals[a:b] for a, b in zip(off[:-1], off[1:])]
        if self.valid is not None:
            rows = [r if ok else None for r, ok in zip(rows, self.valid.tolist())]
        return rows


def block_columns(trace: Trace, run: str) -> dict[str, object]:
    """The blocks table of one trace (:data:`BLOCK_FIELDS`): name -> numpy array, list (of
    str) or :class:`Ragged` (list columns), ``len(trace.blocks)`` rows."""
    b = trace.blocks
    n = len(b)
    ranks = np.asarray(file_ranks(trace), np.int32)
    file_of = np.repeat(np.arange(len(ranks)), trace.nblocks_per_file)
    k, nv, ne = b.k, b.num_verified, b.num_emitted
    cols: dict[str, object] = {
        "run": [run] * n,
        "rank": ranks[file_of] if n else np.zeros(0, np.int32),
        "block": np.arange(n, dtype=np.int64),
        "request": b.request.astype(np.int32),
        "req_id": np.asarray(trace.requests.req_id, dtype=object)[b.request].tolist(),
        "proposed": Ragged.from_matrix(b.proposed, k),
        "verified": Ragged.from_matrix(b.verified, nv, nv >= 0),
        "accepted_recomputed": recompute_accepted(trace),
        "emitted": Ragged.from_matrix(b.emitted, ne, ne >= 0),
        "draft_margin": Ragged.from_matrix(b.draft_margin, k, fill=math.nan),
        # the blocks spectrace info leaves out of its figures (RUN_FIGURES does too)
        "impossible": impossible_rows(TraceData.build(trace, "trace")),
    }
    for name, _, _ in BLOCK_FIELDS:
        if name not in cols:
            cols[name] = getattr(b, name)
    return {name: cols[name] for name, _, _ in BLOCK_FIELDS}


def request_columns(trace: Trace, run: str) -> dict[str, object]:
    """The requests table of one trace (:data:`REQUEST_FIELDS`); a placeholder request of a
    partial trace (blocks flushed before their request row) has the rank of its blocks'
    file."""
    r = trace.requests
    ranks = np.asarray(file_ranks(trace), np.int32)
    return {
        "run": [run] * len(r),
        "rank": ranks[r.file],
        "request": np.arange(len(r), dtype=np.int32),
        "req_id": list(r.req_id),
        "prompt_ids": [p.tolist() for p in r.prompt_ids],
        "output_ids": [o.tolist() for o in r.output_ids],
        "finish_reason": list(r.finish_reason),
    }


def require(module: str):
    """Import an optional dependency (``pyarrow``, ``pyarrow.parquet``, ``pandas``).

    Raises:
        InputError: it is not installed (names the ``export`` extra).
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        top = module.split(".")[0]
        raise InputError(
            f"{top} is not installed: the Parquet export and the table views need it "
            f"(pip install 'spectrace[export]')"
        ) from None


def arrow_schema(table: str) -> pa.Schema:
    """The Arrow schema of ``table`` (``blocks`` or ``requests``), with each field's meaning
    as its ``doc`` metadata.

    Raises:
        InputError: pyarrow is not installed.
    """
    pa = require("pyarrow")

    types = {
        "string": pa.string(),
        "bool": pa.bool_(),
        "int8": pa.int8(),
        "int16": pa.int16(),
        "int32": pa.int32(),
        "int64": pa.int64(),
        "float32": pa.float32(),
        "list<int32>": pa.list_(pa.int32()),
        "list<float32>": pa.list_(pa.float32()),
    }
    return pa.schema(
        [pa.field(n, types[t], metadata={"doc": d}) for n, t, d in TABLES[table]],
        metadata={"spectrace.table": table},
    )


def to_arrow(columns: dict[str, object], table: str) -> pa.Table:
    """A column dict of :func:`block_columns` / :func:`request_columns` as an Arrow table."""
    pa = require("pyarrow")

    schema = arrow_schema(table)
    arrays = [_arrow_array(pa, columns[f.name], f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


def _arrow_array(pa, col: object, type_):
    """One column as an Arrow array: a :class:`Ragged` through its offsets (no Python
    lists), anything else through ``pa.array``."""
    if not isinstance(col, Ragged):
        return pa.array(col, type=type_)
    values = pa.array(col.values, type=type_.value_type)
    mask = None if col.valid is None else pa.array(~col.valid)
    return pa.ListArray.from_arrays(pa.array(col.offsets, pa.int32()), values, mask=mask)


def partitions(
    columns: dict[str, object], ranks: Sequence[int] = ()
) -> Iterator[tuple[str, int, np.ndarray]]:
    """``(run, rank, row indices)`` of each partition of a column dict: every rank with rows,
    and every rank of ``ranks`` (the run's files) even without one."""
    rank_col = np.asarray(columns["rank"])
    runs = columns["run"]
    run = runs[0] if len(rank_col) else ""  # type: ignore[index]
    for rank in sorted(set(np.unique(rank_col).tolist()) | set(ranks)):
        yield str(run), int(rank), np.flatnonzero(rank_col == rank)


def write_parquet(
    columns: dict[str, object],
    table: str,
    out: Path,
    run: str = "",
    ranks: Sequence[int] = (),
) -> list[Path]:
    """Write one run's table as ``out/<table>/run=R/rank=N/part-0.parquet`` files (the
    partition keys live in the directory names only). Every rank of ``ranks`` (the run
    ``run``'s files) gets its file, with no row when it has none: an empty rank or run is
    still in the dataset. Returns the files written."""
    pq = require("pyarrow.parquet")

    full = to_arrow(columns, table)
    written = []
    for name, rank, rows in partitions(columns, ranks):
        part = full.take(rows).drop_columns(list(PARTITION_KEYS))
        d = out / table / f"run={name or run}" / f"rank={rank}"
        d.mkdir(parents=True, exist_ok=True)
        pq.write_table(part, d / "part-0.parquet")
        written.append(d / "part-0.parquet")
    return written


def plain_rows(columns: dict[str, object]) -> Iterator[dict]:
    """Rows of a column dict as JSON-ready dicts (NaN -> None), for CSV and JSONL."""
    names = list(columns)
    cols = [c.tolist() if isinstance(c, (np.ndarray, Ragged)) else c for c in columns.values()]
    for values in zip(*cols):
        yield {n: _plain(v) for n, v in zip(names, values)}


def _plain(v):
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


#: The longest run name: ``run=`` + it is one folder name, of at most 255 bytes (NAME_MAX).
MAX_RUN_NAME = 251

#: Run names that start with a letter but read as a date in DuckDB's hive partitions.
_TYPED_WORDS = frozenset({"inf", "infinity", "epoch"})


def check_run_names(names: list[str]) -> None:
    """Raises InputError when a run name is not a plain directory name (letters, digits,
    ``._-``) of at most :data:`MAX_RUN_NAME` characters, does not start with a letter or is a
    word DuckDB reads as a date (readers would type it as a number or a date), or two runs
    share a name (their partitions would mix)."""
    bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9._-]+", n) or n in (".", "..")]
    if bad:
        raise InputError(f"run name {bad[0]!r}: use letters, digits, '.', '_' and '-' only")
    long = [n for n in names if len(n) > MAX_RUN_NAME]
    if long:
        raise InputError(
            f"run name {long[0][:20]}... ({len(long[0])} characters): at most {MAX_RUN_NAME}, "
            f"since its partition folder run=NAME is one file name (255 bytes at most): "
            f"name it with --run NAME"
        )
    # Readers of hive partitions infer a key's type from the folder names: DuckDB and
    # pyarrow read "123" back as an integer (two runs "007" and "7" merge) and DuckDB
    # reads "2026-12-03", "inf" or "epoch" as a date.
    typed = [n for n in names if not n[0].isalpha() or n.lower() in _TYPED_WORDS]
    if typed:
        raise InputError(
            f"run name {typed[0]!r}: DuckDB and pyarrow would read it back as a number or a "
            f"date, not the string it is (hive partitioning infers a key's type from its "
            f"folder names): start it with a letter, e.g. --run run-{typed[0]}"
        )
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InputError(f"two traces are both run {dup[0]!r}: name them with --run NAME")


def read_parquet(folder: str | Path, table: str) -> pa.Table:
    """Read an export folder's table back (``run``/``rank`` from the directory names, typed
    as in :func:`arrow_schema`), sorted by run, rank and the row index."""
    pa, ds = require("pyarrow"), require("pyarrow.dataset")
    schema = arrow_schema(table)
    keys = pa.schema([schema.field(k) for k in PARTITION_KEYS])
    part = ds.partitioning(keys, flavor="hive")
    data = ds.dataset(Path(folder) / table, format="parquet", partitioning=part, schema=schema)
    key = "block" if table == "blocks" else "request"
    return data.to_table().sort_by([("run", "ascending"), (key, "ascending")])
