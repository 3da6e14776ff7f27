"""The ninth round of defects a fresh user found, each with its clean twin (expected values
derived by hand from the bundled traces: ``traces/README.md``; the vLLM trace has 144 blocks,
k 4, method draft_model).

1. A /blocks ``step`` below 0 (row 3 set to -5) passed ``check`` and ``diff`` (exit 0): the
   sweep read ``step`` unchecked. Now exit 2 naming the file, row and field.
2. /meta ``dp_rank`` -1 and ``tp_size`` 0 were read as valid ranks; /meta ``capture`` of
   another type (a string, a list) or with an ``ended`` outside the writer's values or a
   string ``exit_status`` reached the verdict. Now exit 2 naming the field.
3. A float64 margin beyond the float32 range (1e300) exported as infinite; ``validate``
   called the file valid. Now ``export`` exits 2 naming the field and row, ``validate`` a
   problem.
4. A draft_model run whose blocks all propose k=0 (drafts never installed) while /meta says
   k 4 passed ``check`` (exit 0). Now ``k_mismatch``, exit 1; a prompt-lookup (ngram) run or
   a run naming no method may legitimately propose fewer: no ``k_mismatch``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from inproc import run_inproc

ROOT = Path(__file__).resolve().parents[1]
REFERENCE, VLLM = ROOT / "traces" / "reference.h5", ROOT / "traces" / "vllm.h5"


def _copy(dst: Path, meta: dict | None = None, drop: tuple[str, ...] = (), **cols) -> Path:
    """A copy of the bundled vLLM trace with /meta items replaced by ``meta`` (keys in
    ``drop`` removed) and /blocks columns replaced by ``cols`` (name -> array)."""
    shutil.copyfile(VLLM, dst)
    with h5py.File(dst, "r+") as f:
        m = json.loads(f["meta"][()])
        m.update(meta or {})
        for key in drop:
            m.pop(key, None)
        del f["meta"]
        f["meta"] = json.dumps(m)
        g = f["blocks"]
        for name, a in cols.items():
            if name in g:
                del g[name]
            g.create_dataset(name, data=a, maxshape=(None, *a.shape[1:]), chunks=True)
    return dst


def _blocks() -> dict[str, np.ndarray]:
    with h5py.File(VLLM, "r", locking=False) as f:  # as spectrace opens it (one process)
        return {n: f["blocks"][n][:] for n in f["blocks"]}


def _kinds(r) -> list[str]:
    return [f["kind"] for f in json.loads(r.stdout)["findings"]]


def test_a_negative_step_is_bad_input(tmp_path):
    step = _blocks()["step"]
    step[3] = -5
    bad = _copy(tmp_path / "bad.h5", step=step)
    for cmd in (("check", bad), ("diff", REFERENCE, bad)):
        r = run_inproc(*cmd)
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr
        assert f"{bad}: value below 0 at row 3 (field=blocks/step, value=-5)" in r.stderr


def test_clean_twin_the_bundled_steps_pass(tmp_path):
    # The same copy path with the steps untouched (row 3 step as written: 1).
    good = _copy(tmp_path / "good.h5", step=_blocks()["step"])
    assert run_inproc("check", good).returncode == 0
    assert run_inproc("diff", REFERENCE, good).returncode == 0


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("dp_rank", -1, "expected an integer >= 0"),
        ("tp_size", 0, "expected an integer >= 1"),
        ("capture", "clean", "expected a JSON object"),
        ("capture", [1], "expected a JSON object"),
        ("capture", {"ended": "bogus"}, "ended"),
        ("capture", {"ended": "clean", "exit_status": "0"}, "exit_status"),
    ],
)
def test_meta_values_out_of_range_are_bad_input(tmp_path, key, value, words):
    bad = _copy(tmp_path / "bad.h5", meta={key: value})
    for cmd in (("check", bad), ("diff", REFERENCE, bad)):
        r = run_inproc(*cmd)
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr
        assert key in r.stderr and words in r.stderr, r.stderr
    assert run_inproc("validate", bad).returncode == 1


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("dp_rank", 1),
        ("tp_size", 2),
        ("capture", {"ended": "clean", "exit_status": 0, "signal": None}),
    ],
)
def test_clean_twin_valid_meta_values_pass(tmp_path, key, value):
    good = _copy(tmp_path / "good.h5", meta={key: value})
    assert run_inproc("check", good).returncode == 0
    assert run_inproc("validate", good).returncode == 0


def _margins(tmp_path: Path, value: float) -> Path:
    """The bundled vLLM trace with float64 draft/target margins, row 2's draft margin
    ``value`` (every other margin 1.5)."""
    n = len(_blocks()["k"])
    draft = np.full((n, 4), 1.5, np.float64)
    draft[2, 0] = value
    target = np.full(n, 1.5, np.float64)
    return _copy(tmp_path / "m.h5", draft_margin=draft, target_margin=target)


def test_a_margin_beyond_float32_is_bad_input(tmp_path):
    bad = _margins(tmp_path, 1e300)
    r = run_inproc("export", bad, "-o", tmp_path / "out.parquet")
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert "draft_margin" in r.stderr and "row 2" in r.stderr, r.stderr
    assert not (tmp_path / "out.parquet").exists()
    v = run_inproc("validate", bad)
    assert v.returncode == 1
    assert "float32 range" in v.stdout + v.stderr


def test_clean_twin_float64_margins_in_range_export(tmp_path):
    good = _margins(tmp_path, 2.25)
    r = run_inproc("export", good, "-o", tmp_path / "out.parquet")
    assert r.returncode == 0, r.stderr
    assert run_inproc("validate", good).returncode == 0


def _no_drafts(tmp_path: Path, meta: dict | None = None, drop: tuple[str, ...] = ()) -> Path:
    """The bundled vLLM trace as a run whose drafts were never installed: every block k 0,
    nothing proposed, verified or accepted (the bonus token emitted alone)."""
    b = _blocks()
    n = len(b["k"])
    emitted = np.full_like(b["emitted"], -1)
    emitted[:, 0] = b["emitted"][:, 0]
    return _copy(
        tmp_path / "nodrafts.h5",
        meta=meta,
        drop=drop,
        k=np.zeros(n, np.int16),
        proposed=np.full_like(b["proposed"], -1),
        verified=np.full_like(b["verified"], -1),
        num_verified=np.zeros(n, np.int16),
        accepted=np.zeros(n, np.int16),
        emitted=emitted,
        num_emitted=np.ones(n, np.int16),
    )


def test_a_model_drafter_that_never_drafts_is_k_mismatch(tmp_path):
    bad = _no_drafts(tmp_path)
    r = run_inproc("check", bad, "--format", "json")
    assert r.returncode == 1, r.stderr
    [f] = [f for f in json.loads(r.stdout)["findings"] if f["kind"] == "k_mismatch"]
    assert f["severity"] == "error"
    assert f["message"] == (
        "trace: 144 of 144 blocks propose no draft although its draft_model drafter is "
        "configured with k=4 and proposes k at every step: its drafts were never installed"
    )
    assert f["evidence"]["blocks"] == 144
    assert f["evidence"]["typical_difference"] == -4
    assert f["evidence"]["theirs_k"] == [4]


@pytest.mark.parametrize(
    ("meta", "drop"), [({"method": "ngram"}, ()), (None, ("method",))], ids=["ngram", "none"]
)
def test_clean_twin_variable_k_drafters_are_not_k_mismatch(tmp_path, meta, drop):
    ok = _no_drafts(tmp_path, meta=meta, drop=drop)
    r = run_inproc("check", ok, "--format", "json")
    assert "Traceback" not in r.stderr
    assert "k_mismatch" not in _kinds(r)


def test_clean_twin_the_bundled_trace_has_no_k_mismatch():
    r = run_inproc("check", VLLM, "--format", "json")
    assert r.returncode == 0
    assert "k_mismatch" not in _kinds(r)
