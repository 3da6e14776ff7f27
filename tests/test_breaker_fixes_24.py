"""Fresh-user round 24: value ranges validate missed (damaged copies of traces/reference.h5:
139 blocks, k=4; every expected line is written from what the edit stored)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from spectrace.tracer.cli.main import main
from spectrace.tracer.validate import validate

REFERENCE = Path(__file__).resolve().parents[1] / "traces" / "reference.h5"


def copy_with(tmp_path: Path, edit) -> Path:
    path = tmp_path / "edited.h5"
    shutil.copy(REFERENCE, path)
    with h5py.File(path, "r+") as f:
        edit(f)
    return path


def margins(draft_row3: float, target_row4: float):
    """Add the optional 1.2 margin columns: zeros, with one cell set."""

    def edit(f: h5py.File) -> None:
        d = np.zeros((139, 4), np.float32)
        d[3, 1] = draft_row3
        t = np.zeros(139, np.float32)
        t[4] = target_row4
        f["blocks"].create_dataset("draft_margin", data=d)
        f["blocks"].create_dataset("target_margin", data=t)

    return edit


def lines(path: Path) -> list[str]:
    [(_, problems)] = validate(str(path))
    return [p.line() for p in problems]


def test_a_negative_margin_is_a_problem(tmp_path):
    path = copy_with(tmp_path, margins(-5.0, -np.inf))
    assert lines(path) == [
        f"{path}: negative margin (top-1 minus top-2 logit is at least 0) at row 3 "
        "(field=blocks/draft_margin, value=[0.0, -5.0, 0.0, 0.0])",
        f"{path}: negative margin (top-1 minus top-2 logit is at least 0) at row 4 "
        "(field=blocks/target_margin, value=-inf)",
    ]


def test_twin_zero_and_infinite_margins_are_valid(tmp_path):
    # +inf is a real margin: a target whose other logits were all masked to -inf
    path = copy_with(tmp_path, margins(0.0, np.inf))
    assert lines(path) == []


def set_t_ns(value: int):
    def edit(f: h5py.File) -> None:
        t = f["blocks"]["t_ns"][()]
        t[3] = value
        f["blocks"]["t_ns"][...] = t

    return edit


def test_a_negative_time_is_a_problem(tmp_path):
    path = copy_with(tmp_path, set_t_ns(-1))
    assert lines(path) == [
        f"{path}: negative time (ns since the epoch; 0 is unknown) at row 3 "
        "(field=blocks/t_ns, value=-1)"
    ]


def test_twin_time_zero_is_unknown_not_damage(tmp_path):
    # the golden and llama-dump importers write 0: the source recorded no time
    assert lines(copy_with(tmp_path, set_t_ns(0))) == []


def set_rank(rank: int):
    def edit(f: h5py.File) -> None:
        meta = json.loads(f["meta"][()])
        meta["dp_rank"] = rank
        del f["meta"]
        f.create_dataset("meta", data=json.dumps(meta), dtype=h5py.string_dtype("utf-8"))

    return edit


def run(capsys, *argv: str) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    return exc.value.code, capsys.readouterr().err.splitlines()


def test_a_rank_past_int32_is_bad_input_not_an_internal_error(tmp_path, capsys):
    path = copy_with(tmp_path, set_rank(2**31))
    rc, err = run(capsys, "export", str(path), "-o", str(tmp_path / "out"))
    assert rc == 2
    assert err == [
        f"spectrace: error: {path}: expected an integer <= 2147483647 "
        "(field=meta.dp_rank, value=2147483648)"
    ]
    assert not (tmp_path / "out").exists()


def test_twin_the_largest_int32_rank_exports(tmp_path, capsys):
    path = copy_with(tmp_path, set_rank(2**31 - 1))
    out = tmp_path / "out.jsonl"
    rc, _ = run(capsys, "export", str(path), "--format", "jsonl", "-o", str(out))
    assert rc == 0
    rows = [json.loads(x) for x in (out / "blocks.jsonl").read_text().splitlines()]
    assert len(rows) == 139 and {r["rank"] for r in rows} == {2**31 - 1}
