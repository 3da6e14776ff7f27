"""Fixes for a tester's findings of round 25. Inputs are edited copies of the bundled reference
trace (traces/README.md: 139 blocks, k 4, 5 requests; a clean capture, /meta exit_status 0,
file status ``complete``).

1. A file never closed (status ``recording``) whose /meta says the capture ended clean passed
   ``check`` and ``diff`` with exit 0: the capture supervisor writes /meta ``capture`` before
   the writer's close, and a kill between the two left exactly that. The status now wins: the
   capture is ``capture-killed``, a ``capture_incomplete`` error.
2. ``export --run`` of 252+ characters was an internal error (exit 3): now bad usage.
3. A closed ``spectrace.open`` trace's tables raised IndexError, and ``run`` went unchecked.
4. The README's ``RUN_FIGURES`` counted blocks whose target checked no draft; ``info`` does not.
5. /meta ``interrupted: "false"`` (truthy), ``exit_status: 0.5`` and ``vocab_size: -5`` were read.
6. ``--positions 1_0:20`` read as 10:20 (Python's int() takes underscores).
7. A damaged ``flushed_rows`` attribute read as "damaged trace file" without the field.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
from bundled import edited_copy
from inproc import run_inproc

REF = Path(__file__).resolve().parent.parent / "traces" / "reference.h5"


def _json(*argv) -> tuple[int, dict]:
    r = run_inproc(*argv, "--format", "json")
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout)


def _kinds(doc: dict) -> list[str]:
    return [f["kind"] for f in doc["findings"]]


def _recording(src: Path, dst: Path, meta: dict | None = None) -> Path:
    edited_copy(src, dst, meta=meta)
    with h5py.File(dst, "r+") as f:
        f.attrs["status"] = "recording"
    return dst


# -- 1. an unclosed file is not a clean capture, whatever /meta says ---------------------------

CLEAN = {"capture": {"ended": "clean", "exit_status": 0, "signal": None}}


def test_recording_status_with_clean_capture_meta_is_capture_incomplete(tmp_path):
    t = _recording(REF, tmp_path / "t.h5", meta=CLEAN)
    code, doc = _json("check", str(t))
    assert code == 1
    assert "capture_incomplete" in _kinds(doc)
    f = next(f for f in doc["findings"] if f["kind"] == "capture_incomplete")
    assert f["severity"] == "error"
    assert "the trace file was never closed" in f["message"]
    code, doc = _json("diff", str(REF), str(t))
    assert code == 1 and "capture_incomplete" in _kinds(doc)


def test_recording_status_with_exit_status_zero_is_capture_incomplete(tmp_path):
    # the older /meta items (exit_status 0, no capture object) read the same way
    t = _recording(REF, tmp_path / "t.h5")
    code, doc = _json("check", str(t))
    assert code == 1 and "capture_incomplete" in _kinds(doc)


def test_closed_file_with_clean_capture_meta_passes(tmp_path):
    t = edited_copy(REF, tmp_path / "t.h5", meta=CLEAN)
    code, doc = _json("check", str(t))
    assert (code, _kinds(doc)) == (0, ["degenerate_output"])  # the bundled run's own warning
    code, doc = _json("diff", str(REF), str(t))
    assert code == 0 and "capture_incomplete" not in _kinds(doc)


# -- 2. a run name longer than a folder name can hold ------------------------------------------


def test_export_run_name_over_251_characters_is_bad_input(tmp_path):
    # "run=" + 252 characters = 256 bytes: one more than a file name holds (NAME_MAX 255)
    r = run_inproc("export", str(REF), "-o", str(tmp_path / "o"), "--run", "r" * 252)
    assert r.returncode == 2
    assert r.stderr.startswith("spectrace: error: run name rrrrrrrrrrrrrrrrrrrr... (252 ")
    assert "Traceback" not in r.stderr and not (tmp_path / "o").exists()
    assert not (tmp_path / "o.partial").exists()


def test_export_run_name_of_251_characters_is_written(tmp_path):
    r = run_inproc("export", str(REF), "-o", str(tmp_path / "o"), "--run", "r" * 251)
    assert r.returncode == 0, r.stderr
    assert [p.name for p in (tmp_path / "o" / "blocks").iterdir()] == ["run=" + "r" * 251]


# -- 3. the Python API: closed traces and run names --------------------------------------------


def test_tables_of_a_closed_trace_raise_input_error():
    import spectrace
    from spectrace.tracer.errors import InputError

    t = spectrace.open(REF)
    assert len(t) == 139  # open: the bundled trace's blocks
    t.close()
    for method in ("blocks", "blocks_arrow", "blocks_df", "requests", "requests_df", "info"):
        try:
            getattr(t, method)()
        except InputError as exc:
            assert str(exc) == f"{REF}: the trace is closed; open it again"
        else:
            raise AssertionError(f"{method} of a closed trace did not raise")
    assert t.meta["engine"] == "spectrace-reference"  # /meta stays readable


def test_open_refuses_run_names_export_refuses():
    import pytest

    import spectrace
    from spectrace.tracer.errors import InputError

    for run, msg in (
        (5, "run=5: a run name is a string, e.g. run='ours'"),
        ("", "run name '': use letters, digits, '.', '_' and '-' only"),
        ("a/b", "run name 'a/b': use letters, digits, '.', '_' and '-' only"),
    ):
        with pytest.raises(InputError) as exc:
            spectrace.open(REF, run=run)  # type: ignore[arg-type]
        assert str(exc.value) == msg
    with spectrace.open(REF, run="ours") as t:
        assert set(t.blocks()["run"]) == {"ours"}


# -- 4. RUN_FIGURES leaves out blocks whose target checked no draft ----------------------------


def _run_figures(trace: Path, out: Path) -> dict:
    import duckdb

    from spectrace.tracer.export_sql import RUN_FIGURES

    r = run_inproc("export", str(trace), "-o", str(out), "--run", "r")
    assert r.returncode == 0, r.stderr
    cur = duckdb.connect().execute(RUN_FIGURES.format(out=out))
    (row,) = cur.fetchall()
    return dict(zip([c[0] for c in cur.description], row))


def _trimmed(dst: Path) -> Path:
    """REF with num_verified 0 on the 10 blocks of the first 24 that accepted nothing (a
    target that checked no draft there)."""
    edited_copy(REF, dst)
    with h5py.File(dst, "r+") as f:
        acc = f["blocks"]["accepted"][:]
        nv = f["blocks"]["num_verified"][:]
        nv[:24][acc[:24] == 0] = 0
        f["blocks"]["num_verified"][:] = nv
    return dst


def test_run_figures_leave_out_blocks_of_no_checked_draft(tmp_path):
    # REF: 139 blocks of k 4, 185 accepted drafts, 90 blocks accepting at least one; the
    # trim takes 10 blocks (all accepting 0) out of the verified ones: 129 blocks, 516 drafts
    row = _run_figures(_trimmed(tmp_path / "t.h5"), tmp_path / "o")
    assert (row["blocks"], row["verified_blocks"], row["verified_tokens"]) == (139, 129, 516)
    assert row["accepted_tokens"] == 185 and row["acceptance_rate"] == 185 / 516
    assert row["mean_acceptance_length"] == 1 + 185 / 129
    assert row["per_position"][0] == 90 / 129
    code, info = _json("info", str(tmp_path / "t.h5"))
    assert (info["recorded"]["blocks"], info["recorded"]["per_position"][0]) == (129, 90 / 129)


def test_run_figures_of_the_untrimmed_trace_count_every_block(tmp_path):
    row = _run_figures(REF, tmp_path / "o")
    assert (row["blocks"], row["verified_blocks"], row["verified_tokens"]) == (139, 139, 556)
    assert row["per_position"][0] == 90 / 139


def test_readme_shows_run_figures_verbatim():
    from spectrace.tracer.export_sql import RUN_FIGURES

    readme = (REF.parent.parent / "README.md").read_text()
    assert RUN_FIGURES.strip() in readme


# -- 5. /meta capture items are checked; a narrow draft_margin is no damage -----------------


def _refused(tmp_path: Path, **meta) -> list[str]:
    t = edited_copy(REF, tmp_path / "m.h5", meta=meta)
    lines = []
    for argv in (("check", str(t)), ("diff", str(REF), str(t)), ("info", str(t))):
        r = run_inproc(*argv)
        assert r.returncode == 2, (argv, r.stdout[-300:])
        (line,) = r.stderr.splitlines()
        lines.append(line)
    assert len(set(lines)) == 1  # every command refuses it alike
    return lines[0].split(": ", 3)[-1]


def test_meta_capture_items_of_the_wrong_type_are_bad_input(tmp_path):
    # "false" is a truthy string (an interrupted capture), 0.5 and false no exit status
    assert _refused(tmp_path, interrupted="false") == (
        "expected true or false (field=meta.interrupted, value='false')"
    )
    assert _refused(tmp_path, exit_status=False) == (
        "expected an integer (field=meta.exit_status, value=False)"
    )
    assert _refused(tmp_path, exit_status=0.5) == (
        "expected an integer (field=meta.exit_status, value=0.5)"
    )
    assert _refused(tmp_path, vocab_size=-5) == (
        "expected an integer >= 1 (field=meta.vocab_size, value=-5)"
    )
    assert _refused(tmp_path, vocab_size=2**31) == (
        "expected an integer <= 2147483647 (field=meta.vocab_size, value=2147483648)"
    )


def test_meta_capture_items_of_the_right_type_are_read(tmp_path):
    t = edited_copy(REF, tmp_path / "m.h5", meta={"interrupted": False, "vocab_size": 2**31 - 1})
    assert run_inproc("check", str(t)).returncode == 0  # REF: exit_status 0, a clean capture
    t = edited_copy(REF, tmp_path / "n.h5", meta={"exit_status": 137, "killed_by_signal": 9})
    code, doc = _json("check", str(t))
    assert code == 1 and "capture_incomplete" in _kinds(doc)


def _with_margins(dst: Path, width: int) -> Path:
    edited_copy(REF, dst)
    with h5py.File(dst, "r+") as f:
        f["blocks"].create_dataset("draft_margin", data=np.full((139, width), 1.5, np.float32))
    return dst


def test_draft_margin_narrower_than_proposed_reads_as_unknown_margins(tmp_path):
    # the writer itself stores it narrower when a block's k grows past /meta k (the margins
    # of the slots past its width were never given); readers take a slot past the width as
    # unknown (findings/margins.py _slot_margin, the TUI's detail), so it is no damage
    from spectrace.tracer.store import open_trace

    t = _with_margins(tmp_path / "t.h5", 2)
    assert run_inproc("check", str(t)).returncode == 0
    with open_trace(t) as tr:
        assert tr.blocks.draft_margin.shape == (139, 2)
    r = run_inproc("diff", str(t), str(REF))
    assert r.returncode == 0, r.stdout[-400:]


# -- 6. --positions takes plain digits ---------------------------------------------------------


def test_positions_with_an_underscore_or_other_digits_is_bad_usage():
    for text in ("1_0:20", "\u0661:5"):  # int() reads both (10, 1): a typo, not a window
        r = run_inproc("diff", str(REF), str(REF), "--positions", text)
        assert r.returncode == 2
        assert r.stderr == (
            f"spectrace: error: Invalid value for --positions: expected A:B with positions >= 0, "
            f"e.g. 5:20 or 40: (got {text!r}) (see 'spectrace diff --help')\n"
        )


def test_positions_of_plain_digits_with_spaces_select_the_window():
    with h5py.File(REF, "r", locking=False) as f:
        pos = f["blocks"]["position"][:]
    window = int(((pos >= 10) & (pos < 20)).sum())
    code, doc = _json("diff", str(REF), str(REF), "--positions", " 10 : 20 ")
    assert code == 0 and window > 0
    assert doc["agreement"]["paired_blocks"] == doc["agreement"]["exact_matches"] == window


# -- 7. a damaged flushed_rows attribute is named as the field ---------------------------------


def _announcing(dst: Path, value) -> Path:
    edited_copy(REF, dst)
    with h5py.File(dst, "r+") as f:
        f["blocks"].attrs["flushed_rows"] = value
    return dst


def test_flushed_rows_not_one_integer_is_named_as_the_field(tmp_path):
    for value, shown in ((np.array([1, 2]), "[1, 2]"), (float("nan"), "nan"), (12.5, "12.5")):
        t = _announcing(tmp_path / "t.h5", value)
        r = run_inproc("check", str(t))
        assert (r.returncode, r.stderr) == (
            2,
            f"spectrace: error: {t}: expected an integer >= 0 "
            f"(field=/blocks.flushed_rows, value={shown})\n",
        )


def test_flushed_rows_of_every_row_reads_whole(tmp_path):
    t = _announcing(tmp_path / "t.h5", np.int64(139))
    code, info = _json("info", str(t))
    assert (code, info["blocks"]) == (0, 139)
