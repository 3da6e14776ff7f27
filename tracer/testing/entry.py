"""The ``pytest11`` entry point (``spectrace``): it only names the plugin module.

Why it is not the plugin itself: pytest registers a plugin module once, under one name. With
the entry point naming :mod:`spectrace.tracer.pytest_plugin` directly, the module was
registered as ``spectrace``, and a team's ``pytest_plugins = ["spectrace.tracer.pytest_plugin"]``
or ``-p spectrace.tracer.pytest_plugin`` (what that module's docstring offers) stopped pytest
before any test ("Plugin already registered under a different name"). Naming it here in
``pytest_plugins`` registers it under its module name wherever it is loaded from, once;
``-p no:spectrace`` still keeps it out.
"""

from __future__ import annotations

pytest_plugins = ["spectrace.tracer.pytest_plugin"]
