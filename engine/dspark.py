"""Reference DSpark drafter: a small backbone over the target's hidden states + a Markov head.

DSpark (vLLM ``method="dspark"``, speculators ``speculators_model_type="dspark"``) drafts a whole
block of k tokens in one parallel pass of a small decoder, then adds intra-block dependency with
a sequential low-rank Markov bias. This module is the reference implementation the rest of
spectrace compares vLLM against:

* **Backbone** (DFlash-style, ``vllm/model_executor/models/qwen3_dflash.py``): the target's
  hidden states at the auxiliary layers (``aux_hidden_state_layer_ids``; id ``a`` is the output
  of target decoder layer ``a - 1``, before the final norm, as vLLM's
  ``_maybe_add_hidden_state(aux, idx + 1, ...)`` collects them) for the context tokens
  ``0 .. p-1`` are concatenated, projected by ``fc`` and normed by ``hidden_norm``; every draft
  layer projects that context to its own keys/values (``k_proj``, ``k_norm``, RoPE at the
  context positions, ``v_proj``). The query block (anchor + mask tokens at positions ``p ..``)
  runs through Qwen3 decoder layers whose attention sees the whole context and the whole block
  (non-causal inside the block), then ``norm``; ``lm_head`` gives draft-vocabulary logits.
* **Layouts** (``sample_from_anchor``, ``vllm/v1/worker/gpu/spec_decode/dspark/speculator.py``):
  true: N = k query slots ``[anchor, mask * (k-1)]``, slot j predicts draft j (position
  ``p + 1 + j``); false: the 1+N fill-in block ``[anchor, mask * k]``, slot 0 is the bonus
  anchor and slot ``j + 1`` predicts draft j at its own position.
* **Markov head** (vanilla): ``markov_w1`` is an embedding over the *target* (input) vocabulary,
  ``markov_w2`` projects rank r to the *draft* vocabulary.
* **Greedy sampling** (:func:`sample_sequential`), exactly vLLM's ``_sample_sequential`` +
  ``_sample_logits`` greedy branch: ``prev`` starts as the anchor; per step i the bias
  ``markov_w2 @ markov_w1[prev]`` is added to the base logits of slot i, the argmax is taken in
  the draft vocabulary and mapped to a target id with ``id + d2t[id]`` (reduced vocabulary),
  and that target id becomes ``prev``.
* **Confidence head** (optional): ``sigmoid(proj([hidden, markov_embed]))`` per draft.

Checkpoints use the speculators layout (:mod:`.dspark_ckpt`). Everything is fp32; shapes are
noted as ``[dims]`` with B batch, C context tokens, M query slots, H hidden, V vocab, r rank.
The same module runs on CUDA under a captured graph (``benchmarks/bench_dspark_gpu.py``): the
forward has static shapes and no host synchronisation.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from .drafters import Proposal, ProposeTimings, reduced_vocab
from .dspark_layers import (
    ConfidenceHead,
    DecoderLayer,
    DSparkConfig,
    MarkovHead,
    RMSNorm,
    apply_rope,
    rope_cos_sin,
)
from .loader import LoadedModel

# ---------------------------------------------------------------------------- layouts


def num_query_slots(k: int, sample_from_anchor: bool) -> int:
    """Query slots per request: k (anchor layout) or 1 + k (fill-in layout)."""
    return k if sample_from_anchor else k + 1


def sample_slot_offset(sample_from_anchor: bool) -> int:
    """Query offset of draft 0: 0 (the anchor predicts it) or 1 (the first mask)."""
    return 0 if sample_from_anchor else 1


def block_inputs(
    anchor: int, anchor_pos: int, k: int, sample_from_anchor: bool, mask_token_id: int
) -> tuple[list[int], list[int]]:
    """Query ids and positions of one request's block (what vLLM's prepare kernel writes).

    Returns:
        (ids, positions), each of ``num_query_slots(k, sample_from_anchor)`` ints: the anchor
        at ``anchor_pos``, then mask tokens at the following positions.
    """
    m = num_query_slots(k, sample_from_anchor)
    return [anchor] + [mask_token_id] * (m - 1), [anchor_pos + j for j in range(m)]


# ---------------------------------------------------------------------------- modules


class DSparkDraftModel(nn.Module):
    """The DSpark drafter's weights and forward. ``state_dict()`` keys are the speculators keys
    (``layers.{i}...``, ``fc.weight``, ``markov_head.markov_w1.weight``, ``d2t`` ...)."""

    def __init__(self, cfg: DSparkConfig) -> None:
        super().__init__()
        self.cfg = cfg
        n_aux = len(cfg.aux_hidden_state_layer_ids)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.fc = nn.Linear(n_aux * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.markov_head = MarkovHead(cfg.vocab_size, cfg.draft_vocab_size, cfg.markov_rank)
        self.confidence_head = None
        if cfg.enable_confidence_head:
            dim = cfg.hidden_size + (cfg.markov_rank if cfg.confidence_head_with_markov else 0)
            self.confidence_head = ConfidenceHead(dim)
        if cfg.draft_vocab_size < cfg.vocab_size:
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
            self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))
        else:
            self.d2t = None
            self.t2d = None

    # -- backbone --------------------------------------------------------------------------

    def context_kv(
        self, ctx_states: torch.Tensor, ctx_pos: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer context keys/values (what vLLM precomputes into the draft KV cache).

        Args:
            ctx_states: fp32 [B, C, n_aux * target_hidden] target aux hidden states.
            ctx_pos: int64 [B, C] their positions.
        Returns:
            one (k, v) pair per layer, each fp32 [B, C, kv_heads, head_dim] (k normed + roped).
        """
        c = self.hidden_norm(self.fc(ctx_states))
        cos, sin = rope_cos_sin(ctx_pos, self.cfg.head_dim, self.cfg.rope_theta)
        out = []
        for layer in self.layers:
            a = layer.self_attn
            b, t = c.shape[:2]
            k = a.k_norm(a.k_proj(c).view(b, t, a.nkv, a.d))
            out.append((apply_rope(k, cos, sin), a.v_proj(c).view(b, t, a.nkv, a.d)))
        return out

    def query_forward(
        self,
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        q_ids: torch.Tensor,
        q_pos: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """Run the query block(s) through the decoder layers.

        Args:
            kv: :meth:`context_kv` output (C context rows).
            q_ids: int64 [B, M] query ids (anchor, masks; several blocks may share a row).
            q_pos: int64 [B, M] their positions.
            mask: bool [B, M, C + M], True where query m may attend key (context first).
        Returns:
            fp32 [B, M, H], the normed head hidden states.
        """
        x = self.embed_tokens(q_ids)
        b, m = q_ids.shape
        cos, sin = rope_cos_sin(q_pos, self.cfg.head_dim, self.cfg.rope_theta)
        attn_mask = mask[:, None, :, :]
        for layer, (kc, vc) in zip(self.layers, kv):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            q = apply_rope(a.q_norm(a.q_proj(h).view(b, m, a.nh, a.d)), cos, sin)
            k = apply_rope(a.k_norm(a.k_proj(h).view(b, m, a.nkv, a.d)), cos, sin)
            v = a.v_proj(h).view(b, m, a.nkv, a.d)
            keys = torch.cat([kc, k], dim=1)
            vals = torch.cat([vc, v], dim=1)
            if a.nkv != a.nh:  # GQA: query head h reads kv head h // (nh / nkv)
                rep, t = a.nh // a.nkv, keys.shape[1]
                keys = keys[:, :, :, None, :].expand(b, t, a.nkv, rep, a.d).reshape(b, t, a.nh, a.d)
                vals = vals[:, :, :, None, :].expand(b, t, a.nkv, rep, a.d).reshape(b, t, a.nh, a.d)
            o = F.scaled_dot_product_attention(
                q.transpose(1, 2), keys.transpose(1, 2), vals.transpose(1, 2), attn_mask=attn_mask
            )
            x = x + a.o_proj(o.transpose(1, 2).reshape(b, m, a.nh * a.d))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.norm(x)

    # -- heads -----------------------------------------------------------------------------

    def compute_draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits (no d2t), like vLLM's ``compute_draft_logits``. [..., V_draft]."""
        return self.lm_head(hidden)

    def markov_embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """``markov_w1[token_ids]`` (target ids) -> [..., r]."""
        return self.markov_head.markov_w1(token_ids)

    def markov_bias(self, embed: torch.Tensor) -> torch.Tensor:
        """``markov_w2 @ embed`` -> [..., V_draft]."""
        return self.markov_head.markov_w2(embed)

    def map_draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """``id + d2t[id]`` for a reduced vocabulary, else identity."""
        return draft_ids if self.d2t is None else draft_ids + self.d2t[draft_ids]

    def compute_confidence(self, hidden: torch.Tensor, markov_embed: torch.Tensor) -> torch.Tensor:
        """Acceptance probability per draft: ``sigmoid(proj([hidden, embed]))`` -> [...]."""
        assert self.confidence_head is not None
        x = (
            torch.cat([hidden, markov_embed], dim=-1)
            if self.cfg.confidence_head_with_markov
            else hidden
        )
        return torch.sigmoid(self.confidence_head.proj(x.float()).squeeze(-1))

    def set_vocab_mapping(self, draft_ids: torch.Tensor) -> None:
        """Fill ``d2t``/``t2d`` for a reduced vocabulary of target ids ``draft_ids`` (ascending)."""
        assert self.d2t is not None and self.t2d is not None, "full vocabulary: no mapping"
        ids = draft_ids.to(torch.int64)
        self.d2t.copy_(ids - torch.arange(len(ids)))
        self.t2d.zero_()
        self.t2d[ids] = True


# ---------------------------------------------------------------------------- sampling


def sample_sequential(
    base_logits: torch.Tensor,
    anchors: torch.Tensor,
    model: DSparkDraftModel,
    return_embeds: bool = False,
):
    """Greedy Markov sampling, exactly as vLLM's ``DSparkSpeculator._sample_sequential``.

    Args:
        base_logits: fp32 [n, k, V_draft], the backbone's draft-vocabulary logits per draft.
        anchors: int [n], the anchor (target id) per request.
        model: provides ``markov_embed``, ``markov_bias``, ``map_draft_to_target``.
        return_embeds: also return the Markov embeddings [n, k, r] (confidence head input).
    Returns:
        int64 [n, k] target ids (and the embeddings when asked).
    """
    n, k, _ = base_logits.shape
    out = torch.empty((n, k), dtype=torch.int64, device=base_logits.device)
    prev = anchors.to(torch.int64)
    embeds = []
    for i in range(k):
        emb = model.markov_embed(prev)
        embeds.append(emb)
        logits_i = base_logits[:, i] + model.markov_bias(emb)
        tok = model.map_draft_to_target(logits_i.argmax(dim=-1))
        out[:, i] = tok
        prev = tok
    if return_embeds:
        return out, torch.stack(embeds, dim=1)
    return out


# ---------------------------------------------------------------------------- target features


def target_aux_hidden(
    target: nn.Module, ids: Sequence[int] | torch.Tensor, aux_ids: Sequence[int]
) -> torch.Tensor:
    """The target's aux hidden states, concatenated per token: fp32 [B, T, n_aux * H_target].

    ``ids`` is one sequence (list) or an int64 [B, T] tensor. Aux id 0 is the embedding
    output, id a >= 1 the output of decoder layer a - 1 (before the final norm), as vLLM
    collects them for EAGLE-3/DFlash/DSpark drafters.
    """
    ids_t = ids if isinstance(ids, torch.Tensor) else torch.tensor([list(ids)], dtype=torch.int64)
    inner = target.model
    got: dict[int, torch.Tensor] = {}
    handles = []

    def grab(a):
        def hook(_mod, _inp, out):
            got[a] = out[0] if isinstance(out, tuple) else out

        return hook

    for a in aux_ids:
        mod = inner.embed_tokens if a == 0 else inner.layers[a - 1]
        handles.append(mod.register_forward_hook(grab(a)))
    try:
        with torch.no_grad():
            inner(input_ids=ids_t, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return torch.cat([got[a] for a in aux_ids], dim=-1)


def block_mask(num_ctx: int, num_query: int, device=None) -> torch.Tensor:
    """bool [1, M, C + M]: every query slot sees every context row and the whole block."""
    return torch.ones((1, num_query, num_ctx + num_query), dtype=torch.bool, device=device)


# ---------------------------------------------------------------------------- drafter


@dataclass
class DSparkStep:
    """What one request's draft step computed (kept for tests and the vLLM proof)."""

    anchor: int
    anchor_pos: int
    head_hidden: torch.Tensor  # fp32 [M, H] all query slots
    base_logits: torch.Tensor  # fp32 [k, V_draft] the sampled slots
    drafts: list[int]
    confidence: list[float] | None = None


@dataclass
class DSparkDrafter:
    """The reference engine's ``dspark`` drafter (greedy), over a loaded target.

    Args:
        model: the drafter (:func:`spectrace.engine.dspark_ckpt.load_dspark`).
        target: the target model (its hidden states are recomputed for the context).
        k: drafts per step.
        sample_from_anchor: the layout; None takes the checkpoint's.
    Attributes:
        last_steps: the :class:`DSparkStep` of each row of the last ``propose`` call.
    """

    model: DSparkDraftModel
    target: LoadedModel
    k: int
    sample_from_anchor: bool | None = None
    method: str = field(default="dspark", init=False)
    last_steps: list[DSparkStep] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if self.sample_from_anchor is None:
            self.sample_from_anchor = bool(self.model.cfg.sample_from_anchor)
        self.model.eval()

    @property
    def lookahead(self) -> int:
        """The scheduler's lookahead (tokens): k with `sample_from_anchor`, k+1 in the 1+N layout (vLLM `config/vllm.py`)."""
        return self.k

    @property
    def num_query_per_req(self) -> int:
        """Query slots per request: k (`sample_from_anchor`) or 1+k."""
        return num_query_slots(self.k, self.from_anchor)

    @property
    def from_anchor(self) -> bool:
        """The resolved `sample_from_anchor` layout (the checkpoint's when not given)."""
        assert self.sample_from_anchor is not None  # resolved in __post_init__
        return self.sample_from_anchor

    def step(self, sequence: Sequence[int], timings: ProposeTimings | None = None) -> DSparkStep:
        """One request's draft step: anchor = ``sequence[-1]`` at position ``len - 1``."""
        t0 = time.perf_counter()
        seq = list(sequence)
        cfg = self.model.cfg
        anchor, p = seq[-1], len(seq) - 1
        ctx = target_aux_hidden(self.target.model, seq[:-1], cfg.aux_hidden_state_layer_ids)
        q_ids, q_pos = block_inputs(anchor, p, self.k, self.from_anchor, cfg.mask_token_id)
        t1 = time.perf_counter()
        with torch.no_grad():
            kv = self.model.context_kv(ctx, torch.arange(p).unsqueeze(0))
            hidden = self.model.query_forward(
                kv, torch.tensor([q_ids]), torch.tensor([q_pos]), block_mask(p, len(q_ids))
            )[0]
            off = sample_slot_offset(self.from_anchor)
            sample_hidden = hidden[off : off + self.k]
            base = self.model.compute_draft_logits(sample_hidden)
            t2 = time.perf_counter()
            drafts, embeds = sample_sequential(
                base[None], torch.tensor([anchor]), self.model, return_embeds=True
            )
            conf = None
            if self.model.confidence_head is not None:
                conf = self.model.compute_confidence(sample_hidden, embeds[0]).tolist()
        t3 = time.perf_counter()
        if timings is not None:
            timings.pre_s += t1 - t0
            timings.backbone_s += t2 - t1
            timings.sample_s += t3 - t2
        return DSparkStep(anchor, p, hidden, base, [int(t) for t in drafts[0].tolist()], conf)

    def propose(self, sequences: Sequence[Sequence[int]]) -> Proposal:
        """Propose k drafts per sequence with the DSpark drafter (greedy, as vLLM's `DSparkSpeculator._sample_sequential`); returns a :class:`~spectrace.engine.drafters.Proposal`."""
        timings = ProposeTimings()
        self.last_steps = [self.step(seq, timings) for seq in sequences]
        vocab = self.model.cfg.draft_vocab_size
        return Proposal(
            [s.drafts for s in self.last_steps],
            timings,
            logits_numel=len(sequences) * self.k * vocab,
        )


def reduce_vocab(model: DSparkDraftModel, n: int) -> DSparkDraftModel:
    """A copy of a full-vocabulary drafter restricted to ``n`` target ids with a d2t table.

    The ids are chosen like the draft_model's ``--draft-vocab`` (the ``n`` rows of ``lm_head``
    with the largest L2 norm, ascending); ``lm_head`` and ``markov_w2`` keep those rows.
    """
    cfg = model.cfg
    if cfg.draft_vocab_size != cfg.vocab_size:
        raise ValueError("reduce_vocab needs a full-vocabulary drafter")
    ids, _ = reduced_vocab(model.lm_head.weight, n)
    new_cfg = DSparkConfig(**{**cfg.to_dict(), "draft_vocab_size": n})
    out = DSparkDraftModel(new_cfg)
    state = {k: v for k, v in model.state_dict().items()}
    state["lm_head.weight"] = state["lm_head.weight"][ids].clone()
    state["markov_head.markov_w2.weight"] = state["markov_head.markov_w2.weight"][ids].clone()
    missing, unexpected = out.load_state_dict(state, strict=False)
    assert set(missing) <= {"d2t", "t2d"} and not unexpected, (missing, unexpected)
    out.set_vocab_mapping(ids)
    return out.eval()
