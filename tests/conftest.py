"""Fixtures shared by the test folders (each folder's conftest.py adds its own)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

#: num_speculative_tokens of the tiny DSpark drafter (its block_size).
TINY_DSPARK_K = 4


@pytest.fixture
def tiny_dspark():
    """``tiny_dspark(**config)`` -> a tiny DSpark draft model (vocab 64, hidden 32, 2 layers,
    block_size 4) with seeded normal weights, in eval mode; ``config`` overrides fields."""
    torch = pytest.importorskip("torch")
    from spectrace.engine import dspark

    def make(**kw) -> dspark.DSparkDraftModel:
        cfg = dict(
            vocab_size=64,
            draft_vocab_size=64,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            target_hidden_size=24,
            aux_hidden_state_layer_ids=[1, 2],
            mask_token_id=63,
            block_size=TINY_DSPARK_K,
            markov_rank=8,
        )
        cfg.update(kw)
        torch.manual_seed(0)
        m = dspark.DSparkDraftModel(dspark.DSparkConfig(**cfg))
        for p in m.parameters():
            torch.nn.init.normal_(p, 0.0, 0.5)
        return m.eval()

    return make


def _capture_reference(
    tmp: Path, name: str, args: list[str], k: int = 4, max_tokens: int = 64
) -> subprocess.CompletedProcess:
    """``spectrace capture`` of the reference engine (draft model, greedy) into
    ``tmp/NAME.h5`` with its requests file and raw log beside it; ``args`` go to the engine
    (e.g. ``["--fault", "layout_shift"]``)."""
    h5, req, log = tmp / f"{name}.h5", tmp / f"{name}.requests.jsonl", tmp / f"{name}.log"
    spectrace = str(Path(sys.executable).parent / "spectrace")
    engine = [sys.executable, "-m", "spectrace.engine", "--method", "draft_model"]
    engine += ["--k", str(k), "--max-tokens", str(max_tokens), "--requests-out", str(req)]
    cmd = [spectrace, "capture", "-o", str(h5), "--requests", str(req), "--log", str(log)]
    return subprocess.run([*cmd, "--", *engine, *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="session")
def capture_reference(tmp_path_factory):
    """``capture_reference(tmp, name, args, k=4, max_tokens=64)`` -> the finished process
    of a reference-engine capture into ``tmp/NAME.h5`` (see :func:`_capture_reference`).

    The engine is deterministic, so a configuration (``args``, k, max_tokens) runs once per
    session: test_faults, test_faults_general and the TUI's agreement tests capture the same
    clean and faulty runs, and later callers get copies of the first run's three files (a
    failed run is not kept). The cache is shared by the pytest-xdist workers (a file lock per
    configuration) and by threads."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, above each worker's own
    cache = root / "reference_runs"
    cache.mkdir(exist_ok=True)

    def capture(tmp, name, args, k=4, max_tokens=64):
        key = json.dumps([list(args), k, max_tokens])
        where = cache / hashlib.sha1(key.encode()).hexdigest()[:16]
        with open(f"{where}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one process or thread runs it, the others wait
            if not (where / "done").exists():
                where.mkdir(exist_ok=True)
                proc = _capture_reference(where, "run", args, k, max_tokens)
                if proc.returncode != 0:
                    return proc
                (where / "done").write_text(json.dumps([proc.stdout, proc.stderr]))
            out, err = json.loads((where / "done").read_text())
        for ext in ("h5", "requests.jsonl", "log"):
            shutil.copyfile(where / f"run.{ext}", Path(tmp) / f"{name}.{ext}")
        return subprocess.CompletedProcess(list(args), 0, out, err)

    return capture
