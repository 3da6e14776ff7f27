"""The per-request cross-check: vLLM's per-request spec-decode metrics against the trace file.

With ``--per-request-spec-decode-metrics summary|detailed`` (vLLM 0.32
``ObservabilityConfig.per_request_spec_decode_metrics``), vLLM's scheduler keeps one
``RequestSpecDecodeMetrics`` per request (``vllm/v1/metrics/stats.py``), observed once per
verify step in ``Scheduler.update_from_output``: the accepted draft count and the proposed
draft count (after the grammar adjustment). ``detailed`` also keeps them in order
(``per_step_accepted``, ``per_step_drafted``). The engine core snapshots each object
(``to_dict()``) when the request is freed (:mod:`.engine_core`), and the trace writer's close
compares them, request by request, with the verified blocks of the file on disk in step order:
``accepted`` and ``num_verified``. Equality is exact. Requests the engine never freed
(still running at shutdown) have no vLLM metrics and are counted apart.
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from spectrace.tracer.cli.output import say
from spectrace.tracer.store import TraceWarning, open_trace

#: Shown at most this many mismatching requests in the warning lines (all are in meta).
SHOWN_MISMATCHES = 5

SOURCE = (
    "vLLM RequestSpecDecodeMetrics per request (Scheduler.update_from_output; "
    "--per-request-spec-decode-metrics), snapshot when the engine core freed the request"
)


def trace_steps(path: str | os.PathLike) -> dict[str, tuple[list[int], list[int]]]:
    """Per request id of the trace file, its verified blocks in step order.

    Args:
        path: the trace file (a ``.partial`` one is read without a warning).
    Returns:
        request id -> (accepted per verify step, drafts verified per step), lists of int;
        unverified blocks (``accepted = -1``) are left out, as vLLM counts no step for them.
        Every request of /requests is present (empty lists when it has no verified block).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)  # not closed yet: expected here
        with open_trace(path) as t:
            ids = list(t.requests.req_id)
            req = np.asarray(t.blocks.request)
            step = np.asarray(t.blocks.step)
            acc = np.asarray(t.blocks.accepted)
            nv = np.asarray(t.blocks.num_verified)
    out: dict[str, tuple[list[int], list[int]]] = {rid: ([], []) for rid in ids}
    keep = acc >= 0
    order = np.lexsort((step[keep], req[keep]))
    for r, a, n in zip(req[keep][order], acc[keep][order], nv[keep][order]):
        accepted, drafted = out[ids[int(r)]]
        accepted.append(int(a))
        drafted.append(int(n))
    return out


def _trace_view(accepted: list[int], drafted: list[int], k: int) -> dict:
    """The trace's side in the shape of ``RequestSpecDecodeMetrics.to_dict()``."""
    hist = [0] * (max([k, *accepted]) + 1)
    for a in accepted:
        hist[a] += 1
    return {
        "num_spec_steps": len(accepted),
        "num_draft_tokens": sum(drafted),
        "num_accepted_draft_tokens": sum(accepted),
        "acceptance_histogram": hist,
        "per_step_accepted": accepted,
        "per_step_drafted": drafted,
    }


_SUMMARY_FIELDS = (
    "num_spec_steps",
    "num_draft_tokens",
    "num_accepted_draft_tokens",
    "acceptance_histogram",
)
_DETAILED_FIELDS = ("per_step_accepted", "per_step_drafted")


def check_request(trace: tuple[list[int], list[int]], vllm: dict, k: int, detailed: bool) -> dict:
    """One request: the trace's verified blocks against vLLM's ``to_dict()`` of it.

    Returns:
        ``{"status": "ok", "steps": n}``, or on a difference ``status: "mismatch"``,
        ``mismatch`` (the differing field names), ``first_step`` (the first verify step whose
        accepted/drafted differ, with ``detailed``; else None), ``trace`` and ``vllm`` (the
        compared fields of each side).
    """
    mine = _trace_view(*trace, k)
    theirs = dict(vllm)
    if not detailed:
        theirs.pop("per_step_accepted", None)
        theirs.pop("per_step_drafted", None)
    elif "per_step_accepted" not in theirs:  # to_dict() leaves empty arrays out
        theirs.update(per_step_accepted=[], per_step_drafted=[])
    fields = _SUMMARY_FIELDS + (_DETAILED_FIELDS if detailed else ())
    diff = [f for f in fields if mine[f] != theirs.get(f)]
    if not diff:
        return {"status": "ok", "steps": mine["num_spec_steps"]}
    first = None
    if detailed:
        pairs = list(zip(mine["per_step_accepted"], mine["per_step_drafted"]))
        other = list(zip(theirs["per_step_accepted"], theirs["per_step_drafted"]))
        first = next(
            (i for i, (a, b) in enumerate(zip(pairs, other)) if a != b), min(len(pairs), len(other))
        )
    return {
        "status": "mismatch",
        "mismatch": diff,
        "first_step": first,
        "trace": {f: mine[f] for f in fields},
        "vllm": {f: theirs.get(f) for f in fields},
    }


def cross_check_requests(
    trace: dict[str, tuple[list[int], list[int]]],
    vllm: dict[str, dict] | None,
    level: str | None,
    k: int,
) -> dict | None:
    """Every request's per-step figures against vLLM's per-request metrics.

    Args:
        trace: :func:`trace_steps` of the file.
        vllm: request id -> ``RequestSpecDecodeMetrics.to_dict()``, or None when vLLM ran
            without per-request metrics (nothing to check: returns None).
        level: vLLM's ``per_request_spec_decode_metrics`` (``summary`` | ``detailed``).
        k: the configured draft length (the histogram's upper bound).
    Returns:
        The ``meta["checks"]["per_request"]`` object: ``status`` (``ok`` | ``mismatch``),
        ``level``, ``requests`` (request id -> :func:`check_request`'s result; requests vLLM
        reported but the trace lacks are compared with no steps), ``not_reported`` (trace
        requests vLLM has no metrics for: never freed), ``checked``, ``mismatched``,
        ``source``; None without vLLM metrics.
    """
    if not vllm:
        return None
    detailed = level == "detailed"
    results = {
        rid: check_request(trace.get(rid, ([], [])), m, k, detailed) for rid, m in vllm.items()
    }
    bad = sorted(rid for rid, r in results.items() if r["status"] != "ok")
    return {
        "status": "mismatch" if bad else "ok",
        "level": level,
        "checked": len(results),
        "mismatched": len(bad),
        "requests": results,
        "not_reported": sorted(rid for rid in trace if rid not in vllm),
        "source": SOURCE,
    }


def report_requests(path, checks: dict) -> None:
    """stderr lines about the per-request check: one line when all match, else one
    ``WARNING`` line per mismatching request (the first :data:`SHOWN_MISMATCHES`)."""
    level, n = checks["level"], checks["checked"]
    if checks["status"] == "ok":
        what = "1 request" if n == 1 else f"{n} requests"
        say(f"{path}: per-request spec-decode metrics ({level}) match the trace on {what}")
        return
    bad = [(rid, r) for rid, r in sorted(checks["requests"].items()) if r["status"] != "ok"]
    say(
        f"WARNING {path}: {len(bad)} of {n} requests differ from vLLM's per-request "
        f"spec-decode metrics ({level})"
    )
    for rid, r in bad[:SHOWN_MISMATCHES]:
        where = f" from verify step {r['first_step']}" if r["first_step"] is not None else ""
        fields = ", ".join(r["mismatch"])
        say(
            f"WARNING {path}: request {rid}: {fields} differ{where}: trace "
            f"{_brief(r['trace'])} vs vLLM {_brief(r['vllm'])}"
        )
    if len(bad) > SHOWN_MISMATCHES:
        say(f"WARNING {path}: {len(bad) - SHOWN_MISMATCHES} more in meta checks.per_request")


def _brief(side: dict) -> str:
    acc, dr = side.get("per_step_accepted"), side.get("per_step_drafted")
    if acc is not None:
        return f"accepted {acc} of drafted {dr}"
    return f"histogram {side.get('acceptance_histogram')}, {side.get('num_draft_tokens')} drafts"
