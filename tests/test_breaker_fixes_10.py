"""The tenth round of defects a fresh user found (the verdict part), each with its clean twin.
Expected values derived by hand from the bundled vLLM trace (``traces/README.md``: 144
blocks, k 4, method draft_model, 5 requests x 64 output tokens; /meta checks.trace.blocks
144). Its request 2 (row 2) drafts from positions 12, 13, 15, 17, 19, 20, 24, ... with
accepted 0, 1, 1, 1, 0, 3, 1, ...

1. Three verified blocks of request 2 removed (positions 17, 19, 20) passed ``check`` and
   ``diff`` (exit 0): a hole in the anchor chain (the block at 15 accepted 1, so the next
   drafts from 17; the trace's next drafts from 24) of a drafter that drafts every step, and
   141 blocks where the recorder counted 144 at close. ``capture_incomplete``, exit 1.
2. The trace with no block at all but its 5 requests (64 tokens each): a draft_model run
   that recorded no draft passed ``check``. ``capture_incomplete``, exit 1.
3. vLLM's finish reason ``error`` (FinishReason.ERROR: a request-level internal error) read
   as a completed request. ``requests_incomplete``, exit 1.
4. ``validate`` never compared ``verified_same`` with the matrices, which ``check`` and
   ``diff`` trust to skip reading ``verified``: a lying column hid ``verified_differs``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from bundled import edited_copy
from inproc import run_inproc

ROOT = Path(__file__).resolve().parents[1]
REFERENCE, VLLM = ROOT / "traces" / "reference.h5", ROOT / "traces" / "vllm.h5"


def _copy(dst: Path, keep=None, meta: dict | None = None, drop_meta: tuple[str, ...] = ()) -> Path:
    """A copy of the bundled vLLM trace keeping the /blocks rows ``keep`` selects (bool
    [144]; all when None), /meta items replaced by ``meta`` and ``drop_meta`` removed."""
    return edited_copy(VLLM, dst, keep, meta, drop_meta)


def _column(name: str) -> np.ndarray:
    with h5py.File(VLLM, "r", locking=False) as f:  # as spectrace opens it (one process)
        return f["blocks"][name][:]


def _without_17_to_20() -> np.ndarray:
    req, pos = _column("request"), _column("position")
    drop = (req == 2) & np.isin(pos, [17, 19, 20])
    assert drop.sum() == 3
    return ~drop


def _findings(*args) -> tuple[int, dict[str, dict]]:
    r = run_inproc(*args, "--format", "json")
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, {f["kind"]: f for f in json.loads(r.stdout)["findings"]}


def test_blocks_lost_mid_request_are_missing_work(tmp_path):
    bad = _copy(tmp_path / "holed.h5", keep=_without_17_to_20())
    code, found = _findings("check", bad)
    assert code == 1
    f = found["capture_incomplete"]
    assert f["message"] == (
        "trace: the trace holds 141 blocks where its recorder counted 144 at close (/meta "
        "checks.trace.blocks): blocks were lost or added since; 1 gap in the anchor chain "
        "although its draft_model drafter drafts at every step (first: request 2-9f89bbd7: "
        "the block at position 15 accepted 1, the next drafts from position 24, not 17): the "
        "blocks between are missing: agreement of the rest proves nothing"
    )
    assert f["evidence"]["recorded_blocks"] == 144
    assert f["evidence"]["chain_gaps"] == 1
    code, found = _findings("diff", REFERENCE, bad)
    assert code == 1 and found["capture_incomplete"]["side"] == "theirs"


def test_the_gap_alone_is_missing_work(tmp_path):
    # The recorder's count edited to match: the hole in the chain still says it.
    bad = _copy(tmp_path / "holed.h5", keep=_without_17_to_20(), drop_meta=("checks",))
    code, found = _findings("check", bad)
    assert code == 1
    assert found["capture_incomplete"]["evidence"]["chain_gaps"] == 1
    assert found["capture_incomplete"]["evidence"]["recorded_blocks"] is None


def test_clean_twin_an_ngram_run_skips_steps(tmp_path):
    # Prompt lookup drafts only where the context matches: steps without a block are no
    # lost work. Same rows removed, /meta method ngram, no recorder count.
    ok = _copy(
        tmp_path / "ngram.h5",
        keep=_without_17_to_20(),
        meta={"method": "ngram"},
        drop_meta=("checks",),
    )
    code, found = _findings("check", ok)
    assert "capture_incomplete" not in found
    assert code == 0


def test_clean_twin_the_bundled_traces_have_no_gap():
    for trace in (VLLM, REFERENCE):
        code, found = _findings("check", trace)
        assert code == 0 and "capture_incomplete" not in found


def test_a_model_drafter_without_blocks_is_missing_work(tmp_path):
    bad = _copy(tmp_path / "none.h5", keep=np.zeros(144, bool))
    code, found = _findings("check", bad)
    assert code == 1
    msg = found["capture_incomplete"]["message"]
    assert "the trace holds 0 blocks where its recorder counted 144" in msg
    assert (
        "no block although its draft_model drafter drafts at every step and 5 requests "
        "emitted 2 or more tokens" in msg
    )
    assert found["capture_incomplete"]["evidence"]["undrafted_requests"] == 5


def test_clean_twin_a_vanilla_run_has_no_blocks(tmp_path):
    ok = _copy(tmp_path / "vanilla.h5", keep=np.zeros(144, bool), drop_meta=("method", "checks"))
    code, found = _findings("check", ok)
    assert "capture_incomplete" not in found
    assert code == 0


def _finished(dst: Path, reason: str) -> Path:
    shutil.copyfile(VLLM, dst)
    with h5py.File(dst, "r+") as f:
        fr = f["requests/finish_reason"][:]
        fr[2] = reason.encode()
        f["requests/finish_reason"][:] = fr
    return dst


def test_finish_reason_error_is_incomplete(tmp_path):
    code, found = _findings("check", _finished(tmp_path / "e.h5", "error"))
    assert code == 1
    assert found["requests_incomplete"]["message"] == (
        "trace: 1 request did not complete (first: request 2-9f89bbd7, finish error after 64 "
        "output tokens): their work is missing, not compared"
    )


@pytest.mark.parametrize("reason", ["length", "stop", "repetition"])
def test_clean_twin_finish_reasons_of_completed_requests(tmp_path, reason):
    code, found = _findings("check", _finished(tmp_path / "ok.h5", reason))
    assert "requests_incomplete" not in found
    assert code == 0


def _verified_col(dst: Path, same, rows=slice(None)) -> Path:
    """The bundled trace (format 1.0, no verified_same) with verified slot 3 set to 5 in
    blocks ``rows`` and a verified_same column of ``same`` (one value or one per row)."""
    shutil.copyfile(VLLM, dst)
    with h5py.File(dst, "r+") as f:
        g = f["blocks"]
        v = g["verified"][:]
        v[rows, 3] = 5
        g["verified"][:] = v
        col = np.broadcast_to(np.asarray(same, np.int8), (len(v),))
        g.create_dataset("verified_same", data=col, maxshape=(None,))
    return dst


def test_validate_proves_verified_same(tmp_path):
    bad = _verified_col(tmp_path / "lie.h5", 1)
    r = run_inproc("validate", bad)
    assert r.returncode == 1
    # Every row lies: no block proposed 5 at slot 3 (its 139 verified rows now differ there),
    # and the 5 final proposals were never verified (-1 rows, unequal anyway).
    assert (
        f"{bad}: verified_same contradicts verified and proposed (1: the rows are equal) at "
        "row 0 (144 rows) (field=blocks/verified_same, value=1)"
    ) in r.stdout


def test_clean_twin_an_honest_verified_same_is_valid(tmp_path):
    # Slot 3 edited only where it was not accepted (accepted <= 3): a block that accepted
    # all 4 emitted its real slot-3 draft, and a verified 5 there contradicts it.
    with h5py.File(VLLM, "r", locking=False) as f:
        unaccepted = f["blocks"]["accepted"][:] <= 3
    ok = _verified_col(tmp_path / "honest.h5", (~unaccepted).astype(np.int8), unaccepted)
    assert run_inproc("validate", ok).returncode == 0
    code, found = _findings("check", ok)
    assert code == 1 and "verified_differs" in found
