"""The eleventh round of defects a fresh user found, on real reference-engine runs, each with
its clean twin (expected values derived by hand from the engine's own log lines).

1. A k=1 run with the ``k_minus_one`` fault never installs a draft (``[spec-install]
   installed=0 lookahead=1`` at every step, no ``[SPECTRACE]`` line): its trace recorded /meta
   k 0 (no block to take k from) and read as a vanilla run, so ``diff`` against the clean k=1
   run passed (``content_only``) and ``check`` too. Now /meta k is the engine's lookahead (1)
   and an unknown method with k >= 1 is a speculative run: ``capture_incomplete`` (no block
   although the drafter printed ``[spec-propose]`` lines) and, in the diff,
   ``unverified_drafts`` (5 requests never draft).
2. An n-gram run whose log lost two verify lines of request 3 (anchors 32 and 40) passed
   ``diff`` against the full log: one skipped anchor was below the 3 the detector required,
   and the gap after anchor 27 (accepted 3: next expected 31, a step without a match in
   both runs) hid the skip at 32. Now each gap counts when the other side drafted from any
   anchor inside it: 2 skips, the first before position 37.
3. Two runs configured to draft that never reached a verify step (max_tokens 1) were called
   runs "without speculative decoding" (content_only's words).
4. A one-sided loop against a run cut short (its requests never finished, imported without
   the requests file) was an error claiming the other output does not loop there; and the
   requests_incomplete finding sat at position 0 (inside the unknown prompt).
5. A llama.cpp dump that lost one step read as the engine's miscount
   (acceptance_bookkeeping): the placement after it is off the output (accepted drafts
   differ from it), which a healthy dump never is: ``capture_incomplete``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from inproc import run_inproc

from spectrace.tracer.store import open_trace

SPECTRACE = str(Path(sys.executable).parent / "spectrace")


def _json(*args) -> tuple[int, list[dict]]:
    r = run_inproc(*args, "--format", "json")
    assert "Traceback" not in r.stderr, r.stderr
    return r.returncode, json.loads(r.stdout)["findings"]


@pytest.fixture(scope="module")
def k1(tmp_path_factory, capture_reference):
    tmp = tmp_path_factory.mktemp("k1")
    for name, args in (("clean", []), ("k_minus_one", ["--fault", "k_minus_one"])):
        proc = capture_reference(tmp, name, args, 1, 24)
        assert proc.returncode == 0, proc.stderr[-2000:]
    return tmp


def test_a_k1_run_that_never_installs_a_draft_lost_its_drafts(k1):
    log = (k1 / "k_minus_one.log").read_text()
    assert "[SPECTRACE]" not in log and "installed=0 lookahead=1" in log
    bad = k1 / "k_minus_one.h5"
    t = open_trace(bad)
    assert (len(t.blocks), t.meta["k"], t.meta["method"]) == (0, 1, None)
    code, found = _json("check", bad)
    assert code == 1
    assert [f["kind"] for f in found if f["severity"] == "error"] == ["capture_incomplete"]
    assert found[0]["evidence"]["undrafted_requests"] == 5  # 5 prompts, 24 tokens each
    code, found = _json("diff", k1 / "clean.h5", bad)
    assert code == 1
    errors = [(f["kind"], f["side"]) for f in found if f["severity"] == "error"]
    assert errors == [("capture_incomplete", "theirs"), ("unverified_drafts", "theirs")]


def test_clean_twin_the_k1_run_that_drafts_passes(k1):
    good = k1 / "clean.h5"
    assert open_trace(good).meta["k"] == 1
    assert _json("check", good)[0] == 0
    assert _json("diff", good, good)[0] == 0


@pytest.fixture(scope="module")
def ngram(tmp_path_factory, capture_reference):
    tmp = tmp_path_factory.mktemp("ngram")
    proc = capture_reference(tmp, "ng", ["--method", "ngram"], 4, 48)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = (tmp / "ng.log").read_text().splitlines(True)
    verify = [i for i, x in enumerate(lines) if x.startswith("[SPECTRACE] req=3 ")]
    dropped = [lines[verify[3]], lines[verify[5]]]
    (tmp / "drop2.log").write_text("".join(x for x in lines if x not in dropped))
    for log, out in (("ng.log", "full.h5"), ("drop2.log", "drop2.h5")):
        cmd = [SPECTRACE, "import", "vt", str(tmp / log), "-o", str(tmp / out)]
        cmd += ["--requests", str(tmp / "ng.requests.jsonl"), "--meta", "method=ngram"]
        assert subprocess.run(cmd, capture_output=True, timeout=120).returncode == 0
    return tmp, dropped


def test_an_ngram_run_that_lost_two_blocks_diverges(ngram):
    tmp, dropped = ngram
    # the engine's lines (VT pos = anchor position + 1): anchors 32 and 40 of request 3
    assert [x.split()[2] for x in dropped] == ["pos=33", "pos=41"]
    code, found = _json("diff", tmp / "full.h5", tmp / "drop2.h5")
    assert code == 1
    [f] = [f for f in found if f["severity"] == "error"]
    assert (f["kind"], f["side"], f["request"], f["position"]) == (
        "unverified_drafts",
        "theirs",
        "3",
        37,
    )
    assert f["evidence"]["skipped_anchors"] == 2


def test_clean_twin_the_full_ngram_log_passes(ngram):
    tmp, _ = ngram
    assert _json("diff", tmp / "full.h5", tmp / "full.h5")[0] == 0
    code, found = _json("check", tmp / "full.h5")
    assert code == 0 and not [f for f in found if f["severity"] == "error"]


def test_runs_configured_to_draft_without_a_verify_step_are_no_vanilla_runs(
    tmp_path, capture_reference
):
    # max_tokens 1: the prefill emits the only token, no proposal is ever verified.
    for name, args in (("m1", []), ("m1_shift", ["--fault", "layout_shift"])):
        assert capture_reference(tmp_path, name, args, 4, 1).returncode == 0
    code, found = _json("diff", tmp_path / "m1.h5", tmp_path / "m1_shift.h5")
    assert code == 0
    [f] = found
    assert f["kind"] == "content_only"
    assert f["message"] == (
        "ours and theirs have no draft blocks (configured to draft, none verified): no draft "
        "comparison was possible; the outputs were compared, identical in 5 of 5 matched "
        "requests"
    )


@pytest.fixture(scope="module")
def long_run(tmp_path_factory, capture_reference):
    """A 200-token run (3 of its 5 outputs loop) and its log cut at line 1400, imported
    without the requests file (4 requests never print finished=1 there)."""
    tmp = tmp_path_factory.mktemp("long")
    assert capture_reference(tmp, "long", [], 4, 200).returncode == 0
    lines = (tmp / "long.log").read_text().splitlines(True)
    (tmp / "cut.log").write_text("".join(lines[:1400]))
    cmd = [SPECTRACE, "import", "vt", str(tmp / "cut.log"), "-o", str(tmp / "cut.h5")]
    assert subprocess.run(cmd, capture_output=True, timeout=120).returncode == 0
    return tmp


def test_a_loop_against_a_run_cut_short_is_no_one_sided_loop(long_run):
    code, found = _json("diff", long_run / "long.h5", long_run / "cut.h5")
    assert code == 1
    by_kind = {f["kind"]: f for f in found}
    loop = by_kind["degenerate_output"]
    assert (loop["severity"], loop["side"]) == ("warning", "ours")
    assert "it ends before the loop starts" in loop["message"]
    # theirs knows neither prompt nor output of its unfinished requests: no position
    req = by_kind["requests_incomplete"]
    assert (req["side"], req["request"], req["position"]) == ("theirs", "0", None)


def test_clean_twin_a_loop_both_runs_share_is_a_warning(long_run):
    code, found = _json("diff", long_run / "long.h5", long_run / "long.h5")
    assert code == 0
    [loop] = [f for f in found if f["kind"] == "degenerate_output"]
    assert loop["severity"] == "warning" and "both engines loop identically" in loop["message"]


DATA = Path(__file__).parent / "data_importers"


def _dump(tmp_path: Path, keep: list[int]) -> Path:
    """The bundled mini llama.cpp dump's clean steps (lines 1-4 and 6: steps 1/seq 0, 1/1,
    2/0, 2/1, 3/0, every one placed), those at ``keep``, imported on its requests file."""
    lines = (DATA / "llama_spec_dump.jsonl").read_text().splitlines()
    clean = lines[:4] + lines[5:6]
    src = tmp_path / "dump.jsonl"
    src.write_text("\n".join(clean[i] for i in keep) + "\n")
    out = tmp_path / "dump.h5"
    cmd = [SPECTRACE, "import", "llama-dump", str(src), "-o", str(out)]
    cmd += ["--requests", str(DATA / "llama.requests.jsonl")]
    assert subprocess.run(cmd, capture_output=True, timeout=120).returncode == 0
    return out


def test_a_llama_dump_that_lost_a_step_is_missing_work(tmp_path):
    # Step 1 of seq 0 lost: step 2 (drafts 9 10 12, 2 accepted) is placed at request a's
    # first anchor (position 2), where a's output holds 6 7 at positions 3 and 4.
    lost = _dump(tmp_path, [1, 2, 3, 4])
    code, found = _json("check", lost)
    assert code == 1
    [f] = [f for f in found if f["kind"] == "capture_incomplete"]
    assert (
        f"first: {tmp_path / 'dump.jsonl'}:2: accepted drafts differ from req=a's output at "
        "position 3" in f["message"]
    )


def test_clean_twin_the_whole_llama_dump_is_no_missing_work(tmp_path):
    code, found = _json("check", _dump(tmp_path, [0, 1, 2, 3, 4]))
    assert "capture_incomplete" not in [f["kind"] for f in found]
