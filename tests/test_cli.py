"""The command line's structure (main, commands, exit codes) and the shared formatters."""

from __future__ import annotations

from pathlib import Path

import pytest

from spectrace.tracer.cli.exit_codes import ExitCode
from spectrace.tracer.cli.main import _exit_code, cli, main
from spectrace.tracer.errors import InputError, SpectraceError, TraceFormatError
from spectrace.tracer.findings import SEVERITIES
from spectrace.tracer.fmt import SEVERITY_STYLE, num, pct

BUNDLED = Path(__file__).resolve().parents[1] / "traces" / "reference.h5"


def test_pct_and_num_by_hand():
    assert pct(0.4512) == "45.1%"
    assert pct(0.4512, 0) == "45%"
    assert pct(1) == "100.0%"
    assert pct(0) == "0.0%"
    assert pct(None) == "-"
    assert num(2.5) == "2.500"
    assert num(2.5, 2) == "2.50"
    assert num(None) == "-"


def test_every_severity_has_a_style():
    assert set(SEVERITY_STYLE) == set(SEVERITIES)


def test_the_group_has_every_command():
    assert set(cli.commands) == {
        "capture",
        "check",
        "demo",
        "diff",
        "export",
        "import",
        "replay",
        "info",
        "inspect-draft",
        "schema",
        "validate",
        "view",
    }
    assert set(cli.commands["capture"].commands) == {"vt", "vllm"}
    assert set(cli.commands["import"].commands) == {"vt", "golden", "llama-dump"}


@pytest.mark.parametrize(
    "exc, code",
    [
        (KeyboardInterrupt(), 130),
        (InputError("x"), 2),
        (TraceFormatError("x"), 2),
        (SpectraceError("x"), 3),
        (BrokenPipeError(), 0),
    ],
)
def test_failures_map_to_exit_codes(exc, code):
    assert _exit_code(exc) == code


def test_main_exits_with_the_code_and_one_line(capsys, tmp_path):
    with pytest.raises(SystemExit) as ex:
        main(["bogus"])
    assert ex.value.code == ExitCode.INPUT == 2
    assert (
        capsys.readouterr().err
        == "spectrace: error: No such command 'bogus'. (see 'spectrace --help')\n"
    )
    missing = tmp_path / "missing.h5"
    with pytest.raises(SystemExit) as ex:
        main(["info", str(missing)])
    assert ex.value.code == 2
    assert capsys.readouterr().err == f"spectrace: error: {missing}: no such file\n"
    with pytest.raises(SystemExit) as ex:
        main(["schema"])
    assert ex.value.code == 0
    assert capsys.readouterr().out.startswith("spectrace trace")


def test_an_internal_error_is_exit_3_with_one_line(capsys, monkeypatch):
    # A bug inside a command must not exit 1 (the code for "diverged") with a traceback.
    def boom(*args, **kwargs):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr("spectrace.tracer.metrics.trace_summary", boom)
    monkeypatch.delenv("SPECTRACE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as e:
        main(["info", str(BUNDLED)])
    assert e.value.code == 3
    assert capsys.readouterr().err == (
        "spectrace: internal error: ZeroDivisionError: division by zero (a spectrace bug; "
        "rerun with SPECTRACE_DEBUG=1 for the traceback and report it)\n"
    )
    monkeypatch.setenv("SPECTRACE_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        main(["info", str(BUNDLED)])


def test_no_command_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main([])
    assert e.value.code == 2
    assert capsys.readouterr().err == (
        "spectrace: error: no command given; commands: capture, check, demo, diff, export, import, "
        "info, inspect-draft, replay, schema, validate, view (see 'spectrace --help')\n"
    )
