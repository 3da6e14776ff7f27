"""The cheap structural checks of one open trace file, run before any column is used.

Every check returns :class:`Problem` rows instead of raising, so that ``spectrace validate``
can list them all; the reader (:mod:`.reader`) raises the first one as a
:class:`~spectrace.tracer.errors.TraceFormatError` (exit 2). Nothing here reads a whole
column except the ``request`` index column (:func:`request_index_problems`, run by the
reader when it loads that column). Values are never clamped or wrapped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import h5py
import numpy as np

from .. import schema
from ..errors import TraceFormatError
from .live import FLUSHED_ROWS

_VERSION_RE = re.compile(r"(\d+)\.(\d+)")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a trace file.

    Attributes:
        path: the file, as given.
        field: the dataset, attribute or meta key at fault (``blocks/request``, ``/meta``,
            ``format_version``, ``meta.k``).
        what: what is wrong, in words.
        value: the offending value (shown with ``repr``), or None.
        row: the first row at fault (0-based) when the problem is in rows, else None.
        count: how many rows (or cells) share the problem.
    """

    path: str
    field: str
    what: str
    value: object = None
    row: int | None = None
    count: int = 1

    def line(self) -> str:
        """The one-line message: ``FILE: what at row R (N rows) (field=F, value=V)``."""
        at = f" at row {self.row}" if self.row is not None else ""
        many = f" ({self.count} rows)" if self.count > 1 else ""
        value = "" if self.value is None else f", value={self.value!r}"
        return f"{self.path}: {self.what}{at}{many} (field={self.field}{value})"

    def error(self) -> TraceFormatError:
        """This problem as the reader's exception."""
        return TraceFormatError(self.line())


def is_complete(path: str, f: h5py.File) -> bool:
    """Whether the file was closed cleanly: status ``complete`` and not a ``.partial`` name."""
    status = _attr(f, "status")
    return status == schema.STATUS_COMPLETE and not str(path).endswith(schema.PARTIAL_SUFFIX)


def format_version(path: str, f: h5py.File) -> tuple[str | None, list[Problem]]:
    """The file's format version after checking that it is a trace this reader reads.

    Returns:
        ``(version, [])``, or ``(None, [problem])`` for a foreign file, a missing or
        malformed version (``1.banana``) or an unsupported major version.
    """
    fmt = _attr(f, "format")
    if fmt != schema.FORMAT:
        what = f"not a spectrace trace (format attribute is {fmt!r}, expected {schema.FORMAT!r})"
        return None, [Problem(path, "format", what)]
    version = _attr(f, "format_version")
    if not version:
        return None, [Problem(path, "format_version", "damaged trace file (no format_version)")]
    m = _VERSION_RE.fullmatch(version)
    if m is None:
        what = "malformed format version (expected MAJOR.MINOR)"
        return None, [Problem(path, "format_version", what, version)]
    if int(m.group(1)) != schema.MAJOR_VERSION:
        newer = int(m.group(1)) > schema.MAJOR_VERSION  # an older file needs no upgrade
        what = (
            f"trace format version {version} is not supported; this spectrace reads "
            f"{schema.MAJOR_VERSION}.x ({'upgrade spectrace' if newer else 'an older format'})"
        )
        return None, [Problem(path, "format_version", what)]
    return version, []


def read_meta(path: str, f: h5py.File) -> tuple[dict, list[Problem]]:
    """The /meta document, checked: a JSON object whose known keys have their types
    (:data:`schema.META_TYPES`).

    Returns:
        ``(meta, problems)``; ``meta`` is ``{}`` when /meta is unusable.
    """
    ds = f.get("meta")
    if not isinstance(ds, h5py.Dataset) or ds.shape != ():
        return {}, [Problem(path, "/meta", "missing or not a scalar string dataset")]
    raw = ds[()]
    if not isinstance(raw, (bytes, str)):
        return {}, [Problem(path, "/meta", "not a string", _short_repr(raw))]
    try:
        meta = json.loads(_decode(raw))
    except (ValueError, UnicodeDecodeError) as exc:
        return {}, [Problem(path, "/meta", f"not JSON ({str(exc)[:80]})")]
    if not isinstance(meta, dict):
        what = f"not a JSON object (a JSON {type(meta).__name__.replace('NoneType', 'null')})"
        return {}, [Problem(path, "/meta", what, _short_repr(meta))]
    problems = []
    for key, value in meta.items():
        why = schema.meta_type_error(key, value)
        if why is not None:
            problems.append(Problem(path, f"meta.{key}", why, _short_repr(value)))
    return meta, problems


def column_problems(path: str, f: h5py.File) -> list[Problem]:
    """Tables and columns present with the schema's rank, dtype kind and (matrices) a width.

    Checks every required column and every optional one present; reads no data.
    """
    problems: list[Problem] = []
    for table, cols in schema.TABLES.items():
        g = f.get(table)
        if not isinstance(g, h5py.Group):
            problems.append(Problem(path, f"/{table}", "missing table group"))
            continue
        for c in cols:
            if c.name not in g:
                if not c.optional:
                    problems.append(Problem(path, f"{table}/{c.name}", "missing column"))
                continue
            ds = g[c.name]
            why = _column_shape_error(ds, c) if isinstance(ds, h5py.Dataset) else "not a dataset"
            if why is not None:
                problems.append(Problem(path, f"{table}/{c.name}", why))
    return problems


def length_problems(path: str, f: h5py.File) -> list[Problem]:
    """Columns of one table with different lengths: wrong in a file marked complete (a live
    or killed writer's file may have them; the reader keeps the shortest there)."""
    problems = []
    for table, cols in schema.TABLES.items():
        g = f[table]
        lengths = {c.name: g[c.name].shape[0] for c in cols if c.name in g}
        if len(set(lengths.values())) > 1:
            spread = ", ".join(f"{n}={v}" for n, v in lengths.items())
            problems.append(
                Problem(
                    path, f"/{table}", f"columns of unequal length in a complete file: {spread}"
                )
            )
    told = f["blocks"].attrs.get(FLUSHED_ROWS)
    rows = f["blocks"]["k"].shape[0] if "k" in f["blocks"] else None
    if told is not None and rows is not None and not _at_least(told, rows):
        # the reader reads at most the announced rows: a smaller count would hide the rest
        what = f"{FLUSHED_ROWS} attribute below the {rows} block rows of a complete file"
        problems.append(Problem(path, f"/blocks.{FLUSHED_ROWS}", what, _plain(told)))
    return problems


def _at_least(value: object, n: int) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and int(value) >= n


def _plain(value: object) -> object:
    return value.item() if isinstance(value, np.generic) else value


#: /meta items every rank file of one run holds alike (the vLLM hook writes each rank's from
#: the same engine config).
RUN_KEYS = ("engine", "engine_version", "method", "k", "target_model", "draft_model")


def runs_differ(metas: list[dict]) -> str | None:
    """Why files given as one trace are not the ranks of one run, from their /meta: a
    :data:`RUN_KEYS` item that differs, or a data-parallel rank twice; None otherwise."""
    runs = {tuple(str(m.get(key)) for key in RUN_KEYS) for m in metas}
    if len(runs) > 1:
        return f"{', '.join(RUN_KEYS)}: {sorted(runs)}"
    ranks = [m["dp_rank"] for m in metas if m.get("dp_rank") is not None]
    if len(ranks) != len(set(ranks)):
        return f"data-parallel ranks {sorted(ranks)}: a rank appears twice"
    return None


def shared_request(paths: list, files: list[h5py.File], ranked: bool) -> str | None:
    """Why files given as one trace cannot be ranks of one run: a request id held by two of
    them (a run's ranks serve distinct requests; a copy of one file holds every request
    twice), or None. With every file ``ranked`` (a /meta dp_rank each), only a shared id
    that is one request twice counts (the same known prompt; unknown in both files: the
    same output, else the same blocks, :func:`_same_request`): engines that number each
    rank's requests from 0 reuse ids across ranks, a copy under another rank number repeats
    the request. Reads each file's ``requests/req_id`` (and the first shared id's rows).
    """
    seen: dict[bytes, tuple[str, h5py.File, int]] = {}  # id -> (path, file, its row)
    for path, f in zip(paths, files):
        ids = f["requests"]["req_id"][:].tolist()
        both = set(ids) & seen.keys()
        if both:
            r = min(both)
            where, g, row = seen[r]
            if not ranked or _same_request(g, row, f, ids.index(r)):
                rid = _decode(r)
                return f"request {rid!r} in {where} and {path}: a copy of one file, or two runs"
        seen.update({r: (str(path), f, i) for i, r in enumerate(ids)})
    return None


def _same_request(fa: h5py.File, row_a: int, fb: h5py.File, row_b: int) -> bool:
    """Whether /requests row ``row_a`` of file ``fa`` and ``row_b`` of ``fb`` are one
    request twice: the same non-empty prompt ids; where neither file knows the prompt (a
    log imported without its requests file), the same non-empty output ids, else the same
    blocks recorded at the same instants (anchor positions, anchors, proposals and
    ``t_ns``: two processes never record a request's every block at the same nanosecond,
    a copy does; ranks that serve one prompts file under the same ids stay two ranks)."""
    a, b = fa["requests"], fb["requests"]
    for col in ("prompt_ids", "output_ids"):
        ia, ib = np.asarray(a[col][row_a]), np.asarray(b[col][row_b])
        if len(ia) or len(ib):
            return len(ia) > 0 and np.array_equal(ia, ib)
    rows_a, rows_b = _request_rows(fa, row_a), _request_rows(fb, row_b)
    if not len(rows_a) or len(rows_a) != len(rows_b):
        return False
    cols = ("position", "anchor", "proposed", "t_ns")
    return all(
        np.array_equal(fa["blocks"][c][rows_a], fb["blocks"][c][rows_b])
        for c in cols
        if c in fa["blocks"] and c in fb["blocks"]
    )


def _request_rows(f: h5py.File, row: int) -> np.ndarray:
    """The block rows of /requests row ``row`` (a whole read of ``blocks/request``: only
    for a request id two ranked files share while neither knows its prompt or output)."""
    g = f["blocks"]
    if "request" not in g:
        return np.zeros(0, np.int64)
    n = min(g[c].shape[0] for c in ("request", "position", "anchor", "proposed", "t_ns") if c in g)
    return np.flatnonzero(g["request"][:n] == row)


def request_index_problems(
    path: str, arr: np.ndarray, nreq: int, complete: bool, base: int = 0
) -> list[Problem]:
    """The ``blocks/request`` cells of one file that index no request.

    Args:
        arr: the file's ``request`` cells (int, [n]), as stored (not re-based).
        nreq: rows of the file's /requests table.
        complete: the file was closed cleanly; a live file may index requests not flushed yet.
        base: the block row of ``arr[0]`` (for the row in the message).
    """
    problems = []
    neg = np.flatnonzero(arr < 0)
    if neg.size:
        v = int(arr[neg[0]])
        what = "negative request index"
        problems.append(Problem(path, "blocks/request", what, v, base + int(neg[0]), neg.size))
    if complete:
        high = np.flatnonzero(arr >= nreq)
        if high.size:
            v = int(arr[high[0]])
            what = f"request index out of range (the file has {nreq} requests)"
            problems.append(
                Problem(path, "blocks/request", what, v, base + int(high[0]), high.size)
            )
    return problems


def scanned_request_index_problems(
    path: str, ds: h5py.Dataset, n: int, nreq: int, chunk: int = 1 << 20
) -> list[Problem]:
    """:func:`request_index_problems` of the first ``n`` cells of a complete file's
    ``blocks/request`` dataset, scanned ``chunk`` rows at a time (a few MB, not the whole
    column); the column is read whole only to describe a problem found."""
    for lo in range(0, n, chunk):
        c = ds[lo : min(lo + chunk, n)]
        if len(c) and (int(c.min()) < 0 or int(c.max()) >= nreq):
            return request_index_problems(path, ds[:n], nreq, True)
    return []


#: Count columns whose impossible values (below -1, accepted > num_verified) are findings
#: of a readable trace (``impossible_values``, exit 1), not unreadable input (exit 2).
COUNT_COLUMNS = frozenset({"num_verified", "accepted", "num_emitted"})

#: The smallest value of a 1-D block column (``-1``: unknown); checked when a column loads
#: (except :data:`COUNT_COLUMNS`) and by ``spectrace validate``.
BLOCK_MINIMUM: dict[str, int] = {
    "step": 0,
    "position": 0,
    "k": 0,
    "num_verified": schema.PAD,
    "accepted": schema.PAD,
    "num_emitted": schema.PAD,
    "batch_row": schema.PAD,
    "batch_size": schema.PAD,
    "proposal_source": schema.PAD,
}


def value_problems(path: str, name: str, arr: np.ndarray, base: int = 0) -> list[Problem]:
    """Cells of 1-D block column ``name`` below its minimum (:data:`BLOCK_MINIMUM`), or of a
    float column (stored wider than its float32) that float32 cannot hold (:func:`too_wide`).
    ``base``: the block row of ``arr[0]`` (for the row in the message)."""
    if arr.dtype.kind == "f":
        bad = too_wide(arr)
        if not bad.any():
            return []
        rows = np.flatnonzero(bad.reshape(len(bad), -1).any(axis=1))
        v = float(arr[rows[0]][bad[rows[0]]].flat[0]) if arr.ndim > 1 else float(arr[rows[0]])
        what = "finite value beyond the float32 range (it would read as infinite)"
        return [Problem(path, f"blocks/{name}", what, v, base + int(rows[0]), rows.size)]
    lo = BLOCK_MINIMUM.get(name)
    if lo is None or arr.ndim != 1:
        return []
    bad = np.flatnonzero(arr < lo)
    if not bad.size:
        return []
    what = f"value below {lo}"
    return [Problem(path, f"blocks/{name}", what, int(arr[bad[0]]), base + int(bad[0]), bad.size)]


def too_wide(arr: np.ndarray) -> np.ndarray:
    """bool (``arr``'s shape): finite cells of a float array beyond float32's range, which
    the float32 columns (margins) would turn into infinities (all False for float32)."""
    if arr.dtype.itemsize <= 4:
        return np.zeros(arr.shape, bool)
    return np.isfinite(arr) & (np.abs(arr) > np.finfo(np.float32).max)


def accepted_problems(
    path: str, accepted: np.ndarray, num_verified: np.ndarray, base: int = 0
) -> list[Problem]:
    """Blocks that accept more drafts than were verified (both known): acceptance rates
    above 1 follow from them (``spectrace validate`` reports them; the ``impossible_values``
    finding names them)."""
    bad = np.flatnonzero((num_verified >= 0) & (accepted > num_verified))
    if not bad.size:
        return []
    what = f"accepted > num_verified ({int(num_verified[bad[0]])})"
    v = int(accepted[bad[0]])
    return [Problem(path, "blocks/accepted", what, v, base + int(bad[0]), bad.size)]


def _column_shape_error(ds: h5py.Dataset, c: schema.Column) -> str | None:
    rank = 1 if c.width is None else 2
    if ds.ndim != rank:
        return f"stored {ds.ndim}-D, expected {rank}-D {c.dtype}"
    dt = ds.dtype
    if c.vlen:  # the ids are read as int32: a wider type would wrap them
        base = h5py.check_vlen_dtype(dt)
        if base is None or not _fits(base, c.np_dtype):
            got = _dtype_name(dt) if base is None else f"ragged {base}"
            return f"stored as {got}, expected ragged {c.dtype}"
        return None
    if c.dtype == "str":
        if h5py.check_string_dtype(dt) is None:
            return f"stored as {_dtype_name(dt)}, expected UTF-8 strings"
        return None
    if not _fits(dt, c.np_dtype):
        return f"stored as {_dtype_name(dt)}, expected {c.dtype}"
    if rank == 2 and ds.shape[1] < 1:
        return "a matrix with no columns"
    return None


def _fits(dt: np.dtype, want: np.dtype) -> bool:
    """Whether every value of stored type ``dt`` fits the schema's ``want`` (any float for a
    float column)."""
    if want.kind == "f":
        return dt.kind == "f"
    size = want.itemsize
    return (dt.kind == "i" and dt.itemsize <= size) or (dt.kind == "u" and dt.itemsize < size)


def text_problems(path: str, field: str, cells) -> list[Problem]:
    """The cells of a UTF-8 string column (``bytes``, as h5py reads them) that are not UTF-8
    text (a writer that stored raw bytes): one problem with the first row and a count."""
    bad = [i for i, x in enumerate(cells) if isinstance(x, bytes) and not _is_utf8(x)]
    if not bad:
        return []
    return [Problem(path, field, "not UTF-8 text", cells[bad[0]], bad[0], len(bad))]


def decode_texts(path: str, field: str, cells) -> list[str]:
    """The cells of a UTF-8 string column as ``str``.

    Raises:
        TraceFormatError: a cell is not UTF-8 (names the field and the first row).
    """
    try:
        return [_decode(x) for x in cells]
    except UnicodeDecodeError:
        raise text_problems(path, field, cells)[0].error() from None


def phase_names(path: str, g: h5py.Group) -> tuple[list[str], list[Problem]]:
    """The ``/phases`` ``names`` attribute (the text of each name code): absent, no name;
    anything but a list of UTF-8 strings is a problem (``[]`` is returned then)."""
    raw = g.attrs.get("names")
    if raw is None:
        return [], []
    cells = raw.tolist() if isinstance(raw, np.ndarray) and raw.ndim == 1 else None
    if cells is None or not all(isinstance(x, (str, bytes)) for x in cells):
        what = "not a list of strings"
        return [], [Problem(path, "/phases.names", what, _short_repr(_plain(raw)))]
    problems = text_problems(path, "/phases.names", cells)
    return ([] if problems else [_decode(x) for x in cells]), problems


def phase_name_column(path: str, g: h5py.Group, codes: np.ndarray) -> np.ndarray:
    """The name of each phase row's code (``?``: a code outside the names), object [n].

    Raises:
        TraceFormatError: the ``names`` attribute is unusable (:func:`phase_names`).
    """
    names, problems = phase_names(path, g)
    if problems:
        raise problems[0].error()
    return np.array([names[c] if 0 <= c < len(names) else "?" for c in codes], dtype=object)


def _is_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _dtype_name(dt: np.dtype) -> str:
    if h5py.check_string_dtype(dt) is not None or dt.kind in "SUO":
        return "strings"
    return str(dt)


def _attr(f: h5py.File, name: str) -> str | None:
    v = f.attrs.get(name)
    return _decode(v) if v is not None else None


def _decode(v) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def _short_repr(v: object) -> object:
    text = repr(v)
    return v if len(text) <= 60 else text[:57] + "..."


def stored_rows(g: h5py.Group) -> int:
    """The rows of the shortest block column in /blocks group ``g`` (a 0-D column counts
    none: :func:`column_problems` names it, exit 2)."""
    return min(
        ((g[c.name].shape or (0,))[0] for c in schema.BLOCK_COLUMNS if c.name in g), default=0
    )


def request_ids(path: str, raw: np.ndarray) -> list[str]:
    """A file's ``requests/req_id`` cells (``raw``) as text, each id on one row.

    Raises:
        TraceFormatError: a cell that is not UTF-8 text (:func:`decode_texts`), or an id on
            two rows (the writer keeps one row per request: a second is another request
            under its name, two runs in one file or a copied row; pairing by id would take
            either).
    """
    ids = decode_texts(path, "requests/req_id", raw)
    if len(set(ids)) == len(ids):
        return ids
    first: dict[str, int] = {}
    j = next(j for j, x in enumerate(ids) if first.setdefault(x, j) != j)
    raise TraceFormatError(
        f"{path}: request id {ids[j]!r} on rows {first[ids[j]]} and {j} (field=requests/req_id): "
        f"one row per request"
    )
