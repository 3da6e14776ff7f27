"""spectrace.tracer.testing: draft-trace checks for tests.

* :mod:`.assertions`: :func:`~.assertions.drafts_match_report` and
  :func:`~.assertions.goldens_match`, usable from any test runner (None on success, else the
  failure text);
* :mod:`.plugin`: the pytest hook and ``spectrace_*`` fixtures (registered through the
  ``pytest11`` entry point :mod:`spectrace.tracer.pytest_plugin`).

Importing this package loads nothing else (not even numpy), so the plugin stays light at
collection time; import the submodule you need.
"""
