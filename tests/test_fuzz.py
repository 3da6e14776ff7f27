"""The seeded fuzzer (scripts/fuzz.py) in CI: a few hundred cases, well under a minute.

Mutated real logs go through ``import vt`` and two reader commands; damaged copies of
traces/reference.h5 through two of ``info``, ``check``, ``diff``, ``validate``. Every run
must end without a traceback, with an exit code in {0, 1, 2}; an exit 2 prints exactly one
``spectrace: error:`` line naming an input file; ``--format json`` prints JSON with a
``schema`` key, and a diff document validates against ``spectrace schema --diff``.
``python scripts/fuzz.py --cases 5000`` runs the long version.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "fuzz.py"
_spec = importlib.util.spec_from_file_location("spectrace_fuzz", _SCRIPT)
fuzz = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = fuzz  # dataclasses look their module up while the file runs
_spec.loader.exec_module(fuzz)


def _report(cases) -> str:
    failed = [c for c in cases if c.failures]
    return "\n".join(f"{c.kind} {c.damage}: {c.failures}" for c in failed[:10])


@pytest.mark.parametrize("seed", [11, 12, 13, 14])
def test_mutated_logs_and_traces(seed):
    cases = fuzz.fuzz(50, seed)
    assert len(cases) == 50
    assert not any(c.failures for c in cases), _report(cases)
    assert all(c.runs for c in cases)


@pytest.mark.parametrize("kind", [*fuzz.TRACE_DAMAGE, "bytes"])
def test_every_kind_of_trace_damage(tmp_path, kind):
    cases = []
    for i in range(6):
        d = tmp_path / str(i)
        d.mkdir()
        cases.append(fuzz.trace_case(random.Random(i), d, kind))
    assert not any(c.failures for c in cases), _report(cases)


def test_the_checks_catch_what_they_look_for():
    """The fuzzer's own checks fail a crash, a stray exit code, two error lines and a diff
    document that breaks the schema (its clean twin passes)."""
    ok = fuzz.Run(["info", "a.h5"], 2, "", "spectrace: error: /x/a.h5: bad (field=/meta)\n")
    assert fuzz.check_run(ok, ["/x/a.h5"]) == []
    crash = fuzz.Run(["info", "a.h5"], 3, "", "spectrace: internal error: IndexError: 3\n")
    assert len(fuzz.check_run(crash, ["/x/a.h5"])) == 2
    two = fuzz.Run(["info", "a.h5"], 2, "", "spectrace: error: a.h5: x\nspectrace: error: y\n")
    assert fuzz.check_run(two, ["a.h5"]) == [
        "info a.h5: exit 2 with 2 error lines: " + repr(two.err)
    ]
    anon = fuzz.Run(["info", "a.h5"], 2, "", "spectrace: error: something\n")
    assert len(fuzz.check_run(anon, ["/x/a.h5"])) == 1
    bad_json = fuzz.Run(["diff", "a", "b", "--format", "json"], 1, '{"schema": 1}', "")
    assert fuzz.check_run(bad_json, ["a"])[0].startswith("diff a: JSON breaks the diff schema")
