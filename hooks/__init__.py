"""spectrace.hooks: getting draft blocks out of engines.

* :mod:`spectrace.hooks.vllm`: the vLLM plugin (``vllm.general_plugins`` entry point), which
  records inside vLLM's own processes; :mod:`spectrace.hooks.vllm.v2` is its V2-runner path.
* :mod:`spectrace.hooks.vt`: our engine's ``VT_SPEC_TRACE`` stderr lines, parsed into a trace.
* :mod:`spectrace.hooks.capture`: the ``spectrace capture`` runners for both.
"""
