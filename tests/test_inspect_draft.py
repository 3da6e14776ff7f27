"""``spectrace inspect-draft`` on DSpark checkpoints the project builds, each with one defect.

Checkpoints come from the reference engine's own writer (``spectrace.engine.dspark_ckpt
.save_dspark``, the speculators layout) on a tiny random drafter; each test plants one defect
by editing ``config.json`` or rewriting a tensor, and checks that exactly the right check
reports it (and that a clean checkpoint has no warning at all).
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from spectrace.engine.dspark import DSparkConfig, DSparkDraftModel, reduce_vocab  # noqa: E402
from spectrace.engine.dspark_ckpt import save_dspark  # noqa: E402
from spectrace.tracer import checkpoint as insp  # noqa: E402

SPECTRACE = str(Path(sys.executable).parent / "spectrace")
REPO = Path(__file__).resolve().parents[1]
V, H, HT, R, K = 256, 64, 96, 16, 4


def tiny_cfg(**kw) -> DSparkConfig:
    base = dict(
        vocab_size=V,
        draft_vocab_size=V,
        hidden_size=H,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        target_hidden_size=HT,
        aux_hidden_state_layer_ids=[1, 3],
        mask_token_id=V - 1,
        block_size=K,
        sample_from_anchor=True,
        markov_rank=R,
    )
    base.update(kw)
    return DSparkConfig(**base)


def write_target(path: Path, **kw) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": V,
        "hidden_size": HT,
        "num_hidden_layers": 4,
        "num_attention_heads": 3,
    }
    cfg.update(kw)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def build(tmp: Path, name: str = "ckpt", model: DSparkDraftModel | None = None, **kw) -> Path:
    torch.manual_seed(0)
    return save_dspark(model or DSparkDraftModel(tiny_cfg()), tmp / name, k=K, **kw)


def edit_config(ckpt: Path, drop=(), **set_) -> None:
    d = json.loads((ckpt / "config.json").read_text())
    for k in drop:
        d.pop(k, None)
    for k, v in set_.items():
        if isinstance(v, dict) and isinstance(d.get(k), dict):
            d[k].update(v)
        else:
            d[k] = v
    (ckpt / "config.json").write_text(json.dumps(d))


def edit_tensors(ckpt: Path, drop=(), **set_) -> None:
    from safetensors.torch import load_file, save_file

    f = ckpt / "model.safetensors"
    state = load_file(str(f))
    for k in drop:
        state.pop(k)
    for k, v in set_.items():
        state[k.replace("__", ".")] = v.contiguous()
    save_file(state, str(f))


def reduced_model() -> DSparkDraftModel:
    torch.manual_seed(0)
    return reduce_vocab(DSparkDraftModel(tiny_cfg()), 100)


def verdicts(
    ckpt: Path, target: Path | None = None, k: int | None = None
) -> dict[str, list[tuple[str, str]]]:
    rep = insp.inspect_draft(ckpt, target, k)
    out: dict[str, list[tuple[str, str]]] = {}
    for v in rep.verdicts:
        out.setdefault(v.check, []).append((v.level, v.message))
    return out


def levels(v: dict) -> dict[str, str]:
    """check -> worst level."""
    order = {lvl: i for i, lvl in enumerate(insp.LEVELS)}
    return {c: max((lvl for lvl, _ in vs), key=order.get) for c, vs in v.items()}


def only_problem(v: dict, check: str, level: str = "error") -> str:
    """Assert that ``check`` is the only warning/error and has ``level``; return its message."""
    bad = {c: lvl for c, lvl in levels(v).items() if lvl in ("warn", "error")}
    assert bad == {check: level}, v
    return " ".join(m for lvl, m in v[check] if lvl == level)


@pytest.fixture
def target(tmp_path) -> Path:
    return write_target(tmp_path / "target")


# ---------------------------------------------------------------------------- clean checkpoints


def test_clean_checkpoint_has_no_warning(tmp_path, target):
    v = verdicts(build(tmp_path), target)
    assert set(levels(v).values()) <= {"ok", "info"}, v
    for check in (
        "format",
        "method",
        "layout",
        "vocab",
        "d2t",
        "markov",
        "confidence",
        "aux_layers",
        "fc",
        "attention",
        "block_size",
        "embed_tokens",
        "lm_head",
        "mask_token",
    ):
        assert check in v, check


def test_clean_reduced_checkpoint(tmp_path, target):
    v = verdicts(build(tmp_path, model=reduced_model()), target)
    assert set(levels(v).values()) <= {"ok", "info"}, v
    assert "reduced draft vocabulary 100 of 256" in v["vocab"][0][1]
    assert v["d2t"][0][0] == "ok" and "unique, ascending" in v["d2t"][0][1]
    assert v["t2d"][0][0] == "ok" and "consistent with d2t" in v["t2d"][0][1]


def test_bundled_dspark_checkpoint_is_clean():
    ckpt = REPO / "engine" / "models" / "dspark"
    if not (ckpt / "config.json").exists():
        pytest.skip("no bundled DSpark checkpoint")
    p = subprocess.run(
        [
            SPECTRACE,
            "inspect-draft",
            str(ckpt),
            "--target",
            str(REPO / "engine" / "models" / "target"),
        ],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "0 errors, 0 warnings" in p.stdout


def test_reads_only_headers_and_index_tables(tmp_path, target, monkeypatch):
    """No weight data is read: only d2t and t2d go through ``read_small``."""
    seen = []
    real = insp.read_small
    for m in pkgutil.iter_modules(insp.__path__):  # every module that could call it
        mod = importlib.import_module(f"{insp.__name__}.{m.name}")
        if hasattr(mod, "read_small"):
            monkeypatch.setattr(mod, "read_small", lambda t: seen.append(t.shape) or real(t))
    ckpt = build(tmp_path, model=reduced_model())
    insp.inspect_draft(ckpt, target)
    assert sorted(seen) == [(100,), (V,)]


# ---------------------------------------------------------------------------- one defect each


def test_missing_sample_from_anchor_warns_about_vllm(tmp_path, target):
    ckpt = build(tmp_path, write_sample_from_anchor=False)
    msg = only_problem(verdicts(ckpt, target), "layout", "warn")
    assert "1+N layout" in msg and "vLLM" in msg


def test_reduced_vocab_without_d2t(tmp_path, target):
    ckpt = build(tmp_path, model=reduced_model())
    edit_tensors(ckpt, drop=["d2t", "t2d"])
    assert "without d2t" in only_problem(verdicts(ckpt, target), "d2t")


def test_d2t_out_of_range(tmp_path, target):
    m = reduced_model()
    d2t = m.d2t.clone()
    d2t[-1] += V  # the last draft id maps past the vocabulary
    ckpt = build(tmp_path, model=m)
    edit_tensors(ckpt, d2t=d2t)
    msg = only_problem(verdicts(ckpt, target), "d2t")
    assert "1 of 100 offsets map outside [0, 256)" in msg and "draft id 99" in msg


def test_d2t_duplicates(tmp_path, target):
    m = reduced_model()
    d2t = m.d2t.clone()
    d2t[1] = d2t[0] - 1  # draft ids 0 and 1 map to the same target
    ckpt = build(tmp_path, model=m)
    edit_tensors(ckpt, d2t=d2t)
    v = verdicts(ckpt, target)
    assert "1 duplicate targets" in " ".join(m for _, m in v["d2t"])
    assert levels(v)["d2t"] == "error" and levels(v)["t2d"] == "error"  # t2d no longer matches


def test_d2t_absolute_ids_instead_of_offsets(tmp_path, target):
    m = reduced_model()
    ids = m.d2t + torch.arange(100)
    ckpt = build(tmp_path, model=m)
    edit_tensors(ckpt, d2t=ids)
    v = verdicts(ckpt, target)
    msg = " ".join(m for _, m in v["d2t"])
    assert levels(v)["d2t"] == "error" and "absolute target ids, not offsets" in msg


def test_t2d_inconsistent_with_d2t(tmp_path, target):
    m = reduced_model()
    t2d = m.t2d.clone()
    on, off = int(t2d.nonzero()[0]), int((~t2d).nonzero()[0])
    t2d[on], t2d[off] = False, True  # one target id swapped for another
    ckpt = build(tmp_path, model=m)
    edit_tensors(ckpt, t2d=t2d)
    assert "do not match" in only_problem(verdicts(ckpt, target), "t2d")


def test_d2t_in_full_vocabulary(tmp_path, target):
    ckpt = build(tmp_path)
    edit_tensors(ckpt, d2t=torch.zeros(V, dtype=torch.int64))
    assert "no draft_id_to_target_id" in only_problem(verdicts(ckpt, target), "d2t")


def test_gated_markov_head(tmp_path, target):
    ckpt = build(tmp_path)
    edit_config(ckpt, markov_head_type="gated")
    edit_tensors(ckpt, markov_head__gate_proj__weight=torch.zeros(R, H + R))
    msg = only_problem(verdicts(ckpt, target), "markov")
    assert "'gated'" in msg and "only the vanilla head" in msg


def test_markov_w2_over_the_wrong_vocabulary(tmp_path, target):
    ckpt = build(tmp_path, model=reduced_model())
    edit_tensors(ckpt, markov_head__markov_w2__weight=torch.zeros(V, R))  # target vocab, not draft
    assert "markov_w2 [256, 16] != [100, 16]" in only_problem(verdicts(ckpt, target), "markov")


def test_aux_layer_past_the_target(tmp_path, tmp_path_factory):
    ckpt = build(tmp_path)
    small = write_target(tmp_path / "t2", num_hidden_layers=2)
    assert "[3] outside 0..2" in only_problem(verdicts(ckpt, small), "aux_layers")


def test_hybrid_target_layer_types(tmp_path):
    ckpt = build(tmp_path)
    hybrid = write_target(tmp_path / "hy", layer_types=["linear_attention", "full_attention"] * 2)
    msg = only_problem(verdicts(ckpt, hybrid), "aux_layers", "warn")
    assert "hybrid target (2 linear-attention, 2 full-attention layers)" in msg
    assert "1->linear_attention" in msg and "3->linear_attention" in msg
    assert "would read aux ids [2, -]" in msg


def test_fc_against_aux_count(tmp_path, target):
    ckpt = build(tmp_path)
    edit_config(ckpt, aux_hidden_state_layer_ids=[1, 2, 3])
    msg = only_problem(verdicts(ckpt, target), "fc")
    assert "3 aux ids listed but fc reads 2 taps" in msg


def test_q_proj_with_gate_rows(tmp_path, target):
    ckpt = build(tmp_path)
    edit_tensors(ckpt, layers__1__self_attn__q_proj__weight=torch.zeros(2 * 2 * 32, H))
    msg = only_problem(verdicts(ckpt, target), "attention")
    assert "layer 1: q_proj [128, 64] != [64, 64]" in msg and "attn_output_gate is false" in msg


def test_attn_output_gate_not_supported(tmp_path, target):
    ckpt = build(tmp_path)
    edit_config(ckpt, transformer_layer_config={"attn_output_gate": True})
    v = verdicts(ckpt, target)
    assert levels(v)["attention"] == "error"
    assert "has no gate rows" in v["attention"][0][1]


def test_k_larger_than_block(tmp_path, target):
    ckpt = build(tmp_path)
    assert "> 4 drafts" in only_problem(verdicts(ckpt, target, k=6), "block_size")
    assert "narrower" in only_problem(verdicts(ckpt, target, k=3), "block_size", "warn")


def test_k_in_the_bonus_layout(tmp_path, target):
    ckpt = build(tmp_path)
    edit_config(ckpt, sample_from_anchor=False)  # block 4 = anchor + 3 masks: k is 3
    assert "1+N" in only_problem(verdicts(ckpt, target), "block_size")
    assert set(levels(verdicts(ckpt, target, k=3)).values()) <= {"ok", "info"}


def test_reduced_vocab_without_lm_head(tmp_path, target):
    ckpt = build(tmp_path, model=reduced_model(), include_lm_head=False)
    assert "requires the draft's own lm_head" in only_problem(verdicts(ckpt, target), "lm_head")


def test_missing_mask_token(tmp_path, target):
    ckpt = build(tmp_path)
    edit_config(ckpt, drop=["mask_token_id"])
    assert "no mask_token_id" in only_problem(verdicts(ckpt, target), "mask_token")


def test_confidence_head_shape(tmp_path, target):
    ckpt = build(tmp_path)
    edit_config(ckpt, confidence_head_with_markov=False)  # the weights include the rank
    msg = only_problem(verdicts(ckpt, target), "confidence")
    assert "[1, 80] != [1, 64]" in msg


def test_target_hidden_mismatch(tmp_path):
    ckpt = build(tmp_path)
    other = write_target(tmp_path / "t", hidden_size=128)
    v = verdicts(ckpt, other)
    assert levels(v)["target_hidden"] == "error"


# ---------------------------------------------------------------------------- the command


def test_cli_exit_codes_and_json(tmp_path, target):
    ckpt = build(tmp_path)
    p = subprocess.run(
        [SPECTRACE, "inspect-draft", str(ckpt), "--target", str(target)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0 and p.stdout.startswith("checkpoint ")
    edit_config(ckpt, drop=["mask_token_id"])
    p = subprocess.run(
        [SPECTRACE, "inspect-draft", str(ckpt), "--target", str(target), "--format", "json"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 1
    doc = json.loads(p.stdout)
    assert doc["schema"] == "spectrace.inspect-draft/1" and doc["errors"] == 1
    p = subprocess.run(
        [SPECTRACE, "inspect-draft", str(tmp_path / "nope")], capture_output=True, text=True
    )
    assert p.returncode == 2 and p.stderr.startswith("spectrace: error:")


def test_inspector_imports_no_torch():
    code = (
        "import sys; import spectrace.tracer.checkpoint, spectrace.tracer.cli.main; "
        "assert 'torch' not in sys.modules and 'safetensors' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("vocab", [None, 0, "drop"])
def test_a_target_config_without_vocab_size_is_an_error_not_a_self_comparison(tmp_path, vocab):
    """A ``--target`` whose config names no vocabulary was compared with the draft's own
    input vocabulary ("full vocabulary 256 (= target, target config)"): the check could not
    fail. It is an error now, naming the target's config; the clean twin is
    :func:`test_clean_checkpoint_has_no_warning`."""
    ckpt = build(tmp_path)
    target = write_target(tmp_path / "t")
    cfg = json.loads((target / "config.json").read_text())
    if vocab == "drop":
        del cfg["vocab_size"]
    else:
        cfg["vocab_size"] = vocab
    (target / "config.json").write_text(json.dumps(cfg))
    msg = only_problem(verdicts(ckpt, target), "vocab")
    assert msg.startswith(f"the target config ({target}) has no vocab_size > 0")
    p = subprocess.run(
        [SPECTRACE, "inspect-draft", str(ckpt), "--target", str(target)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 1, p.stdout + p.stderr
