"""The reference DSpark drafter (``spectrace.engine.dspark``), its checkpoints, its engine
wiring (``--method dspark``), and the DSpark hook (``spectrace.hooks.vllm.v2.dspark``) on fake
speculators. The proof against vLLM's own code is ``test_dspark_vllm.py``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from spectrace.engine import dspark  # noqa: E402
from spectrace.engine.dspark_ckpt import config_dict, load_dspark, save_dspark  # noqa: E402
from spectrace.engine.loader import bundled_model_dir, configure_torch, load_model  # noqa: E402
from spectrace.hooks.vllm.common import SpecTraceLayoutError  # noqa: E402
from spectrace.hooks.vllm.session import Session  # noqa: E402
from spectrace.hooks.vllm.v2.dspark import (  # noqa: E402
    DSparkTap,
    SpecTraceConsistencyError,
    dspark_layout,
)
from spectrace.tracer.store import open_trace  # noqa: E402

K = 4
BUNDLED = bundled_model_dir("dspark")
needs_bundled = pytest.mark.skipif(
    not (BUNDLED / "model.safetensors").exists(), reason="no bundled DSpark checkpoint"
)
SPECTRACE_RE = re.compile(
    r"^\[SPECTRACE\] req=(\S+) pos=(\d+) k=(\d+) ns=(\d+) acc=(\d+) "
    r"draft=\[ ((?:-?\d+ )*)\] emit=\[ ((?:-?\d+ )*)\]$"
)


def tiny(**kw) -> dspark.DSparkDraftModel:
    cfg = dict(
        vocab_size=64,
        draft_vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        target_hidden_size=24,
        aux_hidden_state_layer_ids=[1, 2],
        mask_token_id=63,
        block_size=K,
        markov_rank=8,
    )
    cfg.update(kw)
    torch.manual_seed(0)
    m = dspark.DSparkDraftModel(dspark.DSparkConfig(**cfg))
    for p in m.parameters():
        torch.nn.init.normal_(p, 0.0, 0.5)
    return m.eval()


@pytest.fixture(scope="module")
def target():
    configure_torch(1)
    return load_model(bundled_model_dir("target"))


# ---------------------------------------------------------------------------- sampler


def test_sample_sequential_is_vllms_loop():
    """prev = anchor; bias from markov_w1[prev] @ markov_w2^T; argmax; id + d2t[id]; prev = id."""
    m = dspark.reduce_vocab(tiny(), 40)
    w1 = m.markov_head.markov_w1.weight.detach().numpy()
    w2 = m.markov_head.markov_w2.weight.detach().numpy()
    d2t = m.d2t.numpy()
    g = torch.Generator().manual_seed(3)
    base = torch.randn(5, K, 40, generator=g)
    anchors = torch.tensor([0, 7, 63, 12, 40])
    got = dspark.sample_sequential(base, anchors, m)
    for r in range(5):
        prev, want = int(anchors[r]), []
        for i in range(K):
            logits = base[r, i].numpy() + w2 @ w1[prev]
            idx = int(np.argmax(logits))
            prev = idx + int(d2t[idx])
            want.append(prev)
        assert got[r].tolist() == want
    assert set(got.flatten().tolist()) <= set((np.arange(40) + d2t).tolist())


def test_layouts():
    assert dspark.block_inputs(9, 20, K, True, 63) == ([9, 63, 63, 63], [20, 21, 22, 23])
    assert dspark.block_inputs(9, 20, K, False, 63) == ([9, 63, 63, 63, 63], [20, 21, 22, 23, 24])
    assert [dspark.sample_slot_offset(s) for s in (True, False)] == [0, 1]


def test_blocks_in_one_batch_equal_blocks_alone():
    """The training mask (several blocks per row, each seeing its own context prefix) gives the
    same head hidden states as one block at a time."""
    m = tiny()
    g = torch.Generator().manual_seed(1)
    states = torch.randn(1, 30, 48, generator=g)
    pos = torch.arange(30)[None]
    with torch.no_grad():
        kv = m.context_kv(states, pos)
        alone = []
        for p in (5, 17):
            ids, qp = dspark.block_inputs(p % 60, p, K, True, 63)
            kvp = [(k[:, :p], v[:, :p]) for k, v in kv]
            alone.append(
                m.query_forward(
                    kvp, torch.tensor([ids]), torch.tensor([qp]), dspark.block_mask(p, K)
                )[0]
            )
        ids = [i for p in (5, 17) for i in dspark.block_inputs(p % 60, p, K, True, 63)[0]]
        qp = [q for p in (5, 17) for q in dspark.block_inputs(p % 60, p, K, True, 63)[1]]
        ctx = torch.arange(30)[None, :] < torch.tensor([5] * K + [17] * K)[:, None]
        blk = torch.arange(2 * K) // K
        mask = torch.cat([ctx, blk[:, None] == blk[None, :]], dim=1)[None]
        both = m.query_forward(kv, torch.tensor([ids]), torch.tensor([qp]), mask)[0]
    torch.testing.assert_close(both, torch.cat(alone), rtol=1e-5, atol=1e-5)


def test_target_aux_hidden_taps(target):
    """Aux id a is the output of layer a - 1 before the final norm (id 0: the embeddings)."""
    ids = list(range(5, 25))
    aux = dspark.target_aux_hidden(target.model, ids, [0, 1, 2])
    with torch.no_grad():
        out = target.model(
            input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False
        )
    hs = out.hidden_states
    h = target.model.config.hidden_size
    torch.testing.assert_close(aux[0, :, :h], hs[0][0])
    torch.testing.assert_close(aux[0, :, h : 2 * h], hs[1][0])
    last = aux[0, :, 2 * h :]  # HF's last hidden state has the final norm applied
    torch.testing.assert_close(target.model.model.norm(last), hs[2][0], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------- checkpoints


def test_checkpoint_round_trip_in_the_speculators_layout(tmp_path):
    from safetensors import safe_open

    m = dspark.reduce_vocab(tiny(), 40)
    out = save_dspark(m, tmp_path / "ck", k=K, verifier="t")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_model_type"] == "dspark" and cfg["sample_from_anchor"] is True
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == K
    assert cfg["transformer_layer_config"]["vocab_size"] == 64 and cfg["draft_vocab_size"] == 40
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert f.get_tensor("d2t").dtype == torch.int64 and f.get_tensor("t2d").dtype == torch.bool
    assert {
        "fc.weight",
        "hidden_norm.weight",
        "norm.weight",
        "lm_head.weight",
        "embed_tokens.weight",
        "markov_head.markov_w1.weight",
        "markov_head.markov_w2.weight",
        "d2t",
        "t2d",
        "layers.1.self_attn.q_proj.weight",
        "layers.0.mlp.down_proj.weight",
        "confidence_head.proj.weight",
        "confidence_head.proj.bias",
    } <= keys
    assert not any(k.startswith("model.") for k in keys)
    back = load_dspark(out)
    for k, v in m.state_dict().items():
        torch.testing.assert_close(back.state_dict()[k], v)


def test_missing_flag_reads_as_speculators_default(tmp_path):
    m = tiny(sample_from_anchor=True)
    out = save_dspark(m, tmp_path / "ck", write_sample_from_anchor=False)
    assert "sample_from_anchor" not in json.loads((out / "config.json").read_text())
    assert load_dspark(out).cfg.sample_from_anchor is True
    assert (
        config_dict(tiny(sample_from_anchor=False).cfg)["speculators_config"]["proposal_methods"][
            0
        ]["speculative_tokens"]
        == K - 1
    )  # 1+N: block = anchor + k masks


def test_shared_embeddings_come_from_the_target(tmp_path, target):
    m = tiny(
        vocab_size=2048,
        draft_vocab_size=2048,
        hidden_size=128,
        head_dim=32,
        num_attention_heads=4,
        num_key_value_heads=4,
        target_hidden_size=128,
        mask_token_id=2047,
    )
    out = save_dspark(m, tmp_path / "ck", include_embed=False, include_lm_head=False)
    back = load_dspark(out, target.model)
    torch.testing.assert_close(back.lm_head.weight, target.model.lm_head.weight)
    with pytest.raises(ValueError, match="no embed_tokens"):
        load_dspark(out)


# ---------------------------------------------------------------------------- engine


def run_engine(
    tmp_path: Path, *extra: str, max_tokens: int = 24
) -> tuple[list[dict], list[str], str]:
    req = tmp_path / f"req{len(list(tmp_path.iterdir()))}.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "spectrace.engine",
        "--k",
        str(K),
        "--max-tokens",
        str(max_tokens),
        "--requests-out",
        str(req),
        "--stats",
        *extra,
    ]
    p = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "VT_SPEC_TRACE": "1"},
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    reqs = [json.loads(line) for line in req.read_text().splitlines()]
    return reqs, p.stderr.splitlines(), p.stdout


@needs_bundled
def test_engine_dspark_is_lossless_and_drafts_what_the_drafter_computes(tmp_path, target):
    reqs, err, _ = run_engine(tmp_path, "--method", "dspark")
    base, _, _ = run_engine(tmp_path, "--method", "ngram")
    assert [r["output_ids"] for r in reqs] == [r["output_ids"] for r in base]  # greedy, lossless
    drafter = dspark.DSparkDrafter(load_dspark(BUNDLED, target.model), target, K)
    by_id = {r["req_id"]: r for r in reqs}
    blocks = [SPECTRACE_RE.match(line) for line in err if line.startswith("[SPECTRACE]")]
    assert len(blocks) > 10
    for m in blocks[:12]:
        r = by_id[m.group(1)]
        pos = int(m.group(2))
        seq = r["prompt_ids"] + r["output_ids"]
        assert drafter.step(seq[:pos]).drafts == [
            int(t) for t in m.group(6).split()
        ]  # anchor at pos - 1
    assert any(re.match(rf"^\[spec-propose\] rows=\d+ nqpr={K} ", line) for line in err)
    stats = next(line for line in err if "spec_drafts_accepted" in line)
    assert "method=dspark" in stats


@needs_bundled
def test_engine_dspark_reduced_vocab(tmp_path):
    reqs, err, _ = run_engine(tmp_path, "--method", "dspark", "--draft-vocab", "512", max_tokens=12)
    ids, _ = dspark.reduced_vocab(load_dspark(BUNDLED).lm_head.weight, 512)
    allowed = set(ids.tolist())
    drafted = [
        int(t) for line in err if (m := SPECTRACE_RE.match(line)) for t in m.group(6).split()
    ]
    assert drafted and set(drafted) <= allowed


# ---------------------------------------------------------------------------- the hook


class FakeDSparkSpeculator:
    """The attributes vLLM 0.32's DSparkSpeculator has; ``propose`` runs the Markov loop of a
    tiny drafter (greedy) into ``draft_tokens`` via ``_sample_sequential``."""

    def __init__(self, model, k=K, sample_from_anchor=True, max_reqs=8, corrupt=False):
        self.model = model
        self.num_speculative_steps = k
        self.sample_from_anchor = sample_from_anchor
        self.num_query_per_req = k if sample_from_anchor else k + 1
        nq = self.num_query_per_req
        self.input_buffers = SimpleNamespace(
            input_ids=torch.zeros(max_reqs * nq, dtype=torch.int32)
        )
        self._anchor_idx = torch.arange(max_reqs) * nq
        self.sample_pos = torch.zeros(max_reqs * k, dtype=torch.int64)
        self.draft_tokens = torch.zeros((max_reqs, k), dtype=torch.int64)
        self.corrupt = corrupt
        self.g = torch.Generator().manual_seed(0)

    def _sample_sequential(self, num_reqs, head_hidden):
        anchors = self.input_buffers.input_ids[self._anchor_idx[:num_reqs]]
        base = torch.randn(
            num_reqs, self.num_speculative_steps, self.model.cfg.draft_vocab_size, generator=self.g
        )
        self.draft_tokens[:num_reqs] = dspark.sample_sequential(base, anchors, self.model)

    def propose(
        self,
        input_batch,
        attn_metadata,
        slot_mappings,
        last_hidden_states,
        aux_hidden_states,
        num_sampled,
        num_rejected,
        last_sampled,
        next_prefill_tokens,
        temperature,
        seeds,
        dp_sync_state=None,
        dummy_run=False,
        skip_attn_for_dummy_run=False,
        mm_inputs=None,
        is_profile=False,
        num_speculative_tokens=None,
    ):
        n, k = input_batch.num_reqs, self.num_speculative_steps
        for i in range(n):
            slot = int(input_batch.idx_mapping[i])
            anchor = last_sampled[slot, 0] if num_sampled[i] > 0 else next_prefill_tokens[0, slot]
            self.input_buffers.input_ids[self._anchor_idx[i]] = anchor
            q_end = int(input_batch.query_start_loc[i + 1])
            pos = int(input_batch.positions[q_end - 1 - int(num_rejected[i])]) + 1
            self.sample_pos[i * k : (i + 1) * k] = pos + 1 + torch.arange(k)
        self._sample_sequential(n, None)
        out = self.draft_tokens[:n]
        if self.corrupt:  # what propose hands out is not what the Markov loop wrote
            out = out.clone()
            out[:, -1] = 0
        return out


def drive(spec, session_path: Path, steps: int = 6, corrupt_at: int | None = None):
    from spectrace.hooks.vllm.v2.tap import ProposeTap

    session = Session(session_path, {"k": K, "source": "vllm-hook", "method": "dspark"})
    tap = ProposeTap(spec, session)
    dtap = DSparkTap(spec, tap, session, inner=True)
    params = SimpleNamespace(max_tokens=100, eos_token_id=None, stop_token_ids=None)
    rids = ["a-1", "b-2"]
    for i, r in enumerate(rids):
        tap.add_request(r, [1, 2, 3 + i], params)
    last = torch.zeros((8, 1), dtype=torch.int64)
    lens = {r: 3 for r in rids}
    for s in range(steps):
        order = rids if s % 2 else rids[::-1]
        positions, qsl = [], [0]
        for r in order:
            n_q = 3 if s == 0 else K + 1
            positions += list(
                range(lens[r] - (0 if s == 0 else 1), lens[r] - (0 if s == 0 else 1) + n_q)
            )
            qsl.append(len(positions))
        ns = [1 if s == 0 else 2] * 2
        nr = [0 if s == 0 else K - 1] * 2
        for r in order:
            lens[r] += ns[0]
            last[rids.index(r), 0] = 10 + s
        batch = SimpleNamespace(
            req_ids=order,
            num_reqs=2,
            idx_mapping=torch.tensor([rids.index(r) for r in order]),
            positions=torch.tensor(positions),
            query_start_loc=torch.tensor(qsl),
        )
        spec.propose(
            batch,
            {},
            {},
            None,
            None,
            torch.tensor(ns, dtype=torch.int32),
            torch.tensor(nr, dtype=torch.int32),
            last,
            torch.zeros((1, 8), dtype=torch.int32),
            None,
            None,
            num_speculative_tokens=K,
        )
    session.close()
    return dtap


@pytest.mark.parametrize("sfa", [True, False])
def test_dspark_tap_inner_record_agrees(tmp_path, sfa):
    spec = FakeDSparkSpeculator(tiny(), sample_from_anchor=sfa)
    dtap = drive(spec, tmp_path / "t.h5")
    assert dtap.summary() == {
        "status": "ok",
        "steps_checked": 6,
        "steps_mismatched": 0,
        "steps_unchecked": 0,
        "sync_waits": 0,
    }
    with open_trace(tmp_path / "t.h5") as t:
        assert t.meta["layout"]["sample_from_anchor"] is sfa
        assert t.meta["layout"]["query_slots_per_request"] == (K if sfa else K + 1)
        assert t.meta["dspark_inner_check"]["status"] == "ok"
        assert len(t.blocks) == 12


def test_dspark_tap_finds_a_disagreement(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECTRACE_STRICT", "1")
    spec = FakeDSparkSpeculator(tiny(), corrupt=True)
    with pytest.raises(SpecTraceConsistencyError, match="drafts: mismatch at row 0"):
        drive(spec, tmp_path / "t.h5")


def test_dspark_layout_errors_name_vllm_and_what_is_missing():
    spec = FakeDSparkSpeculator(tiny())
    del spec._anchor_idx
    with pytest.raises(
        SpecTraceLayoutError,
        match=r"^vLLM \S+: FakeDSparkSpeculator lacks _anchor_idx; known layout",
    ):
        dspark_layout(spec)
    spec = FakeDSparkSpeculator(tiny())
    spec.num_query_per_req = K + 2
    with pytest.raises(SpecTraceLayoutError, match="neither the N-slot nor the 1\\+N layout"):
        dspark_layout(spec)
    spec = FakeDSparkSpeculator(tiny())
    del spec.sample_from_anchor
    with pytest.raises(SpecTraceLayoutError, match="sample_from_anchor"):
        dspark_layout(spec)
    spec.draft_model_config = SimpleNamespace(hf_config=SimpleNamespace(dspark_bonus_anchor=True))
    spec.num_query_per_req = K + 1
    assert dspark_layout(spec)["sample_from_anchor"] is False


def test_attach_v2_adds_the_dspark_tap(tmp_path, monkeypatch):
    from spectrace.hooks.vllm.v2 import dspark as vllm_dspark
    from spectrace.hooks.vllm.v2.attach import attach_v2

    class DSparkSpeculator(FakeDSparkSpeculator):
        pass

    runner = SimpleNamespace(
        speculator=DSparkSpeculator(tiny()),
        add_requests=lambda *a: None,
        finish_requests=lambda *a: None,
        shutdown=lambda *a: None,
        model_config=SimpleNamespace(enforce_eager=True),
    )
    made = []
    orig = vllm_dspark.DSparkTap.__init__
    monkeypatch.setattr(
        vllm_dspark.DSparkTap,
        "__init__",
        lambda self, *a, **kw: made.append(kw) or orig(self, *a, **kw),
    )
    session = attach_v2(runner, tmp_path / "a.h5", {"k": K, "layout": {"runner": "v2"}})
    assert made == [{"inner": True}]
    assert session.meta["layout"] == {
        "runner": "v2",
        "sample_from_anchor": True,
        "query_slots_per_request": K,
        "speculator": "DSparkSpeculator",
    }
    session.close()
