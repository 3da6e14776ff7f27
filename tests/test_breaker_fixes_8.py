"""The eighth new user's defects (importers, capture, the pytest plugin), each with its twin.

1. A golden whose spec-decode counters are floats (``5.0``: how Prometheus exports a
   counter) was read as having no counters at all ("the golden has no spec-decode
   counters"), so a golden short of its own draft counter passed ``check`` (exit 0); a
   counter that is no count (``"3"``, ``true``) was dropped the same silent way. Integral
   floats are counts now, and any other value is bad input naming the file, line and field.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
from inproc import run_inproc

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data_importers" / "golden_small.json"

# -- 1. golden counters written as floats, or not as counts ------------------------------------


def _golden(tmp_path: Path, metrics: dict) -> Path:
    """The bundled golden with its ``metrics`` replaced, on one line (line 1)."""
    doc = json.loads(GOLDEN.read_text())
    doc["metrics"] = metrics
    src = tmp_path / "g.json"
    src.write_text(json.dumps(doc) + "\n")
    return src


def _check_errors(path: Path) -> tuple[int, list[str]]:
    r = run_inproc("check", path, "--format", "json")
    doc = json.loads(r.stdout)
    return r.returncode, [f["kind"] for f in doc["findings"] if f["severity"] == "error"]


# The bundled golden's walk places 5 blocks of 15 drafts (test_importers derives them).
_FLOATS_SHORT = {
    "vllm:spec_decode_num_drafts": 9.0,  # 4 drafts more than the golden's blocks hold
    "vllm:spec_decode_num_draft_tokens": 27.0,
    "vllm:spec_decode_num_accepted_tokens": 9.0,
    "vllm:spec_decode_num_accepted_tokens_per_pos": [4.0, 3.0, 2.0],
}


def test_float_counters_short_of_the_blocks_are_missing_work(tmp_path):
    out = tmp_path / "g.h5"
    r = run_inproc("import", "golden", _golden(tmp_path, _FLOATS_SHORT), "-o", out)
    assert r.returncode == 0
    with h5py.File(out) as f:
        checks = json.loads(f["meta"][()])["checks"]
    assert (checks["status"], checks["mismatch"]) == ("mismatch", ["drafts", "draft_tokens"])
    assert checks["golden_counters"]["golden"]["drafts"] == 9
    assert _check_errors(out) == (1, ["capture_incomplete"])


def test_float_counters_equal_to_the_blocks_pass_check(tmp_path):
    """Twin: the bundled golden's own counters (5 drafts, 15 draft tokens) as floats."""
    metrics = {**_FLOATS_SHORT, "vllm:spec_decode_num_drafts": 5.0}
    metrics["vllm:spec_decode_num_draft_tokens"] = 15.0
    out = tmp_path / "g.h5"
    assert run_inproc("import", "golden", _golden(tmp_path, metrics), "-o", out).returncode == 0
    with h5py.File(out) as f:
        checks = json.loads(f["meta"][()])["checks"]
    assert checks["status"] == "ok"
    assert _check_errors(out) == (0, [])


def test_a_counter_that_is_no_count_is_bad_input(tmp_path):
    for value in ("5", True, -1, 2.5):
        src = _golden(tmp_path, {**_FLOATS_SHORT, "vllm:spec_decode_num_drafts": value})
        out = tmp_path / "g.h5"
        r = run_inproc("import", "golden", src, "-o", out)
        assert (r.returncode, r.stdout) == (2, "")
        assert r.stderr == (
            f"spectrace: error: {src}:1: metrics field 'vllm:spec_decode_num_drafts' is not a "
            f"count (value {value!r})\n"
        )
        assert not out.exists() and not Path(f"{out}.partial").exists()


def test_a_per_position_counter_that_is_no_list_of_counts_is_bad_input(tmp_path):
    bad = {**_FLOATS_SHORT, "vllm:spec_decode_num_accepted_tokens_per_pos": [4, "3", 2]}
    r = run_inproc("import", "golden", _golden(tmp_path, bad), "-o", tmp_path / "g.h5")
    assert r.returncode == 2
    assert "'vllm:spec_decode_num_accepted_tokens_per_pos' is not a count" in r.stderr
