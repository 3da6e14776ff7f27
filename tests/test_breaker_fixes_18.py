"""The eighteenth round of defects (fresh-user round 20, looking for false alarms), each with
its clean twin; every expected figure is derived by hand in the comments from the bundled
traces (traces/README.md).

1. A golden (each request's final proposal kept, unverified, at its last token) against a VT
   import of the same run without its requests file (outputs unknown) gave
   ``unverified_drafts``: "stops drafting where the other engine goes on". A request's final
   proposal is no going on: no engine drafts past the last token. (The vLLM plugin's stop
   strings, the round's first defect, are tested with real vLLM in
   tests/hooks/test_vllm_capture.py.)
2. Requests without prompts (a VT log imported without its requests file) paired with
   another trace only by request id, else blindly in order: against vLLM's trace of the
   same run (ids with a suffix) nothing paired ("different jobs", exit 1), and two such
   logs with their requests in another order paired the wrong requests (false
   ``unverified_drafts`` and differing blocks). Now such requests pair, in order, only with
   one whose blocks hold the same anchors at the same positions; when none does, the reason
   names the missing prompts.
3. ``trimmed_drafts`` (in a diff, one block is enough) named a request's last verified block
   that verified fewer drafts where that side's output is unknown: the end of the output,
   where an engine may trim, is not known to be elsewhere. Now such a block is exempt, as
   ``acceptance_bookkeeping`` exempts it.
"""

from __future__ import annotations

import json
from pathlib import Path

from inproc import run_inproc

from spectrace.tracer.store import open_trace

ROOT = Path(__file__).resolve().parents[1]
LOG, REQS = ROOT / "traces" / "reference.vt.log", ROOT / "traces" / "reference.requests.jsonl"
LAST = "[SPECTRACE] req=2 pos=75 "  # request 2's last block (VT pos = anchor position + 1)


def _vt(tmp_path: Path, name: str, requests: bool, drop: str | None = None) -> Path:
    lines = LOG.read_text().splitlines(keepends=True)
    log, out = tmp_path / f"{name}.vt.log", tmp_path / f"{name}.h5"
    log.write_text("".join(ln for ln in lines if not (drop and ln.startswith(drop))))
    args = ["import", "vt", log, "-o", out] + (["--requests", REQS] if requests else [])
    assert run_inproc(*args).returncode == 0
    return out


def _golden(tmp_path: Path) -> Path:
    """The oracle-capture golden of the reference run: per request (ids "0".."4", as the VT
    log names them) its prompt, output and blocks in position order, from the VT import with
    the requests file, plus a final proposal drafted from its last token."""
    t = open_trace(_vt(tmp_path, "withreq", True))
    b, r = t.blocks, t.requests
    records = []
    for i, rid in enumerate(r.req_id):
        rows = [j for j in range(len(b)) if b.request[j] == i]
        rows.sort(key=lambda j: int(b.position[j]))
        blocks = [{"call": n, "req_row": 0, "anchor": int(b.anchor[j]),
                   "drafts": [int(x) for x in b.proposed[j] if x >= 0]} for n, j in enumerate(rows)]  # fmt: skip
        full = [int(x) for x in r.prompt_ids[i]] + [int(x) for x in r.output_ids[i]]
        blocks.append({"call": len(rows), "req_row": 0, "anchor": full[-1], "drafts": [1, 2, 3, 4]})
        records.append({"request_id": rid, "prompt_token_ids": full[: len(r.prompt_ids[i])],
                        "output_token_ids": full[len(r.prompt_ids[i]):], "blocks": blocks})  # fmt: skip
    src, out = tmp_path / "g.json", tmp_path / "g.h5"
    src.write_text(json.dumps({"num_speculative_tokens": 4, "records": records}))
    r = run_inproc("import", "golden", src, "-o", out, "--strict")
    assert r.returncode == 0, r.stderr
    # request 0's last block (69, accepting 3) reaches its last token (73): its final
    # proposal is placed there, unverified; the other four were cut at max_tokens, their
    # final proposals past the end (not placed)
    assert "4 final past end" in r.stderr and "1 final proposal (never verified)" in r.stderr
    return out


def _diff(a: Path, b: Path) -> tuple[int, list[str]]:
    r = run_inproc("diff", a, b, "--format", "json")
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, [
        f["kind"] for f in json.loads(r.stdout)["findings"] if f["severity"] == "error"
    ]


def test_a_goldens_final_proposals_are_no_going_on(tmp_path):
    golden, vt = _golden(tmp_path), _vt(tmp_path, "noreq", False)
    assert _diff(golden, vt) == (0, [])
    assert _diff(vt, golden) == (0, [])


def test_a_vt_import_without_requests_that_lost_its_last_block_still_diverges(tmp_path):
    """Twin: request 2's last block (anchored at 74, accepting 4) lost from the log: the
    golden's verified block there is work the VT side skipped."""
    golden, cut = _golden(tmp_path), _vt(tmp_path, "cut", False, drop=LAST)
    assert _diff(golden, cut) == (1, ["unverified_drafts"])
    assert _diff(cut, golden) == (1, ["unverified_drafts"])


# -- 2. requests without prompts pair on their blocks --------------------------------------

VLLM = ROOT / "traces" / "vllm.h5"


def _requests_line(r) -> str:
    return r.stdout.splitlines()[
        [ln.startswith("requests:") for ln in r.stdout.splitlines()].index(True)
    ]


def test_a_vt_import_without_requests_pairs_with_the_same_runs_vllm_trace(tmp_path):
    """vllm.h5 and the VT log are the same 5 prompts x 64 tokens; the log without its
    requests file knows no prompt, and vLLM's request ids carry a suffix ("0-baad9995"):
    nothing paired them ("different jobs", exit 1). Their blocks hold the same anchors at
    the same positions: 5 pairs, 139 paired blocks, all identical."""
    vt = _vt(tmp_path, "noreq", False)
    for a, b in ((VLLM, vt), (vt, VLLM)):
        r = run_inproc("diff", a, b)
        assert r.returncode == 0, r.stdout
        assert _requests_line(r).startswith(
            "requests: 5 matched (by prompt 0, by id 0, by order 5)"
        )
    doc = json.loads(run_inproc("diff", VLLM, vt, "--format", "json").stdout)
    assert doc["agreement"]["paired_blocks"] == doc["agreement"]["exact_matches"] == 139


def test_requests_whose_blocks_disagree_stay_unpaired(tmp_path):
    """Twin: every known anchor of the import moved by one id: no request's blocks agree with
    vLLM's, nothing pairs, and the reason names the missing prompts."""
    import h5py
    from bundled import edited_copy

    vt = edited_copy(_vt(tmp_path, "noreq", False), tmp_path / "moved.h5")
    with h5py.File(vt, "r+") as f:
        a = f["blocks/anchor"][:]
        f["blocks/anchor"][...] = a + (a >= 0)
    r = run_inproc("diff", VLLM, vt)
    assert r.returncode == 1
    assert _requests_line(r).startswith("requests: 0 matched")
    assert (
        "DIVERGED: no request of ours matches one of theirs: theirs has no prompt ids (a VT log "
        "imported without --requests?), and neither request ids nor the blocks' anchors pair "
        "them: import with the requests file"
    ) in r.stdout


# -- 3. a request's last block trimmed where the output is unknown ---------------------------


def _unknown_outputs_trimmed(tmp_path: Path, name: str, last: bool) -> Path:
    """vllm.h5 with every output left unknown, request 4's last verified block (anchored at
    74, accepting 1: its output, 12 + 64 tokens, ends at 75) or its second block verifying 2
    of its 4 drafts."""
    import h5py
    import numpy as np
    from bundled import edited_copy

    out = edited_copy(VLLM, tmp_path / f"{name}.h5", drop_meta=("checks",))
    with h5py.File(out, "r+") as f:
        g = f["requests"]
        for i in range(g["output_ids"].shape[0]):
            g["output_ids"][i], g["finish_reason"][i] = np.zeros(0, np.int32), ""
        req, pos, acc = f["blocks/request"][:], f["blocks/position"][:], f["blocks/accepted"][:]
        rows = np.flatnonzero((req == 4) & (acc >= 0) & (acc <= 2))
        rows = rows[np.argsort(pos[rows])]
        row = rows[-1] if last else rows[1]
        assert not last or int(pos[row]) == 74
        nv, ver = f["blocks/num_verified"][:], f["blocks/verified"][:]
        nv[row], ver[row, 2:] = 2, -1
        f["blocks/num_verified"][...], f["blocks/verified"][...] = nv, ver
    return out


def test_a_last_block_trimmed_where_the_output_is_unknown_is_no_trimming(tmp_path):
    out = _unknown_outputs_trimmed(tmp_path, "last", last=True)
    assert _diff(out, VLLM) == (0, [])


def test_a_middle_block_trimmed_where_the_output_is_unknown_is_named(tmp_path):
    """Twin: the same trim on a block in the middle of the request: trimmed_drafts."""
    out = _unknown_outputs_trimmed(tmp_path, "mid", last=False)
    assert _diff(out, VLLM) == (1, ["trimmed_drafts"])
