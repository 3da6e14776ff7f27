"""The propose tap's background joiner: staged steps are joined off the runner's thread.

The hot path (:meth:`~.tap.ProposeTap.record`) only stages rows and, once per segment (every
``flush_steps`` steps), issues the segment's copy to pinned memory and calls :meth:`Drainer.kick`
(one ``threading.Event.set``). The thread then polls the oldest in-flight segment's event
(``event.query()``: never a wait on the device) every :attr:`Drainer.POLL_S` seconds, sleeping
in between (which releases the GIL), and joins what is ready in pieces through the tap's own
drain, under the tap's lock, pausing :attr:`Drainer.PIECE_PAUSE_S` between pieces. The
runner's thread waits for the GPU most of a GPU-bound step (its ``event.synchronize()``, with
the GIL released): the join runs then, and a piece ends soon after the runner's thread wants
the GIL back (the GIL goes back at the pause at the latest).

While it joins, the thread lowers the interpreter's switch interval to :attr:`Drainer.SWITCH_S`
(``sys.setswitchinterval``; restored after each piece): a thread that wants the GIL waits up
to that interval before the holder must drop it, 5 ms by default, which is longer than a whole
step; measured on the H200, the runner's thread otherwise lost tens of microseconds per step
inside ``propose`` waiting for the join thread.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable


class Drainer:
    """A daemon thread that runs ``drain_ready`` after each :meth:`kick`, and again after
    the pause it returns, until it returns None.

    Args:
        drain_ready: joins a piece of what is ready; returns the seconds to sleep before the
            next call (:attr:`PIECE_PAUSE_S` more is ready, :attr:`POLL_S` a copy is in
            flight), or None when nothing is in flight (wait for the next kick).
        on_error: called with the exception if ``drain_ready`` raises (the thread then stops).

    Attributes:
        busy_ns: nanoseconds spent inside ``drain_ready`` (benchmarks read it).
        runs: calls of ``drain_ready``.
    """

    POLL_S = 0.0005  # 0.5 ms between event polls while a copy is in flight
    PIECE_PAUSE_S = 0.0001  # between two pieces of a join: the runner's thread gets the GIL
    SWITCH_S = 0.0001  # the switch interval while a piece is joined (see the module doc)

    def __init__(
        self,
        drain_ready: Callable[[], float | None],
        on_error: Callable[[BaseException], None],
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
                while not self._stopping:
                    pause = self._once()
                    if pause is None:
                        break
                    time.sleep(pause)
            except BaseException as exc:  # report, then stop joining (the session fails)
                self._on_error(exc)
                return

    def _once(self) -> float | None:
        t0 = time.perf_counter_ns()
        saved = sys.getswitchinterval()
        sys.setswitchinterval(min(saved, self.SWITCH_S))
        try:
            return self._drain_ready()
        finally:
            sys.setswitchinterval(saved)
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
