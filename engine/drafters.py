"""Draft proposers: `draft_model` (greedy continuation of a small LM) and `ngram` (prompt lookup).

A drafter maps the full token sequences of the batch rows (prompt + committed output, the
anchor last) to one draft list per row. Both reproduce vLLM's proposals token for token:

* `draft_model`: vLLM's draft model sees the same sequence and greedily extends it by k tokens.
  We compute that the plain way (a full forward per draft token, argmax of the last row), which
  is numerically the straightforward computation in fp32.
* `ngram`: a line-by-line port of vLLM's numba `_find_longest_matched_ngram_and_propose_tokens`
  (vllm/v1/spec_decode/ngram_proposer.py), including which occurrence wins and the short/empty
  results.

Reduced draft vocabulary (``--draft-vocab N``, draft_model): the draft head's argmax runs over N
target ids only (the N rows of the draft lm_head with the largest L2 norm, ties to the lower
id, sorted ascending) and draft index i maps to ``target = i + d2t[i]``, the offset table vLLM
and speculators define. The faults of :mod:`.faults` hook in at ``faults.active(...)``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from . import faults
from .loader import LoadedModel


@dataclass
class ProposeTimings:
    """Wall time of one propose call, split like the `[spec-phase]` line. Units: seconds."""

    pre_s: float = 0.0  # building the draft model's input tensors
    backbone_s: float = 0.0  # draft model forwards
    sample_s: float = 0.0  # argmax / selection of the next draft token


@dataclass
class Proposal:
    """Drafts for each batch row (`drafts[i]` may be shorter than k, or empty, for ngram)."""

    drafts: list[list[int]]
    timings: ProposeTimings | None = None  # None for drafters that print no propose-side lines
    logits_numel: int = 0  # elements of the logits the selection looked at, for `logits=`
    #: Per row, the drafter's top-1 minus top-2 logit of each draft (fp32 logit units), or
    #: None for drafters without logits (ngram).
    margins: list[list[float]] | None = None


class Drafter(Protocol):
    """What the engine needs from a drafter: ``propose(sequences) -> Proposal`` with up to k int ids per sequence (tokens), plus the method name and the scheduler lookahead. Mirrors vLLM V1's proposer interface (`propose_draft_token_ids`)."""

    method: str
    k: int

    @property
    def lookahead(self) -> int:
        """The scheduler's num_lookahead_tokens for this method (vLLM: k / 0)."""
        ...

    def propose(self, sequences: Sequence[Sequence[int]]) -> Proposal: ...


# ---------------------------------------------------------------------------- draft model


def draft_logits_last(
    model: torch.nn.Module, ids: torch.Tensor, position_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """Logits of the last position. ids: int64 [1, T] (position_ids: int64 [1, T] or None for
    0..T-1). Returns fp32 [vocab]."""
    return model(input_ids=ids, position_ids=position_ids, use_cache=False).logits[0, -1]


def greedy_select(logits: torch.Tensor) -> int:
    """Greedy draft selection: argmax over the vocab (first index on ties, like torch/vLLM)."""
    return int(torch.argmax(logits).item())


def top2_margin(logits: torch.Tensor) -> float:
    """Top-1 minus top-2 of ``logits`` (fp32 [vocab]; logit units, >= 0): how close the greedy
    choice was to a tie. NaN for a vocabulary of one id."""
    if logits.shape[-1] < 2:
        return float("nan")
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def reduced_vocab(lm_head: torch.Tensor, n: int) -> tuple[torch.Tensor, list[int]]:
    """The reduced draft vocabulary: (target ids int64 [n] ascending, d2t offsets [n]).

    The n rows of ``lm_head`` (fp32 [vocab, hidden]) with the largest L2 norm, ties broken
    towards the lower id; ``d2t[i] = ids[i] - i`` so that ``target = i + d2t[i]``.
    """
    vocab = lm_head.shape[0]
    if not 1 <= n <= vocab:
        raise ValueError(f"--draft-vocab must be in 1..{vocab}, got {n}")
    norms = lm_head.detach().norm(dim=1).tolist()
    chosen = sorted(sorted(range(vocab), key=lambda t: (-norms[t], t))[:n])
    return torch.tensor(chosen, dtype=torch.int64), [t - i for i, t in enumerate(chosen)]


@dataclass
class DraftModelDrafter:
    """Greedy k-token continuation of a draft LM from each row's full sequence."""

    draft: LoadedModel
    k: int
    draft_vocab: int | None = None  # reduced draft vocabulary size (None: the full vocab)
    method: str = field(default="draft_model", init=False)
    # Reduced vocabulary: the draft ids' target ids and their offsets (None: the full vocab).
    vocab_ids: torch.Tensor | None = field(default=None, init=False)
    d2t: torch.Tensor | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.vocab_ids, self.d2t = (
            (None, None)
            if self.draft_vocab is None
            else reduced_vocab(self.draft.model.get_output_embeddings().weight, self.draft_vocab)
        )

    @property
    def lookahead(self) -> int:
        """The scheduler's num_lookahead_tokens for this method (tokens), as vLLM sets it."""
        return self.k

    def select(self, logits: torch.Tensor) -> tuple[int, int, float]:
        """(id fed back to the draft model, id handed to the scheduler, top-2 margin of the
        logits the argmax ran over) of one draft step.

        The draft loop feeds back the right target id; the ``d2t_*`` faults corrupt only the ids
        handed out (the mapping step at the proposer's output), ``mapped_feedback`` feeds the
        corrupted id back too.
        """
        if self.vocab_ids is None:
            tok = greedy_select(logits)
            return tok, tok, top2_margin(logits)
        assert self.d2t is not None  # set together with vocab_ids
        sub = logits[self.vocab_ids]
        idx = greedy_select(sub)  # argmax over the draft vocabulary
        out = faults.map_draft_index(idx, self.d2t, self.draft.vocab_size)
        fed = out if faults.active("mapped_feedback") else idx + self.d2t[idx]
        return fed, out, top2_margin(sub)

    def propose_row(
        self,
        sequence: Sequence[int],
        timings: ProposeTimings,
        margins: list[float] | None = None,
    ) -> list[int]:
        """k greedy tokens after `sequence` (ints, anchor last). Adds to `timings` in place;
        appends each returned draft's top-2 logit margin to `margins` when given."""
        seq = list(sequence)
        if faults.active("wrong_features"):
            seq = seq[-faults.FEATURE_WINDOW :]
        ctx = len(seq)
        n = self.k + faults.active("layout_shift") - faults.active("k_minus_one")
        out: list[int] = []
        gaps: list[float] = []
        for depth in range(n):
            t0 = time.perf_counter()
            ids = torch.tensor([seq], dtype=torch.int64)
            positions = None
            if faults.active("broken_depth") or (
                faults.active("broken_depth_late") and depth >= faults.BROKEN_FROM
            ):  # positions not advanced: drafts sit at the anchor's
                positions = torch.tensor([list(range(ctx)) + [ctx - 1] * depth], dtype=torch.int64)
            t1 = time.perf_counter()
            with torch.no_grad():
                logits = draft_logits_last(self.draft.model, ids, positions)
            t2 = time.perf_counter()
            fed, tok, gap = self.select(logits)
            t3 = time.perf_counter()
            timings.pre_s += t1 - t0
            timings.backbone_s += t2 - t1
            timings.sample_s += t3 - t2
            seq.append(fed)
            out.append(tok)
            gaps.append(gap)
        if faults.active("layout_shift"):
            out, gaps = out[1:], gaps[1:]  # slot 0 is the anchor's own (bonus) slot in 1+N
        if faults.active("constant_depth"):
            out, gaps = out[:1] * len(out), gaps[:1] * len(gaps)
        if margins is not None:
            margins.extend(gaps)
        return out

    def propose(self, sequences: Sequence[Sequence[int]]) -> Proposal:
        """Propose drafts for each sequence (prompt + output ids, int); returns a :class:`Proposal` with one list of at most k ids per sequence."""
        timings = ProposeTimings()
        margins: list[list[float]] = [[] for _ in sequences]
        drafts = [self.propose_row(seq, timings, m) for seq, m in zip(sequences, margins)]
        vocab = self.draft_vocab or self.draft.vocab_size
        return Proposal(drafts, timings, len(sequences) * self.k * vocab, margins)


# ---------------------------------------------------------------------------- ngram


def ngram_lookup(
    tokens: Sequence[int], min_n: int, max_n: int, k: int, max_model_len: int
) -> list[int]:
    """vLLM's prompt lookup for one sequence (port of the numba KMP, same branch structure).

    Finds the longest n in [min_n, max_n] such that the last n tokens occur earlier in `tokens`;
    among occurrences of that n-gram it takes the EARLIEST one, and returns the up-to-k tokens
    that follow it (fewer when the match runs into the end; [] when none or no room left
    before max_model_len).
    """
    total = len(tokens)
    if total < min_n:
        return []
    k = min(k, max_model_len - total)
    if k <= 0:
        return []
    rev = tokens[::-1]  # the suffix of `tokens` becomes a prefix of `rev`
    lps = [0] * max_n  # KMP failure function, kept for the first max_n prefix positions only
    longest, position = 0, 0
    prev = 0
    i = 1
    while i < total:
        if rev[prev] == rev[i]:
            prev += 1
            # `>=`: a later i in `rev` is an earlier occurrence in `tokens`, which vLLM prefers.
            if prev >= longest:
                longest, position = prev, i
            if i < max_n:
                lps[i] = prev
            if prev == max_n:
                prev = lps[max_n - 1]
            i += 1
        elif prev != 0:
            prev = lps[prev - 1]
        else:
            i += 1
    if longest < min_n:
        return []
    start = total - 1 - position + longest
    k = min(k, total - start)
    return list(tokens[start : start + k])


@dataclass
class NgramDrafter:
    """Prompt-lookup drafter; vLLM's `ngram` with prompt_lookup_min/max."""

    k: int
    min_n: int = 1
    max_n: int = 3
    max_model_len: int = 512
    method: str = field(default="ngram", init=False)

    @property
    def lookahead(self) -> int:
        """The scheduler's num_lookahead_tokens for this method (tokens), as vLLM sets it."""
        return 0  # vLLM reserves no lookahead KV slots for ngram

    def propose(self, sequences: Sequence[Sequence[int]]) -> Proposal:
        """Propose drafts for each sequence (prompt + output ids, int); returns a :class:`Proposal` with one list of at most k ids per sequence."""
        drafts = [
            ngram_lookup(seq, self.min_n, self.max_n, self.k, self.max_model_len)
            if len(seq) < self.max_model_len
            else []
            for seq in sequences
        ]
        return Proposal(drafts)
