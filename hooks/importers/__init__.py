"""File importers beside :mod:`spectrace.hooks.vt`: what engine teams already keep, into a
trace.

* :mod:`.golden`: oracle-capture JSON goldens of parity gates (blocks placed by
  :mod:`.placement`, totals checked against the golden's counters by :mod:`.counters`);
* :mod:`.llama_dump`: llama.cpp's ``LLAMA_SPEC_DUMP`` JSONL (one object per verification
  step), placed on the prompt + output ids of a requests JSONL;
* :mod:`.common`: counted problems (``--strict`` raises the first), JSON with line numbers,
  writing one trace that a failed import leaves no ``.partial`` of.
"""
