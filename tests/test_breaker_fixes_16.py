"""The sixteenth round of defects (fresh-user round 18, on the importers), each with its
clean twin; every expected figure is derived by hand in the comments.

1. A llama.cpp step with ``n_draft + pmin_drop`` past /meta k's bound (1024) imported with
   exit 0 into a trace no command opens (``check`` exit 2 on meta.k), and past int16 died
   of an OverflowError (exit 3). Now it is an ``invalid_step`` problem: counted (the step is
   lost: ``check`` exit 1), ``--strict`` exit 2 naming the line and field.
2. A requests file's ``req_id`` of another script's digit ("²", no ``seq``) died of a
   ValueError (exit 3): ``str.isdigit`` is true of it, ``int`` refuses it. Now it is no
   sequence number (its steps are ``unknown_seq``).
3. A golden record that is no object was located at line 0. Now the message names the
   record's index, at the line of the document around it.
4. A golden's lost blocks were named "the log lost N trace lines", and a golden short of
   its counters "the capture did not end cleanly": now "the golden lost N blocks" and
   "blocks the engine counted are missing from the trace".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from inproc import run_inproc

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data_importers" / "golden_small.json"
# prompt [1, 2], output [5, 6, 7]: full [1, 2, 5, 6, 7]; the first anchor is 5 at position 2
REQUEST = '{"req_id": "0", "prompt_ids": [1, 2], "output_ids": [5, 6, 7], "finish_reason": "stop"}'


def _step(pmin_drop: int) -> str:
    # one step at position 2: draft 6 accepted (full[3]), the bonus 7 ends the output
    return json.dumps(
        {"step": 1, "seq": 0, "n_draft": 1, "n_accepted": 1, "pmin_drop": pmin_drop,
         "pos": [{"i": 0, "tok": 6}]}
    )  # fmt: skip


def _files(tmp_path: Path, pmin_drop: int, req: str = REQUEST) -> tuple[Path, Path]:
    """The dump of one step of seq 0 (request ``req``) beside a clean step of request "1"
    (seq 1, the same prompt and output), and the requests file."""
    dump, reqs = tmp_path / "d.jsonl", tmp_path / "r.jsonl"
    other = _step(0).replace('"seq": 0', '"seq": 1')
    dump.write_text(_step(pmin_drop) + "\n" + other + "\n")
    reqs.write_text(req + "\n" + REQUEST.replace('"0"', '"1"') + "\n")
    return dump, reqs


def _check(path: Path) -> tuple[int, list[str]]:
    r = run_inproc("check", path, "--format", "json")
    return r.returncode, [
        f["kind"] for f in json.loads(r.stdout)["findings"] if f["severity"] == "error"
    ]


@pytest.mark.parametrize("pmin_drop", [1100, 32767])
def test_a_dump_step_wider_than_k_can_be_is_a_lost_step(tmp_path, pmin_drop):
    dump, reqs = _files(tmp_path, pmin_drop)
    out = tmp_path / "l.h5"
    r = run_inproc("import", "llama-dump", dump, "--requests", reqs, "-o", out, "--strict")
    what = f"{1 + pmin_drop} drafts (n_draft + pmin_drop), more than k can be (1024)"
    assert (r.returncode, r.stderr.splitlines()) == (
        2,
        [f"spectrace: error: {dump}:1: {what} (field=n_draft, value=1)"],
    )
    assert not out.exists()
    r = run_inproc("import", "llama-dump", dump, "--requests", reqs, "-o", out)
    assert r.returncode == 0 and f"1 invalid_step (first at {dump}:1: {what}" in r.stderr
    assert _check(out) == (1, ["capture_incomplete"])


def _imports_clean(tmp_path: Path, pmin_drop: int) -> None:
    """The dump of :func:`_files` imports with ``--strict`` and checks clean."""
    dump, reqs = _files(tmp_path, pmin_drop)
    out = tmp_path / "l.h5"
    r = run_inproc("import", "llama-dump", dump, "--requests", reqs, "-o", out, "--strict")
    assert r.returncode == 0, r.stderr
    assert _check(out) == (0, [])


def test_a_dump_step_within_k_imports_clean(tmp_path):
    """Twin: 1 draft + 3 trimmed by p_min = k 4."""
    _imports_clean(tmp_path, 3)


def test_a_request_id_of_another_scripts_digit_is_no_sequence(tmp_path):
    dump, reqs = _files(tmp_path, 0, REQUEST.replace('"0"', '"\\u00b2"'))  # "²"
    out = tmp_path / "l.h5"
    r = run_inproc("import", "llama-dump", dump, "--requests", reqs, "-o", out)
    assert r.returncode == 0, r.stderr
    assert f"1 unknown_seq (first at {dump}:1: no request of this sequence" in r.stderr
    assert _check(out) == (1, ["capture_incomplete"])  # its step is lost


def test_a_request_id_of_ascii_digits_is_its_sequence(tmp_path):
    """Twin: req_id "0" is seq 0: the step is placed."""
    _imports_clean(tmp_path, 0)


def test_a_golden_record_that_is_no_object_is_named_by_its_index(tmp_path):
    doc = json.loads(GOLDEN.read_text())
    doc["records"].append(5)  # record 4; the document's object starts on line 1
    src = tmp_path / "g.json"
    src.write_text(json.dumps(doc, indent=2))
    r = run_inproc("import", "golden", src, "-o", tmp_path / "g.h5")
    assert r.returncode == 0
    assert (
        f"1 invalid_record (first at {src}:1: record 4 is not an object (field=records, value=5))"
    ) in r.stderr


def _vllm_golden(tmp_path: Path, counters: bool) -> Path:
    """The golden of the bundled real vLLM trace (test_golden_final_proposals writes it)
    with request 0's sixth block deleted: the walk ends on the seventh's anchor."""
    from test_golden_final_proposals import VLLM, _golden_of

    src = tmp_path / "g.json"
    doc = _golden_of(VLLM, src)
    if not counters:
        del doc["metrics"]
    del doc["records"][0]["blocks"][5]
    src.write_text(json.dumps(doc))
    return src


def test_a_golden_that_lost_blocks_says_so_in_its_own_words(tmp_path):
    from spectrace.tracer.store import open_trace

    t = open_trace(ROOT / "traces" / "vllm.h5")
    n0 = int((t.blocks.request == 0).sum())  # request 0's blocks, its final proposal included
    out = tmp_path / "g.h5"
    assert run_inproc("import", "golden", _vllm_golden(tmp_path, False), "-o", out).returncode == 0
    r = run_inproc("check", out)
    assert r.returncode == 1
    # 5 blocks placed, the one at index 5 (the former 7th) ends the walk, the rest follow it
    assert f"the golden lost {n0 - 6} blocks (not placed: a damaged record or block" in r.stdout
    assert "trace line" not in r.stdout
    out2 = tmp_path / "g2.h5"
    assert run_inproc("import", "golden", _vllm_golden(tmp_path, True), "-o", out2).returncode == 0
    r = run_inproc("check", out2)
    assert r.returncode == 1
    assert "blocks the engine counted are missing from the trace" in r.stdout
    assert "did not end cleanly" not in r.stdout


def test_a_killed_capture_still_says_it_did_not_end_cleanly(tmp_path):
    """Twin of the wording: an interrupted capture (the bundled vLLM trace's /meta edited)
    is still 'did not end cleanly'."""
    import shutil

    import h5py

    p = tmp_path / "k.h5"
    shutil.copy(ROOT / "traces" / "vllm.h5", p)
    with h5py.File(p, "r+") as f:
        meta = json.loads(f["meta"][()])
        meta["capture"] = {"ended": "interrupted", "signal": 2}
        del f["meta"]
        f["meta"] = json.dumps(meta)
    r = run_inproc("check", p)
    assert r.returncode == 1 and "did not end cleanly" in r.stdout
