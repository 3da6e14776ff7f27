"""A lenient VT import whose lines break the engine's invariants is not a consistent record.

``import vt`` (lenient) counts every broken invariant in /meta ``import`` violations and
keeps the blocks. Those that no other finding names block by block (an anchor the requests
file contradicts, ``drafts/row`` against ``first=[…]``, ``len(draft) != k``, ``len(emit) !=
ns``) are ``capture_incomplete`` with ``violations`` and ``first_violation``: exit 1 in
``check`` and in both ``diff`` orders. The acceptance invariants stay
``acceptance_bookkeeping``'s (named once). Each case has a clean twin: the bundled log with
its own requests file.

Hand-derived facts of the bundled files: request 0's prompt holds 10 ids, so its
``output_ids[3]`` is the token at position 13, the anchor of its block at ``pos=14`` (the
anchor is the token at ``pos - 1``); line 26 is the second ``[spec-propose]`` line,
``drafts/row=4`` with a 4-id ``first=[…]``; line 20 is request 0's first block, ``ns=3 acc=2``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOG = ROOT / "traces" / "reference.vt.log"
REQS = ROOT / "traces" / "reference.requests.jsonl"
SPECTRACE = [sys.executable, "-m", "spectrace.tracer"]


def _run(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([*SPECTRACE, *map(str, args)], capture_output=True, text=True)


def _findings(*args: object) -> tuple[int, dict[str, dict]]:
    """Exit status and the error findings by kind of ``check``/``diff --format json``."""
    r = _run(*args, "--format", "json")
    assert r.returncode in (0, 1), r.stderr[-2000:]
    doc = json.loads(r.stdout)
    return r.returncode, {f["kind"]: f for f in doc["findings"] if f["severity"] == "error"}


def _import(tmp_path: Path, name: str, lines: list[str], requests: Path = REQS) -> Path:
    log, out = tmp_path / f"{name}.vt.log", tmp_path / f"{name}.h5"
    log.write_text("".join(lines))
    r = _run("import", "vt", log, "-o", out, "--requests", requests)
    assert r.returncode == 0, r.stderr
    return out


def _lines() -> list[str]:
    return LOG.read_text().splitlines(keepends=True)


def test_the_bundled_facts_the_cases_edit():
    lines = LOG.read_text().splitlines()
    first = json.loads(REQS.read_text().splitlines()[0])
    assert (first["req_id"], len(first["prompt_ids"])) == ("0", 10)
    assert lines[43].startswith("[SPECTRACE] req=0 pos=14 ")
    assert [i + 1 for i, x in enumerate(lines) if x.startswith("[spec-propose]")][:2] == [2, 26]
    assert "drafts/row=4 first=[63 376 312 65 ]" in lines[25]
    assert lines[19].startswith("[SPECTRACE] req=0 pos=11 k=4 ns=3 acc=2 ")


def _contradicting_requests(tmp_path: Path) -> Path:
    rows = [json.loads(x) for x in REQS.read_text().splitlines()]
    rows[0]["output_ids"][3] = 999  # position 13: the log's emitted stream has 385 there
    path = tmp_path / "contradicting.requests.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_requests_file_contradicting_the_log_is_not_a_consistent_record(tmp_path):
    bad = _import(tmp_path, "bad", _lines(), _contradicting_requests(tmp_path))
    clean = _import(tmp_path, "clean", _lines())
    for args, side in (
        (["check", bad], "trace"),
        (["diff", bad, clean], "ours"),
        (["diff", clean, bad], "theirs"),
    ):
        rc, errors = _findings(*args)
        assert rc == 1 and "capture_incomplete" in errors, args
        f = errors["capture_incomplete"]
        assert f["side"] == side
        ev = f["evidence"]
        assert (ev["violations"], ev["chain_breaks"], ev["dropped_lines"]) == (
            {"anchor mismatch": 1},
            0,
            0,
        )
        assert ev["first_violation"].startswith(f"{tmp_path / 'bad.vt.log'}:44: anchor mismatch")
        assert "requests file has 999 at position 13" in ev["first_violation"]
        assert "not a consistent record" in f["message"]


def test_drafts_per_row_contradicting_first_is_not_a_consistent_record(tmp_path):
    lines = _lines()
    lines[25] = lines[25].replace("drafts/row=4", "drafts/row=3")
    rc, errors = _findings("check", _import(tmp_path, "rows", lines))
    assert rc == 1
    ev = errors["capture_incomplete"]["evidence"]
    assert ev["violations"] == {"drafts/row": 1}
    assert ev["first_violation"] == (
        f"{tmp_path / 'rows.vt.log'}:26: drafts/row: drafts/row=3 but first=[…] holds 4 ids"
    )


def test_an_acceptance_invariant_is_named_once_by_acceptance_bookkeeping(tmp_path):
    lines = _lines()
    lines[19] = lines[19].replace("acc=2", "acc=1")  # 3 emitted ids: accepted is 2
    rc, errors = _findings("check", _import(tmp_path, "acc", lines))
    assert rc == 1 and set(errors) == {"acceptance_bookkeeping"}
    assert errors["acceptance_bookkeeping"]["evidence"]["blocks"] == 1


@pytest.mark.parametrize("command", ["check", "diff"])
def test_clean_twin_the_bundled_log_with_its_own_requests(tmp_path, command):
    clean = _import(tmp_path, "clean", _lines())
    args = ["check", clean] if command == "check" else ["diff", clean, clean]
    assert _findings(*args) == (0, {})
