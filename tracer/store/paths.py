"""Trace file names: the ``.partial`` rule, the expansion of a trace spec to files, and the
no-clobber rule of every command that writes.

A writer records ``NAME.h5.partial`` and renames it to ``NAME.h5`` on a clean close
(:data:`spectrace.tracer.schema.PARTIAL_SUFFIX`); a reader given ``NAME.h5`` falls back to the
partial file of a writer that died only when ``NAME.h5`` does not exist, and says so.
:func:`check_outputs` refuses an output that is an input or already exists.
"""

from __future__ import annotations

import fnmatch
import glob as _glob
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path

from .. import schema
from ..errors import InputError

#: What :func:`resolve_paths` and :func:`spectrace.tracer.store.open_trace` accept.
TraceSpec = str | os.PathLike | Iterable[str | os.PathLike]
#: A path argument of a command, or None when the option was not given.
MaybePath = str | os.PathLike | None


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
    exist but has a ``NAME.h5.partial`` resolves to the partial file.

    Raises:
        InputError: a path or glob that matches nothing; a file given twice (it would count
            every block twice, as a copy would: the reader refuses those); a spec of another
            type (None, a number).
    """
    one = (str, bytes, os.PathLike)
    if not isinstance(spec, one) and not isinstance(spec, list | tuple):
        raise InputError(f"expected a trace path, glob or list of them, got {type(spec).__name__}")
    specs = [spec] if isinstance(spec, one) else list(spec)
    out: list[Path] = []
    for s in specs:
        if not isinstance(s, one):
            raise InputError(f"expected a trace path or glob, got {type(s).__name__}: {s!r}")
        out += _expand(os.fsdecode(s))
    if not out:
        raise InputError("no trace file given")
    first: dict[Path, Path] = {}
    for p in out:
        if p.resolve() in first:
            also = "" if first[p.resolve()] == p else f" (as {first[p.resolve()]} and {p})"
            raise InputError(f"{p}: one file given twice as one trace{also}")
        first[p.resolve()] = p
    return out


def _expand(s: str) -> list[Path]:
    """The files of one spec item: a glob's sorted matches, or one path (or its partial); a
    file that exists is itself, whatever its name holds (``run[1].h5`` is no pattern then)."""
    if not s.strip():  # Path("") is ".", the current folder: never meant
        raise InputError("an empty trace path; name the trace file")
    if any(ch in s for ch in "*?[") and not os.path.lexists(s):
        return _matches(s)
    p = Path(s)
    if not p.exists():
        partial = partial_path(p)
        if not partial.exists():
            raise InputError(f"{s}: no such file")
        warnings.warn(
            f"{s}: no such file; reading {partial} instead (its writer is still running, "
            f"was killed or stopped on an error: info's capture row says which)",
            TraceWarning,
            stacklevel=3,
        )
        p = partial
    return [p]


def _matches(pattern: str) -> list[Path]:
    """A glob's files, sorted by their final names: its matches, and the ``.partial`` file
    of each final name it would match that does not exist (a rank whose writer died left
    ``NAME.h5.partial``: the pattern stands for ``NAME.h5``, which reads it, as a path
    does, not for a run without that rank; with a warning)."""
    matches = _glob.glob(pattern)
    found = set(matches)
    partials = [
        m
        for m in _glob.glob(pattern + schema.PARTIAL_SUFFIX)
        if m not in found
        and str(final_path(m)) not in found
        and fnmatch.fnmatch(str(final_path(m)), pattern)
    ]
    if not matches and not partials:
        raise InputError(f"{pattern}: no file matches this pattern")
    for m in partials:
        warnings.warn(
            f"{pattern}: reading {m}, matched as {final_path(m).name} (its writer is still "
            f"running, was killed or stopped on an error: info's capture row says which)",
            TraceWarning,
            stacklevel=4,
        )
    return [Path(m) for m in sorted(matches + partials, key=lambda m: str(final_path(m)))]


def _same_file(a: Path, b: Path) -> bool:
    """True when ``a`` and ``b`` name one file: equal after resolving symlinks and ``..``,
    or the same inode (a hard link)."""
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _claimed(label: str, path: Path, traces: Iterable[str]) -> list[tuple[str, Path]]:
    """The files an output writes: a trace output also writes its ``.partial`` first."""
    if label in traces:
        return [(label, final_path(path)), (label, partial_path(final_path(path)))]
    return [(label, path)]


def check_outputs(
    outputs: Mapping[str, MaybePath],
    inputs: Mapping[str, MaybePath],
    *,
    force: bool = False,
    traces: Iterable[str] = ("-o",),
) -> None:
    """Refuse to clobber: the rule every writing command (``import vt``, ``capture``,
    ``capture vllm``, ``demo``) checks before it writes anything.

    Args:
        outputs: option label (``-o``, ``--log``) -> the path it writes, or None.
        inputs: option label (``LOG``, ``--requests``) -> the path it reads, or None;
            ``-`` (stdin) is never a file.
        force: allow overwriting an existing output (never an input).
        traces: the labels of ``outputs`` that are trace files: they also write
            ``NAME.h5.partial`` (so an input or an output equal to it collides as well).
    Raises:
        InputError: ``FILE: what`` when an output is an input, two outputs are one file, a
            trace output is named ``.partial``, or an output (or a trace's ``.partial``)
            exists and ``force`` is False;
            ``LABEL: an empty path`` for an output given as ``""``.
    """
    traces = tuple(traces)
    ins = [(k, Path(v)) for k, v in inputs.items() if v is not None and str(v) != "-"]
    # A quoted glob (a trace of rank files) is an input in each file it matches.
    ins += [(k, Path(m)) for k, v in ins if _glob.has_magic(str(v)) for m in _glob.glob(str(v))]
    seen: list[tuple[str, Path]] = []
    for label, value in outputs.items():
        if value is None:
            continue
        if not str(value).strip():  # Path("") is ".": the current folder, never meant
            raise InputError(f"{label}: an empty path; name the file to write")
        if label in traces and Path(value).name.endswith(schema.PARTIAL_SUFFIX):
            # the writer's own in-progress name: the file it renames to when it closes
            # would be another (NAME.h5, never checked; or a finished file named .partial)
            raise InputError(
                f"{value}: the output ({label}) ends in {schema.PARTIAL_SUFFIX}, the name of "
                f"a trace still being written; name the final file "
                f"({final_path(value).name})"
            )
        for _, path in _claimed(label, Path(value), traces):
            for other, q in ins:
                if _same_file(path, q):
                    raise InputError(
                        f"{value}: the output ({label}) is the input {other}; "
                        f"choose another output path"
                    )
            for other, q in seen:
                if _same_file(path, q):
                    raise InputError(f"{value}: {other} and {label} name the same file")
        seen += _claimed(label, Path(value), traces)
        if not force:
            _refuse_existing(label, Path(value), label in traces)


def _refuse_existing(label: str, path: Path, trace: bool) -> None:
    if path.exists():
        raise InputError(f"{path}: the output ({label}) exists; pass --force to overwrite it")
    partial = partial_path(final_path(path))
    if trace and partial.exists():
        raise InputError(
            f"{partial}: a partial trace of an earlier run exists (its writer was killed or "
            f"still runs); pass --force to overwrite it"
        )
