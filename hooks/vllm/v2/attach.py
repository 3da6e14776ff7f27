"""Attach the V2 hooks to a V2 ``GPUModelRunner`` (``vllm/v1/worker/gpu/model_runner.py``)."""

from __future__ import annotations

import functools
from pathlib import Path

from ..common import require_attrs
from ..session import Session, close_on_shutdown
from .dspark import maybe_attach_dspark
from .tap import ProposeTap


def attach_v2(runner, path: Path, meta: dict) -> Session:
    """Attach to a V2 ``GPUModelRunner``.

    Wraps ``runner.speculator.propose`` (:class:`~.tap.ProposeTap`; DSpark speculators also get
    :class:`~.dspark.DSparkTap`), and on the runner instance ``add_requests`` (prompt ids,
    sampling parameters), ``finish_requests`` (finished requests get their output; preempted
    ones lose their open proposal) and ``shutdown`` (close).

    Raises:
        SpecTraceLayoutError: the speculator's ``propose`` or the runner lacks what is read.
    """
    require_attrs(
        runner,
        ("speculator", "add_requests", "finish_requests", "shutdown"),
        f"V2 {type(runner).__name__}",
    )
    session = Session(path, meta)
    tap = ProposeTap(
        runner.speculator, session, max_model_len=getattr(runner, "max_model_len", None)
    )
    maybe_attach_dspark(runner, tap, session)  # DSpark: layout meta, eager inner check
    runner.add_requests = _on_add(runner.add_requests, tap, session)
    runner.finish_requests = _on_finish(runner.finish_requests, tap, session)
    runner.shutdown = close_on_shutdown(runner.shutdown, session)
    return session


def _on_add(orig, tap: ProposeTap, session: Session):
    """``add_requests``: register each new request with the tap first."""

    @functools.wraps(orig)
    def add_requests(scheduler_output, *args, **kwargs):
        if session.active:
            try:
                for new in getattr(scheduler_output, "scheduled_new_reqs", ()) or ():
                    tap.add_request(
                        new.req_id,
                        getattr(new, "prompt_token_ids", None),
                        getattr(new, "sampling_params", None),
                    )
            except Exception as exc:
                session.fail(exc, "V2 add_requests")
        return orig(scheduler_output, *args, **kwargs)

    return add_requests


def _on_finish(orig, tap: ProposeTap, session: Session):
    """``finish_requests``: queue finishes and preemptions in order with the staged steps
    (no wait for the device here)."""

    @functools.wraps(orig)
    def finish_requests(scheduler_output, *args, **kwargs):
        if session.active:
            try:
                for rid in getattr(scheduler_output, "finished_req_ids", ()) or ():
                    tap.finish_later(rid)
                for rid in getattr(scheduler_output, "preempted_req_ids", ()) or ():
                    tap.drop_later(rid)
            except Exception as exc:
                session.fail(exc, "V2 finish_requests")
        return orig(scheduler_output, *args, **kwargs)

    return finish_requests
