"""Every ``--fault`` of the reference engine, captured and diffed: the first error names it.

Each fault run and the clean runs go through the real pipeline: ``spectrace capture`` around
``python -m spectrace.engine`` (live stderr parse), then ``spectrace diff --format json
FAULT.h5 CLEAN.h5`` (ours = the fault run, theirs = clean). The first finding of severity
``error`` must be the fault's kind (``faults.FAULTS[name].kind``), and at least one figure of
the finding is checked against a value computed here, independently of the detectors, from the
raw ``VT_SPEC_TRACE`` log (own regexes), the requests files or the draft checkpoint.

All engine runs happen once, in a module fixture, two at a time. Runs use 64 output tokens, the
configuration of the real vLLM capture ``traces/vllm.h5`` (draft_model, k=4, bundled prompts):
when that file exists, every fault without ``--draft-vocab`` is also diffed against it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from spectrace.engine.faults import CONTENT_AT, FAULTS  # noqa: E402
from spectrace.engine.loader import bundled_model_dir  # noqa: E402
from spectrace.tracer.findings import KINDS  # noqa: E402

SPECTRACE = str(Path(sys.executable).parent / "spectrace")
K = 4
MAX_TOKENS = 64
DRAFT_VOCAB = 1024
VOCAB = 2048
VLLM_TRACE = Path(__file__).resolve().parents[1] / "traces" / "vllm.h5"

SPECTRACE_RE = re.compile(
    r"^\[SPECTRACE\] req=(\S+) pos=(\d+) k=(\d+) ns=(\d+) acc=(\d+) "
    r"draft=\[ ((?:-?\d+ )*)\] emit=\[ ((?:-?\d+ )*)\]$"
)
PROPOSE_RE = re.compile(
    r"^\[spec-propose\] rows=\d+ nqpr=\d+ drafts/row=\d+ "
    r"first=\[((?:-?\d+ )*)\]$"
)
UPDATE_RE = re.compile(
    r"^\[spec-update\] req=(\S+) found=\d finished=([01]) "
    r"prefill_chunk=\d drafts=(\d+)$"
)
INSTALL_RE = re.compile(r"^\[spec-install\] req=(\S+) installed=(\d+) lookahead=\d+$")


def _vocab_args(name: str) -> list[str]:
    return ["--draft-vocab", str(DRAFT_VOCAB)] if FAULTS[name].needs_draft_vocab else []


RUNS: dict[str, list[str]] = {
    "clean": [],
    "clean_vocab": ["--draft-vocab", str(DRAFT_VOCAB)],
    **{name: ["--fault", name, *_vocab_args(name)] for name in FAULTS},
}


def reference_of(name: str) -> str:
    """The clean run a fault is diffed against (same configuration but the fault)."""
    return "clean_vocab" if FAULTS[name].needs_draft_vocab else "clean"


# ---------------------------------------------------------------------------- raw log


def _ids(text: str) -> list[int]:
    return [int(t) for t in text.split()]


@dataclass
class Block:
    """One ``[SPECTRACE]`` line, with the batch row of its proposing step."""

    line: int
    req: str
    pos: int
    k: int
    ns: int
    acc: int
    draft: list[int]
    emit: list[int]
    row: int  # index of req among the proposing step's [spec-update] rows
    prev: Block | None  # the same request's previous block


@dataclass
class Run:
    name: str
    h5: Path
    lines: list[str]
    requests: dict[str, dict]
    blocks: list[Block]

    def full(self, req: str) -> list[int]:
        r = self.requests[req]
        return r["prompt_ids"] + r["output_ids"]

    def by_key(self) -> dict[tuple[str, int], Block]:
        return {(b.req, b.pos): b for b in self.blocks}

    def last_of(self, req: str) -> Block:
        return [b for b in self.blocks if b.req == req][-1]


def parse_blocks(lines: list[str]) -> list[Block]:
    """[SPECTRACE] blocks in log order. The batch rows of a step are its ``[spec-update]
    req=`` lines, printed after the propose; the next step's blocks were proposed there."""
    blocks, rows, fresh, last = [], [], False, {}
    for n, line in enumerate(lines):
        if line.startswith("[spec-update] called"):
            rows, fresh = [], True
        elif m := UPDATE_RE.match(line):
            rows.append(m.group(1))
        elif m := SPECTRACE_RE.match(line):
            req, pos, k, ns, acc, draft, emit = m.groups()
            b = Block(
                n,
                req,
                int(pos),
                int(k),
                int(ns),
                int(acc),
                _ids(draft),
                _ids(emit),
                rows.index(req),
                last.get(req),
            )
            blocks.append(b)
            last[req] = b
    assert fresh and blocks
    return blocks


def common(ours: Run, theirs: Run) -> list[tuple[Block, Block]]:
    """Block pairs at the same (request, pos) (only valid while the contents agree)."""
    tb = theirs.by_key()
    return [(b, tb[(b.req, b.pos)]) for b in ours.blocks if (b.req, b.pos) in tb]


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def runs(tmp_path_factory, capture_reference) -> dict[str, Run]:
    tmp = tmp_path_factory.mktemp("faults")

    def one(item: tuple[str, list[str]]) -> tuple[str, subprocess.CompletedProcess]:
        name, args = item
        return name, capture_reference(tmp, name, args, K, MAX_TOKENS)

    with ThreadPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(one, RUNS.items()))
    out = {}
    for name, proc in done:
        assert proc.returncode == 0, f"{name}: {proc.stderr[-2000:]}"
        lines = (tmp / f"{name}.log").read_text().splitlines()
        requests = [
            json.loads(x) for x in (tmp / f"{name}.requests.jsonl").read_text().splitlines()
        ]
        out[name] = Run(
            name, tmp / f"{name}.h5", lines, {r["req_id"]: r for r in requests}, parse_blocks(lines)
        )
    return out


def spectrace_diff(ours: Path, theirs: Path) -> dict:
    proc = subprocess.run(
        [SPECTRACE, "diff", "--format", "json", str(ours), str(theirs)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert proc.returncode == int(doc["diverged"])
    return doc


@pytest.fixture(scope="module")
def diffs(runs) -> dict[str, dict]:
    """``spectrace diff`` of every fault run against its clean run, and clean vs clean."""
    pairs = {name: (name, reference_of(name)) for name in FAULTS}
    pairs |= {
        "clean/clean": ("clean", "clean"),
        "clean_vocab/clean_vocab": ("clean_vocab", "clean_vocab"),
    }
    with ThreadPoolExecutor(max_workers=2) as pool:
        docs = pool.map(lambda p: spectrace_diff(runs[p[0]].h5, runs[p[1]].h5), pairs.values())
        return dict(zip(pairs, docs))


def errors(doc: dict) -> list[dict]:
    return [f for f in doc["findings"] if f["severity"] == "error"]


def first_error(doc: dict, kind: str) -> dict:
    errs = errors(doc)
    summary = [(f["kind"], f["message"]) for f in doc["findings"]]
    assert errs, f"no error finding; findings: {summary}"
    assert errs[0]["kind"] == kind, (
        f"first error is {errs[0]['kind']}, expected {kind}; findings: {summary}"
    )
    return errs[0]


def test_every_diff_fits_the_generated_schema_and_the_types(diffs):
    """Each fault pair's document validates against ``spectrace schema --diff`` (generated
    from the DiffResult types) and rebuilds into a DiffResult that writes it again."""
    import jsonschema

    from spectrace.tracer.diff_result import DiffResult
    from spectrace.tracer.diff_schema import SCHEMA

    for name, doc in diffs.items():
        jsonschema.validate(doc, SCHEMA)
        assert DiffResult.from_json(doc).to_json() == doc, name


# ---------------------------------------------------------------------------- registry


#: Kinds no engine fault produces (missing work, impossible values, vanilla baselines, prompt
#: drift): each is built by hand, with a clean twin, in one of CASE_FILES by the test named here.
CASE_FILES = ("test_verdicts.py", "test_prompt_drift.py", "test_replay.py")
CASE_KINDS = {
    "impossible_values": "test_accepted_above_k",
    "capture_incomplete": "test_killed_engine_is_named_in_diff_check_and_assertion",
    "requests_incomplete": "test_request_cut_short_on_one_side",
    "content_only": "test_spec_against_vanilla_with_identical_text_passes",
    "trimmed_drafts": "test_drafts_trimmed_before_verification",
    "prompt_drift": "test_drifted_prompts_are_named",
    "near_ties": "test_near_ties_by_hand",  # in test_replay.py, with the tied-drafter case
}


def test_registry_covers_every_finding_kind():
    fault_kinds = {f.kind for f in FAULTS.values()}
    assert fault_kinds.isdisjoint(CASE_KINDS)
    assert fault_kinds | set(CASE_KINDS) == set(KINDS)
    verdicts = "".join((Path(__file__).parent / name).read_text() for name in CASE_FILES)
    assert all(f"\ndef {name}(" in verdicts for name in CASE_KINDS.values())
    proc = subprocess.run(
        [sys.executable, "-m", "spectrace.engine", "--list-faults"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    assert [line.split()[0] for line in proc.stdout.splitlines()] == list(FAULTS)


def test_bad_fault_configurations_are_refused():
    for args in (
        ["--fault", "nope"],
        ["--fault", "d2t_missing"],
        ["--method", "ngram", "--fault", "layout_shift"],
        ["--method", "ngram", "--draft-vocab", "8"],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "spectrace.engine", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2 and "error:" in proc.stderr, args


# ---------------------------------------------------------------------------- clean runs


@pytest.mark.parametrize("pair", ["clean/clean", "clean_vocab/clean_vocab"])
def test_clean_against_clean_has_no_error(diffs, pair):
    doc = diffs[pair]
    assert errors(doc) == []
    assert doc["diverged"] is False


def test_faults_are_off_by_default(runs):
    """The clean run is plain greedy speculative decoding: the block invariants hold."""
    r = runs["clean"]
    for b in r.blocks:
        assert b.k == K and b.acc == b.ns - 1 and b.emit[: b.acc] == b.draft[: b.acc]
        assert r.full(b.req)[b.pos - 1] == (b.prev.emit[-1] if b.prev else r.full(b.req)[b.pos - 1])
    assert {b.row for b in r.blocks} >= {0, 1}


# ---------------------------------------------------------------------------- faults


def test_layout_shift(runs, diffs):
    f = first_error(diffs["layout_shift"], "layout_shift")
    pairs = common(runs["layout_shift"], runs["clean"])
    hits = sum(o.draft[i] == t.draft[i + 1] for o, t in pairs for i in range(K - 1))
    assert f["evidence"]["shift"] == 1  # ours[i] == theirs[i+1]
    assert f["evidence"]["paired_blocks"] == len(pairs)
    assert f["evidence"]["rate"] == pytest.approx(hits / (len(pairs) * (K - 1)))


def test_anchor_shift(runs, diffs):
    f = first_error(diffs["anchor_shift"], "anchor_shift")
    r = runs["anchor_shift"]
    # Recorded anchor position = printed pos - 1; the recorded anchor is the chain's previous
    # emit[-1] (the first block's comes from the requests file at that position).
    bad = [b for b in r.blocks if b.prev and b.prev.emit[-1] != r.full(b.req)[b.pos - 1]]
    assert f["evidence"]["shift"] == -1
    assert f["evidence"]["checked"] == len(r.blocks)
    assert f["evidence"]["blocks"] == len(bad)
    assert (f["request"], f["position"]) == (bad[0].req, bad[0].pos - 1)
    # Every anchor_shift names the faulty side, the cross-trace one too (it named ours
    # whatever the order: breaker 11); the clean twin (clean/clean) has none.
    for name, faulty in (("anchor_shift", "ours"),):
        found = [x for x in diffs[name]["findings"] if x["kind"] == "anchor_shift"]
        assert len(found) == 2 and {x["side"] for x in found} == {faulty}
    assert not [x for x in diffs["clean/clean"]["findings"] if x["kind"] == "anchor_shift"]


def test_verify_overwrite(runs, diffs):
    f = first_error(diffs["verify_overwrite"], "verified_differs")
    r = runs["verify_overwrite"]
    # Each [spec-propose] first=[...] is verified in the next step by the first row with drafts.
    changed, proposal, first_row, nxt = 0, None, None, {}
    for line in r.lines:
        if m := PROPOSE_RE.match(line):
            proposal, first_row = _ids(m.group(1)), None
        elif (
            (m := UPDATE_RE.match(line))
            and proposal is not None
            and first_row is None
            and int(m.group(3)) > 0
        ):
            first_row = m.group(1) if m.group(2) == "0" else ""
            if first_row:
                nxt[first_row] = proposal
            proposal = None
        elif (m := SPECTRACE_RE.match(line)) and m.group(1) in nxt:
            first, draft = nxt.pop(m.group(1)), _ids(m.group(6))
            anchor = r.full(m.group(1))[int(m.group(2)) - 1]  # the previous emitted token
            assert draft == first[:-1] + [anchor]  # the last slot was overwritten with it
            changed += first[-1] != anchor
    assert f["slot"] == K - 1
    assert f["evidence"]["per_slot"] == [0] * (K - 1) + [changed]
    assert f["evidence"]["blocks"] == changed > 0
    assert f["evidence"]["equals_anchor"] == 1.0


def test_k_minus_one(runs, diffs):
    f = first_error(diffs["k_minus_one"], "k_mismatch")
    assert {b.k for b in runs["k_minus_one"].blocks} == {K - 1}
    assert f["evidence"]["ours_k"] == [K - 1] and f["evidence"]["theirs_k"] == [K]
    assert f["evidence"]["typical_difference"] == -1
    assert f["evidence"]["blocks"] == len(common(runs["k_minus_one"], runs["clean"]))


def test_constant_depth(runs, diffs):
    f = first_error(diffs["constant_depth"], "constant_drafts")
    ours, clean = runs["constant_depth"].blocks, runs["clean"].blocks
    assert all(len(set(b.draft)) == 1 for b in ours)
    assert f["evidence"]["blocks"] == f["evidence"]["eligible"] == len(ours)
    assert f["evidence"]["reference_rate"] == pytest.approx(
        sum(len(set(b.draft)) == 1 for b in clean) / len(clean)
    )


def test_broken_depth(runs, diffs):
    f = first_error(diffs["broken_depth"], "depth_divergence")
    pairs = common(runs["broken_depth"], runs["clean"])
    assert all(o.draft[0] == t.draft[0] for o, t in pairs)  # slot 0 stays right
    s0 = [(o, t) for o, t in pairs if o.draft[0] == t.draft[0]]
    assert f["evidence"]["per_position"][0] == 1.0
    assert f["evidence"]["slot1_given_slot0"] == pytest.approx(
        sum(o.draft[1] == t.draft[1] for o, t in s0) / len(s0)
    )


def _draft_vocab() -> list[int]:
    """The reduced draft vocabulary, from the checkpoint: the DRAFT_VOCAB lm_head rows of
    largest L2 norm (ties to the lower id), ascending."""
    from safetensors.torch import load_file

    w = load_file(str(bundled_model_dir("draft") / "model.safetensors"))["lm_head.weight"]
    norms = (w.double() ** 2).sum(dim=1).sqrt().tolist()
    return sorted(sorted(range(len(norms)), key=lambda t: (-norms[t], t))[:DRAFT_VOCAB])


@pytest.mark.parametrize("name", ["d2t_missing", "d2t_double"])
def test_d2t(runs, diffs, name):
    f = first_error(diffs[name], "vocab_mapping")
    table = _draft_vocab()
    index = {t: i for i, t in enumerate(table)}
    # target = i + d2t[i] = table[i]; missing hands out i, double i + 2 * d2t[i] (mod vocab).
    expect = {
        "d2t_missing": lambda t: index[t],
        "d2t_double": lambda t: (2 * t - index[t]) % VOCAB,
    }[name]
    pairs = common(runs[name], runs["clean_vocab"])
    slots = [(o.draft[i], t.draft[i]) for o, t in pairs for i in range(K)]
    assert all(t in index and o == expect(t) for o, t in slots)
    differing = [(o, t) for o, t in slots if o != t]
    assert f["evidence"]["slots"] == len(differing)
    assert f["evidence"]["consistency"] == 1.0
    assert f["evidence"]["ours_max_id"] == max(o for o, _ in differing)
    if name == "d2t_missing":
        assert max(b for blk in runs[name].blocks for b in blk.draft) < DRAFT_VOCAB


def test_drop_drafts(runs, diffs):
    f = first_error(diffs["drop_drafts"], "unverified_drafts")
    r = runs["drop_drafts"]
    dropped = {
        m.group(1) for line in r.lines if (m := INSTALL_RE.match(line)) and m.group(2) == "0"
    }
    assert dropped == {b.req for b in r.blocks if b.row >= 1}  # every row >= 1 request stops
    assert set(f["evidence"]["requests_stopping"]) == dropped
    first = min((r.last_of(q) for q in dropped), key=lambda b: b.line)
    assert (f["request"], f["position"]) == (first.req, first.pos - 1)


def test_miscount(runs, diffs):
    f = first_error(diffs["miscount"], "acceptance_bookkeeping")
    r = runs["miscount"]
    # A count is excused only where the output ran out under it: the correction (emitted at
    # pos + ns - 1, VT pos being the first draft's position) lies past the output's end.
    wrong = [b for b in r.blocks if b.acc != b.ns - 1 and b.pos + b.ns - 1 < len(r.full(b.req))]
    assert all(b.acc == b.ns for b in r.blocks if b.ns - 1 < b.k)
    assert f["evidence"]["blocks"] == len(wrong) > 0
    assert f["evidence"]["recorded_total"] == sum(b.acc for b in r.blocks)


def test_stale_state(runs, diffs):
    f = first_error(diffs["stale_state"], "stale_state")
    pairs = common(runs["stale_state"], runs["clean"])
    after = [(o, t) for o, t in pairs if o.prev is not None and o.prev.acc < o.prev.k]
    other = [(o, t) for o, t in pairs if not (o.prev is not None and o.prev.acc < o.prev.k)]
    assert all(o.draft == t.draft for o, t in other)  # the context is right after full acceptance
    assert f["evidence"]["blocks_after_rejection"] == len(after)
    assert f["evidence"]["after_rejection"] == pytest.approx(
        sum(o.draft != t.draft for o, t in after) / len(after)
    )
    assert f["evidence"]["otherwise"] == 0.0


def test_batch_order(runs, diffs):
    f = first_error(diffs["batch_order"], "batch_dependence")
    pairs = common(runs["batch_order"], runs["clean"])
    low = [(o, t) for o, t in pairs if o.row == 0]
    high = [(o, t) for o, t in pairs if o.row >= 1]
    assert all(o.draft == t.draft for o, t in low)
    ev = f["evidence"]
    assert ev["by"] == "batch_row"
    assert (ev["blocks_low"], ev["blocks_high"]) == (len(low), len(high))
    assert ev["mismatch_rate_low"] == 0.0
    assert ev["mismatch_rate_high"] == pytest.approx(
        sum(o.draft != t.draft for o, t in high) / len(high)
    )


def _loop(out: list[int]) -> tuple[int, int] | None:
    """(start, period) of the shortest-period repeating tail of >= max(24, 3 * period) tokens."""
    for p in range(1, 33):
        start = len(out) - p
        while start > 0 and out[start - 1] == out[start - 1 + p]:
            start -= 1
        if len(out) - start >= max(24, 3 * p) and len(out) >= 2 * p:
            return start, p
    return None


def test_repetition(runs, diffs):
    f = first_error(diffs["repetition"], "degenerate_output")
    r = runs["repetition"]
    loops = {q: _loop(req["output_ids"]) for q, req in r.requests.items()}
    assert all(loops.values())
    q = min(r.requests, key=int)
    start, period = loops[q]
    assert f["side"] == "ours" and f["request"] == q
    assert f["position"] == len(r.requests[q]["prompt_ids"]) + start
    # One-sided loops only: a request whose clean partner loops too is the model's loop.
    clean_loops = {q for q, req in runs["clean"].requests.items() if _loop(req["output_ids"])}
    one_sided = [q for q in r.requests if q not in clean_loops]
    assert f["evidence"]["period"] == period and f["evidence"]["requests"] == len(one_sided)
    assert q in one_sided


def test_wrong_features(runs, diffs):
    f = first_error(diffs["wrong_features"], "draft_mismatch")
    pairs = common(runs["wrong_features"], runs["clean"])
    assert f["evidence"]["paired"] == len(pairs)
    assert f["evidence"]["blocks"] == sum(o.draft != t.draft for o, t in pairs)


def test_content(runs, diffs):
    f = first_error(diffs["content"], "content_divergence")
    ours, clean = runs["content"], runs["clean"]
    first_diff = {}
    for q in ours.requests:
        a, b = ours.full(q), clean.full(q)
        first_diff[q] = next(i for i in range(len(a)) if a[i] != b[i])
        assert first_diff[q] == len(ours.requests[q]["prompt_ids"]) + CONTENT_AT
    q = min(ours.requests, key=int)
    assert (f["request"], f["position"]) == (q, first_diff[q])
    assert f["evidence"]["requests"] == len(ours.requests)


# ---------------------------------------------------------------------------- real vLLM


VLLM_FAULTS = [n for n, f in FAULTS.items() if not f.needs_draft_vocab]
needs_vllm = pytest.mark.skipif(
    not VLLM_TRACE.exists(), reason=f"no real vLLM capture at {VLLM_TRACE}"
)


@needs_vllm
def test_clean_against_real_vllm_has_no_error(runs):
    doc = spectrace_diff(runs["clean"].h5, VLLM_TRACE)
    assert errors(doc) == []


@needs_vllm
@pytest.mark.parametrize("name", VLLM_FAULTS)
def test_fault_against_real_vllm(runs, name):
    first_error(spectrace_diff(runs[name].h5, VLLM_TRACE), FAULTS[name].kind)


def test_streamed_id_matrices_give_the_same_diff_at_any_chunk_size(runs, monkeypatch):
    """The diff streams the id matrices (``tracer/rows.py``) instead of loading them: with
    5 rows per chunk (nearly every block is near a chunk boundary) every fault pair's diff
    document equals the default chunking's, and no id matrix is ever loaded whole."""
    from spectrace.tracer import rows
    from spectrace.tracer.align import align
    from spectrace.tracer.diff import diff_traces
    from spectrace.tracer.store import open_trace

    def doc(name: str, other: str) -> tuple[str, list]:
        a, b = open_trace(runs[name].h5), open_trace(runs[other].h5)
        text = json.dumps(diff_traces(align(a, b), examples=None).to_json())
        loaded = [
            (t.name, col)
            for t in (a, b)
            for col in ("proposed", "verified")
            if t.blocks.loaded(col)
        ]
        return text, loaded

    pairs = [(name, reference_of(name)) for name in FAULTS] + [("clean", "clean")]
    whole = [doc(*p) for p in pairs]
    monkeypatch.setattr(rows, "ROWS", 5)
    small = [doc(*p) for p in pairs]
    for p, (w, loaded_w), (s, loaded_s) in zip(pairs, whole, small):
        assert s == w, p
        assert loaded_w == loaded_s == [], p
