"""The draft-checkpoint inspector (``spectrace inspect-draft``): check a DSpark draft checkpoint
before vLLM loads it.

Reads ``config.json`` and the safetensors headers only (the 8-byte length + JSON header of each
``*.safetensors`` file, or the shards named by ``model.safetensors.index.json``); the only
tensor data read are the small index tables ``d2t`` and ``t2d``. No torch, no weights.

Each check (one function in :mod:`.identity`, :mod:`.vocab` or :mod:`.shapes`) yields
one or more :class:`Verdict` lines (``ok``, ``info``, ``warn`` or ``error``). What is
checked, against vLLM 0.32 (``transformers_utils/configs/speculators/algos.py:update_dspark``,
``model_executor/models/qwen3_dspark.py``, ``qwen3_dflash.py``) and speculators
(``src/speculators/models/dspark``):

* ``format``: config.json and the weight files; tensor count and dtypes.
* ``method``: ``speculators_model_type`` (or a dense DSpark config) and the architecture vLLM
  loads it as; or a plain draft model (a standalone ``*ForCausalLM``, vLLM's
  ``method="draft_model"``), for which ``tokenizer`` (``tokenizer.json`` equal to the
  target's; one there but unreadable or not a tokenizer is an error, an absent one is not
  compared) and ``context`` (``max_position_embeddings`` at least the target's) are checked
  (:mod:`.plain`) and no aux layers are expected.
* ``layout``: ``sample_from_anchor``. A speculators checkpoint without it is drafted in the
  anchor layout by speculators (default true) but loaded in the 1+N layout by vLLM
  (``config_dict.get("sample_from_anchor", False)``): every draft shifts one slot.
* ``vocab``: input vocabulary (``transformer_layer_config.vocab_size``) and draft vocabulary
  against the target's (a size that is not an int > 0 is an error naming the field).
* ``d2t`` / ``t2d``: present when the draft vocabulary is reduced; ``target = i + d2t[i]`` in
  range and without duplicates; ``t2d`` marks exactly those targets. A ``d2t`` in a
  full-vocabulary checkpoint has no parameter in vLLM (the load fails).
* ``markov``: head type (vLLM's Qwen3 DSpark has only the vanilla head; ``gate_proj`` /
  ``joint_proj`` weights of the gated and rnn heads have no module) and the table shapes
  ``markov_w1 [V_in, r]``, ``markov_w2 [V_draft, r]``.
* ``confidence``: ``enable_confidence_head`` against the weights and their shape.
* ``aux_layers``: ``aux_hidden_state_layer_ids`` against the target's layer count (id a taps
  the output of target layer a - 1; valid 0..L) and, for hybrid linear/full-attention
  targets, the type of each tapped layer; ``fc.weight`` against the number of taps.
* ``attention``: ``q_proj`` rows against heads x head_dim and ``attn_output_gate`` (vLLM's
  DSpark backbone has no output gate), ``k_proj``/``v_proj``/``o_proj``.
* ``block_size``: against k (``speculative_tokens``, or ``--k``): k = block_size in the
  anchor layout, block_size - 1 in the 1+N layout.
* ``embed_tokens`` / ``lm_head``: own or shared from the target, and their shapes.
* ``mask_token``, ``target_hidden``: the mask token id and the target's hidden size.

Exit status of the command: 0 without an error verdict, 1 with one, 2 on unreadable input.
"""

from .draft import Draft, Vocab, load_draft
from .files import TensorInfo, read_header, read_small, read_tensors, target_layer_types
from .inspect import inspect_draft
from .report import LEVELS, SCHEMA, Report, Verdict

__all__ = [
    "LEVELS",
    "SCHEMA",
    "Draft",
    "Report",
    "TensorInfo",
    "Verdict",
    "Vocab",
    "inspect_draft",
    "load_draft",
    "read_header",
    "read_small",
    "read_tensors",
    "target_layer_types",
]
