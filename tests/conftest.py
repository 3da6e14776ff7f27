"""Fixtures shared by the test folders (each folder's conftest.py adds its own)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

#: Modules that capture the same reference-engine runs (:func:`capture_reference`'s session
#: cache): one xdist group, so the runs are made once.
REFERENCE_RUN_MODULES = {"test_faults.py", "test_faults_general.py", "test_agreement.py"}


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist's ``--dist loadgroup`` every module is one group (one worker runs
    it, so a module fixture that loads vLLM loads it once); the reference-run modules share
    one group and their session cache."""
    for item in items:
        name = item.path.name
        group = "reference_runs" if name in REFERENCE_RUN_MODULES else str(item.path)
        item.add_marker(pytest.mark.xdist_group(group))


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
    failed run is not kept). Safe to call from several threads."""
    cache = tmp_path_factory.mktemp("reference_runs")
    done: dict[tuple, tuple[Path, subprocess.CompletedProcess]] = {}
    locks: dict[tuple, threading.Lock] = {}
    guard = threading.Lock()

    def capture(tmp, name, args, k=4, max_tokens=64):
        key = (tuple(args), k, max_tokens)
        with guard:
            lock = locks.setdefault(key, threading.Lock())
        with lock:
            if key not in done:
                where = cache / f"config{list(locks).index(key)}"
                where.mkdir(exist_ok=True)
                proc = _capture_reference(where, "run", args, k, max_tokens)
                if proc.returncode != 0:
                    return proc
                done[key] = (where, proc)
            where, proc = done[key]
        for ext in ("h5", "requests.jsonl", "log"):
            shutil.copyfile(where / f"run.{ext}", Path(tmp) / f"{name}.{ext}")
        return proc

    return capture
