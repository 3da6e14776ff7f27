"""The engine loop: greedy speculative decoding over a batch of concurrent requests.

One `Engine.step()` mirrors one synchronous step of our engine (and of vLLM's V1 engine):

1. schedule: admit waiting requests (up to `batch_size` running); every running request that
   carries pending drafts schedules 1 + len(drafts) tokens (`[spec-sched]`);
2. execute: per batch row, a new request is prefilled and samples one token; a request with
   pending drafts is verified in one target forward (`[SPECTRACE]`); a request without drafts
   (ngram found nothing) decodes one token;
3. propose: the drafter drafts from every row's new sequence, including rows that are about to
   finish, as the runner does not know about stops (`[spec-phase]`, `[spec-propose]`);
4. update: the scheduler commits the emitted tokens, trimming at max_tokens (and EOS when not
   ignored), then installs the new drafts on requests still running (`[spec-post_step]`,
   `[spec-update]`, `[spec-install]`).

Verification is exact greedy: accept the longest draft prefix equal to the target's argmax,
then emit the target's token at the first mismatch (or the bonus token when all match).

Deliberate bugs (``--fault NAME``, see :mod:`.faults`) hook in at ``faults.active(...)`` only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from . import faults
from .drafters import Drafter, Proposal
from .loader import LoadedModel
from .vt_trace import VtTrace


@dataclass
class Request:
    """One generation request. Token ids are ints; lengths are in tokens."""

    req_id: str
    prompt_ids: list[int]
    max_tokens: int
    tokens: list[int] = field(
        default_factory=list
    )  # runner view: prompt + every sampled token (untrimmed)
    output_ids: list[int] = field(
        default_factory=list
    )  # scheduler view: committed output (trimmed)
    pending_drafts: list[int] = field(default_factory=list)  # drafts to verify next step
    prefilled: bool = False
    finish_reason: str | None = None

    def __post_init__(self) -> None:
        if not self.tokens:
            self.tokens = list(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt + committed output (the engine's `num_tokens_no_spec`)."""
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        """True once the request has emitted max_tokens tokens (or stopped)."""
        return self.finish_reason is not None


@dataclass
class SpecStats:
    """Acceptance counters, defined like vLLM's `spec_decode_*` metrics."""

    num_drafts: int = 0  # verified blocks (request-steps with >= 1 draft)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_steps: int = 0


# ---------------------------------------------------------------------------- verify


def target_argmax(
    model: torch.nn.Module, sequence: Sequence[int], num_rows: int, prompt_len: int | None = None
) -> list[int]:
    """Greedy target tokens for the last `num_rows` positions of `sequence`.

    One forward over int64 [1, T]; row j of the result predicts position T - num_rows + j + 1.
    `prompt_len` (tokens) locates output indices for the `content`/`repetition` faults.
    """
    ids = torch.tensor([list(sequence)], dtype=torch.int64)
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0]  # fp32 [T, vocab]
    tokens = [int(t) for t in torch.argmax(logits[-num_rows:], dim=-1).tolist()]
    if prompt_len is not None and (faults.active("content") or faults.active("repetition")):
        tokens = faults.target_tokens(tokens, logits[-num_rows:], sequence, prompt_len)
    return tokens


def accepted_prefix_len(drafts: Sequence[int], target_tokens: Sequence[int]) -> int:
    """Number of leading drafts equal to the target's greedy tokens at the same positions."""
    n = 0
    while n < len(drafts) and drafts[n] == target_tokens[n]:
        n += 1
    return n


def verify_greedy(
    model: torch.nn.Module,
    sequence: Sequence[int],
    drafts: Sequence[int],
    prompt_len: int | None = None,
) -> list[int]:
    """Greedy rejection sampling of `drafts` placed after `sequence` (anchor last).

    Returns the emitted tokens: the accepted drafts plus one target token (correction or
    bonus), so 1 <= len(result) <= len(drafts) + 1. With no drafts this is one decode step.
    """
    target_tokens = target_argmax(model, list(sequence) + list(drafts), len(drafts) + 1, prompt_len)
    acc = accepted_prefix_len(drafts, target_tokens)
    return target_tokens[: acc + 1]


# ---------------------------------------------------------------------------- engine


class Engine:
    """Runs requests to completion with a target model and a drafter, printing VT_SPEC_TRACE."""

    def __init__(
        self,
        target: LoadedModel,
        drafter: Drafter,
        *,
        batch_size: int | None = None,
        ignore_eos: bool = True,
        trace: VtTrace | None = None,
    ):
        self.target = target
        self.drafter = drafter
        self.batch_size = batch_size
        self.ignore_eos = ignore_eos
        self.trace = trace or VtTrace()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.done: list[Request] = []
        self.stats = SpecStats()
        self._rejected: dict[str, list[int]] = {}  # fault stale_state: drafts rejected last step
        self._dropped: set[str] = set()  # fault drop_drafts: requests that stopped proposing
        self._all_accepted: set[str] = set()  # fault stale_after_accept: last block fully accepted
        # fault row_keyed: each row's last owner and context; moved requests' (old context, at)
        self._row_owner: dict[int, str] = {}
        self._row_ctx: dict[int, list[int]] = {}
        self._moved: dict[str, tuple[list[int], int]] = {}

    def add_request(self, req_id: str, prompt_ids: Sequence[int], max_tokens: int) -> None:
        """Queue a request. Refuses sequences that could outgrow the target's positions."""
        if not prompt_ids:
            raise ValueError(f"request {req_id}: empty prompt")
        need = len(prompt_ids) + max_tokens + self.drafter.k
        if need > self.target.max_model_len:
            raise ValueError(
                f"request {req_id}: prompt + max_tokens + k = {need} > max_model_len {self.target.max_model_len}"
            )
        self.waiting.append(Request(req_id, list(prompt_ids), max_tokens))

    def run(self) -> list[Request]:
        """Step until every request finished. Returns them in the order they were added."""
        order = [r.req_id for r in self.waiting]
        while self.waiting or self.running:
            self.step()
        by_id = {r.req_id: r for r in self.done}
        return [by_id[i] for i in order]

    def step(self) -> None:
        """One synchronous engine step (schedule, execute, propose, update)."""
        self._admit()
        batch = list(self.running)
        self._schedule(batch)
        emitted = [self._execute_row(req) for req in batch]
        proposal = self.drafter.propose(self._draft_inputs(batch))
        self._trace_propose(batch, proposal)
        for req, tokens in zip(batch, emitted):
            self._commit(req, tokens)
        self._install_drafts(batch, proposal)
        self.running = [r for r in self.running if not r.finished]
        self.done.extend(r for r in batch if r.finished)
        self.stats.num_steps += 1

    # -- phases -----------------------------------------------------------------

    def _admit(self) -> None:
        while self.waiting and (self.batch_size is None or len(self.running) < self.batch_size):
            self.running.append(self.waiting.popleft())

    def _schedule(self, batch: list[Request]) -> None:
        for req in batch:
            have = len(req.pending_drafts)
            if have:
                # A decode row with drafts schedules anchor + drafts; computed excludes the anchor.
                computed = req.num_tokens - 1
                num_new = 1 + have
                sched = num_new + computed - req.num_tokens
                self.trace.sched(req.req_id, have, num_new, computed, req.num_tokens, 0, sched)

    def _draft_inputs(self, batch: list[Request]) -> list[list[int]]:
        """The sequence each batch row drafts from: its own tokens (anchor last)."""
        seqs = [req.tokens for req in batch]
        if faults.active("batch_order"):  # off-by-one row index: row i reads row i-1
            seqs = seqs[:1] + seqs[:-1]
        if faults.active("stale_state"):  # drafter KV not rolled back after a rejection
            seqs = [s[:-1] + self._rejected.get(r.req_id, []) + s[-1:] for s, r in zip(seqs, batch)]
        if faults.active("stale_after_accept"):  # own stale state for the accepted drafts
            seqs = [
                s[:-2] + s[-1:] if r.req_id in self._all_accepted else s
                for s, r in zip(seqs, batch)
            ]
        if faults.active("row_keyed"):
            seqs = [self._row_keyed(i, r, s) for i, (r, s) in enumerate(zip(batch, seqs))]
        return seqs

    def _row_keyed(self, row: int, req: Request, seq: list[int]) -> list[int]:
        """Fault row_keyed: a request seen before at another row that now sits in a row last
        owned by another request drafts, from then on, from that row's old context followed by
        its own tokens since the move (cut to its own length: positions stay in range)."""
        owner = self._row_owner.get(row)
        seen = req.req_id in self._row_owner.values()
        if owner not in (None, req.req_id) and seen and req.req_id not in self._moved:
            self._moved[req.req_id] = (self._row_ctx[row], len(seq))
        self._row_owner[row], self._row_ctx[row] = req.req_id, list(seq)
        if req.req_id not in self._moved:
            return seq
        old, at = self._moved[req.req_id]
        return (old + seq[at - 1 :])[-len(seq) :]

    def _execute_row(self, req: Request) -> list[int]:
        """Tokens the sampler emits for this row this step (before any trimming)."""
        plen = len(req.prompt_ids)
        self._rejected.pop(req.req_id, None)
        self._all_accepted.discard(req.req_id)
        if not req.prefilled:
            req.prefilled = True
            emitted = verify_greedy(self.target.model, req.tokens, [], plen)
        elif req.pending_drafts:
            drafts = req.pending_drafts
            if faults.active(
                "verify_overwrite"
            ):  # the input combine writes the anchor into the last slot
                drafts = drafts[:-1] + req.tokens[-1:]
            pos = req.num_tokens  # before write-back; the anchor sits at pos - 1
            emitted = verify_greedy(self.target.model, req.tokens, drafts, plen)
            acc = len(emitted) - 1
            shown_pos = pos + 1 if faults.active("anchor_shift") else pos
            shown_acc = acc + 1 if faults.active("miscount") and acc < len(drafts) else acc
            self.trace.spectrace(
                req.req_id, shown_pos, len(drafts), len(emitted), shown_acc, drafts, emitted
            )
            if faults.active("stale_state") and acc < len(drafts):
                self._rejected[req.req_id] = list(drafts[acc:])
            if acc == len(drafts):
                self._all_accepted.add(req.req_id)
            self.stats.num_drafts += 1
            self.stats.num_draft_tokens += len(drafts)
            self.stats.num_accepted_tokens += acc
        else:
            emitted = verify_greedy(self.target.model, req.tokens, [], plen)
        req.pending_drafts = []
        req.tokens.extend(emitted)
        return emitted

    def _trace_propose(self, batch: list[Request], proposal: Proposal) -> None:
        # Deliberate: the reference engine prints propose-side lines for draft_model (our engine
        # prints them only on its block path) so the pipeline exercises the propose/verify join.
        if proposal.timings is None:
            return
        rows = [i for i, d in enumerate(proposal.drafts) if d]
        t = proposal.timings
        self.trace.phase(t.pre_s * 1e3, t.backbone_s * 1e3, t.sample_s * 1e3, proposal.logits_numel)
        if rows:
            nqpr = getattr(self.drafter, "num_query_per_req", self.drafter.k)  # dspark: k or 1 + k
            margins = proposal.margins[rows[0]] if proposal.margins is not None else None
            self.trace.propose(len(rows), nqpr, proposal.drafts[rows[0]], margins)
        else:
            self.trace.propose_none(len(batch))

    def _commit(self, req: Request, emitted: Sequence[int]) -> None:
        """Scheduler-side append with stop checks after each token; the rest is dropped."""
        for tok in emitted:
            req.output_ids.append(tok)
            if len(req.output_ids) >= req.max_tokens:
                req.finish_reason = "length"
            elif not self.ignore_eos and tok == self.target.eos_token_id:
                req.finish_reason = "stop"
            if req.finished:
                break

    def _install_drafts(self, batch: list[Request], proposal: Proposal) -> None:
        self.trace.post_step(True, len(batch))
        self.trace.update_called(len(batch))
        for row, (req, drafts) in enumerate(zip(batch, proposal.drafts)):
            self.trace.update_req(req.req_id, True, req.finished, False, len(drafts))
            if req.finished:
                continue  # drafts of a finished request are dropped, not installed
            if faults.active("drop_drafts") and (
                req.req_id in self._dropped
                or (row >= 1 and self.stats.num_steps >= faults.DROP_FROM_STEP)
            ):
                self._dropped.add(req.req_id)  # proposed, never installed again: plain decode steps
                drafts = []
            req.pending_drafts = list(drafts)
            self.trace.install(req.req_id, len(drafts), self.drafter.lookahead)
