"""Lazy class patches: run a patch on a module right after it is first imported (or at once if
it already is), and wrap ``__init__`` methods. Generic, standard library only: nothing here
knows vLLM."""

from __future__ import annotations

import functools
import importlib.abc
import sys
import threading
from collections.abc import Callable
from types import ModuleType

from spectrace.tracer.cli.output import say

from .common import vllm_version

_lock = threading.RLock()
_pending: dict[str, Callable[[ModuleType], None]] = {}
_finder_installed = False


def on_import(patches: dict[str, Callable[[ModuleType], None]]) -> None:
    """Run ``patches[name](module)`` once per module name: now for modules already imported,
    else right after the module's code has run (an import hook in ``sys.meta_path``).

    A patch that raises is reported on one ``spectrace: ERROR`` line and never breaks the
    import of vLLM's own module.
    """
    global _finder_installed
    with _lock:
        _pending.update(patches)
        for name in list(_pending):
            mod = sys.modules.get(name)
            if mod is not None:
                _apply(name, mod)
        if _pending and not _finder_installed:
            sys.meta_path.insert(0, _PostImportFinder())
            _finder_installed = True


def _apply(name: str, module: ModuleType) -> None:
    patch = _pending.pop(name, None)
    if patch is None:
        return
    try:
        patch(module)
    except Exception as exc:  # never break vLLM's import of its own module
        say(f"ERROR could not patch {name} (vLLM {vllm_version()}): {type(exc).__name__}: {exc}")


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Runs the pending patch of a module right after the module is first executed."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _pending:  # (staying in meta_path costs one dict lookup)
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PatchingLoader(spec.loader, fullname)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        # Put the real loader back so that introspection (resources, linecache) sees it.
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _apply(self._name, module)

    def __getattr__(self, attr):
        return getattr(self._loader, attr)


def wrap_init(cls: type, after: Callable[[object], None]) -> None:
    """Wrap ``cls.__init__`` so that ``after(self)`` runs once the original returns.
    Idempotent per class (a forked child inherits the patched class)."""
    if cls.__dict__.get("_spectrace_patched"):
        return
    orig = cls.__init__  # type: ignore[misc]  # the class's own initialiser, on purpose

    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        after(self)

    cls.__init__ = __init__  # type: ignore[misc]
    setattr(cls, "_spectrace_patched", True)  # noqa: B010 - a marker the class does not declare
