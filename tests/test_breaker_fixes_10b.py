"""Breaker round 10 (b): three defects, each with a failing-before test and a clean twin.

A. The fixture's ``positions=(A, B)`` was read as the two positions {A, B}, unlike
   ``(A, None)`` / ``(None, B)`` / ``range(A, B)``: a divergent block at position 18 passed
   ``positions=(10, 60)``, and ``(5, 2)`` was "nothing selected: positions 2, 5", not the
   ValueError the README promises. A 2-tuple is now the half-open range; B <= A is refused.
B. ``--format json`` printed a bare ``NaN`` (not JSON) for a NaN phase duration (``info``,
   ``check``: ``"pre": NaN``; ``validate``: ``"value": NaN``). Every document is strict JSON
   now, non-finite numbers ``null``.
C. ``inspect-draft``: a plain draft whose ``tokenizer.json`` is the text ``garbage`` was a
   warning ("0 errors", exit 0), and ``vocab_size: -1`` was compared as a vocabulary
   ("input vocabulary -1 < target"). Both are errors now, the second naming the field.

Inputs are built in ``tmp_path`` from ``traces/`` and ``engine/models/``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from inproc import run_inproc

from spectrace.tracer.checkpoint import inspect_draft
from spectrace.tracer.cli.output import finite, json_text
from spectrace.tracer.gate import GateError, Selection
from spectrace.tracer.testing.assertions import drafts_match_report

REPO = Path(__file__).resolve().parents[1]
REF = REPO / "traces" / "reference.h5"
VLLM = REPO / "traces" / "vllm.h5"
MODELS = REPO / "engine" / "models"
TARGET = MODELS / "target"


def _strict(text: str):
    """``json.loads`` that refuses ``NaN``/``Infinity`` (as jq and JSON.parse do)."""

    def refuse(x):
        raise ValueError(f"not JSON: {x}")

    return json.loads(text, parse_constant=refuse)


# --- A: positions=(A, B) is the range A:B ------------------------------------------------


@pytest.fixture(scope="module")
def one_slot(tmp_path_factory) -> Path:
    """vllm.h5 with block 20 (request 4, position 18, k 4) changed in slot 3: 372 -> 373."""
    out = tmp_path_factory.mktemp("a") / "one_slot.h5"
    shutil.copy(VLLM, out)
    with h5py.File(out, "r+") as h:
        b = h["blocks"]
        assert (b["request"][20], b["position"][20]) == (4, 18)
        p = b["proposed"][:]
        assert p[20].tolist() == [199, 318, 351, 372]
        p[20, 3] = 373
        b["proposed"][:] = p
        v = b["verified"][:]
        v[20, 3] = 373
        b["verified"][:] = v
    return out


def test_a_pair_is_a_half_open_range():
    assert Selection.of(positions=(10, 60)).positions == slice(10, 60)
    assert Selection.of(positions=(0, 1)).positions == slice(0, 1)
    assert Selection.of(positions=(np.int64(3), 7)).positions == slice(3, 7)
    assert Selection.of(positions=(10, 60)).positions_text() == "10:60"


def test_a_pair_around_the_divergent_block_fails(one_slot, spectrace_assert_drafts_match):
    got = drafts_match_report(REF, one_slot, positions=(10, 60))
    assert got is not None
    assert "first divergent block: request 4, position 18, slot 3" in got
    assert got == drafts_match_report(REF, one_slot, positions=range(10, 60))
    with pytest.raises(pytest.fail.Exception):
        spectrace_assert_drafts_match(REF, one_slot, positions=(10, 60))
    # the range is half-open: (18, 19) holds position 18, (19, 60) and (None, 18) do not
    assert "position 18, slot 3" in (drafts_match_report(REF, one_slot, positions=(18, 19)) or "")
    assert drafts_match_report(REF, one_slot, positions=(19, 60)) is None
    assert drafts_match_report(REF, one_slot, positions=(None, 18)) is None


@pytest.mark.parametrize(
    "spec, msg",
    [
        ((5, 2), "positions: end 2 is before start 5 (got (5, 2))"),
        ((5, 5), "positions: end 5 is not after start 5 (got (5, 5))"),
        (range(7, 7), "positions: end 7 is not after start 7 (got range(7, 7))"),
        ((-1, 4), "positions: expected A:B with positions >= 0, e.g. 5:20 or 40: (got (-1, 4))"),
        ((1.5, 4), "positions: ends must be ints or None (got (1.5, 4))"),
    ],
)
def test_a_bad_pair_is_a_value_error(spec, msg, spectrace_assert_drafts_match):
    with pytest.raises(GateError) as e:
        Selection.of(positions=spec)
    assert str(e.value) == msg
    with pytest.raises(ValueError) as e2:
        spectrace_assert_drafts_match(REF, VLLM, positions=spec)
    assert str(e2.value) == msg


def test_a_cli_empty_range_is_bad_usage():
    r = run_inproc("diff", REF, VLLM, "--positions", "5:5")
    assert r.returncode == 2 and r.stdout == ""
    assert "end 5 is not after start 5 (got '5:5')" in r.stderr


def test_a_twin_sets_and_ranges_as_documented(one_slot, spectrace_assert_drafts_match):
    """A list or set is those positions (18 is not one of them: passes); ranges as before."""
    for spec in ([10, 60], {10, 60}, frozenset({10, 60})):
        assert Selection.of(positions=spec).positions == frozenset({10, 60})
        assert drafts_match_report(REF, one_slot, positions=spec) is None
        spectrace_assert_drafts_match(REF, one_slot, positions=spec)
    with pytest.raises(GateError, match="None is not an int"):
        Selection.of(positions=(9, None, 3))  # a 3-tuple stays a set of ints
    assert Selection.of(positions=(3, 7, 9)).positions == frozenset({3, 7, 9})
    assert Selection.of(positions=(1000, None)).positions == slice(1000, None)
    assert Selection.of(positions=(None, 7)).positions == slice(None, 7)
    with pytest.raises(pytest.fail.Exception):
        spectrace_assert_drafts_match(REF, one_slot, positions=range(10, 60))
    spectrace_assert_drafts_match(REF, one_slot, positions=range(20, 60))
    spectrace_assert_drafts_match(REF, VLLM, positions=(10, 60))  # the unchanged trace


# --- B: strict JSON -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def phase_nan(tmp_path_factory) -> Path:
    """reference.h5 with its first phase duration (step 0, phase ``pre``) NaN."""
    out = tmp_path_factory.mktemp("b") / "phase_nan.h5"
    shutil.copy(REF, out)
    with h5py.File(out, "r+") as h:
        ms = h["phases/ms"][:]
        assert (h["phases/name"][0], h["phases/step"][0]) == (0, 0)
        ms[0] = np.nan
        h["phases/ms"][:] = ms
    return out


def _medians(path: Path) -> list[float]:
    """Median ms of phases 0, 1, 2 (pre, backbone, sample), as float32 read."""
    with h5py.File(path, "r", locking=False) as h:  # the CLI holds REF open, unlocked
        ms, name = h["phases/ms"][:], h["phases/name"][:]
    return [float(np.median(ms[name == i])) for i in range(3)]


def test_b_nan_phase_is_null_in_info_and_check(phase_nan):
    _, backbone, sample = _medians(REF)  # only the "pre" phase has the NaN
    want = {"pre": None, "backbone": backbone, "sample": sample}
    r = run_inproc("info", phase_nan, "--format", "json")
    assert r.returncode == 0 and "NaN" not in r.stdout
    assert _strict(r.stdout)["phases_ms"] == want
    r = run_inproc("check", phase_nan, "--format", "json")
    assert "NaN" not in r.stdout
    assert _strict(r.stdout)["summary"]["phases_ms"] == want


def test_b_nan_value_is_null_in_validate(phase_nan):
    r = run_inproc("validate", phase_nan, "--format", "json")
    assert r.returncode == 1
    doc = _strict(r.stdout)
    assert doc["files"][0]["problems"] == [
        {
            "path": str(phase_nan),
            "field": "phases/ms",
            "what": "not a finite duration",
            "value": None,
            "row": 0,
            "count": 1,
        }
    ]


def test_b_finite_and_strict_helpers():
    doc = {"a": [1.0, float("nan"), (float("inf"), -float("inf"))], "b": np.float64("nan")}
    assert finite(doc) == {"a": [1.0, None, [None, None]], "b": None}
    assert json_text(doc) == json.dumps({"a": [1.0, None, [None, None]], "b": None}, indent=2)
    clean = {"x": 0.365, "y": [1, 2.5, "NaN"], "z": None, "t": True}
    assert json_text(clean) == json.dumps(clean, indent=2)  # finite: unchanged


def test_b_twin_finite_documents_unchanged():
    pre, backbone, sample = _medians(REF)
    r = run_inproc("info", REF, "--format", "json")
    doc = _strict(r.stdout)
    assert doc["phases_ms"] == {"pre": pre, "backbone": backbone, "sample": sample}
    assert r.stdout == json.dumps(doc, indent=2) + "\n"  # same text as json.dumps wrote
    r = run_inproc("validate", REF, "--format", "json")
    assert r.returncode == 0 and _strict(r.stdout)["files"][0]["problems"] == []
    r = run_inproc("diff", REF, VLLM, "--format", "json")
    assert _strict(r.stdout)["schema"] == "spectrace.diff/1"


# --- C: inspect-draft: unreadable tokenizer, bad vocab_size --------------------------------


def _plain(tmp_path: Path) -> Path:
    ckpt = tmp_path / "draft"
    shutil.copytree(MODELS / "draft", ckpt)
    return ckpt


def _by_check(rep, check: str) -> list[tuple[str, str]]:
    return [(v.level, v.message) for v in rep.verdicts if v.check == check]


def _set_config(ckpt: Path, edit) -> None:
    p = ckpt / "config.json"
    cfg = json.loads(p.read_text())
    edit(cfg)
    p.write_text(json.dumps(cfg))


@pytest.mark.parametrize(
    "text, why",
    [
        ("garbage\n", "is not JSON (Expecting value: line 1 column 1 (char 0))"),
        ("[1, 2]", 'is not a tokenizer (a JSON object with a "model" object)'),
        ('{"version": "1.0"}', 'is not a tokenizer (a JSON object with a "model" object)'),
    ],
)
def test_c_unparseable_draft_tokenizer_is_an_error(tmp_path, text, why):
    ckpt = _plain(tmp_path)
    (ckpt / "tokenizer.json").write_text(text)
    rep = inspect_draft(ckpt, TARGET)
    assert _by_check(rep, "tokenizer") == [
        (
            "error",
            f"the draft's tokenizer.json ({ckpt / 'tokenizer.json'}) {why}: whether each "
            "draft id names the same token for the target cannot be checked",
        )
    ]
    assert (rep.errors, rep.warnings) == (1, 0)
    r = run_inproc("inspect-draft", ckpt, "--target", TARGET)
    assert r.returncode == 1 and "verdict: 1 error, 0 warnings" in r.stdout


def test_c_unreadable_target_tokenizer_is_an_error(tmp_path):
    target = tmp_path / "target"
    shutil.copytree(TARGET, target)
    (target / "tokenizer.json").unlink()
    (target / "tokenizer.json").mkdir()  # there, but no file to read
    rep = inspect_draft(MODELS / "draft", target)
    assert _by_check(rep, "tokenizer") == [
        (
            "error",
            f"the target's tokenizer.json ({target / 'tokenizer.json'}) cannot be read (Is a "
            "directory): whether each draft id names the same token for the target cannot "
            "be checked",
        )
    ]
    assert rep.errors == 1


def test_c_twin_tokenizers_valid_absent_or_different(tmp_path):
    rep = inspect_draft(MODELS / "draft", TARGET)
    assert _by_check(rep, "tokenizer") == [("ok", "tokenizer.json identical to the target's")]
    assert (rep.errors, rep.warnings) == (0, 0)
    ckpt = _plain(tmp_path)
    (ckpt / "tokenizer.json").unlink()  # absent altogether: not compared, as before
    rep = inspect_draft(ckpt, TARGET)
    assert _by_check(rep, "tokenizer") == [
        ("info", "no tokenizer.json in the draft folder: not compared")
    ]
    assert rep.errors == 0
    assert run_inproc("inspect-draft", ckpt, "--target", TARGET).returncode == 0
    tok = json.loads((MODELS / "draft" / "tokenizer.json").read_text())
    tok["normalizer"] = {"type": "NFC"}  # valid but different: still the warning
    (ckpt / "tokenizer.json").write_text(json.dumps(tok))
    assert _by_check(inspect_draft(ckpt, TARGET), "tokenizer")[0][0] == "warn"
    rep = inspect_draft(ckpt)  # no target: not compared, the draft's file parses
    assert _by_check(rep, "tokenizer") == [
        ("info", "no target given (--target): tokenizer not compared")
    ]


@pytest.mark.parametrize("bad", [-1, 0])
def test_c_bad_plain_vocab_size_is_an_error_naming_it(tmp_path, bad):
    ckpt = _plain(tmp_path)
    _set_config(ckpt, lambda c: c.__setitem__("vocab_size", bad))
    rep = inspect_draft(ckpt, TARGET)
    assert _by_check(rep, "vocab") == [
        ("error", f"vocab_size is {bad!r}, not an int > 0: vocabularies unknown")
    ]
    # nothing is compared with a vocabulary of -1 (or None): one error in all
    assert _by_check(rep, "embed_tokens") == [
        ("info", "own [2048, 64], input vocabulary unknown: rows not checked")
    ]
    assert _by_check(rep, "lm_head") == [
        ("info", "own [2048, 64], draft vocabulary unknown: rows not checked")
    ]
    assert (rep.errors, rep.warnings) == (1, 0)
    assert run_inproc("inspect-draft", ckpt, "--target", TARGET).returncode == 1


@pytest.mark.parametrize("bad", [True, "2048", 2048.0])
def test_c_twin_a_non_int_vocab_size_stays_bad_input(tmp_path, bad):
    """Not an int at all is refused when the config loads (exit 2), as before."""
    ckpt = _plain(tmp_path)
    _set_config(ckpt, lambda c: c.__setitem__("vocab_size", bad))
    r = run_inproc("inspect-draft", ckpt, "--target", TARGET)
    assert r.returncode == 2
    assert f"vocab_size is not an integer (field=vocab_size, value={bad!r})" in r.stderr


def test_c_bad_nested_vocab_sizes_name_their_field(tmp_path):
    ckpt = tmp_path / "dspark"
    shutil.copytree(MODELS / "dspark", ckpt)
    _set_config(ckpt, lambda c: c["transformer_layer_config"].__setitem__("vocab_size", -1))
    rep = inspect_draft(ckpt, TARGET)
    assert _by_check(rep, "vocab") == [
        (
            "error",
            "transformer_layer_config.vocab_size is -1, not an int > 0: vocabularies unknown",
        )
    ]
    assert _by_check(rep, "mask_token") == [
        ("info", "mask_token_id 2047; input vocabulary unknown (see vocab)")
    ]
    assert rep.errors == 1
    _set_config(ckpt, lambda c: c["transformer_layer_config"].__setitem__("vocab_size", 2048))
    _set_config(ckpt, lambda c: c.__setitem__("draft_vocab_size", 0))
    rep = inspect_draft(ckpt, TARGET)
    assert _by_check(rep, "vocab") == [
        ("error", "draft_vocab_size is 0, not an int > 0: vocabularies unknown")
    ]


def test_c_twin_vocab_sizes_and_the_absent_and_target_cases(tmp_path):
    rep = inspect_draft(MODELS / "draft", TARGET)
    assert _by_check(rep, "vocab") == [("ok", "full vocabulary 2048 (= target, target config)")]
    rep = inspect_draft(MODELS / "dspark", TARGET)
    assert _by_check(rep, "vocab") == [("ok", "full vocabulary 2048 (= target, target config)")]
    assert rep.errors == 0
    ckpt = _plain(tmp_path)
    _set_config(ckpt, lambda c: c.pop("vocab_size"))  # absent: the message it had
    assert _by_check(inspect_draft(ckpt, TARGET), "vocab") == [
        ("error", "no vocab_size in the layer config: vocabularies unknown")
    ]
    target = tmp_path / "t"
    shutil.copytree(TARGET, target)
    _set_config(target, lambda c: c.__setitem__("vocab_size", -1))  # the target's case
    msg = _by_check(inspect_draft(MODELS / "draft", target), "vocab")[0]
    assert msg[0] == "error"
    assert msg[1].startswith(f"the target config ({target}) has no vocab_size > 0")
