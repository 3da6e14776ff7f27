"""The propose tap's background joiner: staged steps are joined off the runner's thread.

The hot path (:meth:`~.tap.ProposeTap.record`) only stages rows and, once per segment (every
``flush_steps`` steps), issues the segment's copy to pinned memory and calls :meth:`Drainer.kick`
(one ``threading.Event.set``). The thread then polls the oldest in-flight segment's event
(``event.query()``: never a wait on the device) every :attr:`Drainer.POLL_S` seconds, sleeping
in between (which releases the GIL), and joins what is ready through the tap's own
``drain(wait=False)``, under the tap's lock. The runner's thread waits for the GPU most of a
GPU-bound step (its ``event.synchronize()``, with the GIL released): the join runs then.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Drainer:
    """A daemon thread that runs ``drain_ready`` after each :meth:`kick`, again every
    :attr:`POLL_S` seconds for as long as it returns True (copies still in flight).

    Args:
        drain_ready: joins what is ready; returns True while staged steps whose copy was
            issued are still waiting (poll again), False when nothing is in flight.
        on_error: called with the exception if ``drain_ready`` raises (the thread then stops).

    Attributes:
        busy_ns: nanoseconds spent inside ``drain_ready`` (benchmarks read it).
        runs: calls of ``drain_ready``.
    """

    POLL_S = 0.0005  # 0.5 ms between event polls while a copy is in flight

    def __init__(
        self, drain_ready: Callable[[], bool], on_error: Callable[[BaseException], None]
    ) -> None:
        self._drain_ready, self._on_error = drain_ready, on_error
        self._kick = threading.Event()
        self._stopping = False
        self.busy_ns = 0
        self.runs = 0
        self._thread = threading.Thread(target=self._run, name="spectrace-v2-join", daemon=True)
        self._thread.start()

    def kick(self) -> None:
        """A segment's copy was issued: join it once it has landed (never blocks)."""
        self._kick.set()

    def _run(self) -> None:
        while True:
            self._kick.wait()
            self._kick.clear()
            if self._stopping:
                return
            try:
                while self._once() and not self._stopping:
                    time.sleep(self.POLL_S)
            except BaseException as exc:  # report, then stop joining (the session fails)
                self._on_error(exc)
                return

    def _once(self) -> bool:
        t0 = time.perf_counter_ns()
        try:
            return self._drain_ready()
        finally:
            self.busy_ns += time.perf_counter_ns() - t0
            self.runs += 1

    def stop(self) -> None:
        """Stop the thread and wait for it (the caller then drains what is left)."""
        self._stopping = True
        self._kick.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def alive(self) -> bool:
        """True while the thread runs."""
        return self._thread.is_alive()
