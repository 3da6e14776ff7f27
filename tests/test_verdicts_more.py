"""Wrong verdicts a new-user tester found, each with its clean twin.

1. A VT log that lost trace lines (malformed lines dropped by the import, a deleted line that
   leaves a chain gap of a model drafter) is missing work: capture_incomplete, exit 1.
2. A sparse replay (``/meta`` ``source: "replay"``) diffed against a natural capture: the
   positions it never replayed are not dropped drafts.
3. Single impossible values (a proposed id or anchor below -1, a k wider than the stored
   proposals) and ids outside a known vocabulary, each in one block.
4. Unknown outputs (no output ids, no finish reason) are not missing work, and a loop the
   other side cannot show (its output is unknown) is a warning, not an error.

Traces are built with TraceWriter from hand-derived blocks (tests/test_verdicts.py's
builders) or imported from the bundled reference VT log with lines edited; the expected line
numbers come from this file's own scan of the raw lines, never from the importer.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from test_verdicts import (
    NGRAM_LOG,
    OUTPUTS,
    PROMPTS,
    assert_clean,
    check_json,
    clean_trace,
    complete,
    diff_json,
    errors,
    first_error,
    ngram_blocks,
    ngram_trace,
    perfect_blocks,
    write_trace,
)

from spectrace.hooks.vt.importer import import_log
from spectrace.tracer.store import TraceWriter

ROOT = Path(__file__).resolve().parent.parent
REF_LOG = ROOT / "traces" / "reference.vt.log"
REF_REQ = ROOT / "traces" / "reference.requests.jsonl"
REF_H5 = ROOT / "traces" / "reference.h5"
TOKENIZER = ROOT / "engine" / "models" / "target"
TRACE_LINE = re.compile(r"^\[SPECTRACE\] req=(\S+) pos=(\d+)")


def ref_import(tmp_path, name, lines):
    """Import ``lines`` (the edited reference log) as NAME.log with the reference requests."""
    log = tmp_path / f"{name}.log"
    log.write_text("\n".join(lines) + "\n")
    out = tmp_path / f"{name}.h5"
    import_log(log, out, requests_path=REF_REQ)
    return out


def ref_lines():
    return REF_LOG.read_text().splitlines()


def trace_line_numbers(lines):
    """1-based numbers of the [SPECTRACE] lines of ``lines``, in order."""
    return [i + 1 for i, line in enumerate(lines) if TRACE_LINE.match(line)]


def assert_lost(path, name, dropped, first_line, what):
    """check and both diff orders against the bundled reference: capture_incomplete naming
    ``dropped`` lost lines and the first as NAME.log:LINE: WHAT..."""
    rc, doc = check_json(path)
    f = first_error(rc, doc, "capture_incomplete")
    assert f["evidence"]["dropped_lines"] == dropped
    # FILE is the log's name as the import was given it (here a full path).
    assert f"{name}.log:{first_line}: {what}" in f["evidence"]["first_dropped"]
    assert f"the log lost {dropped} trace line" in f["message"]
    assert f"{name}.log:{first_line}" in f["message"]
    for ours, theirs, side in ((path, REF_H5, "ours"), (REF_H5, path, "theirs")):
        rc, doc = diff_json(ours, theirs)
        assert first_error(rc, doc, "capture_incomplete")["side"] == side


# ------------------------------------------------------------ 1. lost VT trace lines


def test_unmodified_reference_log_is_clean(tmp_path):
    """Clean twin of the lost-line cases: the bundled log re-imported as it is."""
    out = ref_import(tmp_path, "ref", ref_lines())
    assert_clean(*check_json(out))
    assert_clean(*diff_json(out, REF_H5))
    assert_clean(*diff_json(REF_H5, out))


def test_first_ten_lines_unreadable_are_lost_work(tmp_path):
    """acc=x on the first 10 [SPECTRACE] lines: the import drops 10 lines, the first at the
    first trace line of the log."""
    lines = ref_lines()
    nums = trace_line_numbers(lines)
    for n in nums[:10]:
        lines[n - 1] = re.sub(r"acc=\d+", "acc=x", lines[n - 1])
    out = ref_import(tmp_path, "first10", lines)
    assert_lost(out, "first10", 10, nums[0], "malformed trace line: acc=x is not an integer")


def test_out_of_range_values_are_lost_work(tmp_path):
    """acc=7 with k=4, and k=-4, on the first trace line: dropped as malformed (1 line)."""
    first = trace_line_numbers(ref_lines())[0]
    for name, old, new in (("acc7", r"acc=\d+", "acc=7"), ("kneg", r"k=4", "k=-4")):
        lines = ref_lines()
        assert re.search(old, lines[first - 1])  # the premise, from the raw line
        lines[first - 1] = re.sub(old, new, lines[first - 1], count=1)
        out = ref_import(tmp_path, name, lines)
        assert_lost(out, name, 1, first, "malformed trace line:")


def test_deleted_line_of_a_model_drafter_is_lost_work(tmp_path):
    """Request 1's third [SPECTRACE] line deleted: its fourth line now starts after a gap
    (a chain gap); the draft-model engine drafts every step (its log prints [spec-propose]
    lines), so the gap is a lost line, reported at the line after it."""
    lines = ref_lines()
    assert any(line.startswith("[spec-propose]") for line in lines)
    req1 = [n for n in trace_line_numbers(lines) if TRACE_LINE.match(lines[n - 1])[1] == "1"]
    third, fourth = req1[2], req1[3]
    del lines[third - 1]
    out = ref_import(tmp_path, "del", lines)
    # The fourth line moved up by one: the gap is seen there.
    assert_lost(out, "del", 1, fourth - 1, "req=1 pos=")


def test_ngram_chain_gaps_are_steps_without_drafts():
    """Clean twin of the deleted line: prompt lookup skips steps without a match (the raw
    log's chains have gaps, and no [spec-propose] line): not lost lines."""
    by_req: dict[str, list[tuple[int, int]]] = {}
    for req, anchor, ns in ngram_blocks():
        by_req.setdefault(req, []).append((anchor, ns))
    gaps = sum(b[0] > a[0] + a[1] for v in by_req.values() for a, b in zip(v, v[1:]))
    assert gaps > 0  # the premise
    assert "[spec-propose]" not in NGRAM_LOG.read_text()


def test_ngram_log_with_gaps_checks_clean(tmp_path):
    assert_clean(*check_json(ngram_trace(tmp_path, "ngram")))


# --------------------------------------------------------- 2. sparse replay vs natural


def sparse(path, meta):
    """a drafts at 2 only, b at 5 only, c never (the natural trace drafts at 2, 5, 8, 11)."""
    blocks = perfect_blocks("a", (2,)) + perfect_blocks("b", (5,))
    return write_trace(path, complete(), blocks, {"exit_status": 0, **meta})


def test_sparse_replay_is_not_dropped_drafts(tmp_path):
    natural = clean_trace(tmp_path / "natural.h5")
    replay = sparse(tmp_path / "replay.h5", {"source": "replay", "replay": {"positions": 4}})
    assert_clean(*diff_json(replay, natural))
    assert_clean(*diff_json(natural, replay))


def test_same_sparse_blocks_in_a_natural_capture_are_dropped_drafts(tmp_path):
    """Twin: the same blocks captured naturally. a's last verified block is at 2 (2 + 2 + 1
    = 5 < 8, 11 where theirs drafts), b's at 5 (5 + 3 = 8 < 11): both stop; c never drafts,
    first at position 2 on theirs."""
    natural = clean_trace(tmp_path / "natural.h5")
    ours = sparse(tmp_path / "ours.h5", {})
    rc, doc = diff_json(ours, natural)
    f = first_error(rc, doc, "unverified_drafts")
    assert (f["side"], f["request"], f["position"]) == ("ours", "c", 2)
    assert f["evidence"]["requests_never_drafting"] == ["c"]
    assert f["evidence"]["requests_stopping"] == ["a", "b"]


# ----------------------------------------------------------- 3. single impossible values


def one_bad_block(path, prop=None, anchor=None, meta=None):
    """The clean trace with request b's block at position 5 (block row 5: a's four blocks
    come first) given proposed ``prop`` and/or ``anchor``."""
    blocks = [b for r in PROMPTS for b in perfect_blocks(r)]
    seq = PROMPTS["b"] + OUTPUTS["b"]
    with TraceWriter(path, meta={"engine": "test", "k": 2, "exit_status": 0, **(meta or {})}) as w:
        for rid, (out, fin) in complete().items():
            w.request(rid, prompt_ids=PROMPTS[rid], output_ids=out, finish_reason=fin)
        for step, (rid, pos, p, v, acc) in enumerate(blocks):
            s = PROMPTS[rid] + OUTPUTS[rid]
            bad = rid == "b" and pos == 5
            w.add_block(
                rid,
                step,
                pos,
                anchor if bad and anchor is not None else s[pos],
                prop if bad and prop is not None else p,
                verified=prop if bad and prop is not None else v,
                accepted=1 if bad and prop is not None else acc,
                emitted=s[pos + 1 : pos + 2 + (1 if bad and prop is not None else acc)],
            )
    assert seq[6:8] == [203, 204]
    return path


def impossible(path):
    rc, doc = check_json(path)
    assert rc == 1
    return next(f for f in errors(doc) if f["kind"] == "impossible_values")


def test_proposed_id_below_minus_one(tmp_path):
    f = impossible(one_bad_block(tmp_path / "p.h5", prop=[203, -9]))
    ev = f["evidence"]
    assert (f["request"], f["position"]) == ("b", 5)
    assert (ev["rule"], ev["column"], ev["value"], ev["row"], ev["blocks"]) == (
        "proposed id < -1",
        "proposed",
        -9,
        5,
        1,
    )


def test_anchor_below_minus_one(tmp_path):
    f = impossible(one_bad_block(tmp_path / "a.h5", anchor=-5))
    ev = f["evidence"]
    assert (f["request"], f["position"], ev["rule"], ev["value"], ev["row"]) == (
        "b",
        5,
        "anchor < -1",
        -5,
        5,
    )


def test_k_wider_than_the_stored_proposals(tmp_path):
    """Block 1 says k=3 while the proposals are stored 2 wide."""
    path = tmp_path / "k.h5"
    seq = PROMPTS["a"] + OUTPUTS["a"]
    _k_wide(path, 2, seq[6:8])
    f = impossible(path)
    ev = f["evidence"]
    assert (f["request"], f["position"], ev["rule"], ev["value"], ev["limit"], ev["row"]) == (
        "a",
        5,
        "k > proposed width",
        3,
        2,
        1,
    )


def _k_wide(path, width: int, last: list[int]) -> None:
    """Request a's blocks at 2 and 5 (k 2 and 3), proposals stored ``width`` wide, the
    block at 5 proposing ``last``."""
    seq = PROMPTS["a"] + OUTPUTS["a"]
    prop = np.full((2, width), -1)
    prop[0, :2], prop[1, : len(last)] = seq[3:5], last
    with TraceWriter(path, meta={"engine": "test", "k": 2, "exit_status": 0}) as w:
        w.request("a", prompt_ids=PROMPTS["a"], output_ids=OUTPUTS["a"], finish_reason="length")
        w.add_blocks(
            {
                "request": np.array([0, 0]),
                "step": np.array([0, 1]),
                "position": np.array([2, 5]),
                "anchor": np.array([seq[2], seq[5]]),
                "k": np.array([2, 3]),
                "proposed": prop,
                "num_verified": np.array([2, 2]),
                "verified": prop[:, :2],
                "accepted": np.array([2, 2]),
            }
        )


def test_k_wider_than_the_stored_proposals_shows_the_stored_ids(tmp_path):
    """Ours stores 2 ids for k=3 at position 5; theirs stores 3 other ids: every example of
    the diff shows our 2 stored ids (no -1 pad of the wider side; found by a breaker)."""
    seq = PROMPTS["a"] + OUTPUTS["a"]
    _k_wide(tmp_path / "ours.h5", 2, seq[6:8])
    _k_wide(tmp_path / "theirs.h5", 3, [7, 8, 9])
    rc, doc = diff_json(tmp_path / "ours.h5", tmp_path / "theirs.h5")
    assert rc == 1
    shown = [e["ours"] for e in doc["examples"]]
    shown += [
        f["evidence"]["example"]["ours"]
        for f in doc["findings"]
        if "example" in (f.get("evidence") or {})
        and isinstance(f["evidence"]["example"], dict)
        and "ours" in f["evidence"]["example"]
    ]
    assert shown and all(s == list(seq[6:8]) for s in shown), shown


def test_minus_one_pad_and_short_proposals_are_possible(tmp_path):
    """Twin: b's block at 5 proposes one id, 203 (k=1, the second slot the -1 pad)."""
    path = one_bad_block(tmp_path / "short.h5", prop=[203])
    rc, doc = check_json(path)
    assert not [f for f in doc["findings"] if f["kind"] in ("impossible_values", "vocab_mapping")]


def test_id_outside_a_known_vocabulary(tmp_path):
    """One proposed id 999999 with vocab_size 2048 in /meta (one block is enough)."""
    path = one_bad_block(tmp_path / "v.h5", prop=[203, 999999], meta={"vocab_size": 2048})
    rc, doc = check_json(path)
    f = first_error(rc, doc, "vocab_mapping")
    assert (f["request"], f["position"], f["slot"]) == ("b", 5, 1)
    assert f["evidence"] == {"ids": 1, "vocab_size": 2048, "max_id": 999999}
    assert "ids out of range" in f["message"]


def test_id_outside_the_tokenizers_vocabulary(tmp_path):
    """No vocab_size in /meta, but the trace names the bundled target's tokenizer."""
    import json

    vocab = len(json.loads((TOKENIZER / "tokenizer.json").read_text())["model"]["vocab"])
    path = one_bad_block(tmp_path / "t.h5", prop=[203, 999999], meta={"tokenizer": str(TOKENIZER)})
    rc, doc = check_json(path)
    f = first_error(rc, doc, "vocab_mapping")
    assert (f["request"], f["position"], f["slot"]) == ("b", 5, 1)
    assert f["evidence"]["ids"] == 1 and f["evidence"]["max_id"] == 999999
    assert f["evidence"]["vocab_size"] >= vocab


def test_ids_unchecked_without_a_vocabulary(tmp_path):
    """Twin: no vocab_size and no tokenizer: nothing says 999999 is out of range."""
    path = one_bad_block(tmp_path / "u.h5", prop=[203, 999999])
    rc, doc = check_json(path)
    assert not [f for f in doc["findings"] if f["kind"] == "vocab_mapping"]


# ----------------------------------------------------------------- 4. unknown outputs

LOOPING = [100, 101, 102] + [150, 151, 152] * 9  # 30 tokens: a period-3 loop from output 3


def loop_trace(path, known, output=LOOPING):
    """One request a, prompt [1, 2, 3], ``output`` (known) or unknown (no ids, finish ''),
    perfect k=2 blocks at 2, 5, 8, 11."""
    seq = PROMPTS["a"] + output
    with TraceWriter(path, meta={"engine": "test", "k": 2, "exit_status": 0}) as w:
        out, fin = (output, "length") if known else ([], "")
        w.request("a", prompt_ids=PROMPTS["a"], output_ids=out, finish_reason=fin)
        for step, p in enumerate((2, 5, 8, 11)):
            d = seq[p + 1 : p + 3]
            w.add_block("a", step, p, seq[p], d, verified=d, accepted=2, emitted=seq[p + 1 : p + 4])
    return path


def test_unknown_outputs_are_not_missing_work(tmp_path):
    """The perfect trace with every output unknown vs the complete one: nothing is missing."""
    blocks = [b for r in PROMPTS for b in perfect_blocks(r)]
    unknown = write_trace(
        tmp_path / "unknown.h5", {r: ([], "") for r in PROMPTS}, blocks, {"exit_status": 0}
    )
    clean = clean_trace(tmp_path / "clean.h5")
    for ours, theirs in ((unknown, clean), (clean, unknown)):
        rc, doc = diff_json(ours, theirs)
        assert_clean(rc, doc)
        assert not [f for f in doc["findings"] if f["kind"] == "requests_incomplete"]
    assert_clean(*check_json(unknown))


def test_empty_output_that_stopped_short_is_still_missing_work(tmp_path):
    """Twin: b with no output but finish 'abort' (known: the engine gave up) is named."""
    reqs = {**complete(), "b": ([], "abort")}
    blocks = perfect_blocks("a") + perfect_blocks("c")
    ours = write_trace(tmp_path / "abort.h5", reqs, blocks, {"exit_status": 0})
    rc, doc = diff_json(ours, clean_trace(tmp_path / "clean.h5"))
    f = first_error(rc, doc, "requests_incomplete")
    assert (f["side"], f["request"], f["evidence"]["empty_output"]) == ("ours", "b", ["b"])


def test_loop_against_an_unknown_output_is_a_warning(tmp_path):
    """theirs loops from position 3 + 3 = 6, period 3; ours does not know its output."""
    rc, doc = diff_json(loop_trace(tmp_path / "u.h5", False), loop_trace(tmp_path / "k.h5", True))
    assert_clean(rc, doc)
    (f,) = [f for f in doc["findings"] if f["kind"] == "degenerate_output"]
    assert (f["severity"], f["side"], f["request"], f["position"]) == ("warning", "theirs", "a", 6)
    assert "output is unknown there" in f["message"]


def test_loop_against_a_known_output_without_it_is_an_error(tmp_path):
    """Twin: ours known, leaving the loop after two periods (at position 3 + 9 = 12, past
    the loop's start 6): theirs' loop is one-sided, an error at 6."""
    ours_out = LOOPING[:9] + list(range(160, 181))
    ours = loop_trace(tmp_path / "o.h5", True, ours_out)
    rc, doc = diff_json(ours, loop_trace(tmp_path / "k.h5", True))
    f = next(f for f in errors(doc) if f["kind"] == "degenerate_output")
    assert rc == 1 and (f["side"], f["request"], f["position"]) == ("theirs", "a", 6)
    assert "the other engine's output does not loop there" in f["message"]


def test_loop_against_the_same_loop_is_a_shared_warning(tmp_path):
    """Twin: both outputs known and looping alike: the shared-loop warning, as before."""
    rc, doc = diff_json(loop_trace(tmp_path / "a.h5", True), loop_trace(tmp_path / "b.h5", True))
    assert_clean(rc, doc)
    (f,) = [f for f in doc["findings"] if f["kind"] == "degenerate_output"]
    assert f["severity"] == "warning" and "both engines loop identically" in f["message"]
