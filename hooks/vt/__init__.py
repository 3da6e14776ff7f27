"""Our engine's ``VT_SPEC_TRACE`` stderr lines into a trace, in the order data flows:
:mod:`.level` (the variable's level rule) -> :mod:`.lines` (one line -> a record) ->
:mod:`.parser` (records -> blocks and phases, with :mod:`.blocks`, :mod:`.requests` and
:mod:`.stats`) -> :mod:`.importer` (a saved log; ``spectrace capture`` parses live through
:mod:`spectrace.hooks.capture`). A saved log file is read whole by the bulk path
(:mod:`.bulk_lex` lexes every line family at once, with numpy over the bytes
(:mod:`.bulk_vec`) or else one regex pass, :mod:`.bulk` decides with numpy and
:mod:`.bulk_steps`, :mod:`.bulk_commit` records), which records exactly what line-by-line
feeding records
and hands every log it cannot reproduce (edited lines, never-installed proposals, joins
without a hint, strict mode with a problem, ``\r`` line ends) to the line-by-line parser.

Rules the parser (:mod:`.parser`) decides where the format leaves them open:

* **Engine steps.** Only runner and engine-core lines delimit steps, because under async
  scheduling the scheduler's ``[spec-sched]`` lines of step t+1 can print before the runner
  lines of step t. Within a step the order is verify (``[SPECTRACE]``) → phases (``[fwd-ops]``,
  ``[spec-phase-dev]``, ``[spec-phase]``) → ``[spec-propose]`` → post (``[spec-post_step]``,
  ``[spec-update]``, ``[spec-install]``, sync only). A line starts a new step when it cannot
  belong to the current one: a ``[SPECTRACE]`` after any phase/propose/post line or for a
  request already verified in this step; a phase line after the propose or a post line (or
  out of order); a second ``[spec-propose]``; a second ``[spec-post_step]`` or
  ``[spec-update] called``; a ``[spec-sched]`` after a post line (sync scheduling only).
  A log whose first runner line is a ``[SPECTRACE]`` gets an implicit untraced step 0 (the
  prefill step that proposed those drafts). Steps are numbered from 0 per log.
* **Block step.** A block verified in step s was proposed at the end of step s-1, so its
  ``step`` column is s-1: the step whose ``[spec-phase]`` timings describe its proposal.
* **Propose join.** ``[spec-propose] first=[…]`` (step s, no request id) belongs to the first
  proposing row. It is joined to one ``[SPECTRACE]`` block of step s+1, tried in this order:
  (1) *exact*: the first block whose ``draft`` equals ``first`` (with ``...`` lists: every
  known id equal); (2) *hint*: under sync scheduling the ``[spec-update] req=…`` rows after the
  propose line list the draft payload in batch order, so the first row with ``drafts > 0`` and
  ``prefill_chunk=0`` *is* the first proposing row: its block, if it has one; when that request
  finished (``finished=1``) or has no block, the proposal was never verified and nothing is
  guessed. Without update rows (async): (3) *truncated*: the first block whose ``draft`` is a
  proper non-empty prefix of ``first`` (the scheduler cut it: ``[spec-sched] sched < have``);
  (4) *partial*: the block of the same length that agrees with ``first`` in the most slots, at
  least half of them (the #2116 corruption overwrites one slot); otherwise *unjoined*, counted.
  The joined block stores ``proposed = first`` and ``verified = draft``; every other block
  (ngram, MTP, draft_model, non-first rows) stores ``proposed = verified``, which is all the
  engine reveals. ``meta["import"]["proposed_source"]`` counts both kinds. The ``k`` column
  counts proposed ids (schema), so after a truncated join it is ``len(first)`` while
  ``num_verified`` is the line's ``k=``.
* **Anchors.** The anchor of a block is the previous block's ``emit[-1]`` for the same request
  when the chain holds (``pos = pos_prev + ns_prev``). ``pos`` past that is a *gap*, not an
  error: rows without drafts print no ``[SPECTRACE]`` (ngram found nothing, k clamped to 0);
  ``pos`` before it is a *chain break* (violation). After either, and for a request's first
  block, it is ``(prompt_ids + output_ids)[pos-1]`` from the requests file (which also wins,
  counted as an ``anchor mismatch`` violation, where the two disagree). Without that file
  it is ``-1`` and the row is remembered so :meth:`VtTraceParser.set_requests` (called later,
  e.g. when a captured command has written its requests file) can fix it; rows already written
  are patched through the writer before it closes.
* **Margins.** ``[spec-propose] … first=[…] margin=[ 0.523 0.010 ]`` (optional, one float or
  ``nan`` per id of ``first``) is stored in ``draft_margin`` of the block the proposal joins
  (NaN-padded to its ``proposed`` width), any float text (``%.3f`` or not); a count that
  differs from ``first``'s, a non-number or a value beyond float32 makes the line malformed.
* **Request ids** are text: one holding bytes that are not UTF-8 makes its line malformed
  (decoding them to U+FFFD would merge distinct ids into one request).
* **Finish.** A request whose ``[spec-update] req=`` lines never say ``finished=1`` (the log
  ends first: a killed or cut-short run) gets finish reason ``unfinished`` unless the
  requests file gives one; a log without update lines (its trace level prints none) says
  nothing about finishing.
* **Batch rows.** ``batch_row``/``batch_size`` of a block come from the ``[spec-update]
  req=…`` payload of its proposing step (one row per batch row, sync only); else ``-1``.
* **Invariants.** Chain breaks (``pos < pos_prev + ns_prev``), ``acc !=
  max(ns-1, 0)``, ``len(emit) != ns``, ``len(draft) != k``, ``acc > k`` and
  ``emit[:acc] != draft[:acc]`` are counted with line numbers (lenient) or raise (strict)
  after the block is recorded: no block is ever dropped for them. Strict mode also refuses a
  block that cannot be its request's, on a log that prints the ``[spec-update]`` payload (a
  wrong request id passes the chain otherwise): :class:`~.blocks.PlainSteps`.
* **Ranges.** A value that its trace column cannot hold is a malformed line (counted with
  its line number and dropped; strict: ``FILE:LINE: ... (field=, value=)``), never clamped:
  ``pos`` in [1, 2^31-1], ``k``/``ns``/``acc``/``drafts/row`` in int16, ids in int32, other
  integers in int64, and ``acc`` at most the verified drafts (accepted <= num_verified).
* **Phase level.** ``[fwd-ops]`` rows get level 3, ``[spec-phase-dev]`` level 2. A
  ``[spec-phase]`` row gets the configured trace level when known (capture), else the highest
  level evidenced in the same step (3/2 when ``[fwd-ops]``/``[spec-phase-dev]`` lines printed),
  else 1: at level ≥ 2 its timestamps include the syncs of the device split.
"""
