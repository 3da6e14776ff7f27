"""The reference engine (`python -m spectrace.engine`) against independent computations.

The engine runs in a subprocess, as spectrace drives it. Its stderr is parsed here with simple
regexes written for this file (not with spectrace's parser), and every expected value comes from
an independent computation: a plain transformers greedy loop for the target and the draft, and
a brute-force n-gram lookup.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from spectrace.engine import vt_trace  # noqa: E402
from spectrace.engine.drafters import ngram_lookup  # noqa: E402
from spectrace.engine.loader import bundled_model_dir, bundled_prompts_path  # noqa: E402

MAX_TOKENS = 16
K = 4
NUM_PROMPTS = 2

SPECTRACE_RE = re.compile(
    r"^\[SPECTRACE\] req=(\S+) pos=(\d+) k=(\d+) ns=(\d+) acc=(\d+) draft=\[ ((?:-?\d+ )*)\] emit=\[ ((?:-?\d+ )*)\]$"
)
FAMILY_RES = {
    "sched": re.compile(
        r"^\[spec-sched\] req=(\S+) have=(\d+) num_new=(\d+) computed=(\d+) NumTokens=(\d+) placeholders=(\d+) -> sched=(\d+)$"
    ),
    "verify": SPECTRACE_RE,
    "phase": re.compile(
        r"^\[spec-phase\] pre=(\d+\.\d\d)ms backbone=(\d+\.\d\d)ms sample=(\d+\.\d\d)ms logits=(\d+)$"
    ),
    "propose": re.compile(
        r"^\[spec-propose\] rows=(\d+) nqpr=(\d+) drafts/row=(\d+) first=\[((?:\d+ )*)\]$"
    ),
    "post_step": re.compile(r"^\[spec-post_step\] pulled=1 rows=(\d+)$"),
    "called": re.compile(r"^\[spec-update\] called n=(\d+)$"),
    "update": re.compile(
        r"^\[spec-update\] req=(\S+) found=1 finished=([01]) prefill_chunk=0 drafts=(\d+)$"
    ),
    "install": re.compile(r"^\[spec-install\] req=(\S+) installed=(\d+) lookahead=(\d+)$"),
}
# One engine step, as family letters: sched* verify* [phase propose] post_step called (update install?)*
STEP_ORDER_RE = re.compile(r"(S*V*(?:HP)?TC(?:UI?)+)+")
LETTER = {
    "sched": "S",
    "verify": "V",
    "phase": "H",
    "propose": "P",
    "post_step": "T",
    "called": "C",
    "update": "U",
    "install": "I",
}
PROBE_FAMILIES = {"sched", "post_step", "called", "update", "install"}


# ---------------------------------------------------------------------------- helpers


def ids(text: str) -> list[int]:
    return [int(t) for t in text.split()]


def classify(line: str) -> tuple[str, re.Match]:
    for name, rx in FAMILY_RES.items():
        m = rx.match(line)
        if m:
            return name, m
    raise AssertionError(f"unexpected stderr line: {line!r}")


def run_engine(
    tmp_path: Path,
    method: str,
    env_value: str | None,
    extra: list[str] = (),
    num_prompts: int = NUM_PROMPTS,
    max_tokens: int = MAX_TOKENS,
):
    """Run the engine on the first `num_prompts` bundled prompts; returns (requests, stderr lines)."""
    prompts = tmp_path / f"prompts_{method}.jsonl"
    prompts.write_text(
        "".join(bundled_prompts_path().read_text().splitlines(keepends=True)[:num_prompts])
    )
    out = tmp_path / f"requests_{method}_{env_value}.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "VT_SPEC_TRACE"}
    if env_value is not None:
        env["VT_SPEC_TRACE"] = env_value
    cmd = [
        sys.executable,
        "-m",
        "spectrace.engine",
        "--method",
        method,
        "--k",
        str(K),
        "--max-tokens",
        str(max_tokens),
        "--prompts",
        str(prompts),
        "--requests-out",
        str(out),
        *extra,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == num_prompts
    requests = [json.loads(line) for line in out.read_text().splitlines()]
    return requests, proc.stderr.splitlines()


def blocks_by_req(lines: list[str]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for line in lines:
        m = SPECTRACE_RE.match(line)
        if m:
            req, pos, k, ns, acc, draft, emit = m.groups()
            out.setdefault(req, []).append(
                dict(
                    pos=int(pos),
                    k=int(k),
                    ns=int(ns),
                    acc=int(acc),
                    draft=ids(draft),
                    emit=ids(emit),
                )
            )
    return out


def greedy(model, prefix: list[int], n: int) -> list[int]:
    """n greedy tokens after prefix, one full forward per token (no KV cache)."""
    seq = list(prefix)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(torch.argmax(model(input_ids=torch.tensor([seq])).logits[0, -1])))
    return seq[len(prefix) :]


def brute_ngram(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """Longest suffix n-gram (max_n..min_n) that also occurs earlier; earliest occurrence wins."""
    total = len(tokens)
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = tokens[total - n :]
        for start in range(0, total - n):
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(1)  # the engine's default; GEMM results may depend on it
    load = transformers.LlamaForCausalLM.from_pretrained
    return {
        name: load(bundled_model_dir(name), dtype=torch.float32).eval()
        for name in ("target", "draft")
    }


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("engine")


@pytest.fixture(scope="module")
def draft_run(module_tmp):
    return run_engine(module_tmp, "draft_model", "1")


@pytest.fixture(scope="module")
def ngram_run(module_tmp):
    # --batch-size 1 exercises the waiting queue: requests run one after the other.
    return run_engine(module_tmp, "ngram", "1", ["--batch-size", "1"])


def expected_blocks(
    full: list[int], prompt_len: int, max_tokens: int, propose
) -> list[tuple[int, list[int]]]:
    """(pos, drafts) of every verified block, replayed from the final stream.

    After prefill the context holds prompt + 1 token; a step with drafts emits acc + 1 tokens
    (acc = drafts matching the stream), a step without drafts emits one token.
    """
    blocks, length = [], prompt_len + 1
    while length - prompt_len < max_tokens:
        drafts = propose(full[:length])
        if drafts:
            acc = 0
            while acc < len(drafts) and drafts[acc] == full[length + acc]:
                acc += 1
            blocks.append((length, drafts))
            length += acc + 1
        else:
            length += 1
    return blocks


# ---------------------------------------------------------------------------- tests


@pytest.mark.parametrize("run", ["draft_run", "ngram_run"])
def test_lines_parse_and_follow_step_order(run, request):
    """Every stderr line is a known family in the exact format; steps follow §2.9's order."""
    _, lines = request.getfixturevalue(run)
    letters = "".join(LETTER[classify(line)[0]] for line in lines)
    assert STEP_ORDER_RE.fullmatch(letters), letters
    assert ("H" in letters) == (run == "draft_run")  # ngram prints no propose-side lines


@pytest.mark.parametrize("run", ["draft_run", "ngram_run"])
def test_output_is_plain_greedy_of_the_target(run, request, models):
    """Speculation is lossless: output_ids equal a straightforward greedy loop of the target."""
    requests, _ = request.getfixturevalue(run)
    for i, req in enumerate(requests):
        assert req["req_id"] == str(i)
        assert req["finish_reason"] == "length"
        assert len(req["output_ids"]) == MAX_TOKENS
        assert req["output_ids"] == greedy(models["target"], req["prompt_ids"], MAX_TOKENS)


@pytest.mark.parametrize("run", ["draft_run", "ngram_run"])
def test_block_invariants(run, request):
    """emit[:acc] == draft[:acc], len(emit) == ns == acc + 1, the anchor is full[pos-1] ==
    previous emit[-1], emit agrees with the stream, and (draft_model) pos' = pos + ns."""
    requests, lines = request.getfixturevalue(run)
    blocks = blocks_by_req(lines)
    assert set(blocks) == {r["req_id"] for r in requests}
    for req in requests:
        full = req["prompt_ids"] + req["output_ids"]
        prev = None
        for b in blocks[req["req_id"]]:
            assert b["k"] == len(b["draft"]) and 1 <= b["k"] <= K
            assert len(b["emit"]) == b["ns"] and b["acc"] == b["ns"] - 1
            assert b["emit"][: b["acc"]] == b["draft"][: b["acc"]]
            if b["acc"] < b["k"]:
                assert b["emit"][b["acc"]] != b["draft"][b["acc"]]
            assert (
                full[b["pos"] : b["pos"] + b["ns"]] == b["emit"][: len(full) - b["pos"]]
            )  # trimmed at max_tokens
            if prev is not None:
                assert full[b["pos"] - 1] == prev["emit"][-1] or b["pos"] > prev["pos"] + prev["ns"]
                if run == "draft_run":
                    assert b["pos"] == prev["pos"] + prev["ns"]
                else:
                    assert (
                        b["pos"] >= prev["pos"] + prev["ns"]
                    )  # gaps are plain decodes (no drafts)
            prev = b
        if run == "draft_run":
            assert prev["pos"] + prev["ns"] >= len(full)  # the last block reaches max_tokens


def test_draft_model_proposals_and_acceptance(draft_run, models):
    """Drafts equal the draft model's own greedy continuation of full[:pos]; accepted totals
    equal the number of leading drafts that match the greedy stream."""
    requests, lines = draft_run
    blocks = blocks_by_req(lines)
    accepted = expected_accepted = drafted = 0
    for req in requests:
        full = req["prompt_ids"] + req["output_ids"]
        full = full + greedy(models["target"], full, K)  # the stream continues past max_tokens
        exp = expected_blocks(
            full, len(req["prompt_ids"]), MAX_TOKENS, lambda ctx: greedy(models["draft"], ctx, K)
        )
        got = blocks[req["req_id"]]
        assert [(b["pos"], b["draft"]) for b in got] == exp
        for b in got:
            m = 0
            while m < b["k"] and b["draft"][m] == full[b["pos"] + m]:
                m += 1
            expected_accepted += m
            accepted += b["acc"]
            drafted += b["k"]
    assert accepted == expected_accepted
    assert 0 < accepted < drafted  # the bundled draft is useful but imperfect


def test_propose_first_joins_next_verify(draft_run):
    """`[spec-propose] first=` of a step equals the drafts that the first batch row (the first
    `[spec-update] req=` line of that step) verifies in its next block, unless it finished."""
    _, lines = draft_run
    first = None  # drafts of the first proposing row, until its request is known
    expect: dict[str, list[int]] = {}  # req -> drafts its next block must verify
    joined = 0
    for line in lines:
        name, m = classify(line)
        if name == "propose":
            rows, nqpr, per_row, ids_text = m.groups()
            assert int(nqpr) == K and int(per_row) == K == len(ids(ids_text))
            first = ids(ids_text)
        elif name == "phase":
            assert int(m.group(4)) % (K * 2048) == 0  # logits = rows * k * vocab
        elif name == "update" and first is not None:
            req, finished, drafts = m.groups()
            assert int(drafts) == K
            if finished == "0":
                expect[req] = first
            first = None
        elif name == "verify" and m.group(1) in expect:
            assert ids(m.group(6)) == expect.pop(m.group(1))
            joined += 1
    assert joined > 0 and not expect


def test_ngram_proposals_match_brute_force(ngram_run):
    """Every ngram block (and every step without one) is what a brute-force lookup predicts."""
    requests, lines = ngram_run
    blocks = blocks_by_req(lines)
    for req in requests:
        full = req["prompt_ids"] + req["output_ids"]
        full = full + [-1] * K  # past max_tokens only the block boundaries matter, not the ids
        exp = expected_blocks(
            full, len(req["prompt_ids"]), MAX_TOKENS, lambda ctx: brute_ngram(ctx, 1, 3, K)
        )
        assert [(b["pos"], b["draft"]) for b in blocks[req["req_id"]]] == exp


def test_ngram_lookup_equals_brute_force_on_random_sequences():
    """The numba port agrees with the brute force, including short and empty results."""
    gen = torch.Generator().manual_seed(0)
    for _trial in range(3000):
        n = int(torch.randint(1, 30, (1,), generator=gen))
        vocab = int(torch.randint(2, 6, (1,), generator=gen))
        seq = torch.randint(0, vocab, (n,), generator=gen).tolist()
        lo = int(torch.randint(1, 4, (1,), generator=gen))
        hi = lo + int(torch.randint(0, 3, (1,), generator=gen))
        assert ngram_lookup(seq, lo, hi, K, 512) == brute_ngram(seq, lo, hi, K), (seq, lo, hi)
    assert ngram_lookup([1, 2, 3, 1, 2], 1, 3, 4, 512) == [3, 1, 2]
    assert ngram_lookup([1, 2, 3, 1, 2], 1, 3, 4, 6) == [
        3
    ]  # room for one token before max_model_len
    assert ngram_lookup([5, 6, 7], 1, 3, 4, 512) == []


@pytest.mark.parametrize("value", ["0", ""])
def test_zero_or_empty_prints_only_probe_families(module_tmp, value):
    """VT_SPEC_TRACE=0 or empty: the scheduler/engine-core probes only, no runner lines."""
    _, lines = run_engine(module_tmp, "draft_model", value, num_prompts=1, max_tokens=6)
    families = {classify(line)[0] for line in lines}
    assert families == PROBE_FAMILIES


def test_unset_prints_nothing(module_tmp):
    _, lines = run_engine(module_tmp, "ngram", None, num_prompts=1, max_tokens=6)
    assert lines == []


@pytest.mark.parametrize(
    "value,verify,level,probes",
    [
        (None, False, 0, False),
        ("", False, 0, True),
        ("0", False, 0, True),
        ("01", False, 0, True),
        ("1", True, 1, True),
        ("2", True, 2, True),
        ("yes", True, 1, True),
        ("-1", True, 1, True),
        (" 3x", True, 3, True),
    ],
)
def test_latch_semantics(monkeypatch, value, verify, level, probes):
    """§1 of the reference page: verify latch, propose level (atoi, <= 0 -> 1), probes on any value."""
    if value is None:
        monkeypatch.delenv("VT_SPEC_TRACE", raising=False)
    else:
        monkeypatch.setenv("VT_SPEC_TRACE", value)
    vt_trace.reset_latches()
    try:
        assert (vt_trace.verify_enabled(), vt_trace.propose_level(), vt_trace.probes_enabled()) == (
            verify,
            level,
            probes,
        )
        monkeypatch.setenv("VT_SPEC_TRACE", "5")  # latched: later changes are ignored
        assert vt_trace.propose_level() == level
    finally:
        vt_trace.reset_latches()


def test_id_list_formats():
    assert vt_trace.spaced_ids([6, 18]) == "[ 6 18 ]" and vt_trace.spaced_ids([]) == "[ ]"
    assert vt_trace.tight_ids([13, 198]) == "[13 198 ]"
