"""Replay through an engine command (``--engine cmd``): the contract for our engine.

The command reads the prefixes JSONL (``{"id": "17", "prompt_ids": [...]}`` per line; ids are
the line's index as a string, so an engine that numbers its requests in input order
complies) and, per line, samples the anchor after the prefix, drafts k tokens after it and
verifies them once (two output tokens), printing ``VT_SPEC_TRACE`` lines with ``req=<id>``;
it writes ``{"req_id", "prompt_ids", "output_ids"}`` per request to the requests JSONL (the
first output id is the anchor). ``{prompts}`` and ``{requests}`` in the command are replaced by
the two paths (also in ``SPECTRACE_REPLAY_PROMPTS`` / ``SPECTRACE_REPLAY_REQUESTS``). It runs
under ``spectrace capture``; each request's first block is its site's block. A
``[spec-propose] margin=[ 0.523 0.010 ]`` field, where the VT parser reads it, gives the
drafter's margins (one request per step, so that ``first=`` is that request's row).

The default command is the reference engine::

    python -m spectrace.engine --method M --k K --max-tokens 2 --batch-size 1 --margins \\
        --prompts {prompts} --requests-out {requests} [--target DIR] [--draft DIR]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from spectrace.hooks.capture import capture_command
from spectrace.tracer.errors import InputError
from spectrace.tracer.findings.capture import incomplete_reasons
from spectrace.tracer.store import open_trace

from .deadline import TIMEOUT_STATUS, wrap
from .engine_io import EngineFailed, drafts_of, stdout_to_stderr, write_prefixes
from .options import EngineOptions
from .positions import Reference, Site
from .write import Draft

Progress = Callable[[int, int], None] | None

PROMPTS_ENV, REQUESTS_ENV = "SPECTRACE_REPLAY_PROMPTS", "SPECTRACE_REPLAY_REQUESTS"


def default_command(opts: EngineOptions) -> list[str]:
    """The reference engine under the contract (see the module docstring)."""
    cmd = [sys.executable, "-m", "spectrace.engine", "--method", opts.method, "--k", str(opts.k)]
    cmd += ["--max-tokens", "2", "--batch-size", "1", "--margins"]
    cmd += ["--prompts", "{prompts}", "--requests-out", "{requests}"]
    if opts.target:
        cmd += ["--target", str(opts.target)]
    if opts.draft:
        cmd += ["--draft", str(opts.draft)]
    return cmd + [a for f in opts.faults for a in ("--fault", f)]


def replay_cmd(
    refs: list[Reference], sites: list[Site], opts: EngineOptions, progress: Progress = None
) -> tuple[list[Draft], dict]:
    """Draft at every site through the engine command. Returns (drafts, /meta items).

    ``opts.timeout_s`` stops the command (its whole process group) after that many
    seconds (:mod:`.deadline`).

    Raises:
        InputError: the command has no ``{requests}`` placeholder. EngineFailed: it exited
            non-zero, ran past ``opts.timeout_s`` or left a site without a block.
    """
    template = opts.command or default_command(opts)
    if not any("{requests}" in a for a in template):
        raise InputError("--command: needs {requests} (where the engine writes its outputs)")
    with tempfile.TemporaryDirectory(prefix="spectrace-replay-") as tmp:
        prompts = write_prefixes(Path(tmp) / "prefixes.jsonl", refs, sites)
        requests = Path(tmp) / "requests.jsonl"
        paths = {"{prompts}": str(prompts), "{requests}": str(requests)}
        cmd = [_fill(a, paths) for a in template]
        os.environ[PROMPTS_ENV], os.environ[REQUESTS_ENV] = str(prompts), str(requests)
        out = Path(tmp) / "cmd.h5"
        meta: dict = {"method": opts.method, "k": opts.k}
        if not opts.command:
            meta["engine"] = "spectrace-reference"
        run = cmd if opts.timeout_s is None else wrap(cmd, opts.timeout_s)
        began = time.monotonic()
        with stdout_to_stderr():
            status = capture_command(run, out, requests, meta=meta, forward_trace_lines=False)
        _check_status(status, cmd[0], opts.timeout_s, time.monotonic() - began)
        t = open_trace(out)
        broken = incomplete_reasons(t)
        if broken:  # the capture's own verdict on the engine's lines (a repeated block, ...)
            raise EngineFailed(f"--engine cmd: {cmd[0]}'s trace lines: {'; '.join(broken)}")
        drafts = drafts_of(t, refs, sites, by="id", always_drafts=opts.method != "ngram")
        meta = {key: t.meta[key] for key in ("engine", "method", "k", "command") if key in t.meta}
    if progress is not None:
        progress(len(sites), len(sites))
    return drafts, meta


def _check_status(status: int, name: str, timeout_s: float | None, took_s: float) -> None:
    """Raises EngineFailed unless the command exited 0 (``took_s``: its run time)."""
    if status == TIMEOUT_STATUS and timeout_s is not None and took_s >= timeout_s:
        raise EngineFailed(
            f"--engine cmd: {name} ran longer than --timeout {timeout_s:g} s: stopped"
        )
    if status != 0:
        raise EngineFailed(f"--engine cmd: {name} exited with status {status}")


def _fill(arg: str, paths: dict[str, str]) -> str:
    for key, value in paths.items():
        arg = arg.replace(key, value)
    return arg
