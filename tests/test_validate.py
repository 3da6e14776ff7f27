"""Reading validates before use, `spectrace validate`, and the VT importer's value ranges.

Damaged traces are copies of traces/reference.h5 with one thing broken (h5py). Expected
values come from that file as stored: 139 blocks of 5 requests (prompts of 10, 14, 12, 10, 12
tokens, 64 output tokens each), k=4; row 10 is request 0 at position 15 with num_verified 4,
accepted 0, num_emitted 1; row 20 the same request at position 19, accepted 0.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from spectrace.tracer.cli.main import main
from spectrace.tracer.errors import TraceFormatError
from spectrace.tracer.store import open_trace
from spectrace.tracer.validate import validate

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "traces" / "reference.h5"


def run(capsys, *argv: str) -> tuple[int, str, list[str]]:
    """``spectrace ARGV`` in-process: exit code, stdout, stderr lines."""
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    out, err = capsys.readouterr()
    return exc.value.code, out, err.splitlines()


def damaged(tmp_path: Path, edit) -> Path:
    """A copy of the reference trace after ``edit(h5py.File)``."""
    path = tmp_path / "damaged.h5"
    shutil.copy(REFERENCE, path)
    with h5py.File(path, "r+") as f:
        edit(f)
    return path


def set_meta(text: str):
    def edit(f: h5py.File) -> None:
        del f["meta"]
        f.create_dataset("meta", data=text, dtype=h5py.string_dtype("utf-8"))

    return edit


def replace(name: str, make):
    def edit(f: h5py.File) -> None:
        data = make(f["blocks"][name][()])
        del f["blocks"][name]
        f["blocks"].create_dataset(name, data=data)

    return edit


def set_cell(name: str, row: int, value: int):
    def edit(f: h5py.File) -> None:
        f["blocks"][name][row] = value

    return edit


def meta_k_four(f: h5py.File) -> None:
    meta = json.loads(f["meta"][()])
    meta["k"] = "four"
    set_meta(json.dumps(meta))(f)


# -- reading validates before use (exit 2, one line naming file and field) -------------------

READ_ERRORS = [
    (set_meta("null"), "damaged.h5: not a JSON object (a JSON null) (field=/meta)"),
    (set_meta("[1, 2]"), "not a JSON object (a JSON list) (field=/meta, value=[1, 2])"),
    (set_meta('"x"'), "not a JSON object (a JSON str) (field=/meta, value='x')"),
    (set_meta("{oops"), "not JSON"),
    (meta_k_four, "expected an integer (field=meta.k, value='four')"),
    (
        replace("proposed", lambda a: a[:, 0]),
        "stored 1-D, expected 2-D int32 (field=blocks/proposed)",
    ),
    (replace("proposed", lambda a: a[:, :, None]), "stored 3-D, expected 2-D int32"),
    (
        replace("proposed", lambda a: a.astype("S")),
        "stored as strings, expected int32 (field=blocks/proposed)",
    ),
    (
        replace("request", lambda a: a.astype(np.float64)),
        "stored as float64, expected int32 (field=blocks/request)",
    ),
    (
        set_cell("request", 7, -1),
        "negative request index at row 7 (field=blocks/request, value=-1)",
    ),
    (
        set_cell("request", 3, 5),
        "request index out of range (the file has 5 requests) at row 3 "
        "(field=blocks/request, value=5)",
    ),
    (set_cell("position", 20, -5), "value below 0 at row 20 (field=blocks/position, value=-5)"),
    (
        lambda f: f.attrs.__setitem__("format_version", "1.banana"),
        "malformed format version (expected MAJOR.MINOR) (field=format_version, value='1.banana')",
    ),
]


def test_an_impossible_count_is_a_finding_not_unreadable_input(tmp_path, capsys):
    # accepted 5 > num_verified 4 at row 10: the file reads; check names it (exit 1) and
    # validate reports it (exit 1); neither is an input error (exit 2).
    path = damaged(tmp_path, set_cell("accepted", 10, 5))
    assert open_trace(path).blocks.accepted[10] == 5
    rc, out, _ = run(capsys, "check", str(path), "--format", "json")
    assert rc == 1
    first = json.loads(out)["findings"][0]
    assert (first["kind"], first["evidence"]["row"]) == ("impossible_values", 10)
    rc, out, _ = run(capsys, "validate", str(path))
    assert rc == 1
    assert "accepted > num_verified (4) at row 10 (field=blocks/accepted, value=5)" in out


def cut_accepted(f: h5py.File) -> None:
    data = f["blocks"]["accepted"][:50]
    del f["blocks"]["accepted"]
    f["blocks"].create_dataset("accepted", data=data, maxshape=(None,))


@pytest.mark.parametrize("edit,expected", READ_ERRORS, ids=[e[1][:40] for e in READ_ERRORS])
def test_reading_a_damaged_trace_is_one_input_error(tmp_path, capsys, edit, expected):
    path = damaged(tmp_path, edit)
    with pytest.raises(TraceFormatError) as exc:
        t = open_trace(path)
        t.blocks.request  # noqa: B018 - index columns are checked when they load
        t.blocks.position  # noqa: B018
        t.blocks.accepted  # noqa: B018
    assert str(exc.value).startswith(f"{path}: ")
    assert expected in str(exc.value)
    for argv in (["info", str(path)], ["check", str(path)], ["diff", str(path), str(REFERENCE)]):
        rc, _, err = run(capsys, *argv)
        assert rc == 2, argv
        assert len(err) == 1 and err[0].startswith(f"spectrace: error: {path}: "), err
        assert expected in err[0]


def test_unequal_columns_in_a_complete_file_are_an_error(tmp_path, capsys):
    path = damaged(tmp_path, cut_accepted)
    rc, _, err = run(capsys, "info", str(path))
    assert rc == 2
    assert err == [
        f"spectrace: error: {path}: columns of unequal length in a complete file: "
        "request=139, step=139, position=139, anchor=139, k=139, proposed=139, "
        "num_verified=139, verified=139, accepted=50, num_emitted=139, emitted=139, "
        "t_ns=139, batch_row=139, batch_size=139, proposal_source=139 (field=/blocks)"
    ]


def test_twin_unequal_columns_in_a_live_file_keep_the_shortest(tmp_path):
    def edit(f: h5py.File) -> None:
        cut_accepted(f)
        f.attrs["status"] = "recording"

    with pytest.warns(UserWarning, match="recovered 50 flushed blocks"):
        t = open_trace(damaged(tmp_path, edit))
    assert len(t.blocks) == 50


def test_twin_a_newer_minor_version_and_clean_meta_read(tmp_path):
    t = open_trace(damaged(tmp_path, lambda f: f.attrs.__setitem__("format_version", "1.7")))
    assert t.formats == ["1.7"] and t.meta["k"] == 4 and len(t.blocks) == 139
    assert t.blocks.request.tolist()[:4] == [0, 1, 2, 3]


def test_twin_a_live_file_may_point_past_its_flushed_requests(tmp_path):
    def edit(f: h5py.File) -> None:
        f["blocks"]["request"][3] = 5
        f.attrs["status"] = "recording"

    with pytest.warns(UserWarning):
        t = open_trace(damaged(tmp_path, edit))
    assert len(t.requests) == 6 and t.requests.req_id[5] == "?5"
    assert t.blocks.request[3] == 5


# -- spectrace validate ---------------------------------------------------------------------


def test_validate_the_bundled_traces(capsys):
    vllm = ROOT / "traces" / "vllm.h5"
    rc, out, _ = run(capsys, "validate", str(REFERENCE), str(vllm))
    assert rc == 0
    assert out.splitlines() == [f"{REFERENCE}: valid", f"{vllm}: valid"]


def _cells(f: h5py.File) -> None:
    b = f["blocks"]
    b["accepted"][10] = 5  # > num_verified 4; num_emitted 1 != 6
    b["num_emitted"][20] = 3  # accepted 0 + 1 != 3
    b["num_emitted"][21] = 3
    b["position"][0] = 74  # request 0 holds 10 + 64 tokens: index 74 is past the end


def test_validate_lists_each_problem_with_its_first_row_and_count(tmp_path, capsys):
    path = damaged(tmp_path, _cells)
    rc, out, _ = run(capsys, "validate", str(path))
    assert rc == 1
    assert out.splitlines() == [
        f"{path}: accepted > num_verified (4) at row 10 (field=blocks/accepted, value=5)",
        f"{path}: num_emitted != accepted + 1 at row 10 (3 rows) (field=blocks/num_emitted, "
        "value=1)",
        # accepted 5 on a block that accepted none: its emitted[0] is the bonus token, not
        # the rejected verified[0]
        f"{path}: emitted ids are not the accepted verified ids (emitted[:accepted]) at row "
        "10 (field=blocks/emitted, value=5)",
        f"{path}: verified block's position past the end of the request's prompt + output at "
        "row 0 (field=blocks/position, value=74)",
    ]


def test_validate_reports_structure_and_ranges_as_problems(tmp_path):
    path = damaged(tmp_path, set_cell("request", 7, -1))
    [(p, problems)] = validate(str(path))
    assert [pr.line() for pr in problems] == [
        f"{path}: negative request index at row 7 (field=blocks/request, value=-1)"
    ]
    path = damaged(tmp_path, replace("proposed", lambda a: a[:, 0]))
    [(p, problems)] = validate(str(path))
    assert [(pr.field, pr.what) for pr in problems] == [
        ("blocks/proposed", "stored 1-D, expected 2-D int32")
    ]


def test_validate_an_unreadable_file_is_exit_2(tmp_path, capsys):
    path = tmp_path / "notes.h5"
    path.write_text("not hdf5\n")
    rc, out, err = run(capsys, "validate", str(path))
    assert rc == 2 and out == ""
    assert len(err) == 1 and err[0].startswith(f"spectrace: error: {path}: not a readable HDF5")


def test_validate_json(tmp_path, capsys):
    path = damaged(tmp_path, set_cell("num_emitted", 20, 3))
    rc, out, _ = run(capsys, "validate", str(path), "--format", "json")
    assert rc == 1
    doc = json.loads(out)
    assert doc["schema"] == "spectrace.validate/1"
    assert doc["files"] == [
        {
            "file": str(path),
            "valid": False,
            "problems": [
                {
                    "path": str(path),
                    "field": "blocks/num_emitted",
                    "what": "num_emitted != accepted + 1",
                    "value": 3,
                    "row": 20,
                    "count": 1,
                }
            ],
        }
    ]


def test_info_json_has_a_schema_key(capsys):
    rc, out, _ = run(capsys, "info", str(REFERENCE), "--format", "json")
    assert rc == 0 and json.loads(out)["schema"] == "spectrace.info/1"
    rc, out, _ = run(capsys, "check", str(REFERENCE), "--format", "json")
    assert json.loads(out)["schema"] == "spectrace.check/1"


# -- VT importer: values out of the schema's range -------------------------------------------

GOOD = "[SPECTRACE] req=a pos=5 k=2 ns=1 acc=0 draft=[ 1 2 ] emit=[ 7 ]"
BAD_LINES = [
    ("[SPECTRACE] req=a pos=5 k=2 ns=1 acc=40000 draft=[ 1 2 ] emit=[ 7 ]", "acc", "40000"),
    ("[SPECTRACE] req=a pos=5 k=2 ns=4 acc=3 draft=[ 1 2 ] emit=[ 1 2 3 4 ]", "acc", "3"),
    ("[SPECTRACE] req=a pos=5 k=2 ns=1 acc=0 draft=[ 2147483648 2 ] emit=[ 7 ]", "draft",
     "2147483648"),
    ("[SPECTRACE] req=a pos=99999999999999999999999 k=2 ns=1 acc=0 draft=[ 1 2 ] emit=[ 7 ]",
     "pos", "99999999999999999999999"),
    ("[SPECTRACE] req=a pos=2147483648 k=2 ns=1 acc=0 draft=[ 1 2 ] emit=[ 7 ]", "pos",
     "2147483648"),
    ("[SPECTRACE] req=a pos=" + "9" * 100000 + " k=2 ns=1 acc=0 draft=[ 1 2 ] emit=[ 7 ]", "pos",
     "99999999999999999999... (100000 digits)"),
]  # fmt: skip


@pytest.mark.parametrize("line,field,value", BAD_LINES, ids=[b[1] + b[2][:12] for b in BAD_LINES])
def test_vt_value_out_of_range(tmp_path, capsys, line, field, value):
    log = tmp_path / "run.log"
    log.write_text(f"{GOOD}\n{line}\n")
    out = tmp_path / "t.h5"
    rc, _, err = run(capsys, "import", "vt", str(log), "-o", str(out), "--strict")
    assert rc == 2
    assert len(err) == 1 and err[0].startswith(f"spectrace: error: {log}:2: malformed trace line")
    # The failed strict import also removed its .partial (and says so at the end).
    assert err[0].endswith(f"(field={field}, value={value}) (partial trace {out}.partial removed)")
    assert not out.with_name(out.name + ".partial").exists()
    rc, _, _ = run(capsys, "import", "vt", str(log), "-o", str(tmp_path / "l.h5"))
    assert rc == 0  # lenient: line 2 counted as malformed and dropped
    t = open_trace(tmp_path / "l.h5")
    assert len(t.blocks) == 1 and t.meta["import"]["malformed"] == 1
    assert t.meta["import"]["examples"]["malformed"][0][0] == 2


def test_twin_vt_values_at_the_edge_of_the_range(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(
        "[SPECTRACE] req=a pos=2147483647 k=2 ns=3 acc=2 draft=[ 2147483647 -1 ] "
        "emit=[ 2147483647 -1 7 ]\n"
    )
    with pytest.raises(SystemExit) as exc:
        main(["import", "vt", str(log), "-o", str(tmp_path / "t.h5")])
    assert exc.value.code == 0
    b = open_trace(tmp_path / "t.h5").blocks
    assert b.position.tolist() == [2147483646]
    assert b.accepted.tolist() == [2]  # all verified drafts accepted: the upper bound
    assert b.proposed.tolist() == [[2147483647, -1]]


def test_requests_output_id_out_of_range(tmp_path, capsys):
    log = tmp_path / "run.log"
    log.write_text(GOOD + "\n")
    req = tmp_path / "r.jsonl"
    req.write_text(json.dumps({"req_id": "a", "prompt_ids": [1], "output_ids": [2**40]}) + "\n")
    rc, _, err = run(capsys, "import", "vt", str(log), "-o", str(tmp_path / "t.h5"), "--requests",
                     str(req))  # fmt: skip
    assert rc == 2
    assert err == [
        f"spectrace: error: {req}:1: output_ids holds a token id out of range [0, 2147483647] "
        "(field=output_ids, value=1099511627776)"
    ]


@pytest.mark.parametrize("cmd", [["import", "vt", "LOG", "-o", "OUT"], ["capture", "-o", "OUT"]])
def test_meta_of_the_wrong_type_is_a_usage_error(tmp_path, capsys, cmd):
    log = tmp_path / "run.log"
    log.write_text(GOOD + "\n")
    argv = [str(log) if a == "LOG" else str(tmp_path / "t.h5") if a == "OUT" else a for a in cmd]
    argv += ["--meta", "k=four"]
    if cmd[0] == "capture":
        argv += ["--", "true"]
    rc, _, err = run(capsys, *argv)
    assert rc == 2 and len(err) == 1
    assert "Invalid value for --meta k: expected an integer (field=k, value='four')" in err[0]
    assert not (tmp_path / "t.h5").exists()


def test_twin_meta_of_the_right_type(tmp_path, capsys):
    log = tmp_path / "run.log"
    log.write_text(GOOD + "\n")
    out = tmp_path / "t.h5"
    rc, _, _ = run(capsys, "import", "vt", str(log), "-o", str(out), "--meta", "k=4", "--meta",
                   "engine_version=1.2", "--meta", "d2t=true")  # fmt: skip
    assert rc == 0
    meta = open_trace(out).meta
    assert (meta["k"], meta["engine_version"], meta["d2t"]) == (4, "1.2", True)
