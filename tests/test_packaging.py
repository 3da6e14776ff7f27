"""Packaging: every subpackage is listed, imports use the namespace, layers stay apart."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
TOP = ("tracer", "hooks", "tui", "engine")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_subpackage_is_listed():
    tool = _pyproject()["tool"]["setuptools"]
    listed = set(tool["packages"])
    found = {"spectrace"}  # api/: the top-level package itself (spectrace.open, spectrace.diff)
    for top in TOP:
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top).parts
            found.add(".".join(("spectrace", top, *rel)))
    assert found == listed, "pyproject [tool.setuptools] packages must list exactly these"
    for top in TOP:
        assert tool["package-dir"][f"spectrace.{top}"] == top
    assert tool["package-dir"]["spectrace"] == "api"
    assert not (ROOT / "spectrace").exists(), "spectrace is mapped from api/, not a folder"


def _imports(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module, node.lineno))
    return out


def _sources():
    for top in (*TOP, "tests", "benchmarks", "scripts"):
        yield from (ROOT / top).rglob("*.py")


def test_no_bare_top_level_imports():
    bad = [
        f"{p.relative_to(ROOT)}:{line}: import {mod}"
        for p in _sources()
        for mod, line in _imports(p)
        if mod.split(".")[0] in TOP
    ]
    assert bad == []


def test_layers_import_only_downward():
    """hooks never import engine/tui; tracer (but the CLI) never imports hooks/tui/engine."""
    bad = []
    for top, banned in (
        ("hooks", ("engine", "tui")),
        ("tracer", ("hooks", "tui", "engine")),
        ("tui", ("hooks", "engine")),
    ):
        for p in (ROOT / top).rglob("*.py"):
            if top == "tracer" and (
                p.parent.name == "cli"
                or p.relative_to(ROOT).as_posix() == "tracer/testing/plugin.py"
            ):
                continue  # composition roots import inside commands/fixtures only
            for mod, line in _imports(p):
                parts = mod.split(".")
                if parts[0] == "spectrace" and len(parts) > 1 and parts[1] in banned:
                    bad.append(f"{p.relative_to(ROOT)}:{line}: {mod}")
    assert bad == []


def test_tracer_is_import_light():
    code = (
        "import sys, spectrace.tracer.cli.main, spectrace.tracer.store, "
        "spectrace.tracer.align, spectrace.tracer.diff, spectrace.tracer.metrics, "
        "spectrace.tracer.cli.report, spectrace.tracer.pytest_plugin; "
        "print(sorted(m for m in ('torch', 'vllm', 'textual', 'transformers') "
        "if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"


def test_entry_points_are_declared():
    proj = _pyproject()["project"]
    assert proj["scripts"]["spectrace"] == "spectrace.tracer.cli.main:main"
    assert (
        proj["entry-points"]["vllm.general_plugins"]["spectrace"] == "spectrace.hooks.vllm:register"
    )
    assert proj["entry-points"]["pytest11"]["spectrace"] == "spectrace.tracer.testing.entry"
    assert set(proj["optional-dependencies"]) >= {"engine", "vllm", "test"}


def test_module_entry_and_version():
    r = subprocess.run(
        [sys.executable, "-m", "spectrace.tracer", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    from importlib.metadata import version

    assert r.stdout.strip() == f"spectrace, version {version('spectrace')}"
