"""A replay from start to end: read the references, choose the sites, run the engine, write.

:func:`replay` runs one engine (``reference``, ``vllm`` or ``cmd``) into one trace;
:func:`replay_pair` runs two and returns both paths for the diff (the CLI prints it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from spectrace.tracer.errors import InputError
from spectrace.tracer.store import open_trace

from .options import EngineOptions
from .positions import Reference, Site, choose_sites, read_references, select_requests
from .write import Draft, write_replay

#: ``--engine`` names.
ENGINES = ("reference", "vllm", "cmd")

Progress = Callable[[int, int], None] | None


@dataclass
class ReplayResult:
    """What a replay did: the trace written, its sites and anchor mismatches, seconds."""

    path: Path
    engine: str
    sites: int
    anchor_mismatches: int
    wall_s: float


def run_engine(
    engine: str,
    refs: list[Reference],
    sites: list[Site],
    opts: EngineOptions,
    progress: Progress = None,
) -> tuple[list[Draft], dict]:
    """One engine's :class:`Draft` per site (site order) and its /meta items.

    Raises:
        InputError: an unknown engine or a bad option. EngineFailed: an engine run that
            failed (:mod:`.engine_io`).
    """
    if engine == "reference":
        from .reference import replay_reference

        return replay_reference(refs, sites, opts, progress)
    if engine == "vllm":
        from .vllm import replay_vllm

        return replay_vllm(refs, sites, opts, progress)
    if engine == "cmd":
        from .cmd import replay_cmd

        return replay_cmd(refs, sites, opts, progress)
    raise InputError(f"--engine {engine}: expected one of {', '.join(ENGINES)}")


def load_sites(
    ref_path: str | os.PathLike,
    positions: str | int = "all",
    requests: Sequence[str] | None = None,
    blocks_of: Sequence[str | os.PathLike] = (),
) -> tuple[list[Reference], list[Site]]:
    """The references of ``ref_path`` (``requests`` only, when given) and the sites chosen by
    ``positions`` (``blocks``: where ``ref_path`` or one of ``blocks_of`` drafted).

    Raises:
        InputError: unreadable input, unknown request ids, or no site at all.
    """
    refs, trace = read_references(ref_path)
    refs = select_requests(refs, requests)
    traces = ([trace] if trace is not None else []) + [open_trace(p) for p in blocks_of]
    sites = choose_sites(refs, positions, traces)
    if not sites:
        raise InputError(f"{ref_path}: no position to replay (--positions {positions})")
    return refs, sites


def replay(
    ref_path: str | os.PathLike,
    out: str | os.PathLike,
    engine: str,
    opts: EngineOptions | None = None,
    positions: str | int = "all",
    requests: Sequence[str] | None = None,
    blocks_of: Sequence[str | os.PathLike] = (),
    progress: Progress = None,
) -> ReplayResult:
    """Replay the reference sequences of ``ref_path`` with ``engine`` into trace ``out``.

    Args:
        ref_path: a trace or a requests JSONL whose prompt + output ids are the references.
        out: the replay trace to write (the caller checks no-clobber).
        engine: ``reference`` | ``vllm`` | ``cmd``; ``opts`` its options.
        positions, requests, blocks_of: see :func:`load_sites`.
        progress: called with (sites done, sites in all) as the engine advances.
    Returns:
        A :class:`ReplayResult`.
    """
    opts = opts or EngineOptions()
    t0 = time.perf_counter()
    refs, sites = load_sites(ref_path, positions, requests, blocks_of)
    drafts, meta = run_engine(engine, refs, sites, opts, progress)
    meta["replay"] = {
        "reference": str(ref_path),
        "engine": engine,
        "positions": str(positions),
    }
    path = write_replay(out, refs, drafts, meta)
    mism = sum(refs[d.site.request].sequence[d.site.position] != d.anchor for d in drafts)
    return ReplayResult(path, engine, len(sites), int(mism), time.perf_counter() - t0)
