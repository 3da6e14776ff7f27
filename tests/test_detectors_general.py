"""Detectors that generalise (issue 11, item 2): depth divergence at any slot, stale state
after any verdict, batch dependence from a change of batch row or size (also at row 0 and at
low mismatch rates), vocabulary mapping per slot and from the id range alone.

Every case is a pair of traces written with TraceWriter from blocks built here, with a clean
twin (ours == theirs) that exits 0 with no error finding. Most cases keep both sides'
acceptance identical: our proposal differs from theirs only at or after the slot the target
rejected, so both engines draft from the same anchors and every block pairs. Expected kinds,
first locations and evidence numbers are counted here from the built blocks (plain Python
over the lists below, or closed forms in the comments), never by the detectors.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from itertools import cycle

import pytest

from spectrace.tracer.store import TraceWriter
from spectrace.tracer.testing.assertions import drafts_match_report

SPECTRACE = os.path.join(os.path.dirname(sys.executable), "spectrace")
RIDS = ("a", "b", "c")


# ------------------------------------------------------------------------------ builders


@dataclass
class Blk:
    """One block of a request on both sides (acceptance identical unless ``ours_acc``)."""

    rid: str
    pos: int
    acc: int
    theirs: list[int]
    ours: list[int]
    row: int = -1
    size: int = -1
    ours_acc: int | None = None
    prev: Blk | None = field(default=None, repr=False)


def prompt(rid: str) -> list[int]:
    return [1 + RIDS.index(rid), 2, 3]


def output(rid: str, n: int) -> list[int]:
    """Distinct tokens 100.. per request (offset 300 per request)."""
    return [100 + 300 * RIDS.index(rid) + i for i in range(n)]


def wrong_theirs(pos: int, j: int) -> int:
    """Their rejected guesses: 1500..1899, never a sequence token."""
    return 1500 + (7 * pos + 3 * j) % 400


def wrong_ours(rid: str, pos: int, j: int) -> int:
    """Our other guesses: 1100..1399 (never theirs, never a sequence token); salted by
    request so that no id map ours = f(theirs) arises by accident."""
    return 1100 + (11 * pos + 5 * j + 37 * RIDS.index(rid)) % 300


def schedule(rid, seq, accs, k, ours_fn=None, batch_fn=None) -> list[Blk]:
    """Blocks of one request whose target accepts ``accs`` (cycled) drafts of theirs, from
    anchor 2 while a whole block fits (pos + k + 1 < len(seq)). ``ours_fn(blk, i)`` returns
    our proposal (it must keep the accepted prefix); ``batch_fn(pos)`` (row, size)."""
    out, pos, prev = [], len(prompt(rid)) - 1, None
    for i, a in enumerate(cycle(accs)):
        if pos + k + 1 >= len(seq):
            break
        theirs = seq[pos + 1 : pos + 1 + a] + [wrong_theirs(pos, j) for j in range(a, k)]
        b = Blk(rid, pos, a, theirs, list(theirs), prev=prev)
        if batch_fn:
            b.row, b.size = batch_fn(pos)
        if ours_fn:
            b.ours = ours_fn(b, i)
            assert b.ours[:a] == theirs[:a] and (a == k or b.ours[a] != seq[pos + 1 + a])
        out.append(b)
        prev, pos = b, pos + a + 1
    return out


def write(path, seqs: dict[str, list[int]], blocks: list[Blk], side: str, k: int):
    """One side's trace: requests (prompt 3 tokens, finish length) and its blocks."""
    with TraceWriter(path, meta={"engine": "test", "k": k, "exit_status": 0}) as w:
        for rid, seq in seqs.items():
            w.request(rid, prompt_ids=seq[:3], output_ids=seq[3:], finish_reason="length")
        for step, b in enumerate(blocks):
            prop = b.ours if side == "ours" else b.theirs
            acc = b.acc if side == "theirs" or b.ours_acc is None else b.ours_acc
            seq = seqs[b.rid]
            w.add_block(
                b.rid,
                step,
                b.pos,
                seq[b.pos],
                prop,
                verified=prop,
                accepted=acc,
                emitted=seq[b.pos + 1 : b.pos + 2 + acc],
                batch_row=b.row,
                batch_size=b.size,
            )
    return path


def pair(tmp_path, name, seqs, blocks, k, ours_blocks=None):
    """Write ``name.ours.h5`` / ``name.theirs.h5`` (ours from ``ours_blocks`` when given)."""
    o = write(tmp_path / f"{name}.ours.h5", seqs, ours_blocks or blocks, "ours", k)
    t = write(tmp_path / f"{name}.theirs.h5", seqs, blocks, "theirs", k)
    return o, t


def twin(tmp_path, name, seqs, blocks, k):
    """The clean twin: ours proposes exactly theirs."""
    same = [Blk(b.rid, b.pos, b.acc, b.theirs, list(b.theirs), b.row, b.size) for b in blocks]
    return pair(tmp_path, name, seqs, same, k)


def run(*args):
    return subprocess.run([SPECTRACE, *args], capture_output=True, text=True)


def diff_json(ours, theirs):
    r = run("diff", str(ours), str(theirs), "--format", "json")
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    jsonschema = pytest.importorskip("jsonschema")
    from spectrace.tracer.diff_schema import SCHEMA

    jsonschema.validate(doc, SCHEMA)
    return r.returncode, doc


def errors(doc):
    return [f for f in doc["findings"] if f["severity"] == "error"]


def first_error(rc, doc, kind):
    errs = errors(doc)
    assert rc == 1 and errs, doc["findings"]
    assert errs[0]["kind"] == kind, [(f["kind"], f["message"]) for f in errs]
    return errs[0]


def diff_first_error(ours, theirs, kind):
    """``spectrace diff``'s first error finding, which the pytest assertion names too."""
    f = first_error(*diff_json(ours, theirs), kind)
    msg = drafts_match_report(str(ours), str(theirs))
    assert msg is not None and f"first error finding: {kind}" in msg
    return f


def assert_clean_twin(tmp_path, name, seqs, blocks, k):
    o, t = twin(tmp_path, name, seqs, blocks, k)
    rc, doc = diff_json(o, t)
    assert rc == 0 and not errors(doc), [(f["kind"], f["message"]) for f in doc["findings"]]
    assert drafts_match_report(str(o), str(t)) is None
    r = run("check", str(o), "--format", "json")
    assert r.returncode == 0, r.stdout


def fisher_tail(hits_in, n_in, hits_out, n_out):
    """P(X >= hits_in), X hypergeometric, by math.comb (the test's own computation)."""
    N, m = n_in + n_out, hits_in + hits_out
    tail = sum(
        math.comb(m, x) * math.comb(N - m, n_in - x) for x in range(hits_in, min(m, n_in) + 1)
    )
    return tail / math.comb(N, n_in)


# --------------------------------------------------------------------------- depth at s


def depth_from_3():
    """k=8: the target accepts 3, 1, 2, 0, 3, 3 drafts (cycled); our slots 0..2 are theirs
    (accepted or not), from slot 3 on ours are other guesses (the draft loop broken from
    depth 3: stale positions). Slots 0..2 always agree, slot 3 never."""
    seqs = {r: prompt(r) + output(r, 40) for r in RIDS}

    def ours(b, i):
        return b.theirs[:3] + [wrong_ours(b.rid, b.pos, j) for j in range(3, 8)]

    blocks = [x for r in RIDS for x in schedule(r, seqs[r], [3, 1, 2, 0, 3, 3], 8, ours)]
    return seqs, blocks


def test_depth_broken_from_slot_3(tmp_path):
    seqs, blocks = depth_from_3()
    n = len(blocks)
    o, t = pair(tmp_path, "depth3", seqs, blocks, 8)
    f = diff_first_error(o, t, "depth_divergence")
    # Every block: slots 0..2 equal, slot 3 differs; nothing past slot 3 is conditioned on.
    assert (f["request"], f["position"], f["slot"]) == ("a", 2, 3)
    ev = f["evidence"]
    assert ev["break_slot"] == 3
    assert ev["conditional"] == [1.0, 1.0, 1.0, 0.0, None, None, None, None]
    assert ev["conditional_blocks"] == [n, n, n, n, 0, 0, 0, 0]
    assert ev["per_position"] == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert "breaks at slot 3" in f["message"] and "[1.00, 1.00, 1.00, 0.00, -" in f["message"]


def test_depth_broken_from_slot_3_clean_twin(tmp_path):
    assert_clean_twin(tmp_path, "depth3", *depth_from_3(), 8)


#: A 12-block cycle (k=4): accepted counts, and whether our slot 0 copies theirs where the
#: target rejected slot 0 (where it accepted one, ours holds the same right id).
PARTIAL_ACCS = [0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0]
PARTIAL_COPY = [False, True, True, False, True, True, False, True, True, False, True, False]


def depth_partial():
    """Slot 0 agrees in 7 of 12 blocks (4 accepted + 3 copied rejections), deeper slots are
    always our own guesses."""
    seqs = {r: prompt(r) + output(r, 30) for r in RIDS}

    def ours(b, i):
        s0 = b.theirs[0] if PARTIAL_COPY[i % 12] else wrong_ours(b.rid, b.pos, 0)
        return [s0] + [wrong_ours(b.rid, b.pos, j) for j in range(1, 4)]

    blocks = [x for r in RIDS for x in schedule(r, seqs[r], PARTIAL_ACCS, 4, ours)]
    return seqs, blocks


def test_depth_slot0_partly_and_deeper_never(tmp_path):
    seqs, blocks = depth_partial()
    agree0 = [b for b in blocks if b.ours[0] == b.theirs[0]]
    o, t = pair(tmp_path, "depth1", seqs, blocks, 4)
    f = diff_first_error(o, t, "depth_divergence")
    # Block 0 of a (anchor 2) rejects and differs at slot 0; block 1 (anchor 3) copies.
    assert (f["request"], f["position"], f["slot"]) == ("a", 3, 1)
    ev = f["evidence"]
    assert ev["break_slot"] == 1
    assert ev["conditional"][:2] == [pytest.approx(len(agree0) / len(blocks)), 0.0]
    assert ev["conditional_blocks"][:2] == [len(blocks), len(agree0)]
    assert 0.55 < len(agree0) / len(blocks) < 0.62  # "about 58%"
    assert ev["slot1_given_slot0"] == 0.0


def test_depth_slot0_partly_clean_twin(tmp_path):
    assert_clean_twin(tmp_path, "depth1", *depth_partial(), 4)


# ------------------------------------------------------------------ stale after accepts

#: k=2 verdicts (cycled): every full acceptance (2) is followed by a block that rejects.
STALE_ACCS = [2, 0, 1, 2, 1, 0, 0, 2, 0, 1]


def stale_after_accept():
    """Ours reuses its own approximate state after a fully accepted block: the next block
    differs from the slot the target rejected on."""
    seqs = {r: prompt(r) + output(r, 40) for r in RIDS}

    def ours(b, i):
        if b.prev is None or b.prev.acc < 2:
            return list(b.theirs)
        return b.theirs[: b.acc] + [wrong_ours(b.rid, b.pos, j) for j in range(b.acc, 2)]

    blocks = [x for r in RIDS for x in schedule(r, seqs[r], STALE_ACCS, 2, ours)]
    return seqs, blocks


def _verdict(b: Blk) -> str:
    if b.prev is None:
        return "first"
    return {2: "accepted", 0: "rejected"}.get(b.prev.acc, "partial")


def test_stale_after_full_acceptance(tmp_path):
    seqs, blocks = stale_after_accept()
    after = [b for b in blocks if _verdict(b) == "accepted"]
    other = [b for b in blocks if _verdict(b) != "accepted"]
    assert all(b.ours != b.theirs for b in after) and all(b.ours == b.theirs for b in other)
    o, t = pair(tmp_path, "stale", seqs, blocks, 2)
    f = diff_first_error(o, t, "stale_state")
    # a's blocks: anchor 2 (acc 2) -> anchor 5 follows the first full acceptance.
    assert (f["request"], f["position"]) == ("a", 5)
    ev = f["evidence"]
    assert ev["verdict"] == "acceptance"
    assert (ev["blocks_after"], ev["mismatches_after"]) == (len(after), len(after))
    assert (ev["blocks_otherwise"], ev["mismatches_otherwise"]) == (len(other), 0)
    assert (ev["mismatch_rate"], ev["otherwise"]) == (1.0, 0.0)
    assert ev["p_value"] == pytest.approx(fisher_tail(len(after), len(after), 0, len(other)))
    by = {
        v: sum(_verdict(b) == v for b in blocks)
        for v in ("first", "accepted", "partial", "rejected")
    }
    assert {v: x["blocks"] for v, x in ev["by_verdict"].items()} == by
    assert ev["by_verdict"]["accepted"]["mismatches"] == len(after)
    assert f"accepted {len(after)}/{len(after)}" in f["message"]
    assert "full acceptance" in f["message"]


def test_stale_after_full_acceptance_clean_twin(tmp_path):
    assert_clean_twin(tmp_path, "stale", *stale_after_accept(), 2)


# ---------------------------------------------------------------- batch row / size change

MOVE_AT = 14  # from this anchor position on, a has finished: b moves to row 0, c to row 1


def row_keyed():
    """a (12 output tokens) at row 0 finishes; b and c move down a row (batch 3 -> 2) and,
    their draft context being keyed by batch row, differ from then on wherever the target
    rejected a draft (verdicts 2, 0, 1 cycled, k=2)."""
    seqs = {"a": prompt("a") + output("a", 12)} | {r: prompt(r) + output(r, 40) for r in "bc"}
    base = {"a": 0, "b": 1, "c": 2}

    def rows(rid):
        def at(pos):
            moved = rid != "a" and pos >= MOVE_AT
            return base[rid] - moved, 3 - moved

        return at

    def ours(b, i):
        if b.rid == "a" or b.pos < MOVE_AT:
            return list(b.theirs)
        return b.theirs[: b.acc] + [wrong_ours(b.rid, b.pos, j) for j in range(b.acc, 2)]

    blocks = [x for r in RIDS for x in schedule(r, seqs[r], [2, 0, 1], 2, ours, rows(r))]
    return seqs, blocks


def test_row_keyed_state_breaks_after_the_move_to_row_0(tmp_path):
    seqs, blocks = row_keyed()
    elig = [b for b in blocks if b.prev is not None]
    moved = [b for b in elig if b.rid != "a" and b.pos >= MOVE_AT]
    bad = [b for b in moved if b.ours != b.theirs]
    assert bad == [b for b in blocks if b.ours != b.theirs]
    assert all(b.acc < 2 for b in bad) and all(b.acc == 2 for b in moved if b not in bad)
    o, t = pair(tmp_path, "rowkey", seqs, blocks, 2)
    f = diff_first_error(o, t, "batch_dependence")
    move = next(b for b in blocks if b.rid == "b" and b.pos >= MOVE_AT)
    first = next(b for b in bad if b.rid == "b")  # b's first rejecting block at row 0
    assert (move.pos, move.prev.row, move.row) == (14, 1, 0)
    assert (f["request"], f["position"]) == ("b", first.pos)
    ev = f["evidence"]
    assert ev["by"] == "batch_row_moved"
    assert (ev["blocks_high"], ev["mismatches_high"]) == (len(moved), len(bad))
    assert (ev["blocks_low"], ev["mismatches_low"]) == (len(elig) - len(moved), 0)
    assert ev["p_value"] == pytest.approx(
        fisher_tail(len(bad), len(moved), 0, len(elig) - len(moved))
    )
    assert ev["change"] == {
        "position": move.pos,
        "from_row": 1,
        "to_row": 0,
        "from_size": 3,
        "to_size": 2,
    }
    assert "batch row 1 -> 0, batch size 3 -> 2 at position 14" in f["message"]
    assert f"mismatches start at request b position {first.pos}" in f["message"]


def test_row_keyed_clean_twin(tmp_path):
    assert_clean_twin(tmp_path, "rowkey", *row_keyed(), 2)


SIZE_AT = (40, 80, 120)  # the batch size flips 3 -> 4 -> 3 -> 4 at these anchors


def size_changes(bad_at_change=4, bad_elsewhere=1):
    """Rows fixed (a 0, b 1, c 2); the batch size changes three times. Ours differs at the
    first ``bad_at_change`` size-change blocks that reject a draft, and at the first
    ``bad_elsewhere`` other rejecting blocks of c: a low overall rate."""
    seqs = {r: prompt(r) + output(r, 150) for r in RIDS}

    def rows(rid):
        return lambda pos: (RIDS.index(rid), 3 + sum(pos >= s for s in SIZE_AT) % 2)

    blocks = [x for r in RIDS for x in schedule(r, seqs[r], [2, 0, 1], 2, None, rows(r))]
    change = [b for b in blocks if b.prev is not None and b.size != b.prev.size]
    picks = [b for b in change if b.acc < 2][:bad_at_change]
    picks += [b for b in blocks if b.rid == "c" and b.acc < 2 and b not in change][:bad_elsewhere]
    for b in picks:
        b.ours = b.theirs[: b.acc] + [wrong_ours(b.rid, b.pos, j) for j in range(b.acc, 2)]
    return seqs, blocks, change


def test_batch_size_change_at_a_low_mismatch_rate(tmp_path):
    seqs, blocks, change = size_changes()
    elig = [b for b in blocks if b.prev is not None]
    bad_in = sum(b.ours != b.theirs for b in change)
    bad_out = sum(b.ours != b.theirs for b in elig if b not in change)
    assert (len(change), bad_in, bad_out) == (9, 4, 1)  # 3 changes x 3 requests
    assert (bad_in + bad_out) / len(blocks) < 0.05
    o, t = pair(tmp_path, "size", seqs, blocks, 2)
    f = diff_first_error(o, t, "batch_dependence")
    first = next(b for b in change if b.ours != b.theirs)
    assert (f["request"], f["position"]) == (first.rid, first.pos)
    ev = f["evidence"]
    assert ev["by"] == "batch_size_change"
    assert (ev["blocks_high"], ev["mismatches_high"]) == (9, 4)
    assert (ev["blocks_low"], ev["mismatches_low"]) == (len(elig) - 9, 1)
    assert ev["p_value"] == pytest.approx(fisher_tail(4, 9, 1, len(elig) - 9))
    assert ev["p_value"] < 1e-4
    assert ev["change"]["from_size"] == first.prev.size and ev["change"]["to_size"] == first.size


def test_batch_size_change_twins(tmp_path):
    """Clean twin; and the same five mismatches away from the changes are no batch
    dependence (a generic draft_mismatch)."""
    seqs, blocks, _ = size_changes()
    assert_clean_twin(tmp_path, "size", seqs, blocks, 2)
    seqs, blocks, _ = size_changes(bad_at_change=0, bad_elsewhere=5)
    rc, doc = diff_json(*pair(tmp_path, "spread", seqs, blocks, 2))
    assert [f["kind"] for f in errors(doc)] == ["draft_mismatch"]


# ------------------------------------------------------------------ vocabulary mapping


def mapped(t: int) -> int:
    """A wrong per-id mapping (a permutation of 0..2047, never the identity: 5t+3 - t is
    odd)."""
    return (5 * t + 3) % 2048


def perfect(rid, seq, k):
    """Their perfect drafter: every draft accepted, anchors every k + 1 tokens."""
    return schedule(rid, seq, [k], k)


def always_rejected(rid, seq, k, slots):
    """Our blocks at EVERY anchor (slot 0 is always rejected, one token per block):
    ``slots(pos)`` -> our k ids."""
    out = []
    for pos in range(2, len(seq) - k - 1):
        ids = slots(pos)
        assert ids[0] != seq[pos + 1]
        out.append(Blk(rid, pos, 0, [], ids, ours_acc=0))
    return out


def feedback_case():
    """Same output tokens on every request (so each id recurs); theirs perfect (k=3). Ours
    hands out mapped(t) at slot 0 and, the mapped id being fed back, drafts deeper slots
    from another context (ids salted per request)."""
    out = [100 + 13 * i for i in range(60)]
    seqs = {r: prompt(r) + out for r in RIDS}
    theirs = [b for r in RIDS for b in perfect(r, seqs[r], 3)]
    ours = [
        b
        for r in RIDS
        for b in always_rejected(
            r,
            seqs[r],
            3,
            lambda p, r=r: (
                [mapped(seqs[r][p + 1])]
                + [1100 + (17 * p + 5 * j + 101 * RIDS.index(r)) % 300 for j in (1, 2)]
            ),
        )
    ]
    return seqs, theirs, ours


def _one_way(pairs):
    """(share, covered): of the (src, dst) pairs whose src recurs, the share whose dst is
    the most frequent dst of their src."""
    by: dict[int, list[int]] = {}
    for t, o in pairs:
        by.setdefault(t, []).append(o)
    rep = [v for v in by.values() if len(v) >= 2]
    n = sum(len(v) for v in rep)
    return (sum(max(v.count(x) for x in v) for v in rep) / n if n else 0.0), n


def _consistency(pairs):
    """ours as a function of theirs, and theirs of ours where 20+ of our ids recur: the
    lower."""
    fwd, _ = _one_way(pairs)
    back, n = _one_way([(o, t) for t, o in pairs])
    return min(fwd, back) if n >= 20 else fwd


def test_mapped_ids_fed_back_show_at_slot_0(tmp_path):
    seqs, theirs, ours = feedback_case()
    at = {(b.rid, b.pos): b for b in ours}
    pairs = [(t, at[(t.rid, t.pos)]) for t in theirs]
    slot = [[(t.theirs[j], o.ours[j]) for t, o in pairs] for j in range(3)]
    assert all(o == mapped(t) for t, o in slot[0])
    per_slot = [_consistency(s) for s in slot]
    assert per_slot[0] == 1.0 and max(per_slot[1:]) < 0.9
    o, t = (
        write(tmp_path / "fb.ours.h5", seqs, ours, "ours", 3),
        write(tmp_path / "fb.theirs.h5", seqs, theirs, "theirs", 3),
    )
    f = diff_first_error(o, t, "vocab_mapping")
    assert (f["request"], f["position"], f["slot"]) == ("a", 2, 0)
    ev = f["evidence"]
    assert ev["decided_by"] == "slot"
    assert ev["consistency"] == 1.0 and ev["slots"] == len(pairs) == 45  # 15 blocks x 3
    assert ev["per_slot_consistency"][0] == 1.0
    assert ev["per_slot_consistency"][1:] == [pytest.approx(x) for x in per_slot[1:]]
    assert "at slot 0 alone" in f["message"] and "fixed per-id mapping" in f["message"]


def test_mapped_ids_fed_back_clean_twin(tmp_path):
    seqs, theirs, _ = feedback_case()
    assert_clean_twin(tmp_path, "fb", seqs, theirs, 3)


def range_case():
    """Theirs (perfect, k=3) draft ids over the whole vocabulary 0..2047; ours are draft
    indices never mapped (every one below 1000), not a function of theirs."""
    seqs = {r: prompt(r) + [(739 * i + 17 * RIDS.index(r)) % 2048 for i in range(60)] for r in RIDS}
    theirs = [b for r in RIDS for b in perfect(r, seqs[r], 3)]

    def ids(r, p):
        x = [(37 * p + 101 * j + 7 * RIDS.index(r)) % 1000 for j in range(3)]
        return x if x[0] != seqs[r][p + 1] else [(x[0] + 1) % 1000, *x[1:]]

    ours = [b for r in RIDS for b in always_rejected(r, seqs[r], 3, lambda p, r=r: ids(r, p))]
    return seqs, theirs, ours


def test_unmapped_ids_below_a_draft_vocabulary_from_the_range_alone(tmp_path):
    seqs, theirs, ours = range_case()
    at = {(b.rid, b.pos): b for b in ours}
    paired = [at[(t.rid, t.pos)] for t in theirs]
    above = [x for t in theirs for x in t.theirs if x >= 1024]
    assert max(x for b in paired for x in b.ours) < 1000
    o = write(tmp_path / "rng.ours.h5", seqs, ours, "ours", 3)
    t = write(tmp_path / "rng.theirs.h5", seqs, theirs, "theirs", 3)
    f = diff_first_error(o, t, "vocab_mapping")
    first = next(b for b in theirs if max(b.theirs) >= 1024)
    slot = next(j for j, x in enumerate(first.theirs) if x >= 1024)
    assert (f["request"], f["position"], f["slot"]) == (first.rid, first.pos, slot)
    ev = f["evidence"]
    assert ev["decided_by"] == "id_range" and ev["range_bound"] == 1024
    assert ev["theirs_at_or_above"] == len(above) and ev["theirs_ids"] == 3 * len(theirs)
    assert ev["ours_ids"] == 3 * len(paired)
    assert ev["ours_max_id"] == max(x for b in paired for x in b.ours)
    assert (
        f"{3 * len(paired)} proposed ids on {len(paired)} paired blocks lies below 1024"
        in f["message"]
    )
    assert "draft-vocabulary size" in f["message"]


def test_unmapped_ids_clean_twin(tmp_path):
    seqs, theirs, _ = range_case()
    assert_clean_twin(tmp_path, "rng", seqs, theirs, 3)
