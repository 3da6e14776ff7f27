"""pytest plugin (entry point ``pytest11``): spectrace fixtures for engine teams' CI.

Import-light by design: loading the plugin imports nothing heavy (no h5py, numpy, torch,
vllm or textual); fixtures import what they need when used.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def spectrace_load():
    """Return a function ``load(path)`` that opens a trace file (or glob) for reading.

    Returns:
        ``load(path) -> spectrace.tracer.store.Trace``; raises ``InputError`` on a missing
        file and ``TraceFormatError`` on a file that is not a spectrace trace.
    """
    from .store import open_trace

    return open_trace
