"""Alignment and diff on traces simulated by an independent greedy spec-decode loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from spectrace.tracer.align import align
from spectrace.tracer.compare import NO_DIVERGENCE
from spectrace.tracer.diff import SCHEMA, diff_traces
from spectrace.tracer.diff_result import ContentDivergence
from spectrace.tracer.metrics import recompute_accepted, trace_summary
from spectrace.tracer.store import TraceWriter, open_trace

SPECTRACE = os.path.join(os.path.dirname(sys.executable), "spectrace")
K = 3


def simulate(writer, req_id, prompt, output, drafter, miscount=None):
    """Greedy speculative decoding over a known output: returns the anchor positions."""
    seq = list(prompt) + list(output)
    writer.request(req_id, prompt_ids=prompt, output_ids=output, finish_reason="length")
    pos, step, positions = len(prompt) - 1, 0, []
    while pos + 1 < len(seq):
        drafts = drafter(seq, pos)
        acc = 0
        while acc < len(drafts) and pos + 1 + acc < len(seq) and drafts[acc] == seq[pos + 1 + acc]:
            acc += 1
        recorded = acc if miscount is None or step != miscount else acc + 1
        writer.add_block(
            req_id,
            step,
            pos,
            seq[pos],
            drafts,
            verified=drafts,
            accepted=recorded,
            emitted=seq[pos + 1 : pos + 2 + acc],
        )
        positions.append(pos)
        pos, step = pos + acc + 1, step + 1
    return positions


PROMPT = [1, 2, 3]
OUTPUT = list(range(10, 30))  # 20 output tokens


def oracle(good_slots, truth=PROMPT + OUTPUT):
    """Drafts equal to a fixed reference text in the given slots, a wrong id elsewhere.

    Like a real drafter it depends only on the anchor position, never on the output.
    """

    def drafter(seq, pos):
        out = []
        for j in range(K):
            true = truth[pos + 1 + j] if pos + 1 + j < len(truth) else 0
            out.append(true if j in good_slots(pos) else 1000 + j)
        return out

    return drafter


def make(path, req_id, drafter, output=OUTPUT, prompt=PROMPT, miscount=None):
    with TraceWriter(path, {"k": K, "engine": req_id}, flush_interval=0) as w:
        pos = simulate(w, req_id, prompt, output, drafter, miscount=miscount)
    return pos


def test_identical_traces_agree(tmp_path):
    full = oracle(lambda p: {0, 1} if p % 2 else {0})
    pa = make(tmp_path / "a.h5", "ours-0", full)
    make(tmp_path / "b.h5", "theirs-0", full)
    al = align(open_trace(tmp_path / "a.h5"), open_trace(tmp_path / "b.h5"))
    assert al.matched_by == ["prompt"]  # different ids, same prompt
    assert al.divergence.tolist() == [NO_DIVERGENCE]
    r = diff_traces(al)
    assert not r.diverged
    assert r.agreement.paired_blocks == len(pa)
    assert r.agreement.exact_matches == len(pa)
    assert r.coverage.ours_coverage == 1.0
    out = subprocess.run(
        [SPECTRACE, "diff", str(tmp_path / "a.h5"), str(tmp_path / "b.h5")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "no divergence" in out.stdout


def test_pairs_only_common_anchor_positions(tmp_path):
    # Ours accepts slot 0 only (advance 2), theirs accepts everything (advance 4).
    pa = make(tmp_path / "a.h5", "a", oracle(lambda p: {0}))
    pb = make(tmp_path / "b.h5", "b", oracle(lambda p: {0, 1, 2}))
    common = sorted(set(pa) & set(pb))
    assert pa == list(range(2, 21, 2)) and pb == [2, 6, 10, 14, 18]
    r = diff_traces(align(open_trace(tmp_path / "a.h5"), open_trace(tmp_path / "b.h5")))
    assert r.agreement.paired_blocks == len(common) == 5
    assert r.coverage.ours_coverage == 5 / 10
    assert r.coverage.theirs_coverage == 1.0
    # The proposals differ in slots 1 and 2 of every paired block.
    assert r.agreement.exact_matches == 0
    assert r.agreement.per_position == [1.0, 0.0, 0.0]
    assert r.agreement.mean_common_prefix == 1.0
    assert r.diverged
    acc = r.acceptance
    assert acc.ours.all_content.recorded.accepted_tokens == 10
    assert acc.theirs.all_content.recorded.accepted_tokens == 5 * 3
    assert acc.ours.all_content.recorded.mean_acceptance_length == 2.0


def test_content_divergence_excludes_later_blocks(tmp_path):
    good = oracle(lambda p: {0, 1, 2})
    make(tmp_path / "a.h5", "a", good)
    other = OUTPUT[:9] + [99] + OUTPUT[10:]  # differs at output index 9
    pb = make(tmp_path / "b.h5", "b", good, output=other)
    al = align(open_trace(tmp_path / "a.h5"), open_trace(tmp_path / "b.h5"))
    d = len(PROMPT) + 9
    assert al.divergence.tolist() == [d]
    r = diff_traces(al)
    assert r.content_divergence == [
        ContentDivergence(
            ours_req="a",
            theirs_req="b",
            position=d,
            prompt_len=3,
            ours_token=OUTPUT[9],
            theirs_token=99,
        )
    ]
    assert r.coverage.theirs_on_matched_content == sum(p < d for p in pb) == 3
    assert r.agreement.paired_blocks == 3
    # The paired blocks agree, but differing content is an error finding of its own.
    assert [(f.kind, f.severity, f.position) for f in r.findings] == [
        ("content_divergence", "error", d)
    ]
    assert r.diverged


def test_recomputed_acceptance_exposes_miscount(tmp_path):
    make(tmp_path / "a.h5", "a", oracle(lambda p: {0}), miscount=2)
    t = open_trace(tmp_path / "a.h5")
    rec, recomp = t.blocks.accepted, recompute_accepted(t)
    assert (rec != recomp).nonzero()[0].tolist() == [2]
    s = trace_summary(t)
    assert s["recorded"]["accepted_tokens"] == s["recomputed"]["accepted_tokens"] + 1


def test_requests_match_by_prompt_regardless_of_order(tmp_path):
    d = oracle(lambda p: {0})
    with TraceWriter(tmp_path / "a.h5", {"k": K}, flush_interval=0) as w:
        simulate(w, "x", [1, 2], OUTPUT, d)
        simulate(w, "y", [4, 5], OUTPUT, d)
    with TraceWriter(tmp_path / "b.h5", {"k": K}, flush_interval=0) as w:
        simulate(w, "q", [4, 5], OUTPUT, d)
        simulate(w, "p", [1, 2], OUTPUT, d)
        simulate(w, "z", [7, 7], OUTPUT, d)
    al = align(open_trace(tmp_path / "a.h5"), open_trace(tmp_path / "b.h5"))
    assert al.req_a.tolist() == [0, 1] and al.req_b.tolist() == [1, 0]
    assert al.unmatched_b.tolist() == [2]
    r = diff_traces(al)
    assert r.requests.unmatched_theirs == ["z"]
    # The reference text is offset for 2-token prompts: nothing accepted, one block per token.
    assert r.agreement.exact_matches == r.agreement.paired_blocks == 2 * 20


def test_json_output_and_exit_code(tmp_path):
    make(tmp_path / "a.h5", "a", oracle(lambda p: {0}))
    make(tmp_path / "b.h5", "b", oracle(lambda p: {1}))
    out = subprocess.run(
        [SPECTRACE, "diff", "--format", "json", str(tmp_path / "a.h5"), str(tmp_path / "b.h5")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1
    doc = json.loads(out.stdout)
    assert doc["schema"] == SCHEMA and doc["diverged"] is True
    ex = doc["examples"][0]
    assert ex["position"] == 2 and ex["first_differing_slot"] == 0
    assert ex["ours"] == [OUTPUT[0], 1001, 1002] and ex["theirs"] == [1000, OUTPUT[1], 1002]


def test_vectorised_pairing_scales(tmp_path):
    """200k blocks per side pair up exactly (keys, not loops)."""
    n = 200_000
    rng = np.random.default_rng(1)
    prop = rng.integers(0, 50, (n, 4)).astype(np.int32)
    for name, p in (("a", prop), ("b", prop.copy())):
        with TraceWriter(tmp_path / f"{name}.h5", {"k": 4}, flush_interval=0) as w:
            for r in range(4):
                w.request(f"r{r}", prompt_ids=[r])
            w.add_blocks(
                {
                    "request": np.arange(n) % 4,
                    "position": np.arange(n) // 4 + 1,
                    "anchor": np.zeros(n),
                    "k": np.full(n, 4),
                    "proposed": p,
                    "accepted": np.zeros(n),
                }
            )
    r = diff_traces(align(open_trace(tmp_path / "a.h5"), open_trace(tmp_path / "b.h5")))
    assert r.agreement.paired_blocks == n and r.agreement.exact_matches == n


def test_json_output_validates_against_its_schema(tmp_path):
    """The documented schema (``spectrace schema --diff``) holds for real output."""
    import jsonschema

    make(tmp_path / "a.h5", "a", oracle(lambda p: {0}))
    other = OUTPUT[:5] + [77] + OUTPUT[6:]
    make(tmp_path / "b.h5", "b", oracle(lambda p: {1}), output=other)
    out = subprocess.run(
        [SPECTRACE, "diff", "--format", "json", str(tmp_path / "a.h5"), str(tmp_path / "b.h5")],
        capture_output=True,
        text=True,
    )
    doc = json.loads(out.stdout)
    assert doc["findings"] and doc["content_divergence"] and doc["examples"]
    schema = json.loads(
        subprocess.run(
            [SPECTRACE, "schema", "--diff"], capture_output=True, text=True, check=True
        ).stdout
    )
    jsonschema.validate(doc, schema)
    doc["findings"][0]["kind"] = "not_a_kind"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, schema)


def test_text_report_lists_ten_content_divergences(tmp_path):
    # 12 requests whose outputs differ from output token 5 on: ten lines, then a count.
    full = oracle(lambda p: {0})
    for side, bump in (("a", 0), ("b", 1)):
        with TraceWriter(tmp_path / f"{side}.h5", {"k": K, "engine": side}, flush_interval=0) as w:
            for r in range(12):
                out = OUTPUT[:5] + [t + bump for t in OUTPUT[5:]]
                simulate(w, f"{side}-{r}", [r + 100] + PROMPT, out, full)
    out = subprocess.run(
        [SPECTRACE, "diff", str(tmp_path / "a.h5"), str(tmp_path / "b.h5")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1, out.stderr
    lines = out.stdout.splitlines()
    listed = [ln for ln in lines if ln.startswith("  content diverges: ")]
    assert len(listed) == 10
    assert listed[0].startswith(
        "  content diverges: request a-0 / b-0 at position 9 (output token 5): ours 15, theirs 16"
    )
    assert "  ... and 2 more requests diverge (--format json lists every one)" in lines
    doc = json.loads(
        subprocess.run(
            [SPECTRACE, "diff", "--format", "json", str(tmp_path / "a.h5"), str(tmp_path / "b.h5")],
            capture_output=True,
            text=True,
        ).stdout
    )
    assert len(doc["content_divergence"]) == 12


def test_reader_leaving_early_keeps_the_verdict(tmp_path):
    # `spectrace diff A B | head -1`: the exit status stays the verdict (0 agree, 1 diverged),
    # not an error about the closed pipe.
    full = oracle(lambda p: {0})
    make(tmp_path / "a.h5", "a-0", full)
    make(tmp_path / "b.h5", "b-0", full)
    make(tmp_path / "c.h5", "c-0", oracle(lambda p: set()))  # every draft differs
    for other, verdict in (("b", 0), ("c", 1)):
        for fmt in ("text", "json"):
            p = subprocess.Popen(
                [
                    SPECTRACE,
                    "diff",
                    "--format",
                    fmt,
                    str(tmp_path / "a.h5"),
                    str(tmp_path / f"{other}.h5"),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            p.stdout.read(1)
            p.stdout.close()  # the reader leaves after one byte
            assert p.wait(timeout=60) == verdict, (other, fmt, p.stderr.read())
            p.stderr.close()


def test_acceptance_figures_match_a_direct_count():
    # Random blocks with unknown (-1) and absurd (30000, a garbage record) accepted counts;
    # the figures are recounted here by hand. A block whose target verified no draft
    # (verified 0) is no verified block (vLLM's num_drafts skips it); -1 (unknown) counts.
    from spectrace.tracer.metrics import acceptance

    rng = np.random.default_rng(7)
    acc = rng.integers(-1, 5, 1000).astype(np.int16)
    acc[17] = 30000
    ver = rng.integers(-1, 5, 1000).astype(np.int64)
    got = acceptance(acc, ver, kmax=4)
    known = (acc >= 0) & (ver != 0)
    assert got["blocks"] == int(known.sum())
    assert got["accepted_tokens"] == int(acc[known].astype(np.int64).sum())
    assert got["verified_tokens"] == int(np.maximum(ver[known], 0).sum())
    assert got["per_position"] == [float((acc[known] > i).mean()) for i in range(4)]
    default = acceptance(acc, ver)  # kmax = the largest verified count of known blocks
    assert len(default["per_position"]) == int(np.maximum(ver[known], 0).max())


def test_nothing_compared_is_never_a_pass(tmp_path):
    # An empty trace (a capture that recorded nothing) or a trace of another job "agrees" with
    # nothing: exit 1, with the reason in one line.
    make(tmp_path / "a.h5", "a-0", oracle(lambda p: {0}))
    with TraceWriter(tmp_path / "empty.h5", {"k": K}, flush_interval=0):
        pass
    make(tmp_path / "other.h5", "o-0", oracle(lambda p: {0}), prompt=[7, 7, 7])
    cases = [
        ("empty.h5", "a.h5", "ours has no draft blocks: nothing to compare"),
        ("a.h5", "empty.h5", "theirs has no draft blocks: nothing to compare"),
        (
            "a.h5",
            "other.h5",
            "no request of ours matches one of theirs (compare the "
            "prompts): the traces are of different jobs",
        ),
    ]
    for ours, theirs, reason in cases:
        r = diff_traces(align(open_trace(tmp_path / ours), open_trace(tmp_path / theirs)))
        want = [reason]
        if "empty.h5" in (ours, theirs):  # no request either: capture_incomplete, first
            want.insert(0, "1 error finding, first: capture_incomplete")
        assert r.diverged and r.reasons == want, (ours, theirs, r.reasons)
        out = subprocess.run(
            [SPECTRACE, "diff", str(tmp_path / ours), str(tmp_path / theirs)],
            capture_output=True,
            text=True,
        )
        assert out.returncode == 1, out.stderr
        assert reason in out.stdout


TRACES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "traces")


def _diff_json(a, b) -> dict:
    out = subprocess.run(
        [SPECTRACE, "diff", "--format", "json", str(a), str(b)], capture_output=True, text=True
    )
    assert out.returncode in (0, 1), out.stderr
    return json.loads(out.stdout)


def test_generated_schema_holds_for_bundled_and_faulty_pairs(tmp_path):
    """``spectrace schema --diff`` (generated from the DiffResult types) validates the
    bundled pair and a faulty pair (a layout shift by one slot, one token short), and
    rejects a document missing a required field."""
    import jsonschema

    full = oracle(lambda p: {0, 1, 2})
    truth = PROMPT + OUTPUT

    def shifted(seq, pos):  # ours[i] == theirs[i+1], and k - 1 drafts
        return [truth[pos + 2 + j] if pos + 2 + j < len(truth) else 0 for j in range(K - 1)]

    make(tmp_path / "a.h5", "a", shifted)
    make(tmp_path / "b.h5", "b", full)
    schema = json.loads(
        subprocess.run(
            [SPECTRACE, "schema", "--diff"], capture_output=True, text=True, check=True
        ).stdout
    )
    bundled = _diff_json(os.path.join(TRACES, "reference.h5"), os.path.join(TRACES, "vllm.h5"))
    faulty = _diff_json(tmp_path / "a.h5", tmp_path / "b.h5")
    assert faulty["diverged"] and faulty["examples"]
    assert faulty["examples"][0]["ours"] == truth[4:6]  # the first paired block: anchor 2
    assert [f["kind"] for f in faulty["findings"] if f["severity"] == "error"][0] in (
        "layout_shift",
        "k_mismatch",
    )
    for doc in (bundled, faulty):
        jsonschema.validate(doc, schema)
    for key, part in (("coverage", "paired"), ("agreement", "shift_plus_one"), (None, "examples")):
        doc = json.loads(json.dumps(faulty))
        del (doc[key] if key else doc)[part]
        with pytest.raises(jsonschema.ValidationError, match=repr(part)):
            jsonschema.validate(doc, schema)


def test_diff_result_from_json_rebuilds_the_typed_result():
    """The TUI's child process ships the JSON document; the typed result it rebuilds writes
    the same document again."""
    from spectrace.tracer.diff_result import DiffResult, Example
    from spectrace.tracer.findings import Finding

    doc = _diff_json(os.path.join(TRACES, "reference.h5"), os.path.join(TRACES, "vllm.h5"))
    r = DiffResult.from_json(doc)
    assert r.to_json() == doc
    assert json.dumps(r.to_json(), indent=2) == json.dumps(doc, indent=2)
    assert all(isinstance(f, Finding) for f in r.findings)
    assert all(isinstance(e, Example) for e in r.examples)
    assert r.agreement.paired_blocks == doc["agreement"]["paired_blocks"]
    assert (
        r.acceptance.ours.matched_content.recorded.blocks
        == doc["acceptance"]["ours"]["matched_content"]["recorded"]["blocks"]
    )
    with pytest.raises(ValueError):
        DiffResult.from_json(doc | {"schema": "spectrace.diff/0"})
    with pytest.raises(TypeError):
        DiffResult.from_json({k: v for k, v in doc.items() if k != "coverage"})
