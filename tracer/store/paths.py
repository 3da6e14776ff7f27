"""Trace file names: the ``.partial`` rule and the expansion of a trace spec to files.

A writer records ``NAME.h5.partial`` and renames it to ``NAME.h5`` on a clean close
(:data:`spectrace.tracer.schema.PARTIAL_SUFFIX`); a reader given ``NAME.h5`` falls back to the
partial file of a writer that died.
"""

from __future__ import annotations

import glob as _glob
import os
import warnings
from collections.abc import Iterable
from pathlib import Path

from .. import schema
from ..errors import InputError

#: What :func:`resolve_paths` and :func:`spectrace.tracer.store.open_trace` accept.
TraceSpec = str | os.PathLike | Iterable[str | os.PathLike]


class TraceWarning(UserWarning):
    """A recoverable problem with a trace file (e.g. a ``.partial`` file of a dead writer)."""


def final_path(path: str | os.PathLike) -> Path:
    """Return the clean-close name of a trace path (strips a trailing ``.partial``)."""
    p = Path(path)
    return (
        p.with_name(p.name[: -len(schema.PARTIAL_SUFFIX)])
        if p.name.endswith(schema.PARTIAL_SUFFIX)
        else p
    )


def partial_path(path: str | os.PathLike) -> Path:
    """Return the name a writer records ``path`` under before its clean close."""
    p = Path(path)
    return p.with_name(p.name + schema.PARTIAL_SUFFIX)


def resolve_paths(spec: TraceSpec) -> list[Path]:
    """Expand a trace spec to file paths.

    A spec is a path, a glob (``run-*.h5``) or a list of either. ``NAME.h5`` that does not
    exist but has a ``NAME.h5.partial`` resolves to the partial file. A file given twice is
    read once (with a :class:`TraceWarning`): it would count every block twice.

    Raises:
        InputError: a path or glob that matches nothing.
    """
    specs = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    out: list[Path] = []
    for s in specs:
        out += _expand(str(s))
    if not out:
        raise InputError("no trace file given")
    unique = list(dict.fromkeys(p.resolve() for p in out))
    if len(unique) < len(out):  # the same file twice would count every block twice
        warnings.warn(
            f"{len(out) - len(unique)} trace file(s) given more than once; each is read once",
            TraceWarning,
            stacklevel=2,
        )
        out = [p for p in dict.fromkeys(out) if p.resolve() in unique]
        out = list({p.resolve(): p for p in out}.values())
    return out


def _expand(s: str) -> list[Path]:
    """The files of one spec item: a glob's sorted matches, or one path (or its partial)."""
    if any(ch in s for ch in "*?["):
        matches = sorted(_glob.glob(s))
        if not matches:
            raise InputError(f"{s}: no file matches this pattern")
        return [Path(m) for m in matches]
    p = Path(s)
    if not p.exists():
        partial = partial_path(p)
        if not partial.exists():
            raise InputError(f"{s}: no such file")
        p = partial
    return [p]
