"""Where the vLLM plugin writes: the ``SPECTRACE_OUT`` variable, the per-rank trace names and
the engine core's counter hand-off file. Shared by the plugin (in vLLM's processes) and by
``spectrace capture vllm`` (which sets the variable and looks for the files). Standard library
only."""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path

#: The trace file the plugin writes (its per-rank siblings: :func:`trace_path`). Set by
#: ``spectrace capture vllm``; the plugin does nothing without it.
ENV_OUT = "SPECTRACE_OUT"
#: The front end's command line, exported for the trace's /meta (spawned children inherit it).
ENV_DRIVER_ARGV = "SPECTRACE_DRIVER_ARGV"

HANDOFF_SUFFIX = ".vllm-counters.json"


def output_path() -> str:
    """``SPECTRACE_OUT`` stripped, or ``""`` when unset (the plugin is then off)."""
    return os.environ.get(ENV_OUT, "").strip()


def trace_path(out: str | os.PathLike, dp_rank: int = 0) -> Path:
    """The trace file of DP rank ``dp_rank``: ``out`` itself for rank 0, else
    ``<stem>.dp<r>.h5`` (``<stem>`` is ``out`` without a trailing ``.h5``)."""
    p = Path(out)
    if not dp_rank:
        return p
    stem = p.with_suffix("") if p.suffix == ".h5" else p
    return stem.with_name(f"{stem.name}.dp{int(dp_rank)}.h5")


def rank_files(out: str | os.PathLike) -> list[Path]:
    """The files the plugin writes for DP ranks above 0 of ``out`` (:func:`trace_path`:
    ``<stem>.dp<r>.h5``) that exist, and their ``.partial`` forms; sorted."""
    p = Path(out)
    stem = trace_path(p, 1).name[: -len(".dp1.h5")]  # the stem as trace_path names it
    rank = re.compile(re.escape(stem) + r"\.dp\d+\.h5(\.partial)?")
    return sorted(q for q in p.parent.glob(glob.escape(stem) + ".dp*") if rank.fullmatch(q.name))


def counters_handoff_path(trace: str | os.PathLike) -> Path:
    """Where an engine core hands its counters to the worker writing ``trace``
    (``NAME.h5.vllm-counters.json``; written at shutdown, consumed by the worker)."""
    p = Path(trace)
    return p.with_name(p.name + HANDOFF_SUFFIX)


def trace_of_handoff(handoff: Path) -> Path:
    """The trace a hand-off file belongs to (the inverse of :func:`counters_handoff_path`)."""
    return handoff.with_name(handoff.name[: -len(HANDOFF_SUFFIX)])


def written_traces(out: str | os.PathLike, since: float = 0.0) -> list[Path]:
    """Trace files the plugin wrote for OUT: ``OUT`` itself and its per-rank siblings
    (:func:`trace_path`), each possibly still ``.partial``.

    For ``run.h5`` these are ``run.h5``, ``run.dp1.h5``, ... and their ``.partial`` forms.

    Args:
        out: the path given as ``SPECTRACE_OUT``.
        since: ignore files last modified before this time (seconds since the epoch).
    Returns:
        The matching files, sorted.
    """
    out = Path(out)
    stem = out.name[:-3] if out.name.endswith(".h5") else out.name
    found = []
    for p in sorted(out.parent.glob(f"{stem}*.h5*")):
        rest = p.name[len(stem) :]
        if (
            (rest.startswith(".h5") or rest.startswith("."))
            and p.is_file()
            and p.stat().st_mtime >= since
        ):
            found.append(p)
    return found
