"""The layout's rules, checked over every module of the package (issue 10).

* the headless library (``spectrace.tracer`` outside ``cli/``) loads none of textual, rich,
  torch, vllm; the TUI's model (``spectrace.tui.model``) loads no textual;
* no import cycle between modules, function-level imports included;
* no function over 80 lines, no module over about 500 lines.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOPS = ("tracer", "hooks", "tui", "engine")
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 500
#: Modules allowed past MAX_MODULE_LINES, with the reason (keep this list short).
LONG_MODULES: dict[str, str] = {
    "spectrace.tui.screens.main": "the main screen's message handlers and key actions, one"
    " per key of the keymap (494 lines before ruff format wrapped them)",
}


def _modules() -> dict[str, Path]:
    """``spectrace.<dotted>`` -> file, for every module of the package."""
    out = {}
    for top in (*TOPS, "api"):  # api/ is the top-level package ``spectrace`` itself
        for p in sorted((ROOT / top).rglob("*.py")):
            rel = p.relative_to(ROOT / "api" if top == "api" else ROOT).with_suffix("").parts
            parts = ["spectrace", *rel]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


MODULES = _modules()
HEADLESS = sorted(
    m
    for m in MODULES
    if m.startswith("spectrace.tracer")
    and not m.startswith("spectrace.tracer.cli")
    and not m.endswith("__main__")
)
TUI_MODEL = sorted(m for m in MODULES if m.startswith("spectrace.tui.model"))


def _loaded(module: str, heavy: tuple[str, ...]) -> list[str]:
    code = f"import sys, {module}; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return eval(r.stdout)


@pytest.mark.parametrize("module", HEADLESS)
def test_headless_module_loads_no_ui_or_engine(module):
    assert _loaded(module, ("textual", "rich", "torch", "vllm")) == []


@pytest.mark.parametrize("module", TUI_MODEL)
def test_tui_model_loads_no_textual(module):
    assert _loaded(module, ("textual",)) == []


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _imports(module: str) -> set[str]:
    """The package modules ``module`` imports anywhere in its body (functions included)."""
    tree = ast.parse(MODULES[module].read_text())
    pkg = module if _is_package(module) else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = pkg.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # ``from pkg import sub`` imports the submodule when there is one, after running
            # the package's __init__: an edge to both.
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        found.update(n for n in names if n in MODULES and n != module)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert _cycles({m: _imports(m) for m in MODULES}) == []


def test_cycle_finder_finds_a_cycle():
    # The twin of test_no_import_cycles: a two-module cycle (c only imports into it) is found.
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_from_package_import_counts_the_package():
    # ``from . import x`` inside a package's module runs the package's __init__ first.
    graph = {m: _imports(m) for m in MODULES}
    assert "spectrace.tracer.cli" in graph["spectrace.tracer.cli.read_cmds"]
    assert "spectrace.tracer.cli.output" in graph["spectrace.tracer.cli.read_cmds"]


def test_function_level_imports_count():
    # The CLI's commands import the store inside their functions: the edge must be seen.
    assert "spectrace.tracer.store" in _imports("spectrace.tracer.cli.read_cmds")


def _long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    return [
        f"{path.relative_to(ROOT)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
        for n in ast.walk(tree)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES
    ]


def test_no_function_over_80_lines():
    assert [f for p in MODULES.values() for f in _long_functions(p)] == []


def test_no_module_over_500_lines():
    long = [
        f"{m} ({n} lines)"
        for m, p in MODULES.items()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES and m not in LONG_MODULES
    ]
    assert long == []
