"""The reference DSpark drafter (``spectrace.engine.dspark``), its checkpoints, its engine
wiring (``--method dspark``). The DSpark hook on fake speculators is
``tests/hooks/test_dspark_tap.py``; the proof against vLLM's own code is
``tests/hooks/test_dspark_vllm.py``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from spectrace.engine import dspark  # noqa: E402
from spectrace.engine.dspark_ckpt import config_dict, load_dspark, save_dspark  # noqa: E402
from spectrace.engine.loader import bundled_model_dir, configure_torch, load_model  # noqa: E402

K = 4
BUNDLED = bundled_model_dir("dspark")
needs_bundled = pytest.mark.skipif(
    not (BUNDLED / "model.safetensors").exists(), reason="no bundled DSpark checkpoint"
)
SPECTRACE_RE = re.compile(
    r"^\[SPECTRACE\] req=(\S+) pos=(\d+) k=(\d+) ns=(\d+) acc=(\d+) "
    r"draft=\[ ((?:-?\d+ )*)\] emit=\[ ((?:-?\d+ )*)\]$"
)


@pytest.fixture(scope="module")
def target():
    configure_torch(1)
    return load_model(bundled_model_dir("target"))


# ---------------------------------------------------------------------------- sampler


def test_sample_sequential_is_vllms_loop(tiny_dspark):
    """prev = anchor; bias from markov_w1[prev] @ markov_w2^T; argmax; id + d2t[id]; prev = id."""
    m = dspark.reduce_vocab(tiny_dspark(), 40)
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


def test_blocks_in_one_batch_equal_blocks_alone(tiny_dspark):
    """The training mask (several blocks per row, each seeing its own context prefix) gives the
    same head hidden states as one block at a time."""
    m = tiny_dspark()
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


def test_target_aux_hidden_taps(target, tiny_dspark):
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


def test_checkpoint_round_trip_in_the_speculators_layout(tmp_path, tiny_dspark):
    from safetensors import safe_open

    m = dspark.reduce_vocab(tiny_dspark(), 40)
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


def test_missing_flag_reads_as_speculators_default(tmp_path, tiny_dspark):
    m = tiny_dspark(sample_from_anchor=True)
    out = save_dspark(m, tmp_path / "ck", write_sample_from_anchor=False)
    assert "sample_from_anchor" not in json.loads((out / "config.json").read_text())
    assert load_dspark(out).cfg.sample_from_anchor is True
    assert (
        config_dict(tiny_dspark(sample_from_anchor=False).cfg)["speculators_config"][
            "proposal_methods"
        ][0]["speculative_tokens"]
        == K - 1
    )  # 1+N: block = anchor + k masks


def test_shared_embeddings_come_from_the_target(tmp_path, target, tiny_dspark):
    m = tiny_dspark(
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
