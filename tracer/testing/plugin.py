"""The pytest plugin's hooks and fixtures: draft-trace fixtures for engine teams' CI.

pytest loads them through the ``pytest11`` entry point :mod:`spectrace.tracer.pytest_plugin`,
which re-exports this module's names.

Fixtures (all prefixed ``spectrace_``):

* ``spectrace_load(path, requests=None)`` -> Trace: an HDF5 trace, or a ``VT_SPEC_TRACE`` log
  (imported next to the test's tmp dir) with its requests JSONL.
* ``spectrace_assert_drafts_match(ours, theirs, *, min_agreement=None, max_error_findings=0,
  positions=None, ignore=(), requests=None)``: fails with a short text naming the first
  divergent block (the gate of :mod:`spectrace.tracer.gate`, as ``spectrace diff``'s options).
* ``spectrace_regression.check(trace)``: golden-trace workflow (``--spectrace-regen``).
* ``spectrace_capture_cmd(cmd, requests=None)`` / ``spectrace_capture_vllm(cmd)`` -> Trace:
  run an engine command or a vLLM script under capture.

Import-light by design: loading the plugin imports only pytest; each fixture imports what it
needs when used (no h5py, numpy, torch, vllm or textual at collection time). Like the CLI,
this module is a composition root and may reach ``spectrace.hooks`` inside fixtures.
"""

from __future__ import annotations

import shutil
from glob import escape as glob_escape
from pathlib import Path

import pytest

_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def pytest_addoption(parser) -> None:
    """Adds ``--spectrace-regen`` (rewrite golden traces)."""
    group = parser.getgroup("spectrace")
    group.addoption(
        "--spectrace-regen",
        action="store_true",
        default=False,
        help="rewrite spectrace golden traces (the tests still fail once)",
    )


def _unused(folder: Path, stem: str) -> Path:
    """``folder/STEM.h5``, or ``STEM-2.h5``, ``STEM-3.h5``... when a file of that stem is
    there already (``STEM.h5``, its ``.partial``, its ``.dpN.h5`` ranks): a second capture or
    import of one name in a test never replaces the first one's file, which an earlier
    Trace, a golden copy or the ``spectrace view`` line still names."""
    name, n = stem, 1
    while (folder / f"{name}.h5").exists() or any(folder.glob(f"{glob_escape(name)}.*")):
        n += 1
        name = f"{stem}-{n}"
    return folder / f"{name}.h5"


def _load(path, requests=None, workdir=None):
    """A :class:`Trace` as is; an HDF5 file, a list of files or a glob opened; any other
    file imported as a ``VT_SPEC_TRACE`` log into ``workdir`` (default: beside it) and
    opened."""
    from ..store import Trace, open_trace

    if isinstance(path, Trace):
        return path
    if isinstance(path, (list, tuple)):  # the files of one trace (ranks), as open_trace takes
        return open_trace([str(x) for x in path])
    p = Path(path)
    if p.is_file():
        with open(p, "rb") as fh:
            is_hdf5 = fh.read(8) == _HDF5_SIGNATURE
        if not is_hdf5:
            from spectrace.hooks.vt.importer import import_log

            out = _unused(Path(workdir or p.parent), p.name)
            import_log(str(p), str(out), requests_path=str(requests) if requests else None)
            return open_trace(out)
    return open_trace(path)


@pytest.fixture
def spectrace_load(tmp_path):
    """``load(path, requests=None) -> Trace``: open an HDF5 trace (file or glob), or import a
    ``VT_SPEC_TRACE`` log (with its requests JSONL) into the test's tmp dir and open that.

    Raises:
        InputError: a missing file or a malformed requests file (one line naming it).
    """
    return lambda path, requests=None: _load(path, requests, tmp_path)


def _workdir(tmp_path: Path, side: str) -> Path:
    """Where a fixture imports a log given as ``side``: the test's tmp dir, never beside the
    log (that wrote into the source tree and replaced a ``LOG.h5`` already there)."""
    d = tmp_path / f"spectrace-{side}"
    d.mkdir(exist_ok=True)
    return d


@pytest.fixture
def spectrace_assert_drafts_match(tmp_path):
    """``check(ours, theirs, *, min_agreement=None, max_error_findings=0, positions=None,
    ignore=(), requests=None, tokenizer=None)``: fail the test unless our drafts match theirs
    (the same gate as ``spectrace diff --min-agreement F --max-errors N --positions A:B
    --ignore KIND --request ID``).

    Raises:
        GateError (a ValueError): ``min_agreement`` outside [0, 1], a negative
            ``max_error_findings``, an unknown kind in ``ignore``, bad ``positions``, a
            request id that neither trace has.

    Passing needs comparable content: content that diverged before any comparable block,
    or a selection that leaves no paired block, fails (never a vacuous pass);
    ``min_agreement`` given (not None: 1.0 then) also fails a pair with no paired block at
    all (a vanilla side). The failure text names the first divergent block (request,
    position, slot) with both sides' ids and decoded tokens, the first error finding and the
    ``spectrace view`` command for the pair. See :func:`assertions.drafts_match_report`.
    """

    def check(ours, theirs, **kw) -> None:
        from .assertions import drafts_match_report

        a = _load(ours, workdir=_workdir(tmp_path, "ours"))
        msg = drafts_match_report(a, _load(theirs, workdir=_workdir(tmp_path, "theirs")), **kw)
        if msg:
            pytest.fail(msg, pytrace=False)

    return check


class Regression:
    """Golden traces beside the test: ``<test_module_dir>/<test_module>/<test_name>.h5``.

    ``check(trace)``: a missing golden is written and the test fails; a mismatch writes
    ``<test_name>.obtained.h5`` beside the golden and fails with the diff summary;
    ``--spectrace-regen`` rewrites the golden and fails. Goldens are compared through the
    alignment (prompt ids, anchor positions, proposals), so request ids and timestamps never
    matter.
    """

    def __init__(self, golden: Path, regen: bool, workdir: Path | None = None) -> None:
        self.golden = golden
        self.obtained = self.obtained_of(golden)
        self.regen = regen
        self.workdir = workdir  # where a log given to check() is imported (None: beside it)

    @staticmethod
    def obtained_of(golden: Path) -> Path:
        """Where a mismatch leaves the obtained trace: ``NAME.obtained.h5`` beside the
        golden ``NAME.h5``."""
        return golden.with_name(golden.stem + ".obtained.h5")

    def check(self, trace) -> None:
        """Compare ``trace`` (a path or Trace) with the golden; see the class docstring."""
        from .assertions import goldens_match

        t = _load(trace, workdir=self.workdir)
        if len(t.paths) != 1:  # a golden is one file: rank 0 alone would never match again
            names = ", ".join(str(p) for p in t.paths)
            pytest.fail(
                f"spectrace: a regression golden is one trace file; this trace has "
                f"{len(t.paths)} ({names}): check each rank on its own",
                pytrace=False,
            )
        src = Path(t.paths[0])
        self.golden.parent.mkdir(parents=True, exist_ok=True)
        if self.regen or not self.golden.exists():
            what = "rewritten (--spectrace-regen)" if self.golden.exists() else "written"
            shutil.copyfile(src, self.golden)
            pytest.fail(
                f"spectrace: golden trace {what}: {self.golden}; re-run the test", pytrace=False
            )
        msg = goldens_match(t, _load(self.golden))
        if msg:
            shutil.copyfile(src, self.obtained)
            pytest.fail(
                f"{msg}\n  obtained trace: {self.obtained}\n  golden trace:   "
                f"{self.golden}\n  accept it with --spectrace-regen",
                pytrace=False,
            )
        if self.obtained.exists():
            self.obtained.unlink()


#: Golden path -> the node id that uses it, in this session (two tests must not share one).
_GOLDEN_OWNERS = pytest.StashKey[dict]()


def _claim(request, golden: Path) -> str:
    """The node id that owns ``golden`` in this test session: this test's, unless another
    claimed it first. Under pytest-xdist each worker is a process of its own, so the claims
    are files in the session's shared temporary folder (the parent of every worker's
    basetemp), each made whole by one atomic link: the two tests of a shared golden may run
    on two workers."""
    me = request.node.nodeid
    if not hasattr(request.config, "workerinput"):  # one process: its stash is the session's
        return request.config.stash.setdefault(_GOLDEN_OWNERS, {}).setdefault(golden, me)
    import hashlib
    import os
    import tempfile

    folder = request.getfixturevalue("tmp_path_factory").getbasetemp().parent / "spectrace-goldens"
    folder.mkdir(exist_ok=True)
    claim = folder / hashlib.sha256(str(golden.resolve()).encode()).hexdigest()
    with tempfile.NamedTemporaryFile("w", dir=folder, delete=False) as f:
        f.write(me)
    try:
        os.link(f.name, claim)  # fails when another test claimed it: then theirs counts
    except FileExistsError:
        return claim.read_text()
    finally:
        os.unlink(f.name)
    return me


@pytest.fixture
def spectrace_regression(request) -> Regression:
    """The golden-trace checker of this test (see :class:`Regression`). Fails the test when
    another test of the session has the same golden file (``test_x[a/b]`` and
    ``test_x[a_b]``, or ``test_x[1]`` and ``test_x_1``): each would be judged against the
    other's trace."""
    path = Path(request.node.path)
    name = request.node.name.replace("/", "_").replace("[", "_").replace("]", "")
    golden = path.parent / path.stem / f"{name}.h5"
    # A test owns its golden and the .obtained.h5 beside it (written on a mismatch,
    # removed on a pass): test_x[a]'s obtained trace is test_x[a.obtained]'s golden.
    for mine in (golden, Regression.obtained_of(golden)):
        owner = _claim(request, mine)
        if owner != request.node.nodeid:
            pytest.fail(
                f"spectrace: {request.node.nodeid} and {owner} have one golden trace {mine}; "
                f"give the tests (or their parameters) names that stay distinct (a test owns "
                f"its golden NAME.h5 and the NAME.obtained.h5 a mismatch writes)",
                pytrace=False,
            )
    return Regression(
        golden,
        request.config.getoption("spectrace_regen"),
        _workdir(request.getfixturevalue("tmp_path"), "obtained"),
    )


def _argv(cmd) -> list[str]:
    """A capture fixture's command as its argument list (``str`` each: paths welcome).

    Raises:
        ValueError: a string or bytes (read item by item it would run ``/``, ``u``,
            ``s``...: pass ``shlex.split(cmd)`` or the list itself) or an empty command.
    """
    if isinstance(cmd, str | bytes):
        raise ValueError(
            f"cmd must be the command's argument list, not one string ({cmd!r}): pass "
            f"[program, arg, ...] (or shlex.split of it)"
        )
    argv = [str(c) for c in cmd]
    if not argv:
        raise ValueError("cmd is empty: pass [program, arg, ...]")
    return argv


@pytest.fixture
def spectrace_capture_cmd(tmp_path):
    """``capture(cmd, requests=None, name="ours") -> Trace``: run our engine's command under
    ``spectrace capture`` (VT_SPEC_TRACE=1) and open the trace. ``requests`` is the JSONL the
    command writes with prompt/output ids. Fails the test if the command fails. The trace is
    ``tmp_path/NAME.h5``; a second capture of one NAME writes ``NAME-2.h5`` (never over the
    first)."""

    def capture(cmd, requests=None, name: str = "ours"):
        from spectrace.hooks.capture import capture_command

        from ..store import open_trace

        out = _unused(tmp_path, name)
        rc = capture_command(
            _argv(cmd),
            str(out),
            requests_path=str(requests) if requests else None,
            forward_trace_lines=False,
        )  # failures stay readable
        if rc != 0:
            pytest.fail(f"spectrace: captured command exited with {rc}: {cmd}", pytrace=False)
        return open_trace(out)

    return capture


@pytest.fixture
def spectrace_capture_vllm(tmp_path):
    """``capture(cmd, name="theirs") -> Trace``: run a vLLM script under spectrace's vLLM
    plugin (``SPECTRACE_OUT``) and open the trace. Fails the test if the script fails. A
    second capture of one NAME writes ``NAME-2.h5`` (never over the first)."""

    def capture(cmd, name: str = "theirs"):
        from spectrace.hooks.capture import capture_vllm

        from ..store import open_trace

        out = _unused(tmp_path, name)
        rc = capture_vllm(_argv(cmd), str(out))
        if rc != 0:
            pytest.fail(f"spectrace: vLLM script exited with {rc}: {cmd}", pytrace=False)
        return open_trace(out)

    return capture


__all__ = [
    "Regression",
    "pytest_addoption",
    "spectrace_assert_drafts_match",
    "spectrace_capture_cmd",
    "spectrace_capture_vllm",
    "spectrace_load",
    "spectrace_regression",
]
