"""spectrace.tui: the Textual viewer of one trace or an aligned pair (``spectrace view``).

Reads only through :mod:`spectrace.tracer` and its own UI-independent model
(:mod:`spectrace.tui.model`); no HDF5 calls here. Build the app with :func:`make_app`,
shared by the CLI and the tests.

``make_app`` and ``SpectraceApp`` load on first use (PEP 562), so importing the model
(``spectrace.tui.model``, also what the analysis child process runs) never loads textual.
"""

from __future__ import annotations

__all__ = ["SpectraceApp", "make_app"]


def __getattr__(name: str):
    if name in __all__:
        from . import app  # textual is heavy and optional for the model: load it on use

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
