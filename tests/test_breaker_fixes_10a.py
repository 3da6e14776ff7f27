"""The tenth round of defects (part a), each with its clean twin; every expected figure is
derived by hand in the comments from the bundled golden (tests/data_importers/golden_small.json)
and traces (traces/README.md).

1. ``import golden`` excused any accepted-token counter difference once one placed block
   reached past max_tokens: a golden counting 100 accepted of 15 draft tokens, or fewer
   accepted than the placed blocks show, ended ``checks.status`` "ok" and ``check`` exit 0.
   vLLM counts acceptance before it trims the output at a stop, so the counters may exceed
   the placed blocks by at most the drafts cut at the output's end, never fall below them,
   never exceed the drafts. Now anything else is ``mismatch`` -> ``capture_incomplete``.
2. ``--meta k=<huge>`` was not range-checked (exit 3 and a ``.partial`` left behind, or a
   40000-wide trace); a /meta k of 1e30 was valid to ``validate`` while ``check``/``diff``
   exited 3. Now k <= ``schema.META_MAXIMUM["k"]`` (1024): exit 2, one line, no file; an
   import dying of an unexpected error removes its ``.partial``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import pytest
from inproc import run_inproc

from spectrace.tracer import schema
from spectrace.tracer.store import writer as writer_mod

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data_importers" / "golden_small.json"
VT_LOG, VLLM = ROOT / "traces" / "reference.vt.log", ROOT / "traces" / "vllm.h5"
REQUESTS = ROOT / "traces" / "reference.requests.jsonl"
BIG = 10**29  # written out in full on the command line: 1 and 29 zeros

# The bundled golden's walk (test_importers derives it): 6 verified placed blocks (the final
# proposal left out), 18 draft tokens, 8 accepted, per slot [6, 2, 0]. One placed block
# reaches past max_tokens: record 0's third block, anchor 26 at position 9, drafts
# [27, 28, 29]: 27 is the last of 11 tokens (position 10), so 28 and 29 cannot be compared:
# 2 drafts cut, in slots 1 and 2. The golden may count 0..2 accepted tokens more than 8 (per
# slot 0..1 more in slots 1 and 2), never fewer, never more than 18.


def _golden(tmp_path: Path, **metrics) -> Path:
    doc = json.loads(GOLDEN.read_text())
    doc["metrics"].update({f"vllm:spec_decode_num_{k}": v for k, v in metrics.items()})
    src = tmp_path / "g.json"
    src.write_text(json.dumps(doc))
    return src


def _import_and_check(tmp_path: Path, **metrics) -> tuple[dict, object]:
    out = tmp_path / "g.h5"
    r = run_inproc("import", "golden", _golden(tmp_path, **metrics), "-o", out)
    assert r.returncode == 0, r.stderr
    with h5py.File(out) as f:
        checks = json.loads(f["meta"][()])["checks"]
    return checks, run_inproc("check", out, "--format", "json")


def _error_kinds(r) -> list[str]:
    return [f["kind"] for f in json.loads(r.stdout)["findings"] if f["severity"] == "error"]


@pytest.mark.parametrize(
    ("metrics", "mismatch", "why"),
    [
        # 100 accepted of 18 draft tokens: more than drafted (per slot [6, 3, 0] stays within)
        (
            {"accepted_tokens": 100},
            ["accepted_tokens"],
            "accepted tokens: the golden counts 100, more than its 18 draft tokens",
        ),
        # 6 accepted, [6, 0, 0]: 2 fewer than the placed 8, slot 1 two fewer than 2
        (
            {"accepted_tokens": 6, "accepted_tokens_per_pos": [6, 0, 0]},
            ["accepted_tokens", "accepted_per_pos"],
            "accepted tokens: the golden counts 2 fewer than the placed blocks show",
        ),
        # 11 accepted (per slot [6, 3, 0] within): 3 more than 8, only 2 drafts were cut
        (
            {"accepted_tokens": 11},
            ["accepted_tokens"],
            "accepted tokens: the golden counts 3 more than the placed blocks show; the drafts "
            "cut at the output's end explain at most 2",
        ),
        # 10 accepted, [6, 4, 0]: the total within 2, slot 1 two more than 2 (one was cut)
        (
            {"accepted_tokens": 10, "accepted_tokens_per_pos": [6, 4, 0]},
            ["accepted_per_pos"],
            "accepted at position 1: the golden counts 2 more than the placed blocks show",
        ),
    ],
    ids=["more-than-drafted", "fewer-than-placed", "past-the-cut", "slot-past-the-cut"],
)
def test_accepted_counters_trimming_cannot_explain_are_missing_work(
    tmp_path, metrics, mismatch, why
):
    checks, r = _import_and_check(tmp_path, **metrics)
    assert (checks["status"], checks["mismatch"]) == ("mismatch", mismatch)
    gc = checks["golden_counters"]
    assert (gc["past_max_tokens"], gc["cut_drafts"], gc["unexplained"]) == (1, 2, mismatch)
    assert why in gc["message"]
    assert r.returncode == 1 and _error_kinds(r) == ["capture_incomplete"]
    assert f"own counters ({', '.join(mismatch)})" in r.stdout


@pytest.mark.parametrize(
    "metrics",
    [
        {},  # the bundled counters: 9 accepted, [6, 3, 0]: 1 more than 8, slots [0, 1, 0]
        {"accepted_tokens": 10, "accepted_tokens_per_pos": [6, 3, 1]},  # 2 more: both cut ones
        {"accepted_tokens": 8, "accepted_tokens_per_pos": [6, 2, 0]},  # equal
    ],
    ids=["bundled", "at-the-bound", "equal"],
)
def test_accepted_counters_within_the_trimming_bound_stay_ok(tmp_path, metrics):
    """Twin: what vLLM's trimming at max_tokens can hide (0..2 here) is no mismatch."""
    checks, r = _import_and_check(tmp_path, **metrics)
    assert checks["status"] == "ok" and "mismatch" not in checks
    assert checks["golden_counters"].get("unexplained", []) == []
    assert r.returncode == 0 and _error_kinds(r) == []


# -- /meta k's upper bound --------------------------------------------------------------------


@pytest.mark.parametrize("k", [BIG, 3_000_000_000, 1025])
def test_import_meta_k_past_the_bound_is_bad_usage_and_leaves_nothing(tmp_path, k):
    out = tmp_path / "X.h5"
    r = run_inproc("import", "vt", VT_LOG, "-o", out, "--requests", REQUESTS, "--meta", f"k={k}")
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"spectrace: error: Invalid value for --meta k: expected an integer <= 1024 (field=k, "
        f"value='{k}') (see 'spectrace import vt --help')"
    ]
    assert list(tmp_path.iterdir()) == []
    assert schema.META_MAXIMUM["k"] == 1024
    assert schema.meta_type_error("k", k) == "expected an integer <= 1024"


def test_import_meta_k_at_the_bound_imports(tmp_path):
    """Twin: k=1024 (``META_MAXIMUM``) is a valid k: the trace is written and valid."""
    out = tmp_path / "X.h5"
    r = run_inproc("import", "vt", VT_LOG, "-o", out, "--requests", REQUESTS, "--meta", "k=1024")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["X.h5"]
    with h5py.File(out) as f:
        assert json.loads(f["meta"][()])["k"] == 1024
    assert run_inproc("validate", out).returncode == 0
    assert schema.meta_type_error("k", 1024) is None


def _with_k(dst: Path, k: int) -> Path:
    shutil.copyfile(VLLM, dst)
    with h5py.File(dst, "r+") as f:
        m = json.loads(f["meta"][()])
        m["k"] = k
        del f["meta"]
        f["meta"] = json.dumps(m)
    return dst


def test_stored_meta_k_past_the_bound_is_refused_by_every_reader(tmp_path):
    t = _with_k(tmp_path / "t.h5", 10**30)
    line = f"{t}: expected an integer <= 1024 (field=meta.k, value={10**30})"
    v = run_inproc("validate", t)
    assert v.returncode == 1 and v.stdout.splitlines() == [line]
    for args in (("check", t), ("diff", t, VLLM)):
        r = run_inproc(*args)
        assert r.returncode == 2 and r.stderr.splitlines() == [f"spectrace: error: {line}"]


def test_stored_meta_k_at_the_bound_is_valid(tmp_path):
    """Twin: the bundled vLLM trace (k 4) and the same with k 1024 are valid."""
    assert run_inproc("validate", VLLM).returncode == 0
    assert run_inproc("validate", _with_k(tmp_path / "t.h5", 1024)).returncode == 0


# -- an import dying of an unexpected error ---------------------------------------------------


def _fail(*args, **kwargs):
    raise RuntimeError("injected")


@pytest.mark.parametrize("where", ["_init_file", "_append_blocks"])
def test_an_import_dying_of_a_bug_removes_its_partial(tmp_path, monkeypatch, where):
    # _init_file: the writer fails laying out its columns (the .partial already created);
    # _append_blocks: the closing flush fails (k=1e29's HDF5 chunk, k=3e9's MemoryError)
    monkeypatch.setattr(writer_mod.TraceWriter, where, _fail)
    monkeypatch.delenv("SPECTRACE_DEBUG", raising=False)
    out = tmp_path / "X.h5"
    r = run_inproc("import", "vt", VT_LOG, "-o", out)
    assert r.returncode == 3
    assert r.stderr.splitlines()[-1].startswith("spectrace: internal error: RuntimeError: injected")
    assert f"partial trace {out}.partial removed" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_import_that_works_leaves_only_its_trace(tmp_path):
    """Twin: nothing injected, the trace is renamed from its ``.partial`` and nothing else."""
    out = tmp_path / "X.h5"
    assert run_inproc("import", "vt", VT_LOG, "-o", out).returncode == 0
    assert [p.name for p in tmp_path.iterdir()] == ["X.h5"]
