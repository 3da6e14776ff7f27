"""HDF5 trace store (schema v1): the writer, the reader and background column reads.

* :mod:`.writer`: :class:`TraceWriter`, the crash-safe buffered writer (``NAME.h5.partial``
  renamed to ``NAME.h5`` on a clean close; late patches through ``patch_blocks``).
* :mod:`.reader`: :class:`Trace` and :func:`open_trace`, the lazy reader of one or several files.
* :mod:`.structure`: the checks the reader runs before use (format version, /meta types,
  column ranks and dtypes, equal lengths, index and value ranges), as :class:`Problem` rows.
* :mod:`.columns`: the column views a trace hands out (:class:`Requests`, :class:`Blocks`,
  :class:`RaggedColumn`).
* :mod:`.prefetch`: :func:`prefetch`, block columns read on a background thread.
* :mod:`.paths`: file names (:func:`final_path`, :func:`resolve_paths`) and :class:`TraceWarning`.

The file layout is defined in :mod:`spectrace.tracer.schema`.
"""

from .columns import Blocks, RaggedColumn, Requests
from .paths import TraceSpec, TraceWarning, final_path, partial_path, resolve_paths
from .prefetch import prefetch
from .reader import Trace, open_trace
from .writer import TraceWriter, spectrace_version

__all__ = [
    "Blocks",
    "RaggedColumn",
    "Requests",
    "Trace",
    "TraceSpec",
    "TraceWarning",
    "TraceWriter",
    "final_path",
    "open_trace",
    "partial_path",
    "prefetch",
    "resolve_paths",
    "spectrace_version",
]
