"""Lint, format and type checks at the settings in pyproject.toml, as part of the suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_check():
    r = _run(str(BIN / "ruff"), "check", "--no-cache", ".")
    assert r.returncode == 0, r.stdout[-4000:]


def test_ruff_format():
    r = _run(str(BIN / "ruff"), "format", "--check", "--no-cache", ".")
    assert r.returncode == 0, r.stdout[-4000:]


def test_mypy():
    r = _run("bash", "scripts/typecheck.sh")
    assert r.returncode == 0, r.stdout[-4000:]
