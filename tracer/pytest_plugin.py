"""The module pytest registers as spectrace's pytest plugin (``spectrace.tracer.pytest_plugin``).

Why this module exists: the ``pytest11`` entry point (:mod:`spectrace.tracer.testing.entry`)
names it in ``pytest_plugins``, and engine teams may list it in ``-p``/``pytest_plugins``
themselves (pytest then registers it once, under this name), so it keeps working after the
plugin moved to :mod:`spectrace.tracer.testing.plugin`. pytest finds hooks and fixtures by
attribute on the registered module, so the hook and every fixture are re-exported here;
nothing else lives here.
"""

from __future__ import annotations

from .testing.plugin import (
    Regression,
    pytest_addoption,
    spectrace_assert_drafts_match,
    spectrace_capture_cmd,
    spectrace_capture_vllm,
    spectrace_load,
    spectrace_regression,
)

__all__ = [
    "Regression",
    "pytest_addoption",
    "spectrace_assert_drafts_match",
    "spectrace_capture_cmd",
    "spectrace_capture_vllm",
    "spectrace_load",
    "spectrace_regression",
]
