"""spectrace.engine: the reference greedy speculative-decoding engine (PyTorch, CPU, fp32).

"Our engine" in miniature: `core` runs the step loop, `drafters` proposes (draft_model, ngram),
`vt_trace` prints the VT_SPEC_TRACE stderr lines, `models` finds and loads the bundled models.
Run it with ``python -m spectrace.engine``; nothing else in spectrace imports it.
"""
