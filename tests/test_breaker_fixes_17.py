"""The seventeenth round of defects (fresh-user round 19, on the diff and check verdicts),
each with its clean twin; every expected figure is derived by hand in the comments from the
bundled traces (traces/README.md).

1. A VT log imported without its requests file (prompt and output unknown) that lost a
   request's first or last block diffed clean against the whole log (exit 0): the head
   check starts at ``len(prompt)`` and the tail check stops at the output's end, both
   unknown. Now a request whose prompt is unknown is checked from position 0 (the other
   side drafts only past a prompt the pair shares) and one whose output is unknown up to
   the other side's last block: ``unverified_drafts``. A side's final proposal (its last
   block, unverified, at its verified reach) counts as drafting there.
2. /meta ``k`` 0 (a vanilla run) beside blocks that propose drafts was no contradiction
   (k 0 read as unknown). Now each such block is above /meta k: ``impossible_values``.
3. An n-gram side that keeps its no-match steps as k=0 blocks, against one that leaves them
   out, was "a request went on without drafting from an anchor the other engine drafted
   from": a k=0 block drafted nothing. Now it is no drafting.
4. A ``[spec-phase]`` timing printed as ``nan`` (printf's ``%.2f`` of a NaN; glibc's
   ``-nan``) was a malformed line, reported as lost blocks (``capture_incomplete``). Now it
   is an unknown timing, canonical even for ``--strict``.
5. A request id on two rows of /requests, which ``validate`` rejects, was read by ``check``
   and ``diff`` (``--request`` then took both rows). Now opening the trace is bad input
   (exit 2) naming the field.
6. ``validate`` of a trace with ``batch_size`` but not ``batch_row`` (two optional columns)
   said "damaged trace file ('batch_row')": now it checks them only together.
7. A stored trace whose ``emitted`` ids contradict the output (two rejected blocks' bonus
   tokens swapped, as a recorder's batch-row mis-join would) passed ``validate``, ``check``
   and ``diff``: no detector read the emitted ids. The sweep now holds them against the
   output (``acceptance_bookkeeping``).
8. Two blocks whose target verified 1 of 4 drafts, paired with blocks whose target verified
   all 4, diffed clean: ``trimmed_drafts`` needs 3 blocks in one trace. In a diff one block
   is enough where the paired block's target verified more.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
from bundled import edited_copy
from inproc import run_inproc

ROOT = Path(__file__).resolve().parents[1]
LOG, VLLM = ROOT / "traces" / "reference.vt.log", ROOT / "traces" / "vllm.h5"
REQS = ROOT / "traces" / "reference.requests.jsonl"
# request 2's first and last [SPECTRACE] lines (VT pos = anchor position + 1; its prompt
# holds 12 ids, so the first anchors at 12, the last at 74)
FIRST = "[SPECTRACE] req=2 pos=13 "
LAST = "[SPECTRACE] req=2 pos=75 "


def _import(tmp_path: Path, name: str, drop: str | None, requests: bool = False) -> Path:
    text = LOG.read_text()
    if drop:
        lines = text.splitlines(keepends=True)
        assert sum(ln.startswith(drop) for ln in lines) == 1
        text = "".join(ln for ln in lines if not ln.startswith(drop))
    log, out = tmp_path / f"{name}.vt.log", tmp_path / f"{name}.h5"
    log.write_text(text)
    args = ["import", "vt", log, "-o", out] + (["--requests", REQS] if requests else [])
    assert run_inproc(*args).returncode == 0
    return out


def _diff(a: Path, b: Path, *opts: str) -> tuple[int, list[str]]:
    r = run_inproc("diff", a, b, "--format", "json", *opts)
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    return r.returncode, [f["kind"] for f in doc["findings"] if f["severity"] == "error"]


@pytest.mark.parametrize("drop", [FIRST, LAST], ids=["first-block", "last-block"])
def test_a_lost_end_block_without_the_requests_file_is_missing_work(tmp_path, drop):
    whole, cut = _import(tmp_path, "whole", None), _import(tmp_path, "cut", drop)
    assert _diff(whole, cut, "--max-errors", "0") == (1, ["unverified_drafts"])
    assert _diff(cut, whole) == (1, ["unverified_drafts"])


def test_the_whole_log_without_the_requests_file_diffs_clean(tmp_path):
    """Twin: the whole log against itself re-imported, and against the real vLLM trace by
    the requests file (its blocks and final proposals: 139 paired, 5 final ones unpaired)."""
    whole, again = _import(tmp_path, "whole", None), _import(tmp_path, "again", None)
    assert _diff(whole, again) == (0, [])
    assert _diff(_import(tmp_path, "req", None, requests=True), VLLM) == (0, [])
    assert _diff(VLLM, _import(tmp_path, "req2", None, requests=True)) == (0, [])


def _check(path: Path) -> tuple[int, list[str]]:
    r = run_inproc("check", path, "--format", "json")
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, [
        f["kind"] for f in json.loads(r.stdout)["findings"] if f["severity"] == "error"
    ]


def test_meta_k_zero_beside_drafting_blocks_is_impossible(tmp_path):
    # the bundled vLLM trace: every block proposes 4 drafts; /meta k 0 says no drafts
    out = edited_copy(VLLM, tmp_path / "k0.h5", meta={"k": 0})
    code, kinds = _check(out)
    assert (code, kinds[0]) == (1, "impossible_values")
    r = run_inproc("check", out)
    assert "144 blocks hold values no engine can produce" in r.stdout
    assert "k > /meta k, k=4, limit 0" in r.stdout


def test_meta_k_zero_without_blocks_is_a_vanilla_run(tmp_path):
    """Twin: k 0 and no block (a vanilla run) checks clean, as does the trace's own k 4."""
    out = edited_copy(VLLM, tmp_path / "v.h5", keep=np.zeros(144, bool), meta={"k": 0, "method": None}, drop_meta=("checks",))  # fmt: skip
    assert _check(out) == (0, [])
    assert _check(VLLM) == (0, [])


def _ngram(tmp_path: Path, name: str, zero_k: bool) -> Path:
    """The vLLM trace as an n-gram run whose every other rejected block (accepted 0) was a
    step without a match: kept as a k=0 block (nothing proposed or verified), or left out."""
    out = edited_copy(
        VLLM, tmp_path / f"{name}.h5", meta={"method": "ngram"}, drop_meta=("checks",)
    )
    with h5py.File(out, "r") as f:
        acc = f["blocks/accepted"][:]
    nomatch = np.zeros(len(acc), bool)
    nomatch[np.flatnonzero(acc == 0)[::2]] = True
    if not zero_k:
        return edited_copy(out, tmp_path / f"{name}-cut.h5", keep=~nomatch)
    with h5py.File(out, "r+") as f:
        for col, v in (("k", 0), ("proposed", -1), ("verified", -1), ("num_verified", 0)):
            d = f[f"blocks/{col}"][:]
            d[nomatch] = v
            f[f"blocks/{col}"][...] = d
    return out


def test_ngram_no_match_steps_kept_as_k0_blocks_are_no_drafting(tmp_path):
    kept, left = _ngram(tmp_path, "kept", True), _ngram(tmp_path, "left", False)
    assert _diff(left, kept) == (0, [])
    assert _diff(kept, left) == (0, [])


def test_an_ngram_side_that_lost_a_drafting_block_is_still_missing_work(tmp_path):
    """Twin: the k=0 side against one that also lost a block that drafted (request 0's
    second block: a chain gap where the other side proposed)."""
    kept = _ngram(tmp_path, "kept", True)
    with h5py.File(kept, "r") as f:
        req, pos, k = f["blocks/request"][:], f["blocks/position"][:], f["blocks/k"][:]
    rows = np.flatnonzero((req == 0) & (k > 0))
    second = rows[np.argsort(pos[rows])][1]
    keep = np.ones(len(req), bool)
    keep[second] = False
    lost = edited_copy(kept, tmp_path / "lost.h5", keep=keep)
    assert _diff(lost, kept) == (1, ["unverified_drafts"])


def _vt_with(tmp_path: Path, old: str, new: str, strict: bool) -> tuple[int, Path]:
    text = LOG.read_text()
    assert text.count(old) >= 1
    log, out = tmp_path / "p.vt.log", tmp_path / "p.h5"
    log.write_text(text.replace(old, new, 1))
    args = ["import", "vt", log, "-o", out, "--requests", REQS] + (["--strict"] if strict else [])
    return run_inproc(*args).returncode, out


@pytest.mark.parametrize("nan", ["nan", "-nan", "NaN"])
def test_a_nan_phase_timing_is_an_unknown_timing(tmp_path, nan):
    code, out = _vt_with(tmp_path, "backbone=15.91ms", f"backbone={nan}ms", strict=nan != "NaN")
    assert code == 0
    assert _check(out) == (0, [])


def test_a_phase_timing_that_is_no_number_is_still_malformed(tmp_path):
    """Twin: ``backbone=abcms`` is no number: a malformed line (capture_incomplete)."""
    code, out = _vt_with(tmp_path, "backbone=15.91ms", "backbone=abcms", strict=False)
    assert code == 0
    assert _check(out) == (1, ["capture_incomplete"])


def test_a_request_id_on_two_rows_is_bad_input(tmp_path):
    out = edited_copy(VLLM, tmp_path / "dup.h5")
    with h5py.File(out, "r+") as f:
        ids = f["requests/req_id"]
        ids[1] = ids[0]  # request 0-baad9995 on rows 0 and 1
    want = (
        f"spectrace: error: {out}: request id '0-baad9995' on rows 0 and 1 "
        f"(field=requests/req_id): one row per request"
    )
    for args in (
        ("check", out),
        ("diff", VLLM, out),
        ("diff", out, VLLM, "--request", "0-baad9995"),
    ):
        r = run_inproc(*args)
        assert (r.returncode, r.stderr.splitlines()) == (2, [want])


def test_distinct_request_ids_open(tmp_path):
    """Twin: the copy before the edit."""
    out = edited_copy(VLLM, tmp_path / "ok.h5")
    assert run_inproc("check", out).returncode == 0


def test_validate_checks_batch_rows_only_beside_their_column(tmp_path):
    out = edited_copy(VLLM, tmp_path / "nb.h5")
    with h5py.File(out, "r+") as f:
        del f["blocks/batch_row"]  # optional; batch_size stays
    r = run_inproc("validate", out)
    assert (r.returncode, r.stdout) == (0, f"{out}: valid\n")
    with h5py.File(out, "r+") as f:  # twin: a batch row outside its batch is still named
        f["blocks/batch_size"][0] = 1
        f["blocks"].create_dataset("batch_row", data=np.full(144, 3, np.int16), maxshape=(None,))
    r = run_inproc("validate", out)
    assert r.returncode == 1 and "batch_row outside the batch" in r.stdout


# -- 7. emitted ids the output contradicts ---------------------------------------------------


def _emitted_edit(tmp_path: Path, name: str, edit) -> Path:
    out = edited_copy(VLLM, tmp_path / f"{name}.h5")
    with h5py.File(out, "r+") as f:
        e = f["blocks/emitted"][:]
        edit(e, f)
        f["blocks/emitted"][...] = e
    return out


def _swap_bonus(e, f):
    # the first two rejected blocks (accepted 0) of different requests: each emits only its
    # bonus; swapped, as a batch-row mis-join in a recorder would
    acc, req = f["blocks/accepted"][:], f["blocks/request"][:]
    rows = np.flatnonzero(acc == 0)
    i = rows[0]
    j = next(r for r in rows if req[r] != req[i] and e[r, 0] != e[i, 0])
    e[i, 0], e[j, 0] = e[j, 0], e[i, 0]


def test_emitted_ids_the_output_contradicts_are_bookkeeping_errors(tmp_path):
    out = _emitted_edit(tmp_path, "swap", _swap_bonus)
    assert _check(out) == (1, ["acceptance_bookkeeping"])
    r = run_inproc("check", out)
    assert "2 blocks emit ids that the output does not hold at their positions" in r.stdout
    assert _diff(VLLM, out) == (1, ["acceptance_bookkeeping"])


def test_emitted_ids_past_the_output_end_are_not_compared(tmp_path):
    """Twin: request 2's last verified block anchors at 74 and emits 5 ids (accepted 4 + the
    bonus) at 75..79, but its output (12 prompt + 64) ends at 75: max_tokens trimmed 76..79,
    so an edit of the fifth id (position 79) contradicts nothing."""

    def edit(e, f):
        req, pos, acc = f["blocks/request"][:], f["blocks/position"][:], f["blocks/accepted"][:]
        (row,) = np.flatnonzero((req == 2) & (pos == 74) & (acc == 4))
        e[row, 4] = 7

    out = _emitted_edit(tmp_path, "past", edit)
    assert _check(out) == (0, [])
    assert _diff(VLLM, out) == (0, [])


# -- 8. drafts trimmed beside a paired block verified whole -----------------------------------


def _trimmed(tmp_path: Path, name: str) -> Path:
    """The vLLM trace with its first two rejected blocks (accepted 0) verified 1 of their 4
    drafts (the rest cut before verification); its counters' check left out."""
    out = edited_copy(VLLM, tmp_path / f"{name}.h5", drop_meta=("checks",))
    with h5py.File(out, "r+") as f:
        rows = np.flatnonzero(f["blocks/accepted"][:] == 0)[:2]
        nv, ver = f["blocks/num_verified"][:], f["blocks/verified"][:]
        nv[rows], ver[rows, 1:] = 1, -1
        f["blocks/num_verified"][...], f["blocks/verified"][...] = nv, ver
    return out


def test_drafts_trimmed_where_the_other_target_verified_them_are_named(tmp_path):
    cut = _trimmed(tmp_path, "cut")
    assert _check(cut) == (0, [])  # alone: 2 blocks, below the 3 a single trace needs
    code, kinds = _diff(VLLM, cut)
    assert (code, kinds) == (1, ["trimmed_drafts"])
    r = run_inproc("diff", VLLM, cut)
    assert "in 2 of 139 verified blocks" in r.stdout
    assert "at 2 of these anchors the other engine's target verified more drafts" in r.stdout
    assert _diff(cut, VLLM) == (1, ["trimmed_drafts"])


def test_drafts_trimmed_alike_on_both_sides_stay_below_the_bar(tmp_path):
    """Twin: both sides trimmed the same two blocks: neither verified more."""
    assert _diff(_trimmed(tmp_path, "a"), _trimmed(tmp_path, "b")) == (0, [])


def test_a_side_without_outputs_keeps_its_final_proposals(tmp_path):
    """Twin of 1 (no false alarm): the vLLM trace with every output and finish reason left
    unknown against itself whole. Each request's last verified block reaches the anchor of
    its final proposal (e.g. request 3: 69 + 4 accepted + 1 = 74, its unverified last block);
    the other side's final proposal there is no drafting this side skipped."""
    out = edited_copy(VLLM, tmp_path / "unknown.h5")
    with h5py.File(out, "r+") as f:
        g = f["requests"]
        for i in range(g["output_ids"].shape[0]):
            g["output_ids"][i] = np.zeros(0, np.int32)
            g["finish_reason"][i] = ""
    assert _diff(out, VLLM) == (0, [])
    assert _diff(VLLM, out) == (0, [])
