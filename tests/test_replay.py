"""``spectrace replay`` with the reference engine (in process and through the ``cmd``
contract): teacher-forced acceptance, site choice, replay pairs in ``diff``, the near_ties
finding on a drafter built to tie, and an early-divergence pair whose replay reaches the
positions the natural run never compared. Expected counts are derived by hand or with plain
Python from the inputs, never from the code under test."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from spectrace.engine import faults
from spectrace.engine.replay import replay_reference
from spectrace.hooks.replay.options import EngineOptions
from spectrace.hooks.replay.positions import Reference, choose_sites, parse_positions
from spectrace.hooks.replay.run import replay
from spectrace.hooks.replay.write import teacher_forced
from spectrace.tracer.align import align
from spectrace.tracer.cli.main import cli
from spectrace.tracer.diff import diff_traces
from spectrace.tracer.errors import InputError
from spectrace.tracer.findings import check_trace
from spectrace.tracer.store import TraceWriter, open_trace

ROOT = Path(__file__).resolve().parents[1]
BUNDLED_REF, BUNDLED_VLLM = ROOT / "traces" / "reference.h5", ROOT / "traces" / "vllm.h5"
OUTPUT_LEN = 64  # every bundled request has 64 output tokens: 63 replayable positions
TIE_TOKEN, TIE_TWIN = 272, 1  # the drafter's 272 gets a twin row 1 (never in the text)


# ---------------------------------------------------------------- pure parts


def test_teacher_forced_by_hand():
    seq = [5, 6, 7, 8, 9, 10, 11]
    v = teacher_forced(seq, 1, [7, 8, 0, 10])  # after the anchor 6: 7 8 9 10 11
    assert (v.verified, v.accepted, v.emitted) == ([7, 8, 0, 10], 2, [7, 8, 9])
    # Only 9 10 11 follow position 3: two drafts can be checked and still leave a bonus.
    v = teacher_forced(seq, 3, [9, 10, 11, 12])
    assert (v.verified, v.accepted, v.emitted) == ([9, 10], 2, [9, 10, 11])
    v = teacher_forced(seq, 6, [1, 2])  # nothing follows the last token
    assert (v.verified, v.accepted, v.emitted) == (None, -1, None)


def test_sites_all_n_and_parse():
    refs = [Reference("a", (1, 2, 3), (4, 5, 6, 7)), Reference("b", (9,), (8, 7))]
    every = choose_sites(refs, "all")
    assert [(s.request, s.position) for s in every] == [(0, 3), (0, 4), (0, 5), (1, 1)]
    assert [s.ident for s in every] == ["0", "1", "2", "3"]
    two = choose_sites(refs, 2)
    assert [(s.request, s.position) for s in two] == [(0, 3), (0, 5), (1, 1)]
    assert parse_positions("blocks") == "blocks" and parse_positions("7") == 7
    with pytest.raises(ValueError):
        parse_positions("0")


def test_sites_blocks_are_the_natural_positions():
    t = open_trace(BUNDLED_REF)
    refs = [
        Reference(
            str(t.requests.req_id[i]),
            tuple(t.requests.prompt_ids[i].tolist()),
            tuple(t.requests.output_ids[i].tolist()),
        )
        for i in range(len(t.requests))
    ]
    sites = choose_sites(refs, "blocks", [t])
    want = 0
    for i, ref in enumerate(refs):  # block positions that leave a token to check against
        pos = set(t.blocks.position[t.blocks.request == i].tolist())
        want += len([p for p in pos if len(ref.prompt_ids) <= p < len(ref.sequence) - 1])
    assert len(sites) == want


# ---------------------------------------------------------------- reference engine


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The bundled reference trace replayed at every position by the reference engine."""
    tmp = tmp_path_factory.mktemp("replay")
    r = replay(BUNDLED_REF, tmp / "clean.h5", "reference", runner=replay_reference)
    return r, open_trace(r.path), tmp


def test_reference_replay_blocks_and_teacher_forcing(clean):
    r, t, _ = clean
    nreq = len(t.requests)
    assert r.sites == nreq * (OUTPUT_LEN - 1) == len(t.blocks) == 315
    assert r.anchor_mismatches == 0 and t.meta["source"] == "replay"
    assert t.meta["replay"]["sites"] == 315 and t.meta["replay"]["anchor_mismatches"] == 0
    # Every block's acceptance, recomputed here from the reference sequence.
    for row in range(0, 315, 37):
        req, pos = int(t.blocks.request[row]), int(t.blocks.position[row])
        seq = t.requests.full_sequence(req).tolist()
        prop = [int(x) for x in t.blocks.proposed[row] if x >= 0]
        acc = 0
        while acc < len(prop) and pos + 1 + acc < len(seq) - 1 and prop[acc] == seq[pos + 1 + acc]:
            acc += 1
        assert int(t.blocks.accepted[row]) == acc
        assert int(t.blocks.anchor[row]) == seq[pos]
    assert not any(f.severity == "error" for f in check_trace(t))


def test_reference_margins_are_the_draft_logits(clean):
    """Slot 0's margin at one site equals top-1 minus top-2 of the draft model's logits."""
    import torch

    from spectrace.engine.loader import bundled_model_dir, load_model

    _, t, _ = clean
    row = 40
    req, pos = int(t.blocks.request[row]), int(t.blocks.position[row])
    seq = t.requests.full_sequence(req).tolist()[: pos + 1]
    draft = load_model(bundled_model_dir("draft")).model
    with torch.no_grad():
        logits = draft(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1]
    top = torch.topk(logits, 2).values
    assert float(t.blocks.draft_margin[row, 0]) == pytest.approx(float(top[0] - top[1]), abs=1e-5)
    assert np.isfinite(t.blocks.target_margin[:]).all()
    assert (t.blocks.target_margin[:] >= 0).all()


def test_cmd_contract_matches_in_process(clean):
    """The reference engine driven through the cmd contract drafts what it drafts in
    process, at every one of 4 sampled positions per request."""
    _, _, tmp = clean
    a = replay(BUNDLED_REF, tmp / "cmd.h5", "cmd", positions=4)
    b = replay(BUNDLED_REF, tmp / "inproc10.h5", "reference", positions=4, runner=replay_reference)
    ta, tb = open_trace(a.path), open_trace(b.path)
    assert a.sites == b.sites == 20
    res = diff_traces(align(ta, tb))
    assert res.coverage.paired == 20 and res.agreement.exact_matches == 20
    assert not res.diverged
    if np.isnan(ta.blocks.draft_margin[:]).all():
        pytest.skip("the VT parser does not read [spec-propose] margin= yet (helper 'speed')")
    assert np.allclose(ta.blocks.draft_margin[:], tb.blocks.draft_margin[:], atol=1e-3)


def test_replay_cli_vs_and_views(clean):
    """`spectrace replay --vs reference` prints a replay diff; info/check/validate open it."""
    _, _, tmp = clean
    out, vs = tmp / "cli.h5", tmp / "cli.reference.h5"
    run = CliRunner().invoke(
        cli, ["replay", str(BUNDLED_REF), "-o", str(out), "--vs", "reference", "--positions", "3"]
    )
    assert run.exit_code == 0, run.output
    assert "replay pair: both engines drafted from the same reference prefixes" in run.output
    assert "15 paired blocks = 100.0% of ours (15)" in run.output
    for cmd in (["info", str(vs)], ["check", str(vs)], ["validate", str(out)]):
        assert CliRunner().invoke(cli, cmd).exit_code == 0
    again = CliRunner().invoke(cli, ["replay", str(BUNDLED_REF), "-o", str(out)])
    assert isinstance(again.exception, InputError)  # no clobber without --force (exit 2)
    assert "pass --force" in str(again.exception)


# ---------------------------------------------------------------- near-ties


def _tied_draft(tmp: Path) -> Path:
    """The bundled draft with lm_head row TIE_TWIN set to row TIE_TOKEN: wherever the drafter
    would pick TIE_TOKEN, TIE_TWIN ties with it exactly and wins (lower id first)."""
    from safetensors.torch import load_file, save_file

    dst = tmp / "tied_draft"
    shutil.copytree(ROOT / "engine" / "models" / "draft", dst)
    sd = load_file(dst / "model.safetensors")
    w = sd["lm_head.weight"].clone()
    w[TIE_TWIN] = w[TIE_TOKEN]
    sd["lm_head.weight"] = w
    save_file(sd, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_near_ties_on_a_drafter_built_to_tie(clean):
    _, t_clean, tmp = clean
    tied = replay(
        BUNDLED_REF,
        tmp / "tied.h5",
        "reference",
        EngineOptions(draft=_tied_draft(tmp)),
        runner=replay_reference,
    )
    res = diff_traces(align(open_trace(tied.path), t_clean))
    # Expected: one differing block per clean block that proposes TIE_TOKEN at all (the tied
    # drafter proposes TIE_TWIN there, with margin 0, and agrees before it).
    proposed = t_clean.blocks.proposed[:]
    want = int((proposed == TIE_TOKEN).any(axis=1).sum())
    assert want == 69
    kinds = [f.kind for f in res.findings]
    tie = next(f for f in res.findings if f.kind == "near_ties")
    assert tie.severity == "warning"
    assert tie.evidence["differing"] == want and tie.evidence["near_ties"] == want
    first = int(np.flatnonzero((proposed == TIE_TOKEN).any(axis=1))[0])
    slot = int(np.flatnonzero(proposed[first] == TIE_TOKEN)[0])
    assert (tie.position, tie.slot) == (int(t_clean.blocks.position[first]), slot)
    assert "every one is numerics, not a bug" in tie.message
    # Error findings are unchanged by near_ties: the pair detectors still name an error (the
    # tie-flipped blocks follow one verdict often enough for stale_state's concentration test).
    assert kinds[0] in ("stale_state", "draft_mismatch") and res.findings[0].severity == "error"


def _synthetic(path: Path, proposals, margins, source="replay"):
    w = TraceWriter(path, {"source": source, "k": 2})
    w.request("r", [1, 2], [3, 4, 5, 6, 7, 8])
    for pos, (prop, mar) in enumerate(zip(proposals, margins), start=2):
        w.add_block("r", pos, pos, [1, 2, 3, 4, 5, 6, 7, 8][pos], prop, draft_margin=mar)
    w.close()
    return open_trace(path)


def test_near_ties_by_hand(tmp_path):
    """3 of 5 blocks differ; the first differing slot's margin is below 0.01 on one side in
    2 of them (blocks at positions 3 and 6), 5.0 / 4.0 at the third."""
    ours = [[4, 5], [9, 6], [5, 6], [7, 8], [7, 1]]
    theirs = [[4, 5], [5, 6], [5, 9], [7, 8], [7, 8]]
    mo = [[1.0, 1.0], [0.004, 1.0], [1.0, 5.0], [1.0, 1.0], [1.0, 2.0]]
    mt = [[1.0, 1.0], [0.5, 1.0], [1.0, 4.0], [1.0, 1.0], [1.0, 0.001]]
    a = _synthetic(tmp_path / "a.h5", ours, mo)
    b = _synthetic(tmp_path / "b.h5", theirs, mt)
    tie = next(f for f in diff_traces(align(a, b)).findings if f.kind == "near_ties")
    assert (tie.evidence["differing"], tie.evidence["near_ties"]) == (3, 2)
    assert (tie.position, tie.slot) == (3, 0)
    assert "the other 1 are not near-ties" in tie.message
    clean_a = _synthetic(tmp_path / "c.h5", theirs, mo)  # the clean twin: identical drafts
    assert not [f for f in diff_traces(align(clean_a, b)).findings if f.kind == "near_ties"]


# ---------------------------------------------------------------- early divergence


def _first_difference(x: list[int], y: list[int]) -> int:
    n = 0
    while n < min(len(x), len(y)) and x[n] == y[n]:
        n += 1
    return n


def test_replay_reaches_what_an_early_divergence_hides(tmp_path, capture_reference):
    """Natural: the reference engine with `content` (output token 10 is the target's
    second-best) and `broken_depth` against clean vLLM: only blocks before output token 10
    pair. Replayed on vLLM's sequences: every position but the 5 where the faulty target
    samples another anchor (output token 10 of each request) pairs, and the drafter fault
    shows at positions the natural run never compared."""
    planted = ["--fault", "content", "--fault", "broken_depth"]
    assert capture_reference(tmp_path, "natural", planted).returncode == 0
    nat, clean_vllm = open_trace(tmp_path / "natural.h5"), open_trace(BUNDLED_VLLM)
    natural = diff_traces(align(nat, clean_vllm))
    # Independently: per request, the positions both sides drafted from before the outputs
    # differ (requests matched by prompt).
    want_nat, reached = 0, {}
    for i in range(len(nat.requests)):
        sa = nat.requests.full_sequence(i).tolist()
        j = next(
            j
            for j in range(len(clean_vllm.requests))
            if clean_vllm.requests.prompt_ids[j].tolist() == nat.requests.prompt_ids[i].tolist()
        )
        sb = clean_vllm.requests.full_sequence(j).tolist()
        d = _first_difference(sa, sb)
        assert d == len(nat.requests.prompt_ids[i]) + faults.CONTENT_AT
        pa = {p for p in nat.blocks.position[nat.blocks.request == i].tolist() if p < d}
        pb = {
            p for p in clean_vllm.blocks.position[clean_vllm.blocks.request == j].tolist() if p < d
        }
        want_nat += len(pa & pb)
        reached[str(clean_vllm.requests.req_id[j])] = d
    assert natural.coverage.paired == want_nat
    assert natural.findings[0].kind == "content_divergence"

    opts = EngineOptions(faults=["content", "broken_depth"])
    a = replay(BUNDLED_VLLM, tmp_path / "faulty.h5", "reference", opts, runner=replay_reference)
    b = replay(BUNDLED_VLLM, tmp_path / "clean.h5", "reference", runner=replay_reference)
    assert a.anchor_mismatches == 5 and b.anchor_mismatches == 0
    al_rep = align(open_trace(a.path), open_trace(b.path))
    rep = diff_traces(al_rep)
    assert rep.coverage.paired == 5 * (OUTPUT_LEN - 1) - 5 == 310
    assert rep.coverage.paired >= 10 * natural.coverage.paired
    errors = [f for f in rep.findings if f.severity == "error"]
    assert errors[0].kind == "depth_divergence"
    ta = open_trace(a.path)
    beyond = [
        int(ta.blocks.position[x]) >= reached[str(ta.requests.req_id[int(ta.blocks.request[x])])]
        for x in al_rep.ia.tolist()
    ]
    # Paired positions at or past output token 10, less the 5 disagreements there.
    assert sum(beyond) == 5 * (OUTPUT_LEN - 1 - faults.CONTENT_AT) - 5 == 260
    tie = [f for f in rep.findings if f.kind == "near_ties"]
    assert not tie or tie[0].evidence["near_ties"] < 0.1 * tie[0].evidence["differing"]
    ours, theirs = rep.acceptance.ours.matched_content, rep.acceptance.theirs.matched_content
    assert ours.recorded.acceptance_rate < theirs.recorded.acceptance_rate


def test_vt_printer_margin_field_only_when_asked():
    import io

    from spectrace.engine import vt_trace

    vt_trace.reset_latches()
    try:
        import os

        old = os.environ.get(vt_trace.ENV_VAR)
        os.environ[vt_trace.ENV_VAR] = "1"
        on, off = io.StringIO(), io.StringIO()
        vt_trace.VtTrace(on, margins=True).propose(1, 4, [13, 198], [0.5234, 0.0104])
        vt_trace.VtTrace(off).propose(1, 4, [13, 198], [0.5234, 0.0104])
    finally:
        vt_trace.reset_latches()
        if old is None:
            os.environ.pop(vt_trace.ENV_VAR, None)
        else:
            os.environ[vt_trace.ENV_VAR] = old
    head = "[spec-propose] rows=1 nqpr=4 drafts/row=2 first=[13 198 ]"
    assert on.getvalue() == head + " margin=[ 0.523 0.010 ]\n"
    assert off.getvalue() == head + "\n"
