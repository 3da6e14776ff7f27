"""A block anchored inside its request's prompt (before the prompt's last token) is an
impossible value in ``check`` and ``diff``, as ``validate`` already said: a drafter drafts
from the last verified token, at the earliest the prompt's last one. Its clean twin anchors
at exactly that token.

The request: prompt ``1 2 3 4 5`` (5 tokens: the last at position 4), output ``10..17``
(positions 5..12). Every block below is self-consistent (anchor = the token at its position,
drafts = the next tokens, accepted 2, emitted = the drafts and the bonus token) and follows
the previous one of the chain (each 3 positions on).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from spectrace.tracer.store import TraceWriter

SPECTRACE = os.path.join(os.path.dirname(sys.executable), "spectrace")
PROMPT, OUTPUT = [1, 2, 3, 4, 5], list(range(10, 18))
SEQ = PROMPT + OUTPUT


def write(path, positions: tuple[int, ...]):
    """k=2, one request; a block at each of ``positions``."""
    with TraceWriter(path, {"k": 2, "engine": "x"}, flush_interval=0) as w:
        w.request("r", prompt_ids=PROMPT, output_ids=OUTPUT, finish_reason="length")
        for step, p in enumerate(positions):
            drafts = SEQ[p + 1 : p + 3]
            w.add_block("r", step, p, SEQ[p], drafts, verified=drafts, accepted=2,
                        emitted=SEQ[p + 1 : p + 4])  # fmt: skip
    return path


def run(*args) -> tuple[int, dict]:
    r = subprocess.run([SPECTRACE, *map(str, args), "--format", "json"], capture_output=True,
                       text=True)  # fmt: skip
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def test_the_cases_are_self_consistent():
    assert (SEQ[1], SEQ[4], SEQ[7]) == (2, 5, 12) and SEQ[2:5] == [3, 4, 5]


def test_a_block_inside_the_prompt_is_an_impossible_value(tmp_path):
    bad = write(tmp_path / "bad.h5", (1, 4, 7))  # anchor 2: 3 tokens before the prompt's last
    good = write(tmp_path / "good.h5", (4, 7))
    for args, side in ((["check", bad], "trace"), (["diff", bad, good], "ours")):
        rc, doc = run(*args)
        errors = [f for f in doc["findings"] if f["severity"] == "error"]
        assert rc == 1 and [f["kind"] for f in errors] == ["impossible_values"], args
        f = errors[0]
        assert (f["side"], f["request"], f["position"]) == (side, "r", 1)
        ev = f["evidence"]
        assert (ev["blocks"], ev["row"], ev["rule"], ev["column"], ev["value"], ev["limit"]) == (
            1, 0, "position inside the prompt", "position", 1, 4,
        )  # fmt: skip
        assert ev["rules"] == {"position inside the prompt": 1}


def test_clean_twin_anchored_at_the_prompts_last_token(tmp_path):
    good = write(tmp_path / "good.h5", (4, 7))
    rc, doc = run("check", good)
    assert rc == 0 and [f for f in doc["findings"] if f["severity"] == "error"] == []
    assert run("diff", good, good)[0] == 0
