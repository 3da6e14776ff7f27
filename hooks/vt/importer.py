"""``spectrace import vt``: a saved ``VT_SPEC_TRACE`` log (a file or stdin) into a trace."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable, Iterable

from spectrace.tracer.errors import InputError
from spectrace.tracer.store import TraceWriter

from .parser import DEFAULT_ENGINE, SOURCE, VtTraceParser
from .requests import read_requests
from .stats import ImportStats


def _open_log(log: str | os.PathLike) -> tuple[Iterable[str], str, Callable[[], None]]:
    if str(log) == "-":
        stream = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
        return stream, "<stdin>", stream.detach  # detach: never close the process's stdin
    try:
        fh = open(log, encoding="utf-8", errors="replace", newline="")
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
) -> ImportStats:
    """Import a ``VT_SPEC_TRACE`` log (what ``spectrace import vt`` runs).

    Args:
        log: the stderr log file, or ``-`` for stdin.
        out: the trace file to write (``.h5``; written as ``.h5.partial`` until done).
        requests_path: JSONL of ``{"req_id", "prompt_ids", "output_ids", "finish_reason"}``
            (resolves first-block anchors and fills /requests), or None.
        strict: fail on the first malformed/edited line or broken invariant.
        meta: /meta items that override the defaults (``engine``, ``k``, ``method``, ...).
    Returns:
        The :class:`ImportStats` (also stored as ``meta["import"]``).
    Raises:
        InputError: missing log, bad requests file (``FILE:LINE``), unwritable output.
        ParseError: strict mode; the ``.partial`` file keeps everything parsed before it.
    """
    requests = read_requests(requests_path) if requests_path is not None else None
    lines, name, close = _open_log(log)
    try:
        writer = TraceWriter(out, {"source": SOURCE, "engine": DEFAULT_ENGINE, **(meta or {})})
        parser = VtTraceParser(writer, strict=strict, source_name=name)
        with writer:
            if requests is not None:
                parser.set_requests(requests)
            try:
                for n, line in enumerate(lines, 1):
                    parser.feed_line(line, n)
            except BaseException:
                parser.abort()  # keep every block parsed so far in the .partial file
                raise
            stats = parser.finish()
    finally:
        close()
    return stats
