"""spectrace.engine: the reference greedy speculative-decoding engine (PyTorch, CPU, fp32).

"Our engine" in miniature: `core` runs the step loop, `drafters` proposes (draft_model, ngram),
`vt_trace` prints the VT_SPEC_TRACE stderr lines, `models` finds and loads the bundled models.
`faults` holds deliberate, documented bugs (``--fault NAME``, off by default; one per finding
kind, see its table or ``--list-faults``) that spectrace's detectors must name.
Run it with ``python -m spectrace.engine``; nothing else in spectrace imports it.
"""
