"""``spectrace replay``: drive an engine to draft from chosen positions of reference sequences.

Every (request, position) of a reference trace (or requests JSONL) becomes one request whose
prompt is the reference prefix before that position: the engine's target samples one token
there (the anchor) and its drafter proposes k ids after it. The answers are written as a
normal trace (``/meta`` ``source: "replay"``) with one block per (request, position) and the
acceptance recomputed against the reference sequence (teacher-forced acceptance).

* :mod:`.positions`: the reference sequences and the positions to replay (:class:`Site`);
* :mod:`.write`: teacher-forced acceptance and the replay trace (:func:`write_replay`);
* :mod:`.reference`: the bundled reference engine, in process;
* :mod:`.vllm`: real vLLM under the spectrace plugin (:mod:`.vllm_driver` is its script);
* :mod:`.cmd`: any engine command that reads ``{"id", "prompt_ids"}`` JSONL and prints
  ``VT_SPEC_TRACE`` lines;
* :mod:`.run`: :func:`replay` (engine by name) and :func:`replay_pair` (two engines, diffed).
"""
