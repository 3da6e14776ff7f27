"""vLLM's own spec-decode counters, and their hand-off from the engine core to the worker.

With multiprocessing the scheduler (engine core) and the trace writer (worker) live in
different processes. The engine core, as its shutdown begins and before it tells the workers
to stop, writes its final counters next to the trace (:func:`hand_off`); the worker's close
reads and removes that file (:func:`take_handoff`). The engine core never touches the trace:
the front end SIGKILLs it 5 s after its SIGTERM, possibly mid-write, and a worker may take
longer than that to exit. Standard library only (vLLM is imported on first count).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spectrace.tracer.cli.output import say

from .paths import counters_handoff_path, output_path, trace_path

#: The counters compared at close: vLLM's ``vllm:spec_decode_<name>`` metrics.
COUNTER_NAMES = (
    "num_drafts",
    "num_draft_tokens",
    "num_accepted_tokens",
    "num_accepted_tokens_per_pos",
)


@dataclass
class VllmCounters:
    """vLLM's spec-decode counters of one scheduler, accumulated by vLLM's own
    ``SpecDecodingStats.observe_draft`` from the arguments of
    ``Scheduler.make_spec_decoding_stats`` (``vllm/v1/core/sched/scheduler.py``), i.e. the
    numbers behind ``vllm:spec_decode_*`` whether or not stats logging is on."""

    k: int
    dp_rank: int
    stats: Any = None  # vllm SpecDecodingStats, made on first use
    local: bool = False  # the trace writer is in this process
    handed_off: bool = False  # written for the worker at engine-core shutdown
    broken: bool = False  # counting failed: no counters to compare with
    #: vLLM's ``per_request_spec_decode_metrics`` level (``none`` | ``summary`` | ``detailed``).
    per_request_level: str = "none"
    #: request id -> ``RequestSpecDecodeMetrics.to_dict()``, taken when the request was freed.
    per_request: dict = field(default_factory=dict)

    #: (draft tokens, accepted tokens) -> how many drafts were observed so: a step's counting
    #: is one dict update per request (vLLM's ``observe_draft`` per request cost the engine
    #: thread about 1 us each); :meth:`_fold` replays the tally through vLLM's own method.
    tally: dict = field(default_factory=dict)

    def observe(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Count one verified draft of one request (``SpecDecodingStats.observe_draft``,
        applied when the counters are read: :meth:`as_dict`)."""
        key = (num_draft_tokens, num_accepted_tokens)
        t = self.tally
        t[key] = t.get(key, 0) + 1

    def _fold(self) -> None:
        """Add the tally into :attr:`stats`: each distinct draft once through vLLM's
        ``SpecDecodingStats.observe_draft`` (its own per-draft rule, and its assertion that
        no draft accepts more than k), times its count (the stats are sums).

        Raises:
            Exception: what ``observe_draft`` raises for a draft vLLM would reject.
        """
        if not self.tally:
            return
        from vllm.v1.spec_decode.metrics import SpecDecodingStats

        if self.stats is None:
            self.stats = SpecDecodingStats.new(self.k)
        tally, self.tally = self.tally, {}
        for (n, a), count in tally.items():
            one = SpecDecodingStats.new(self.k)
            one.observe_draft(num_draft_tokens=n, num_accepted_tokens=a)
            for f in dataclasses.fields(one):
                v = getattr(one, f.name)
                if f.name == "num_spec_tokens":
                    continue
                if isinstance(v, list):
                    total = getattr(self.stats, f.name)
                    total[:] = [x + y * count for x, y in zip(total, v)]
                elif isinstance(v, int):
                    setattr(self.stats, f.name, getattr(self.stats, f.name) + v * count)

    def as_dict(self) -> dict | None:
        """The four counters (:data:`COUNTER_NAMES`; ``num_accepted_tokens_per_pos`` a list
        of k ints), or None when counting failed."""
        if self.broken:
            return None
        try:
            self._fold()
        except Exception as exc:  # a draft vLLM's own counting rejects: no counters
            say(f"WARNING counting vLLM's spec-decode stats failed: {exc!r}")
            self.broken = True
            return None
        st = self.stats
        return {
            "num_drafts": int(getattr(st, "num_drafts", 0)),
            "num_draft_tokens": int(getattr(st, "num_draft_tokens", 0)),
            "num_accepted_tokens": int(getattr(st, "num_accepted_tokens", 0)),
            "num_accepted_tokens_per_pos": [
                int(x) for x in getattr(st, "num_accepted_tokens_per_pos", [0] * self.k)
            ],
        }


def fmt_counts(d: dict) -> str:
    """``12 drafts / 48 draft tokens / 20 accepted, per position [9, 6, 3, 2]``."""
    return (
        f"{d.get('num_drafts')} drafts / {d.get('num_draft_tokens')} draft tokens / "
        f"{d.get('num_accepted_tokens')} accepted, per position "
        f"{d.get('num_accepted_tokens_per_pos')}"
    )


def hand_off(c: VllmCounters) -> Path | None:
    """Write ``c`` for the worker process that writes the trace of its DP rank (atomically:
    a temporary file, then a rename). Called when the engine core begins to shut down.

    The file holds :meth:`VllmCounters.as_dict`, plus ``per_request`` and
    ``per_request_level`` when vLLM kept per-request metrics.

    Returns:
        The hand-off file, or None (no output configured, counting broke, or the write
        failed: one ``spectrace: WARNING`` line).
    """
    c.handed_off = True
    out = output_path()
    counted = c.as_dict()
    if not out or counted is None:
        return None
    path = counters_handoff_path(trace_path(out, c.dp_rank))
    if c.per_request:
        counted.update(per_request=c.per_request, per_request_level=c.per_request_level)
    try:
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(counted))
        os.replace(tmp, path)
    except OSError as exc:
        say(f"WARNING cannot hand vLLM's counters to the trace writer ({exc})")
        return None
    return path


def take_handoff(trace: Path, since: float) -> dict | None:
    """Read and remove the counters the engine core handed over for ``trace``.

    Args:
        trace: the trace path.
        since: the session's start (seconds since the epoch); an older file is an earlier
            run's and is ignored (1 s of slack for coarse file-system clocks).
    Returns:
        The counters dict, or None (no file, a stale or unreadable one).
    """
    handoff = counters_handoff_path(trace)
    try:
        fresh = handoff.stat().st_mtime >= since - 1.0
    except OSError:
        return None
    try:
        return json.loads(handoff.read_text()) if fresh else None
    except (OSError, ValueError):
        return None
    finally:
        handoff.unlink(missing_ok=True)
