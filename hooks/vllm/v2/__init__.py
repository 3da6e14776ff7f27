"""The V2 model runner path of the vLLM plugin: a wrapper on ``speculator.propose``.

Modules: :mod:`.attach` (wires a runner), :mod:`.layout` (the ``propose`` signature),
:mod:`.tap` (the hot path), :mod:`.tap_join` (its joins), :mod:`.tap_requests` (request
registrations, finishes, preemptions, emitted ids), :mod:`.stage` /
:mod:`.stage_triton` (one staging launch), :mod:`.graph_stage` (staging from inside the
drafter's CUDA graph: a descriptor per step, no launch),
:mod:`.ring` (device/host blocks), :mod:`.stream` (staged steps in order), :mod:`.drainer`
(the background join thread), :mod:`.join` (the vectorised join), :mod:`.outputs` (emitted
ids per request), :mod:`.dspark` (DSpark's inner record and agreement check).

.. warning:: Not exercised on a real V2 runner yet. vLLM's V2 runner needs Triton, which the
   CPU wheel does not have; this code is tested against a fake speculator whose ``propose``
   has the real 0.32 signature (``vllm/v1/worker/gpu/spec_decode/speculator.py``,
   ``BaseSpeculator.propose``) and real CPU tensors, and shares its join logic
   (:class:`spectrace.hooks.vllm.joiner.BlockJoiner`) with the V1 path that is tested on real vLLM.

Why ``propose`` (``vllm_hooks.md`` §1.2, §2, §6): the V2 runner calls
``speculator.propose(input_batch, ..., num_sampled, num_rejected, last_sampled,
next_prefill_tokens, ...)`` once per step, after the rejection sampler and the bookkeeping
that writes ``last_sampled``. Its ``num_sampled``/``num_rejected`` are the verdict on the
drafts verified in this step, which are request r's previous proposal; its return value is
r's new proposal. One wrapper therefore sees the whole chain. ``propose`` is never captured in
a CUDA graph, and wrapping the instance survives subclass overrides.

Per call, for the ``n = input_batch.num_reqs`` rows (row i is ``input_batch.req_ids[i]``, slot
``idx_mapping[i]``), the hot path writes ``int32 [n, 4 + K]`` rows: ``num_sampled``,
``num_rejected``, the anchor (``last_sampled[slot]`` when ``num_sampled > 0``, else
``next_prefill_tokens[0, slot]``), the anchor position
(``positions[query_start_loc[i + 1] - 1 - num_rejected[i]] + 1``) and the K drafts. On CUDA
that is one Triton launch (:mod:`.stage`) into a segment of a device ring, or, once the
drafter has captured the tap's staging kernel in its CUDA graph (DSpark: :mod:`.dspark`), one
descriptor written to pinned memory before the call and no launch (:mod:`.graph_stage`);
every ``flush_steps`` steps the segment goes to pinned host memory with one non-blocking copy
and one event. Nothing synchronises: segments are joined once their event has completed
(``event.query()``), many steps at once (:mod:`.join`), on a background thread
(:mod:`.drainer`) kicked once per segment; finishes, preemptions and (while that thread runs)
new requests are queued in order with the steps. Waits happen only at close (and in
:meth:`.tap.ProposeTap.drain` with ``wait=True``). On a CPU device the rows are written in place
with torch ops and joined at once.

Join (per row, by request id): ``num_sampled == 0`` is a prefill chunk, so r's open proposal
(if any) was not verified; otherwise ``verified = num_sampled + num_rejected - 1`` drafts were
checked, ``accepted = num_sampled - 1``, ``emitted = proposal[:accepted] + [anchor]``. Then the
row's new drafts (the first ``num_speculative_tokens`` columns, trailing ``-1`` removed) open
r's next block.
"""
