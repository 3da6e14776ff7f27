"""The thirteenth round of defects a fresh user found, each with its clean twin.

Expected values derived by hand from the bundled traces (``traces/README.md``). vLLM's
request 0 (``0-baad9995``: prompt 10 + output 64 tokens, last index 73) ends with blocks at
64 (accepted 4), 69 (accepted 3) and its final, never-verified proposal at 73; its request 3
(``3-b7ce7833``) has 23 blocks. The reference log's last ``[SPECTRACE]`` line of request 4
(prompt 12 + 64 tokens, last index 75) is line 692 (``pos=75``: the block at 74); the block
before it is at 72 with ``acc=1``, so without that line the request's blocks reach 74.

1. Blocks lost at a request's end passed ``check``, ``import --strict`` and ``diff`` (exit 0):
   tokens emitted past the last block of a drafter that drafts every step.
   ``capture_incomplete``, exit 1.
2. A request with 64 output tokens and no block beside requests with blocks passed
   ``check``. ``capture_incomplete``, exit 1.
3. ``/meta checks.trace.blocks`` as 143.0 or "143" silenced the recorder-count check: exit 2.
4. A 0-D block column was an internal error (exit 3): exit 2 naming the field.
5. ``spectrace.diff(examples=0)`` kept no example where ``--examples 0`` keeps every one, and
   ``examples=-1`` dropped the last: 0 keeps every one, a negative count is an InputError.
6. A request id on both sides with another prompt read as "absent ... work is missing".
7. A replayed ``cmd`` engine that printed a block but wrote no requests record for it passed
   as "the target sampled another anchor": its result is missing, exit 3 (as a missing
   block is).
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
from replay_fake import replay_fake

import spectrace
from spectrace.tracer.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"
VLLM, REFERENCE = TRACES / "vllm.h5", TRACES / "reference.h5"
LOG, REQUESTS = TRACES / "reference.vt.log", TRACES / "reference.requests.jsonl"


def _vllm_copy(dst: Path, drop_rows=(), meta: dict | None = None, no_checks=True) -> Path:
    """The bundled vLLM trace without block rows ``drop_rows``; /meta items replaced by
    ``meta``; its ``checks`` removed (so that the recorder's block count does not speak)."""
    keep = np.ones(144, bool)  # traces/README.md: 144 blocks
    keep[list(drop_rows)] = False
    return edited_copy(VLLM, dst, keep, meta, ("checks",) if no_checks else ())


def _capture_message(*args) -> tuple[int, str | None]:
    r = run_inproc(*args, "--format", "json")
    found = {f["kind"]: f for f in json.loads(r.stdout)["findings"]}
    f = found.get("capture_incomplete")
    return r.returncode, None if f is None else f["message"]


# -- 1. blocks lost at a request's end -----------------------------------------------------


def _import(tmp_path: Path, drop_line: int | None, *extra: str) -> tuple[int, Path]:
    lines = LOG.read_text().splitlines(keepends=True)
    if drop_line is not None:
        assert lines[drop_line - 1].startswith("[SPECTRACE] req=4 pos=75 ")
        del lines[drop_line - 1]
    log = tmp_path / "run.vt.log"
    log.write_text("".join(lines))
    out = tmp_path / "run.h5"
    r = run_inproc("import", "vt", log, "-o", out, "--requests", REQUESTS, *extra)
    return r.returncode, out


def test_a_log_without_a_requests_last_block_is_missing_work(tmp_path):
    rc, trace = _import(tmp_path, 692, "--meta", "method=draft_model")
    assert rc == 0
    rc, message = _capture_message("check", trace)
    assert rc == 1
    assert message == (
        "trace: 1 request whose output goes on past its last block although its draft_model "
        "drafter drafts at every step (first: request 4: its last block, at position 72, "
        "reaches position 74; its output goes on to position 75): the blocks at the end are "
        "missing: agreement of the rest proves nothing"
    )
    assert run_inproc("diff", trace, VLLM).returncode == 1
    assert run_inproc("diff", trace, REFERENCE).returncode == 1


def test_clean_twin_the_whole_log_reaches_every_requests_end(tmp_path):
    rc, trace = _import(tmp_path, None, "--meta", "method=draft_model")
    assert rc == 0
    assert _capture_message("check", trace) == (0, None)
    assert run_inproc("diff", trace, REFERENCE).returncode == 0


def test_vllm_blocks_lost_at_a_requests_end_are_missing_work(tmp_path):
    trace = _vllm_copy(tmp_path / "cut.h5", drop_rows=(132, 135))  # request 0's last two
    rc, message = _capture_message("check", trace)
    assert rc == 1
    assert "(first: request 0-baad9995: its last block, at position 64, reaches position 69; " \
        "its output goes on to position 73)" in message  # fmt: skip


def test_clean_twin_without_the_final_unverified_proposal(tmp_path):
    # the block at 69 accepted 3: it reaches 73, the output's last token
    trace = _vllm_copy(tmp_path / "final.h5", drop_rows=(135,))
    assert _capture_message("check", trace) == (0, None)


# -- 2. a request served without a block ---------------------------------------------------


def _request_rows(row: int) -> list[int]:
    with h5py.File(VLLM, "r", locking=False) as f:
        return np.flatnonzero(f["blocks/request"][:] == row).tolist()


def test_a_request_without_blocks_is_missing_work(tmp_path):
    rows = _request_rows(3)
    assert len(rows) == 23
    rc, message = _capture_message("check", _vllm_copy(tmp_path / "no3.h5", drop_rows=rows))
    assert rc == 1
    assert message == (
        "trace: 1 request emitted 2 or more tokens without a block although its draft_model "
        "drafter drafts at every step (first: request 3-b7ce7833): its blocks are missing: "
        "agreement of the rest proves nothing"
    )


def test_clean_twin_an_ngram_request_may_never_match(tmp_path):
    trace = _vllm_copy(tmp_path / "ng.h5", drop_rows=_request_rows(3), meta={"method": "ngram"})
    assert _capture_message("check", trace) == (0, None)


# -- 3. the recorder's block count must be an integer --------------------------------------


def _with_recorded_blocks(dst: Path, value) -> Path:
    shutil.copyfile(VLLM, dst)
    with h5py.File(dst, "r+") as f:
        m = json.loads(f["meta"][()])
        m["checks"]["trace"]["blocks"] = value
        del f["meta"]
        f["meta"] = json.dumps(m)
    return dst


@pytest.mark.parametrize("value", [143.0, "143", -1])
def test_a_recorder_count_that_is_no_integer_is_bad_input(tmp_path, value):
    r = run_inproc("check", _with_recorded_blocks(tmp_path / "m.h5", value))
    assert r.returncode == 2
    assert r.stderr.splitlines()[-1].startswith(
        f"spectrace: error: {tmp_path / 'm.h5'}: checks.trace.blocks: expected an integer >= 0 "
        f"(field=meta.checks"
    )


def test_clean_twin_an_integer_recorder_count_is_read(tmp_path):
    assert run_inproc("check", _with_recorded_blocks(tmp_path / "ok.h5", 144)).returncode == 0
    rc, message = _capture_message("check", _with_recorded_blocks(tmp_path / "lo.h5", 143))
    assert rc == 1 and "where its recorder counted 143 at close" in message


# -- 4. a 0-D block column -----------------------------------------------------------------


def test_a_scalar_block_column_is_bad_input(tmp_path):
    dst = tmp_path / "scalar.h5"
    shutil.copyfile(VLLM, dst)
    with h5py.File(dst, "r+") as f:
        del f["blocks/k"]
        f["blocks"].create_dataset("k", data=np.int16(4))
    for cmd in ("info", "check"):
        r = run_inproc(cmd, dst)
        assert r.returncode == 2
        assert r.stderr.splitlines()[-1] == (
            f"spectrace: error: {dst}: stored 0-D, expected 1-D int16 (field=blocks/k)"
        )
    assert run_inproc("info", VLLM).returncode == 0  # twin: the bundled column


# -- 5. the API's examples -----------------------------------------------------------------


def test_api_examples_zero_keeps_every_divergent_block(tmp_path):
    dst = tmp_path / "shifted.h5"
    shutil.copyfile(VLLM, dst)
    with h5py.File(dst, "r+") as f:
        p = f["blocks/proposed"]
        p[:, 0] = np.where(p[:, 0] >= 0, p[:, 0] + 1, p[:, 0])  # every block's first draft
    # 139 paired blocks (the bundled pair), each differing now in slot 0
    assert len(spectrace.diff(dst, REFERENCE, examples=0).examples) == 139
    assert len(spectrace.diff(dst, REFERENCE, examples=None).examples) == 139
    assert len(spectrace.diff(dst, REFERENCE).examples) == 5
    for bad in (-1, 2.5, True):
        with pytest.raises(InputError):
            spectrace.diff(dst, REFERENCE, examples=bad)


# -- 6. a request id on both sides with another prompt -------------------------------------


def _reference_copy(dst: Path, prompt: list[int], req_id: str | None = None) -> Path:
    shutil.copyfile(REFERENCE, dst)
    with h5py.File(dst, "r+") as f:
        f["requests/prompt_ids"][2] = np.asarray(prompt, np.int32)
        if req_id is not None:
            f["requests/req_id"][2] = req_id
    return dst


def _requests_message(trace: Path) -> str:
    r = run_inproc("diff", trace, REFERENCE, "--format", "json")
    assert r.returncode == 1
    return next(
        f["message"]
        for f in json.loads(r.stdout)["findings"]
        if f["kind"] == "requests_incomplete" and f["side"] == "ours"
    )


def test_a_request_with_another_prompt_is_not_called_absent(tmp_path):
    trace = _reference_copy(tmp_path / "p.h5", [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16])
    assert _requests_message(trace) == (
        "ours: 1 request of the other side is absent (theirs' id 2); ours has a request 2 "
        "with another prompt: not compared, their prompts differ"
    )


def test_clean_twin_a_request_under_another_id_is_absent(tmp_path):
    trace = _reference_copy(tmp_path / "q.h5", [5, 6, 7, 8, 9, 10, 11, 12], req_id="2x")
    assert _requests_message(trace) == (
        "ours: 1 request of the other side is absent (theirs' id 2): their work is missing, "
        "not compared"
    )


# -- 7. a replayed engine that loses a request's record ------------------------------------

_FAKE_ENGINE = """
import json, sys
prompts, requests, unrecorded = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(requests, "w") as out:
    for line in open(prompts):
        d = json.loads(line)
        n = len(d["prompt_ids"])
        print(f"[SPECTRACE] req={d['id']} pos={n + 1} k=2 ns=1 acc=0 draft=[ 5 6 ] "
              f"emit=[ 7 ]", file=sys.stderr)
        if d["id"] not in unrecorded:
            out.write(json.dumps({"req_id": d["id"], "prompt_ids": d["prompt_ids"],
                                  "output_ids": [4, 7]}) + "\\n")
"""


def _replay_fake(tmp_path: Path, *unrecorded: str):
    """Replay a 3-token prompt + 4-token output: 3 positions (3, 4, 5: sites 0, 1, 2)."""
    return replay_fake(tmp_path, _FAKE_ENGINE, *unrecorded)


def test_an_engine_that_loses_a_requests_record_failed(tmp_path):
    r, out = _replay_fake(tmp_path, "2")
    assert (r.returncode, r.stdout) == (3, "")
    assert r.stderr.splitlines()[-1] == (
        "spectrace: error: engine left no anchor at 1 of 3 replayed positions (first: request "
        "a position 5, site 2: no requests record holds it): its results there are missing"
    )
    assert not out.exists()


def test_clean_twin_an_engine_that_records_every_request_replays(tmp_path):
    r, out = _replay_fake(tmp_path)
    assert r.returncode == 0, r.stderr
    with h5py.File(out) as f:
        assert [int(x) for x in f["blocks/position"][()]] == [3, 4, 5]
