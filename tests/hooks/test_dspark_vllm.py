"""DSpark against vLLM's real code on a CPU: ``DSparkSpeculator._sample_sequential`` and the
Qwen3 DSpark Markov head, fed the reference drafter's weights, captured through spectrace.

vLLM's V2 runner (the only one with DSpark) needs Triton, which the CPU wheel lacks, so the
speculator is built with ``object.__new__`` and only the attributes ``_sample_sequential``
reads (``shared/reference/vllm_cpu.md``), in a single-rank gloo tensor-parallel group. Its
``model`` is a ``Qwen3DSparkForCausalLM`` made
the same way, holding vLLM's own ``DSparkMarkovHead``, ``DSparkConfidenceHead``,
``ParallelLMHead`` and ``LogitsProcessor``, loaded from the checkpoint's safetensors with
vLLM's weight loaders (renamed as ``Qwen3DSparkForCausalLM.load_weights`` does) and
``process_weights_after_loading`` (vLLM's CPU GEMM dispatch). So ``compute_draft_logits``,
``markov_embed``, ``markov_bias``, ``map_draft_to_target``, ``compute_confidence``,
``_sample_logits`` and ``_sample_sequential`` are all vLLM's code. The full
``Qwen3DSparkForCausalLM.__init__`` is not used: its DFlash backbone builds vLLM
``Attention`` layers, which need a draft-model ``SpeculativeConfig``, and vLLM refuses DSpark
configs without the V2 runner.

:class:`V2Harness` plays the V2 runner around it: greedy verification by the reference
engine's target (``spectrace.engine.core.verify_greedy``), then ``speculator.propose`` with
the real 0.32 signature, whose body does what the DFlash prepare kernel does (anchor into
``input_buffers.input_ids[_anchor_idx]``, ``sample_indices``, ``sample_pos``), runs the
reference backbone over the target's hidden states for the head hidden states, and calls
vLLM's ``_sample_sequential``. spectrace's V2 hooks (``ProposeTap`` + ``DSparkTap``, with the
inner recording and its agreement check) write the trace. The reference engine runs as a
subprocess under ``spectrace capture``. The layout vLLM uses is read from ``config.json`` by
vLLM's own ``SpeculatorsConfig.extract_transformers_pre_trained_config``.

Variants (one checkpoint each, both sides load it): the anchor and the 1+N layout, a reduced
vocabulary (1024 ids, d2t) in both layouts, and a checkpoint without ``sample_from_anchor``
(speculators reads the anchor layout, vLLM 0.32 the 1+N layout), also with the Markov bias
zeroed. Same layout on both sides: every block identical, ``spectrace diff`` clean. Flipped:
``layout_shift`` when the parallel backbone decides the slots; with the bundled drafter's
Markov chain on, the tiny backbone's weak mask slots make the flip a divergence from slot 0
rather than a clean shift (``test_flipped_layout_with_the_markov_chain``).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")
if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm (vllm-cpu) is not installed", allow_module_level=True)

from spectrace.engine.core import verify_greedy  # noqa: E402
from spectrace.engine.dspark import (  # noqa: E402
    block_inputs,
    reduce_vocab,
    sample_sequential,
    target_aux_hidden,
)
from spectrace.engine.dspark_ckpt import load_dspark, save_dspark  # noqa: E402
from spectrace.engine.loader import (  # noqa: E402
    bundled_model_dir,
    bundled_prompts_path,
    configure_torch,
    encode_prompt,
    load_model,
    load_tokenizer,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SPECTRACE = str(Path(sys.executable).parent / "spectrace")
K = 4
MAX_TOKENS = 32
DRAFT_VOCAB = 1024
MAX_REQS = 8
#: checkpoint variants: name -> (config.json sample_from_anchor or None to omit it, reduced
#: draft vocabulary or None, Markov head kept (False: markov_w2 zeroed, so the bias is 0 and
#: the parallel backbone alone decides, as in DFlash))
VARIANTS = {
    "anchor": (True, None, True),
    "bonus": (False, None, True),
    "reduced": (True, DRAFT_VOCAB, True),
    "reduced_bonus": (False, DRAFT_VOCAB, True),
    "noflag": (None, None, True),  # speculators' default (anchor) vs vLLM's reading (1+N)
    "noflag_nomarkov": (None, None, False),
}
#: end-to-end captures diffed against the reference engine
E2E = ("anchor", "bonus", "reduced", "noflag", "noflag_nomarkov")


# --------------------------------------------------------------------------------------------
# Checkpoints and reference runs (module scope)
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def target():
    configure_torch(1)
    return load_model(bundled_model_dir("target"))


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory, target) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dspark_ckpts")
    out = {}
    for name, (sfa, vocab, markov) in VARIANTS.items():
        m = load_dspark(bundled_model_dir("dspark"), target.model)
        if vocab:
            m = reduce_vocab(m, vocab)
        if not markov:
            with torch.no_grad():
                m.markov_head.markov_w2.weight.zero_()
        m.cfg.sample_from_anchor = True if sfa is None else sfa
        out[name] = save_dspark(m, root / name, k=K, write_sample_from_anchor=sfa is not None)
    return out


@pytest.fixture(scope="module")
def ref_traces(ckpts, tmp_path_factory) -> dict[str, Path]:
    """The reference engine under ``spectrace capture``, one run per end-to-end variant."""
    root = tmp_path_factory.mktemp("dspark_ref")
    procs = {}
    for name in E2E:
        h5, req = root / f"ref_{name}.h5", root / f"ref_{name}.requests.jsonl"
        cmd = [
            SPECTRACE,
            "capture",
            "-o",
            str(h5),
            "--requests",
            str(req),
            "--meta",
            "engine=spectrace-reference",
            "--meta",
            "method=dspark",
            "--meta",
            f"k={K}",
            "--",
            sys.executable,
            "-m",
            "spectrace.engine",
            "--method",
            "dspark",
            "--draft",
            str(ckpts[name]),
            "--k",
            str(K),
            "--max-tokens",
            str(MAX_TOKENS),
            "--requests-out",
            str(req),
        ]
        procs[name] = (
            subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
            h5,
        )
    out = {}
    for name, (p, h5) in procs.items():
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, f"reference {name}: {stderr[-2000:]}"
        out[name] = h5
    return out


@pytest.fixture(scope="module")
def vllm_mods(tmp_path_factory):
    """vLLM's DSpark speculator module (about 13 s to import) and its Qwen3 DSpark model, in a
    single-rank tensor-parallel group (gloo), as a vLLM CPU worker sets one up: the confidence
    head's ``ReplicatedLinear`` asks the group for its rank."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import (
        ensure_model_parallel_initialized,
        init_distributed_environment,
        model_parallel_is_initialized,
    )
    from vllm.model_executor.models import qwen3_dspark
    from vllm.v1.worker.gpu.spec_decode.dspark import speculator

    if not model_parallel_is_initialized():
        init = tmp_path_factory.mktemp("dist") / "init"
        with set_current_vllm_config(VllmConfig()):
            init_distributed_environment(
                world_size=1,
                rank=0,
                local_rank=0,
                backend="gloo",
                distributed_init_method=f"file://{init}",
            )
            ensure_model_parallel_initialized(1, 1)
    return speculator, qwen3_dspark


# --------------------------------------------------------------------------------------------
# vLLM objects on a CPU
# --------------------------------------------------------------------------------------------


def vllm_layout(ckpt: Path) -> bool:
    """``sample_from_anchor`` as vLLM reads a speculators config.json (its own code)."""
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    d = json.loads((ckpt / "config.json").read_text())
    return bool(SpeculatorsConfig.extract_transformers_pre_trained_config(d)["sample_from_anchor"])


def build_vllm_model(q3, ckpt: Path):
    """vLLM's ``Qwen3DSparkForCausalLM`` heads (no backbone) loaded from ``ckpt``."""
    import torch.nn as nn
    from safetensors.torch import load_file
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    d = json.loads((ckpt / "config.json").read_text())
    tl = d["transformer_layer_config"]
    vocab, vd, r, h = tl["vocab_size"], d["draft_vocab_size"], d["markov_rank"], tl["hidden_size"]
    with set_current_vllm_config(VllmConfig()):
        model = object.__new__(q3.Qwen3DSparkForCausalLM)
        nn.Module.__init__(model)
        inner = nn.Module()
        inner.markov_head = q3.DSparkMarkovHead(vocab, vd, r, prefix="model.markov_head")
        inner.confidence_head = None
        if d.get("enable_confidence_head"):
            with_markov = bool(d.get("confidence_head_with_markov"))
            inner.confidence_head = q3.DSparkConfidenceHead(
                h + (r if with_markov else 0),
                prefix="model.confidence_head",
                bias=True,
                with_markov=with_markov,
            )
        model.model = inner
        model.lm_head = ParallelLMHead(vd, h, prefix="lm_head")
        model.logits_processor = LogitsProcessor(vd, scale=d.get("logit_scale", 1.0))
        model.draft_id_to_target_id = (
            nn.Parameter(torch.zeros(vd, dtype=torch.long), requires_grad=False)
            if vd < vocab
            else None
        )
    params = dict(model.named_parameters())
    loaded = set()
    for name, w in load_file(str(ckpt / "model.safetensors")).items():
        if "t2d" in name:  # the renaming of Qwen3DSparkForCausalLM.load_weights
            continue
        name = (
            name.replace("d2t", "draft_id_to_target_id")
            if "d2t" in name
            else (name if "lm_head" in name else "model." + name)
        )
        if name in params:
            p = params[name]
            getattr(p, "weight_loader", default_weight_loader)(p, w)
            loaded.add(name)
    assert loaded == set(params), f"not loaded: {set(params) - loaded}"
    for mod in model.modules():
        qm = getattr(mod, "quant_method", None)
        if qm is not None and hasattr(qm, "process_weights_after_loading"):
            qm.process_weights_after_loading(mod)
    return model.eval()


def build_speculator(spec_mod, model, k: int, sample_from_anchor: bool):
    """A ``DSparkSpeculator`` with the attributes ``_sample_sequential`` reads (greedy)."""
    spec = object.__new__(spec_mod.DSparkSpeculator)
    nq = k if sample_from_anchor else k + 1
    spec.num_speculative_steps = k
    spec.sample_from_anchor = sample_from_anchor
    spec.num_query_per_req = nq
    spec.max_num_reqs = MAX_REQS
    spec._draft_topk = None
    spec.sample_indices = torch.zeros(MAX_REQS * k, dtype=torch.int64)
    spec.sample_idx_mapping = torch.zeros(MAX_REQS * k, dtype=torch.int64)
    spec.sample_pos = torch.zeros(MAX_REQS * k, dtype=torch.int64)
    spec.input_buffers = SimpleNamespace(
        input_ids=torch.zeros(MAX_REQS * nq, dtype=torch.int32),
        positions=torch.zeros(MAX_REQS * nq, dtype=torch.int64),
    )
    spec._anchor_idx = torch.arange(MAX_REQS, dtype=torch.int64) * nq
    spec.draft_tokens = torch.zeros((MAX_REQS, k), dtype=torch.int64)
    spec.draft_logits = None
    spec.draft_token_confidence_probs = torch.zeros((MAX_REQS, k), dtype=torch.float32)
    spec.use_confidence_head = model.model.confidence_head is not None
    spec.acceptance_estimator = None
    spec._step_cols = torch.arange(k, dtype=torch.int32)
    spec.model = model
    return spec


# --------------------------------------------------------------------------------------------
# The V2 harness
# --------------------------------------------------------------------------------------------


class V2Harness:
    """Greedy speculative decoding around a real ``DSparkSpeculator`` (see the module doc).

    Attributes:
        blocks: draft steps checked against the reference sampler on vLLM's base logits.
        equal: of those, blocks whose drafts were identical.
        conf_err: largest |vLLM confidence - reference confidence|.
    """

    def __init__(
        self,
        spec,
        ref_model,
        target,
        mask_id: int,
        prompts: list[list[int]],
        make_propose,
        v2_batch,
    ):
        self.batch = v2_batch
        self.spec, self.ref, self.target, self.mask_id = spec, ref_model, target, mask_id
        self.k = spec.num_speculative_steps
        self.rids = [f"{i}-dspk{i:04d}" for i in range(len(prompts))]
        self.prompts = dict(zip(self.rids, prompts))
        self.tokens = {r: list(p) for r, p in self.prompts.items()}
        self.out = {r: [] for r in self.rids}
        self.pending: dict[str, list[int] | None] = {r: None for r in self.rids}
        self.slot = {r: i for i, r in enumerate(self.rids)}
        self.last_sampled = torch.zeros((MAX_REQS, 1), dtype=torch.int64)
        self.next_prefill = torch.zeros((1, MAX_REQS), dtype=torch.int32)
        self.blocks = self.equal = 0
        self.conf_err = 0.0
        # what vLLM's scheduler would count (Scheduler.make_spec_decoding_stats)
        self.counters = {
            "num_drafts": 0,
            "num_draft_tokens": 0,
            "num_accepted_tokens": 0,
            "num_accepted_tokens_per_pos": [0] * self.k,
        }
        self._base = None
        orig = spec.model.compute_draft_logits

        def compute_draft_logits(hidden):  # keep vLLM's base logits for the reference sampler
            self._base = orig(hidden)
            return self._base

        spec.model.compute_draft_logits = compute_draft_logits
        # vLLM 0.32's propose signature, set on the instance the runner calls (the tap wraps it)
        spec.propose = make_propose(self._propose)

    def _propose(
        self,
        input_batch,
        num_sampled,
        num_rejected,
        last_sampled,
        next_prefill_tokens,
        num_speculative_tokens,
    ):
        spec, k, n = self.spec, self.k, input_batch.num_reqs
        hidden_rows = [
            self._prepare_row(
                input_batch, i, rid, num_sampled, num_rejected, last_sampled, next_prefill_tokens
            )
            for i, rid in enumerate(input_batch.req_ids[:n])
        ]
        head_hidden = torch.cat(hidden_rows)  # [n * nq, H]
        with torch.inference_mode():
            spec._sample_sequential(n, head_hidden)  # vLLM's code (wrapped by DSparkTap)
        drafts = spec.draft_tokens[:n]
        # the reference sampler on the same anchors and vLLM's own base logits
        anchors = spec.input_buffers.input_ids[spec._anchor_idx[:n]]
        with torch.no_grad():
            ref, emb = sample_sequential(
                self._base.reshape(n, k, -1), anchors, self.ref, return_embeds=True
            )
        self.blocks += n
        self.equal += int((ref == drafts).all(dim=1).sum())
        if spec.use_confidence_head:
            with torch.no_grad():
                sh = head_hidden[spec.sample_indices[: n * k]].view(n, k, -1)
                conf = self.ref.compute_confidence(sh, emb)
            err = (conf - spec.draft_token_confidence_probs[:n]).abs().max()
            self.conf_err = max(self.conf_err, float(err))
        return drafts

    def _prepare_row(
        self, input_batch, i, rid, num_sampled, num_rejected, last_sampled, next_prefill_tokens
    ):
        """Row i as the DFlash prepare kernel (SAMPLE_FROM_ANCHOR branch) leaves it, in torch;
        returns the draft backbone's hidden states of its query slots (the reference model
        over the target's hidden states)."""
        spec, k = self.spec, self.k
        nq = spec.num_query_per_req
        off = 0 if spec.sample_from_anchor else 1
        slot = int(input_batch.idx_mapping[i])
        nr = int(num_rejected[i])
        q_end = int(input_batch.query_start_loc[i + 1])
        anchor = int(
            last_sampled[slot, 0] if int(num_sampled[i]) > 0 else next_prefill_tokens[0, slot]
        )
        pos = int(input_batch.positions[q_end - 1 - nr]) + 1
        ids, qpos = block_inputs(anchor, pos, k, spec.sample_from_anchor, self.mask_id)
        spec.input_buffers.input_ids[i * nq : (i + 1) * nq] = torch.tensor(ids)
        spec.input_buffers.positions[i * nq : (i + 1) * nq] = torch.tensor(qpos)
        j = torch.arange(k)
        spec.sample_indices[i * k : (i + 1) * k] = i * nq + off + j
        spec.sample_pos[i * k : (i + 1) * k] = pos + 1 + j
        spec.sample_idx_mapping[i * k : (i + 1) * k] = slot
        seq = self.tokens[rid]
        assert seq[-1] == anchor and len(seq) - 1 == pos, (rid, anchor, pos)
        with torch.no_grad():
            ctx = target_aux_hidden(
                self.target.model, seq[:-1], self.ref.cfg.aux_hidden_state_layer_ids
            )
            kv = self.ref.context_kv(ctx, torch.arange(pos)[None])
            mask = torch.ones((1, nq, pos + nq), dtype=torch.bool)
            return self.ref.query_forward(kv, torch.tensor([ids]), torch.tensor([qpos]), mask)[0]

    def step(self, flip: bool) -> list[str]:
        rids = [r for r in self.rids if len(self.out[r]) < MAX_TOKENS]
        if flip:
            rids = rids[::-1]  # the V2 runner re-sorts its batch every step
        ns, nr, positions, qsl = [], [], [], [0]
        for rid in rids:
            seq, drafts = self.tokens[rid], self.pending[rid]
            if drafts is None:  # prefill: the whole prompt, one token sampled
                positions += list(range(len(seq)))
                emitted = verify_greedy(self.target.model, seq, [])
                ns.append(1)
                nr.append(0)
            else:
                positions += list(range(len(seq) - 1, len(seq) + len(drafts)))
                emitted = verify_greedy(self.target.model, seq, drafts)
                ns.append(len(emitted))
                nr.append(len(drafts) + 1 - len(emitted))
                c = self.counters
                c["num_drafts"] += 1
                c["num_draft_tokens"] += len(drafts)
                c["num_accepted_tokens"] += len(emitted) - 1
                for i in range(len(emitted) - 1):
                    c["num_accepted_tokens_per_pos"][i] += 1
            qsl.append(len(positions))
            seq.extend(emitted)
            self.out[rid].extend(emitted)
            self.last_sampled[self.slot[rid], 0] = emitted[-1]
        slots = [self.slot[r] for r in rids]
        batch = self.batch(
            rids, slots, positions, qsl, idx_dtype=torch.int64, idx_mapping_np=np.array(slots)
        )
        drafts = self.spec.propose(
            batch,
            {},
            {},
            None,
            None,
            torch.tensor(ns, dtype=torch.int32),
            torch.tensor(nr, dtype=torch.int32),
            self.last_sampled,
            self.next_prefill,
            torch.zeros(MAX_REQS),
            torch.zeros(MAX_REQS),
            num_speculative_tokens=self.k,
        )
        for i, rid in enumerate(rids):
            self.pending[rid] = [int(t) for t in drafts[i]]
        return [r for r in rids if len(self.out[r]) >= MAX_TOKENS]


def run_vllm_side(vllm_mods, ckpt: Path, target, out: Path, fakes) -> dict:
    """Capture one decode of the bundled prompts through spectrace's V2 + DSpark hooks."""
    from spectrace.hooks.vllm.session import Session
    from spectrace.hooks.vllm.v2.dspark import DSparkTap
    from spectrace.hooks.vllm.v2.tap import ProposeTap

    spec_mod, q3 = vllm_mods
    sfa = vllm_layout(ckpt)
    ref = load_dspark(ckpt, target.model)
    spec = build_speculator(spec_mod, build_vllm_model(q3, ckpt), K, sfa)
    tok = load_tokenizer(bundled_model_dir("target"))
    prompts = [
        encode_prompt(tok, json.loads(line)["text"])
        for line in bundled_prompts_path().read_text().splitlines()
        if line.strip()
    ]
    make_propose, v2_batch, sampling = fakes
    h = V2Harness(spec, ref, target, ref.cfg.mask_token_id, prompts, make_propose, v2_batch)
    import vllm

    session = Session(
        out,
        {
            "engine": "vllm",
            "engine_version": vllm.__version__,
            "method": "dspark",
            "k": K,
            "source": "vllm-hook",
            "trace_level": "vllm-v2 (CPU harness)",
            "tokenizer": str(bundled_model_dir("target")),
            "layout": {"runner": "v2 harness"},
        },
    )
    tap = ProposeTap(spec, session, max_model_len=target.max_model_len)
    dtap = DSparkTap(spec, tap, session, inner=True)
    params = sampling(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.0)
    for rid in h.rids:
        tap.add_request(rid, h.prompts[rid], params)
    flip = False
    while any(len(h.out[r]) < MAX_TOKENS for r in h.rids):
        for rid in h.step(flip):
            tap.drain(wait=True)
            tap.finish(rid)
        flip = not flip
    # the close-time cross-check
    session.counters = SimpleNamespace(as_dict=lambda: h.counters, per_request=None)
    session.close()
    return {
        "sfa": sfa,
        "blocks": h.blocks,
        "equal": h.equal,
        "conf_err": h.conf_err,
        "inner": dtap.summary(),
        "layout": dtap.layout,
        "counters": h.counters,
    }


def spectrace_diff(ours: Path, theirs: Path) -> dict:
    p = subprocess.run(
        [SPECTRACE, "diff", "--format", "json", str(ours), str(theirs)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode in (0, 1), p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def vllm_runs(
    vllm_mods, ckpts, target, tmp_path_factory, ref_traces, make_propose, v2_batch, sampling
) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("dspark_vllm")
    out = {}
    for name in VARIANTS:
        h5 = root / f"vllm_{name}.h5"
        fakes = (make_propose, v2_batch, sampling)
        out[name] = {**run_vllm_side(vllm_mods, ckpts[name], target, h5, fakes), "trace": h5}
    return out


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------


def test_harness_signature_is_vllms(vllm_mods, make_propose):
    """The ``propose`` the harness installs on the speculator has vLLM's own parameters."""
    import inspect

    from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator

    real = list(inspect.signature(BaseSpeculator.propose).parameters)
    fake = make_propose(lambda *args: None)  # set on the instance: no self
    assert real[0] == "self" and real[1:] == list(inspect.signature(fake).parameters)


def test_vllm_reads_the_layouts(vllm_mods, ckpts):
    """vLLM's config code: an explicit flag is kept, a missing one means the 1+N layout."""
    assert [vllm_layout(ckpts[n]) for n in ("anchor", "bonus", "reduced", "noflag")] == [
        True,
        False,
        True,
        False,
    ]


@pytest.mark.parametrize("name", list(VARIANTS))
def test_vllm_sampler_equals_reference(vllm_runs, name):
    """Same anchors, same base logits: vLLM's ``_sample_sequential`` and the reference
    sampler give identical drafts on every block; the inner record agrees with propose."""
    r = vllm_runs[name]
    print(
        f"{name}: sample_from_anchor={r['sfa']} {r['equal']}/{r['blocks']} blocks identical, "
        f"confidence max |diff| {r['conf_err']:.2e}, inner check {r['inner']}"
    )
    assert r["blocks"] > 40 and r["equal"] == r["blocks"]
    assert r["conf_err"] < 1e-5
    assert r["inner"]["status"] == "ok" and r["inner"]["steps_mismatched"] == 0
    assert r["inner"]["steps_checked"] > 10 and r["inner"]["steps_unchecked"] == 0
    assert r["layout"]["d2t"] == (name.startswith("reduced"))
    assert r["sfa"] == (VARIANTS[name][0] is True)
    from spectrace.tracer.store import open_trace

    with open_trace(r["trace"]) as t:  # the trace's totals are what the runner counted
        assert t.meta["checks"]["status"] == "ok", t.meta["checks"]
        assert t.meta["dspark_inner_check"]["status"] == "ok"
        assert t.meta["layout"]["sample_from_anchor"] is r["sfa"]
        assert t.meta["layout"]["query_slots_per_request"] == (K if r["sfa"] else K + 1)
        assert t.meta["d2t"] is name.startswith("reduced")
        vocab = DRAFT_VOCAB if name.startswith("reduced") else None
        assert t.meta.get("draft_vocab_size") == vocab


@pytest.mark.parametrize("name", ["anchor", "bonus", "reduced"])
def test_vllm_capture_diffs_clean_against_reference_engine(vllm_runs, ref_traces, name):
    """The captured vLLM run and the reference engine's run: no error finding, and every
    comparable block agrees."""
    d = spectrace_diff(vllm_runs[name]["trace"], ref_traces[name])
    errors = [f for f in d["findings"] if f["severity"] == "error"]
    assert errors == [], errors
    agree = d["agreement"]
    print(name, json.dumps(d["coverage"]), json.dumps({k: agree[k] for k in list(agree)[:4]}))
    assert not d["diverged"], d["reasons"]


def test_flipped_layout_is_found(vllm_runs, ref_traces):
    """A checkpoint without ``sample_from_anchor``: the reference engine (speculators'
    default) drafts in the anchor layout, vLLM 0.32 in the 1+N layout. With the Markov bias at
    zero (the parallel backbone alone decides each slot, as in DFlash), vLLM's draft i is the
    reference's draft i + 1: ``layout_shift`` is the first error."""
    d = spectrace_diff(vllm_runs["noflag_nomarkov"]["trace"], ref_traces["noflag_nomarkov"])
    errors = [f for f in d["findings"] if f["severity"] == "error"]
    assert errors and errors[0]["kind"] == "layout_shift", [f["kind"] for f in errors]
    ev = errors[0]["evidence"]
    assert ev["shift"] == 1 and ev["rate"] >= 0.8 and ev["same_slot_rate"] < 0.45
    print(errors[0]["message"])


def test_flipped_layout_with_the_markov_chain(vllm_runs, ref_traces):
    """The same flip on the bundled drafter, Markov head on: its tiny backbone predicts the
    mask slots poorly (base-only top-1 about 0.25 beyond slot 0) and the Markov chain from the
    anchor carries most of the block, so the 1+N reading mostly breaks slot 0 and the chain
    after it rather than shifting the drafts. spectrace reports a divergence from slot 0 on
    (``draft_mismatch``) and lower acceptance on vLLM's side, not a clean shift."""
    d = spectrace_diff(vllm_runs["noflag"]["trace"], ref_traces["noflag"])
    errors = [f for f in d["findings"] if f["severity"] == "error"]
    assert d["diverged"] and errors, d["reasons"]
    assert errors[0]["kind"] in ("layout_shift", "draft_mismatch"), [f["kind"] for f in errors]
    acc = d["acceptance"]
    print(errors[0]["message"], json.dumps(acc)[:400])
