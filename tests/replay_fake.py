"""``spectrace replay --engine cmd`` through a tiny engine script that tests write
(the ``cmd`` contract: it reads ``{prompts}``, prints ``[SPECTRACE]`` lines, writes
``{requests}``). Test modules import it by name, as :mod:`inproc`."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

from inproc import run_inproc


def replay_fake(tmp_path: Path, engine_source: str, *args: str) -> tuple[SimpleNamespace, Path]:
    """Replay a 3-token prompt + 4-token output (3 positions: 3, 4, 5, sites 0, 1, 2) with
    k 2 through ``engine_source`` run as ``python ENGINE {prompts} {requests} ARGS``.

    Returns:
        ``(the CLI's result, the replay's output path)``.
    """
    engine = tmp_path / "engine.py"
    engine.write_text(engine_source)
    ref = tmp_path / "ref.jsonl"
    ref.write_text('{"req_id": "a", "prompt_ids": [1, 2, 3], "output_ids": [4, 5, 6, 7]}\n')
    out = tmp_path / "replay.h5"
    cmd = " ".join([sys.executable, str(engine), "{prompts}", "{requests}", *args])
    r = run_inproc("replay", ref, "-o", out, "--engine", "cmd", "--k", "2", "--command", cmd)
    return r, out
