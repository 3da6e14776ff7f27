"""The propose tap's requests (a mixin of :class:`~.tap.ProposeTap`): registrations,
finishes and preemptions, queued in order with the staged steps where a join is pending,
and the emitted ids per request."""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING

from ..common import is_warmup
from ..sampling import removed_reason, trim_output
from .stream import ReqEvent

if TYPE_CHECKING:
    from ..session import Session
    from .drainer import Drainer
    from .outputs import EmittedIds


class TapRequests:
    """:class:`~.tap.ProposeTap`'s request methods (they use its attributes: ``requests``,
    ``session``, ``max_model_len``, ``drainer``, ``_stream``, ``_ring_key``, ``_lock``,
    ``_out``, ``_ids``, ``_names``)."""

    requests: dict[str, tuple[int, object]]
    session: Session
    max_model_len: int | None
    drainer: Drainer | None
    _stream: deque
    _ring_key: tuple | None
    _lock: threading.RLock
    _out: EmittedIds
    _ids: dict[str, int]
    _names: list[str]

    if TYPE_CHECKING:  # TapJoin's

        def _hand_over(self, req_id: str) -> None: ...

    def output_ids(self, req_id: str) -> list[int]:
        """``req_id``'s emitted ids so far (joined steps only), as a list."""
        with self._lock:
            return self._out.ids(self._ids.get(req_id, -1))

    @property
    def outputs(self) -> dict[str, list[int]]:
        """Request id -> emitted ids so far (built on each access; for inspection)."""
        with self._lock:
            return self._out.by_name(self._names)

    def add_request(self, req_id: str, prompt_ids, sampling_params) -> None:
        """Register a new request (prompt ids, sampling parameters); while the background
        joiner runs, queued in order with the staged steps (it writes the session)."""
        if is_warmup(req_id):
            return
        if self.drainer is not None:
            self._stream.append(ReqEvent(("add", req_id, list(prompt_ids or []), sampling_params)))
        else:
            self._register(req_id, prompt_ids, sampling_params)

    def _register(self, req_id: str, prompt_ids, sampling_params) -> None:
        self.requests[req_id] = (len(prompt_ids or []), sampling_params)
        self.session.see_request(req_id, prompt_ids, sampling_params)

    def finish(self, req_id: str, final: bool = True) -> None:
        """Record a finished (``final``) or still running request's trimmed output now (its
        staged steps must have been joined: :meth:`drain`); its open proposal is written
        unverified."""
        self._hand_over(req_id)
        if is_warmup(req_id) or req_id not in self.requests:
            return
        prompt_len, params = self.requests.pop(req_id) if final else self.requests[req_id]
        ids, reason = trim_output(self.output_ids(req_id), params, prompt_len, self.max_model_len)
        if final:  # its steps are all joined (finishes are queued after them): free its ids
            self._out.forget(self._ids.get(req_id, -1))
        self.session.finish_request(req_id, ids, reason or removed_reason(params, final))

    def finish_later(self, req_id: str) -> None:
        """``req_id`` finished: record it once the steps staged so far are joined (at once
        on a CPU device with nothing pending; never waits)."""
        if self._stream or self._device_ring():
            self._stream.append(ReqEvent(("finish", req_id, True)))
        else:
            self.finish(req_id, final=True)

    def drop_later(self, req_id: str) -> None:
        """``req_id`` was preempted: its open proposal is written unverified, in order after
        the steps staged so far (never waits)."""
        if self._stream or self._device_ring():
            self._stream.append(ReqEvent(("drop", req_id, None)))
        else:
            self._hand_over(req_id)
            self.session.joiner.drop(req_id)

    def _device_ring(self) -> bool:
        # On CUDA, finishes go through the stream too: a synthetic row, not a row-wise write.
        return bool(self._ring_key and self._ring_key[2])
