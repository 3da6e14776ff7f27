"""Issue 12's smaller items: the same-file notice of ``diff X X``, an imported VT log's
unknown engine and method, ``inspect-draft`` on a plain draft model, and the explanation of
a k difference (2 vs 4 is a configuration, not the anchor counted in k)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from spectrace.tracer.findings.ksize import k_reason
from spectrace.tracer.store import TraceWriter

ROOT = Path(__file__).resolve().parents[1]
SPECTRACE = os.path.join(os.path.dirname(sys.executable), "spectrace")
BUNDLED = ROOT / "traces" / "reference.h5"
VT_LOG = ROOT / "traces" / "reference.vt.log"
DRAFT, TARGET = ROOT / "engine" / "models" / "draft", ROOT / "engine" / "models" / "target"
PROMPT, OUTPUT = [1, 2, 3], list(range(10, 40))  # 30 output tokens


def run(*args):
    r = subprocess.run([SPECTRACE, *map(str, args)], capture_output=True, text=True)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def flat(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines


# ------------------------------------------------------------------------------ diff X X


def test_diff_of_a_file_with_itself_says_so(tmp_path):
    r = run("diff", BUNDLED, BUNDLED)
    assert r.returncode == 0
    note = (
        f"spectrace: note: ours and theirs are the same file ({BUNDLED}): the diff compares "
        f"the trace with itself and agrees by construction\n"
    )
    assert r.stderr == note
    link = tmp_path / "link.h5"
    link.symlink_to(BUNDLED)
    assert "same file" in run("diff", link, BUNDLED).stderr


def test_diff_of_a_copy_has_no_same_file_note(tmp_path):
    copy = tmp_path / "copy.h5"
    shutil.copy(BUNDLED, copy)
    r = run("diff", BUNDLED, copy)
    assert r.returncode == 0 and "same file" not in r.stderr


# ----------------------------------------------------------------- VT import: unknown meta


def test_vt_import_without_meta_says_engine_and_method_unknown(tmp_path):
    out = tmp_path / "vt.h5"
    assert run("import", "vt", VT_LOG, "-o", out).returncode == 0
    meta = json.loads(run("info", out, "--format", "json").stdout)["meta"]
    assert (meta["engine"], meta["method"], meta["k"]) == (None, None, 4)
    text = flat(run("info", out).stdout)
    assert "engine │ unknown (not recorded; set it with --meta engine=...)" in text
    assert "method │ unknown (not recorded; set it with --meta method=...)" in text
    head = run("diff", out, out).stdout.splitlines()[0]
    assert head == f"ours:   {out}  (engine unknown, method unknown, k=4, 139 blocks)"


def test_vt_import_with_meta_keeps_it(tmp_path):
    out = tmp_path / "vt.h5"
    r = run(
        "import",
        "vt",
        VT_LOG,
        "-o",
        out,
        "--meta",
        "engine=vllm.cpp",
        "--meta",
        "method=draft_model",
    )
    assert r.returncode == 0
    meta = json.loads(run("info", out, "--format", "json").stdout)["meta"]
    assert (meta["engine"], meta["method"]) == ("vllm.cpp", "draft_model")
    assert "unknown" not in run("info", out).stdout


# ---------------------------------------------------------------- inspect-draft: plain


def test_inspect_draft_names_the_plain_draft_model():
    r = run("inspect-draft", DRAFT, "--target", TARGET, "--format", "json")
    assert r.returncode == 0
    doc = json.loads(r.stdout)
    levels = {v["check"]: v["level"] for v in doc["verdicts"]}
    assert doc["errors"] == doc["warnings"] == 0
    assert levels["method"] == levels["tokenizer"] == levels["context"] == "ok"
    assert levels["aux_layers"] == "ok"
    method = next(v["message"] for v in doc["verdicts"] if v["check"] == "method")
    assert method.startswith(
        "plain draft model (model_type 'llama', architectures ['LlamaForCausalLM']): a "
        "standalone causal LM that vLLM runs with method 'draft_model'"
    )
    ctx = next(v["message"] for v in doc["verdicts"] if v["check"] == "context")
    assert ctx == "max_position_embeddings 512 >= the target's 512"


@pytest.fixture
def plain_copy(tmp_path):
    ckpt = tmp_path / "draft"
    shutil.copytree(DRAFT, ckpt)
    return ckpt


def test_inspect_draft_plain_twin_with_defects(plain_copy):
    cfg = json.loads((plain_copy / "config.json").read_text())
    cfg["max_position_embeddings"] = 256
    (plain_copy / "config.json").write_text(json.dumps(cfg))
    tok = json.loads((plain_copy / "tokenizer.json").read_text())
    tok["added_tokens"] = tok.get("added_tokens", []) + [{"id": 1, "content": "<x>"}]
    (plain_copy / "tokenizer.json").write_text(json.dumps(tok))
    doc = json.loads(
        run("inspect-draft", plain_copy, "--target", TARGET, "--format", "json").stdout
    )
    by = {v["check"]: (v["level"], v["message"]) for v in doc["verdicts"]}
    assert by["context"] == (
        "warn",
        "max_position_embeddings 256 < the target's 512: positions past 256 lie outside the "
        "draft's trained context",
    )
    assert by["tokenizer"][0] == "warn"
    assert doc["warnings"] == 2 and doc["errors"] == 0


def test_inspect_draft_unknown_format_is_still_an_error(plain_copy):
    cfg = json.loads((plain_copy / "config.json").read_text())
    cfg["architectures"] = ["LlamaModel"]  # a backbone, no LM head: not a draft model
    (plain_copy / "config.json").write_text(json.dumps(cfg))
    r = run("inspect-draft", plain_copy)
    assert r.returncode == 1 and "unknown draft format" in r.stdout


# --------------------------------------------------------------------------- k_mismatch


def test_k_reason_by_hand():
    assert k_reason(2, 4, 2, 4).startswith(
        "the runs draft 2 and 4 tokens per block (/meta k: ours 2, theirs 4): they are "
        "configured with different k (num_speculative_tokens), not off by the anchor"
    )
    assert k_reason(3, 4, 4, 4) == (
        "ours proposes 3 = k - 1 drafts although configured with k=4: it counts the anchor in k"
    )
    assert k_reason(3, 4, None, None) == (
        "a difference of one draft (/meta k: ours ?, theirs ?): either one side counts the "
        "anchor in k (k - 1 drafts) or the runs are configured with k=3 and k=4"
    )


def test_k_reason_of_runs_configured_alike_names_the_side_that_drafts_less():
    # /meta k 4 on both sides, theirs proposes 0 (drafts never installed) or 2 (dropped):
    # not "configured with different k" (breaker 7: the old clause quoted k 4 vs 4)
    assert k_reason(4, 0, 4, 4) == (
        "both runs are configured with k=4, but theirs proposes 0: its drafter proposes "
        "fewer drafts than configured (0: none installed; else dropped or trimmed before "
        "verification), not a k setting"
    )
    assert k_reason(2, 4, 4, 4).startswith("both runs are configured with k=4, but ours proposes 2")
    assert k_reason(5, 4, 4, 4) == (
        "both runs are configured with k=4, but ours proposes 5: more drafts than configured "
        "(its drafter does not read num_speculative_tokens)"
    )
    # twin: configured differently, the clause is unchanged
    assert "configured with different k" in k_reason(4, 0, 4, 8)


def write(path, k: int):
    """One request; at every position a block of k wrong drafts 1000, 1001, ... (nothing
    accepted): both sides draft from every anchor, their first slots agree, k differs."""
    with TraceWriter(path, {"k": k, "engine": path.stem}, flush_interval=0) as w:
        seq = PROMPT + OUTPUT
        w.request("r", prompt_ids=PROMPT, output_ids=OUTPUT, finish_reason="length")
        for step, pos in enumerate(range(len(PROMPT) - 1, len(seq) - 1)):
            d = [1000 + j for j in range(k)]
            w.add_block("r", step, pos, seq[pos], d, verified=d, accepted=0, emitted=[seq[pos + 1]])
    return path


def test_k_two_vs_four_is_a_configuration(tmp_path):
    a, b = write(tmp_path / "a.h5", 2), write(tmp_path / "b.h5", 4)
    r = run("diff", a, b, "--format", "json")
    assert r.returncode == 1
    f = json.loads(r.stdout)["findings"][0]
    # Anchors 2..31 on both sides: 30 paired blocks, every one with k 2 vs 4.
    assert (f["kind"], f["request"], f["position"]) == ("k_mismatch", "r", 2)
    assert f["evidence"] == {"blocks": 30, "typical_difference": -2, "ours_k": [2], "theirs_k": [4]}
    assert f["message"] == (
        "k differs in 30 of 30 paired blocks: ours proposes 2 fewer draft ids than theirs "
        "(ours k=2, theirs k=4 at the first); the runs draft 2 and 4 tokens per block (/meta "
        "k: ours 2, theirs 4): they are configured with different k (num_speculative_tokens), "
        "not off by the anchor (that shifts k by one); compare runs of one k"
    )


def test_k_equal_twin_has_no_k_mismatch(tmp_path):
    a, b = write(tmp_path / "a.h5", 4), write(tmp_path / "b.h5", 4)
    r = run("diff", a, b, "--format", "json")
    assert r.returncode == 0
    assert not json.loads(r.stdout)["findings"]
