"""The closing cross-check: vLLM's spec-decode counters against the acceptance figures the
library computes from the trace file on disk.

The trace side is read back from the file (:func:`file_totals`) with
:func:`spectrace.tracer.store.open_trace` and :mod:`spectrace.tracer.metrics`, the same code
``spectrace info`` runs, so a block the writer lost or mangled shows up as a mismatch. The
result goes into ``meta["checks"]`` before the writer closes, and :func:`report` prints one
``spectrace:`` line (``spectrace: WARNING`` unless the totals match).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from spectrace.tracer.cli.output import say
from spectrace.tracer.metrics import acceptance_counts, acceptance_from_counts
from spectrace.tracer.store import TraceWarning, TraceWriter, open_trace

from .counters import COUNTER_NAMES, fmt_counts


def file_totals(path: str | os.PathLike, k: int) -> dict:
    """vLLM's four counters as the library computes them from a trace file.

    A verified block is one of vLLM's drafts (``num_drafts``), its verified ids are draft
    tokens, ``accepted`` counts accepted tokens, and ``num_accepted_tokens_per_pos[i]`` is the
    number of verified blocks with more than i accepted (the library's per-position curve,
    as counts). Unverified blocks (``accepted = -1``) count for nothing, as in vLLM.

    Args:
        path: the trace file (a ``.partial`` one is read without a warning).
        k: the configured draft length: the per-position list has max(k, largest accepted)
            entries.
    Returns:
        ``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens``,
        ``num_accepted_tokens_per_pos`` (list of int) and ``blocks`` (every block row).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)  # not closed yet: expected here
        with open_trace(path, lazy_requests=True) as t:
            by_acc, verified = acceptance_counts(t.blocks.accepted, t.blocks.num_verified)
            blocks = len(t.blocks)
    kmax = max(int(k), by_acc.shape[1] - 1)
    fig = acceptance_from_counts(by_acc[0], int(verified[0]), kmax)
    n = fig["blocks"]
    return {
        "num_drafts": n,
        "num_draft_tokens": fig["verified_tokens"],
        "num_accepted_tokens": fig["accepted_tokens"],
        "num_accepted_tokens_per_pos": [
            0 if s is None else round(s * n) for s in fig["per_position"]
        ],
        "blocks": blocks,
    }


def flushed_totals(writer: TraceWriter, k: int) -> dict:
    """:func:`file_totals` of what ``writer`` has written so far (flushed first), read back
    from its ``.partial`` file while it is still open (the writer takes no file lock)."""
    writer.flush()
    return file_totals(writer.partial_path, k)


def cross_check(trace: dict, vllm: dict | None) -> dict:
    """Compare a trace's totals with vLLM's spec-decode counters.

    Args:
        trace: :func:`file_totals` of the trace.
        vllm: the same keys from vLLM (:class:`~.counters.VllmCounters`), or None when
            unavailable.
    Returns:
        The ``meta["checks"]`` object: ``status`` (``ok`` | ``mismatch`` | ``unavailable``),
        ``vllm``, ``trace``, ``mismatch`` (the names that differ) and ``source``. The
        session adds ``per_request`` (:mod:`.request_check`) when vLLM kept per-request
        metrics; a per-request difference makes ``status`` ``mismatch`` and appends
        ``per_request`` to ``mismatch``.
    """
    if vllm is None:
        return {
            "status": "unavailable",
            "trace": trace,
            "vllm": None,
            "mismatch": [],
            "source": "vLLM's counters did not reach the writing process (the engine "
            "core did not shut down cleanly)",
        }
    diff = [name for name in COUNTER_NAMES if trace.get(name) != vllm.get(name)]
    return {
        "status": "mismatch" if diff else "ok",
        "trace": trace,
        "vllm": vllm,
        "mismatch": diff,
        "source": "vLLM Scheduler.make_spec_decoding_stats (engine core): the numbers "
        "behind the vllm:spec_decode_* counters",
    }


def report(path: Path, checks: dict) -> None:
    """One stderr line about the totals' cross-check (a ``WARNING`` unless they match; the
    per-request check, ``mismatch`` entry ``per_request``, reports itself:
    :func:`~.request_check.report_requests`)."""
    t = checks["trace"]
    totals = [name for name in checks["mismatch"] if name in COUNTER_NAMES]
    if checks["status"] == "unavailable":
        say(f"WARNING {path}: not cross-checked: {checks['source']}; trace {fmt_counts(t)}")
    elif totals:
        say(
            f"WARNING {path}: trace totals differ from vLLM's spec-decode counters in "
            f"{', '.join(totals)}: trace {fmt_counts(t)} vs vLLM "
            f"{fmt_counts(checks['vllm'])}"
        )
    else:
        say(
            f"{path}: {t['blocks']} blocks; totals match vLLM's spec-decode counters "
            f"({fmt_counts(t)})"
        )
