"""``spectrace import vt``: a saved ``VT_SPEC_TRACE`` log (a file or stdin) into a trace."""

from __future__ import annotations

import io
import mmap
import os
import sys
from collections.abc import Callable, Iterable

from spectrace.tracer.cli.output import say
from spectrace.tracer.errors import InputError, SpectraceError
from spectrace.tracer.store import TraceWriter
from spectrace.tracer.store.paths import final_path, partial_path

from .bulk import bulk_feed
from .parser import SOURCE, VtTraceParser
from .requests import read_requests
from .stats import ImportStats

#: /meta of an imported log before ``--meta``: a ``VT_SPEC_TRACE`` log names neither the
#: engine that wrote it (our engine and the reference engine write the same lines) nor the
#: drafting method, so both are recorded as unknown (None) rather than guessed.
UNKNOWN_META: dict = {"source": SOURCE, "engine": None, "method": None}


def _open_log(log: str | os.PathLike) -> tuple[Iterable[str], str, Callable[[], None]]:
    if str(log) == "-":
        stream = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="surrogateescape")

        def detach() -> None:  # never close the process's stdin
            stream.detach()

        return stream, "<stdin>", detach
    try:
        fh = open(log, encoding="utf-8", errors="surrogateescape", newline="")
    except FileNotFoundError:
        raise InputError(f"{log}: no such log file") from None
    except OSError as exc:
        raise InputError(f"{log}: cannot read log file ({exc})") from None
    return fh, str(log), fh.close


def import_log(
    log: str | os.PathLike,
    out: str | os.PathLike,
    requests_path: str | os.PathLike | None = None,
    strict: bool = False,
    meta: dict | None = None,
    progress: Callable[[int, int | None], None] | None = None,
) -> ImportStats:
    """Import a ``VT_SPEC_TRACE`` log (what ``spectrace import vt`` runs).

    Args:
        log: the stderr log file, or ``-`` for stdin.
        out: the trace file to write (``.h5``; written as ``.h5.partial`` until done).
        requests_path: JSONL of ``{"req_id", "prompt_ids", "output_ids", "finish_reason"}``
            (resolves first-block anchors and fills /requests), or None. Ids and lengths
            that do not match the log are counted in ``meta["import"]["requests_check"]``.
        strict: fail on the first malformed/edited line, broken invariant or requests file
            that does not match the log.
        meta: /meta items that override the defaults (:data:`UNKNOWN_META`: ``engine``
            and ``method`` unknown; ``k`` is the log's largest).
        progress: ``callback(bytes_read, total_bytes)`` called while reading (total None
            for stdin), e.g. a ``spectrace.tracer.cli.progress`` bar; None: no reports.
    Returns:
        The :class:`ImportStats` (also stored as ``meta["import"]``).
    Raises:
        InputError: missing, empty or binary log, or one without any trace line; bad
            requests file (``FILE:LINE``); unwritable output. The ``.partial`` file is
            removed (the message says so).
        ParseError: strict mode; the ``.partial`` file is removed too.
    """
    requests = read_requests(requests_path) if requests_path is not None else None
    lines, name, close = _open_log(log)
    try:
        writer = new_writer(out, {**UNKNOWN_META, **(meta or {})})
        parser = VtTraceParser(writer, strict=strict, source_name=name)
        try:
            if requests is not None:
                parser.set_requests(requests, source=str(requests_path))
            binary = _feed_bulk(parser, log, progress)
            binary = _feed(parser, lines, progress) if binary is None else binary
            _refuse_non_log(parser.stats, name, binary)
            stats = parser.finish()
            writer.close()  # its last flush writes the blocks: a failure there is a failure
        except Exception as exc:
            raise discard_failed(writer, exc) from None
        except BaseException:  # Ctrl-C: keep every block parsed so far, say where
            parser.abort()
            writer.close(complete=False)
            say(f"partial trace kept in {writer.partial_path}")
            raise
    finally:
        close()
    return stats


def _feed_bulk(
    parser: VtTraceParser,
    log: str | os.PathLike,
    progress: Callable[[int, int | None], None] | None,
) -> bool | None:
    """A saved log file mapped (or read) at once (:func:`~.bulk.bulk_feed`); None for stdin
    or a log that needs the line-by-line parser. ``progress(size, size)`` once parsed."""
    if str(log) == "-":
        return None
    with open(log, "rb") as fh:
        data = _map(fh)
        binary = bulk_feed(parser, data)
        size = len(data)
    if isinstance(data, mmap.mmap):
        try:
            data.close()
        except BufferError:  # a view of it still alive: closed when collected
            pass
    if binary is not None and progress is not None:
        progress(size, size)
    return binary


def _map(fh: io.BufferedReader) -> bytes | mmap.mmap:
    """The file's bytes: mapped read-only where it can be (a regular, non-empty file: no
    copy of a big log), else read."""
    try:
        if os.fstat(fh.fileno()).st_size > 0:
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        pass
    return fh.read()


#: Lines between two progress reports.
_REPORT_EVERY = 4096


def _feed(
    parser: VtTraceParser, lines: Iterable[str], progress: Callable[[int, int | None], None] | None
) -> bool:
    """Feed every line; returns True when a NUL character showed the input is binary.
    ``progress(bytes_read, total)`` every :data:`_REPORT_EVERY` lines and at the end."""
    binary = False
    tell, total = _position(lines) if progress else (None, None)
    read = 0  # characters, where the stream cannot tell its byte position (stdin)
    for n, line in enumerate(lines, 1):
        binary = binary or "\x00" in line
        parser.feed_line(line, n)
        if progress is not None:
            read += len(line)
            if n % _REPORT_EVERY == 0:
                progress(min(tell(), total) if tell and total else read, total)
    if progress is not None:
        progress(read if total is None else total, total)
    return binary


def _position(lines: Iterable[str]) -> tuple[Callable[[], int] | None, int | None]:
    """``(tell, size)`` of a log file's byte stream (``tell`` runs ahead by at most one
    buffer); ``(None, None)`` for a pipe (stdin)."""
    raw = getattr(lines, "buffer", None)
    try:
        if raw is None or not raw.seekable():
            return None, None
        return raw.tell, os.fstat(raw.fileno()).st_size
    except (OSError, ValueError):
        return None, None


def _refuse_non_log(stats: ImportStats, name: str, binary: bool) -> None:
    """An empty input, a binary file or text without a single trace line is no log.

    Raises:
        InputError: naming the file.
    """
    if stats.trace_lines:
        return
    if not stats.lines:
        raise InputError(f"{name}: empty log (no lines)")
    if binary:
        raise InputError(f"{name}: binary file, not a VT_SPEC_TRACE text log")
    raise InputError(
        f"{name}: no VT_SPEC_TRACE line in {stats.lines} lines (is this our engine's stderr, "
        f"run with VT_SPEC_TRACE=1?)"
    )


def new_writer(out: str | os.PathLike, meta: dict, **kwargs) -> TraceWriter:
    """An import's :class:`TraceWriter` (the VT, golden and llama-dump importers), saying
    that the ``.partial`` file is gone when the writer fails laying it out (it removes the
    file itself).

    Args:
        kwargs: :class:`TraceWriter`'s options (``flush_interval``).
    Raises:
        InputError: the file cannot be created; anything else the writer raised (a bug),
            after that line.
    """
    try:
        return TraceWriter(out, meta, **kwargs)
    except SpectraceError:
        raise
    except Exception:
        say(f"partial trace {partial_path(final_path(out))} removed")
        raise


def discard_failed(writer: TraceWriter, exc: Exception) -> Exception:
    """Remove the ``.partial`` file of a failed import (its log is still on disk; a failed
    capture keeps its file instead); return the error to raise (:func:`with_note`:
    `` (partial trace FILE removed)``)."""
    return with_note(exc, f"partial trace {writer.discard()} removed")


def with_note(exc: Exception, note: str) -> Exception:
    """``exc`` to raise after a failed import or capture, with ``note`` (what became of its
    ``.partial`` file): a :class:`SpectraceError` comes back with `` (NOTE)`` added, one
    line for the user; another exception (a bug) as it is, after ``note`` on its own line."""
    if isinstance(exc, SpectraceError):
        return type(exc)(f"{exc} ({note})")
    say(note)
    return exc
