"""spectrace.tui: the Textual viewer of one trace or an aligned pair (``spectrace view``).

Reads only through :mod:`spectrace.tracer` (the view model in
:mod:`spectrace.tracer.view_model`); no HDF5 calls here. Build the app with
:func:`make_app`, shared by the CLI and the tests.
"""

from .app import SpectraceApp, make_app

__all__ = ["SpectraceApp", "make_app"]
