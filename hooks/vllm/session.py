"""One trace file written by one vLLM model runner: the writer, the block joiner, the request
table, and the closing cross-check against vLLM's counters (:mod:`.crosscheck`)."""

from __future__ import annotations

import atexit
import functools
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from spectrace.tracer.cli.output import say
from spectrace.tracer.store import TraceWriter

from .columns import ColumnWriter, RowBuffer
from .common import strict, vllm_version
from .counters import VllmCounters, take_handoff
from .crosscheck import cross_check, flushed_totals, report
from .joiner import BlockJoiner
from .registry import add as register_session
from .registry import close_all
from .request_check import cross_check_requests, report_requests, trace_steps
from .sampling import sampling_meta


class Session:
    """One trace file written by one runner: the writer (opened at the first request, so a
    process that never records leaves no file), the :class:`~.joiner.BlockJoiner`, the
    request table.

    Args:
        path: the final trace path.
        meta: /meta document (``sampling`` is filled from the first request).

    Attributes:
        joiner: proposals waiting for their verdict.
        step: the engine step the recorder is at (it advances it).
        blocks: block rows recorded so far.
        counters: vLLM's counters when the scheduler is in this process (else the engine
            core hands them over at shutdown).
    """

    def __init__(self, path: Path, meta: dict) -> None:
        self.path = Path(path)
        self.meta = meta
        self.joiner = BlockJoiner(self)
        self.step = 0
        self.blocks = 0
        self.started = time.time()
        self.counters: VllmCounters | None = None
        self._on_close: list[Callable[[], None]] = []
        self._writer: TraceWriter | None = None
        self._columns = ColumnWriter(lambda: self.writer)
        self._pending = RowBuffer(self.request_row)  # the joiner's blocks, as columns
        self._rows: dict[str, int] = {}  # request id -> its /requests row
        self._seen: set[str] = set()
        self._finished: set[str] = set()
        self._sampling: dict | None = None
        self._lock = threading.RLock()
        self.closed = False
        self.disabled = False
        register_session(self)

    @property
    def writer(self) -> TraceWriter:
        """The :class:`~spectrace.tracer.store.TraceWriter`, created on first use."""
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = TraceWriter(self.path, self.meta)
            # h5py unregisters its type converters in an atexit handler registered when it
            # was imported; atexit runs handlers last-in first-out, so register the close
            # again now: it then runs before h5py's teardown (and before vLLM's own
            # finalizers, which in one-process mode would shut the engine down later).
            atexit.register(close_all)
        return self._writer

    def update_meta(self, **items) -> None:
        """Merge ``items`` into /meta (also into the file, once it exists)."""
        self.meta.update(items)
        if self._writer is not None:
            self._writer.update_meta(**items)

    # -- requests ----------------------------------------------------------------------------

    def see_request(
        self, req_id: str, prompt_ids: Sequence[int] | None, sampling_params=None
    ) -> None:
        """Register a request at first sight (prompt ids, sampling parameters)."""
        if req_id in self._seen or self.closed:
            return
        self._seen.add(req_id)
        if sampling_params is not None:
            s = sampling_meta(sampling_params)
            if self._sampling is None:
                self._sampling = s
                self.update_meta(sampling=s)
            elif s != self._sampling and not self.meta.get("sampling_varies"):
                self.meta["sampling_varies"] = True
                self.writer.update_meta(sampling_varies=True)
        self._rows[req_id] = self.writer.request(
            req_id, prompt_ids=list(prompt_ids or []), finish_reason=""
        )

    def seen(self, req_id: str) -> bool:
        """True once ``req_id`` was registered (:meth:`see_request`)."""
        return req_id in self._seen

    def request_row(self, req_id: str) -> int:
        """``req_id``'s row in /requests (registered on first sight, like ``add_block``)."""
        row = self._rows.get(req_id)
        if row is None:
            row = self._rows[req_id] = self.writer.request(req_id)
        return row

    def finish_request(
        self, req_id: str, output_ids: Sequence[int] | None, finish_reason: str
    ) -> None:
        """Record a request's final output; its open proposal is written unverified."""
        if self.closed:
            return
        self.joiner.drop(req_id)
        if req_id in self._finished:
            return
        self._finished.add(req_id)
        self.writer.request(req_id, output_ids=list(output_ids or []), finish_reason=finish_reason)

    # -- blocks ------------------------------------------------------------------------------

    def add_block(self, req_id, step, position, anchor, proposed, **kw) -> None:
        """The joiner's sink, with :meth:`TraceWriter.add_block`'s arguments (nothing after
        close): gathered in a :class:`~.columns.RowBuffer` and written as columns on the
        writer thread (:meth:`end_step` hands them over)."""
        if self.closed:
            return
        self._pending.add_block(req_id, step, position, anchor, proposed, **kw)
        self.blocks += 1

    def end_step(self) -> None:
        """After a recorded step: hand gathered blocks to the writer thread once
        :attr:`ColumnWriter.FLUSH_ROWS` rows or :attr:`ColumnWriter.FLUSH_S` seconds
        are buffered (so a killed engine leaves every block older than about 1.5 s: the
        writer syncs what it was handed at its next 1 s flush)."""
        p = self._pending
        if len(p) >= ColumnWriter.FLUSH_ROWS or (
            len(p) and time.monotonic() - p.t0 >= ColumnWriter.FLUSH_S
        ):
            self._take_pending()

    def _take_pending(self) -> None:
        n = len(self._pending)
        if n:
            self._columns.add(self._pending.take(), n)

    def add_block_columns(self, columns) -> None:
        """Many blocks at once (the V2 vectorised join), written on a background thread
        (:class:`~.columns.ColumnWriter`); or a deferred part (a
        :class:`~.v1_join.ClosedStep`: ``len()`` rows, made into columns there).

        Args:
            columns: block column name -> array of b rows, as ``TraceWriter.add_blocks``
                takes them (``request``: rows from :meth:`request_row`; ``proposed``,
                ``verified`` ``[b, w]`` and ``emitted`` ``[b, w + 1]``, ``-1`` padded);
                ``num_verified``/``accepted`` are ``-1`` for unverified blocks.
        """
        if self.closed:
            return
        n = len(columns["request"]) if isinstance(columns, dict) else len(columns)
        if n:
            self._take_pending()  # the joiner's earlier rows first: one write order
            self.blocks += n
            self._columns.add(columns, n)

    def flush_columns(self, wait: bool = False) -> None:
        """Hand buffered columnar blocks to the writer thread (``wait``: until written)."""
        self._take_pending()
        self._columns.flush(wait=wait)

    # -- lifecycle ---------------------------------------------------------------------------

    def on_close(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` at close, before the writer closes (to record requests still
        running: the recorder that knows them registers it)."""
        self._on_close.append(fn)

    @property
    def active(self) -> bool:
        """Recording: neither closed nor disabled by an error."""
        return not (self.closed or self.disabled)

    def fail(self, exc: BaseException, where: str) -> None:
        """A recording error: raise in strict mode, else disable this session (one line);
        either way /meta ``aborted`` names it (the trace lacks the blocks from here on)."""
        msg = f"{where}: {type(exc).__name__}: {exc} (vLLM {vllm_version()}, trace {self.path})"
        # In /meta ``aborted`` (capture_incomplete): blocks from here on are missing, also
        # when vLLM's counters never reach the close to show it (checks ``unavailable``).
        try:
            self.update_meta(aborted=f"a recorder error: {msg}")
        except Exception as meta_exc:  # the error path: never raise from here
            say(f"ERROR noting the error in {self.path}: {type(meta_exc).__name__}: {meta_exc}")
        if strict():
            say(f"ERROR {msg}")
            raise exc
        say(f"ERROR {msg}; recording stopped")
        self.disabled = True

    def close(self) -> Path | None:
        """Write open proposals as unverified, record the requests still running, cross-check
        the file against vLLM's counters and close the writer cleanly (``NAME.h5``).
        Idempotent; returns the file or None when nothing was recorded."""
        with self._lock:
            if self.closed:
                return self.path if self._writer is not None else None
            checks = None
            try:
                checks = self._finish_recording()
            finally:
                self.closed = True
                self._columns.stop()
                if self._writer is not None:
                    self._writer.close(complete=True)
            if checks is not None:
                report(self.path, checks)
                if "per_request" in checks:
                    report_requests(self.path, checks["per_request"])
            return self.path if self._writer is not None else None

    def _finish_recording(self) -> dict | None:
        """Everything before the writer closes; returns the cross-check (None: no file)."""
        for fn in self._on_close:
            fn()
        self.joiner.drop_all()
        self._take_pending()
        self._columns.flush(wait=True)
        if self._writer is None:
            return None
        vllm = self._vllm_counters()
        per_request = (vllm or {}).pop("per_request", None)
        level = (vllm or {}).pop("per_request_level", None)
        k = int(self.meta.get("k") or 0)
        checks = cross_check(flushed_totals(self._writer, k), vllm)
        by_request = cross_check_requests(
            trace_steps(self._writer.partial_path), per_request, level, k
        )
        if by_request is not None:
            checks["per_request"] = by_request
            if by_request["status"] != "ok" and checks["status"] == "ok":
                checks["status"] = "mismatch"
            if by_request["status"] != "ok":
                checks["mismatch"].append("per_request")
        self._writer.update_meta(checks=checks)
        if self.joiner.verified_mismatch:
            self._writer.update_meta(verified_not_prefix_of_proposed=self.joiner.verified_mismatch)
        return checks

    def _vllm_counters(self) -> dict | None:
        """vLLM's counters for this trace: from the scheduler in this process, else from the
        hand-off file the engine core wrote when it began to shut down (consumed here); with
        ``per_request`` and ``per_request_level`` when vLLM kept per-request metrics."""
        c = self.counters
        if c is None:
            return take_handoff(self.path, self.started)
        counted = c.as_dict()  # None if counting broke
        if counted is not None and c.per_request:
            counted.update(per_request=c.per_request, per_request_level=c.per_request_level)
        return counted


def close_on_shutdown(orig: Callable, session: Session) -> Callable:
    """Wrap a runner's ``shutdown`` so that ``session`` closes first (its errors are reported
    on one ``spectrace: ERROR`` line, never raised into vLLM's shutdown)."""

    @functools.wraps(orig)
    def shutdown(*args, **kwargs):
        try:
            session.close()
        except Exception as exc:
            say(f"ERROR closing {session.path}: {type(exc).__name__}: {exc}")
        return orig(*args, **kwargs)

    return shutdown
