"""Block rows as the arrays a :class:`~.writer.TraceWriter` appends: the columns a caller
hands to ``add_blocks`` checked and completed, the writer-computed columns, and the
low-level append of rows to one resizable dataset."""

from __future__ import annotations

import h5py
import numpy as np

from .. import schema

_BLOCK_COLUMNS = {c.name: c for c in schema.BLOCK_COLUMNS}


def block_arrays(columns: dict, copy: bool) -> tuple[int, dict[str, np.ndarray]]:
    """``(n, arrays)``: every block column of ``columns`` (name -> n rows) as an array of
    its schema dtype (``copy``: always a new one, for rows kept after the call returns:
    the caller may reuse its arrays), a missing one filled with its fill value (matrices
    one column wide).

    Raises:
        ValueError: an unknown column name, or columns of different lengths.
    """
    n = len(next(iter(columns.values())))
    for name, arr in columns.items():
        if name not in _BLOCK_COLUMNS:
            raise ValueError(f"blocks: unknown column {name!r}")
        if len(arr) != n:
            raise ValueError(f"blocks.{name}: {len(arr)} rows, expected {n}")
    arrays = {}
    for c in schema.BLOCK_COLUMNS:
        given = columns.get(c.name)
        if given is None:
            shape = (n,) if c.width is None else (n, 1)
            arrays[c.name] = np.full(shape, c.fill, dtype=c.np_dtype)
        else:
            arrays[c.name] = (np.array if copy else np.asarray)(given, dtype=c.np_dtype)
    return n, arrays


def concat_blocks(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """:func:`block_arrays` results as one set of rows, in order (so that a flush appends
    each column once, not once per part): matrices padded with their column's fill to the
    widest part, as the narrower rows read back from a widened dataset."""
    if len(parts) == 1:
        return parts[0]
    out = {}
    for c in schema.BLOCK_COLUMNS:
        cols = [p[c.name] for p in parts]
        if c.width is not None:
            w = max(x.shape[1] for x in cols)
            cols = [schema.pad_to(x, w, c.fill) for x in cols]
        out[c.name] = np.concatenate(cols)
    return out


def same_rows(proposed: np.ndarray, verified: np.ndarray) -> np.ndarray:
    """bool [n]: each block's ``verified`` row equals its ``proposed`` row (int [n, w] each,
    any widths: both padded with -1 to the wider, as they read back), what the stored
    ``verified_same`` column says."""
    w = max(proposed.shape[1], verified.shape[1])
    return (schema.pad_to(proposed, w) == schema.pad_to(verified, w)).all(axis=1)


def derived(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The writer-computed block columns of rows about to be appended: ``verified_same``
    (:func:`same_rows`; the -1 padding to a wider stored width changes no row's
    equality)."""
    return {"verified_same": same_rows(arrays["proposed"], arrays["verified"]).astype(np.int8)}


def append_rows(ds: h5py.Dataset, arr: np.ndarray, c: schema.Column) -> None:
    """Append rows ``arr`` to ``ds`` (a narrower matrix: its first columns) with h5py's
    low-level calls (``resize`` and ``__setitem__`` cost three times more, holding the
    GIL)."""
    dsid = ds.id
    n0, n = dsid.shape[0], len(arr)
    if c.width is None:
        dsid.set_extent((n0 + n,))
    else:
        if arr.shape[1] > dsid.shape[1]:  # a wider block than seen: new cells read as -1
            dsid.set_extent((n0, arr.shape[1]))
        dsid.set_extent((n0 + n, dsid.shape[1]))
    fspace = dsid.get_space()
    fspace.select_hyperslab((n0,) + (0,) * (arr.ndim - 1), arr.shape)
    arr = np.ascontiguousarray(arr, dtype=c.np_dtype)
    dsid.write(h5py.h5s.create_simple(arr.shape), fspace, arr)
