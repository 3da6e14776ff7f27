"""Bad input the viewer meets after its first paint (a damaged chunk of a column it reads, a
request index past its table) ends ``spectrace view`` with the CLI's one line and exit 2,
not Textual's traceback; each with its clean twin, which stays open and shows its rows.

The viewer opens traces without the request-index scan (``scan_requests=False``: its first
paint does not wait for the column), so the index check comes from the load worker's read.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest

from spectrace.tracer.errors import TraceFormatError
from spectrace.tui import make_app
from spectrace.tui.widgets.block_view import BlockView

ROOT = Path(__file__).resolve().parents[2]
REF = ROOT / "traces" / "reference.h5"
VLLM = ROOT / "traces" / "vllm.h5"
SPECTRACE = str(Path(sys.executable).with_name("spectrace"))


def _damaged(dst: Path, column: str) -> Path:
    """A copy of the bundled reference trace with two bytes of ``column``'s first chunk
    flipped (its fletcher32 checksum fails on read)."""
    shutil.copyfile(REF, dst)
    with h5py.File(dst, "r", locking=False) as f:
        info = f[column].id.get_chunk_info(0)
    with open(dst, "r+b") as fh:
        fh.seek(info.byte_offset + info.size // 2)
        two = fh.read(2)
        fh.seek(info.byte_offset + info.size // 2)
        fh.write(bytes(b ^ 0xFF for b in two))
    return dst


def _bad_index(dst: Path) -> tuple[Path, int]:
    """A copy whose block row 3 names request row ``nreq`` (one past the table)."""
    shutil.copyfile(REF, dst)
    with h5py.File(dst, "r+", locking=False) as f:
        nreq = f["requests"]["req_id"].shape[0]
        f["blocks"]["request"][3] = nreq
    return dst, nreq


def _run(a: Path, b: Path | None = None) -> tuple:
    """The viewer headless (as ``app.run`` runs it, no test pilot) until it exits or its
    block view has rows (then it is told to exit; 20 s at most):
    ``(return_code, failure, rows shown)``."""

    async def go():
        app = make_app(a, b, start_tab="blocks", analysis="off")
        task = asyncio.create_task(app.run_async(headless=True, size=(120, 40)))
        rows, end = None, time.monotonic() + 20
        while not task.done() and time.monotonic() < end:
            await asyncio.sleep(0.02)
            views = list(app.screen.query(BlockView)) if app.is_running else []
            if views and views[0].rows is not None:
                rows = len(views[0].rows)
                app.exit()
                break
        await asyncio.wait_for(task, 20)
        return app.return_code, app.failure, rows

    return asyncio.run(go())


@pytest.mark.parametrize("column", ["position", "request"])
def test_a_damaged_chunk_ends_the_viewer_as_bad_input(tmp_path, column):
    bad = _damaged(tmp_path / "bad.h5", f"blocks/{column}")
    code, failure, _ = _run(bad, VLLM)
    assert code == 2
    assert isinstance(failure, TraceFormatError)
    assert str(failure).startswith(f"{bad}: damaged column blocks/{column} (")


def test_a_request_index_past_the_table_ends_the_viewer_as_bad_input(tmp_path):
    bad, nreq = _bad_index(tmp_path / "bad.h5")
    code, failure, _ = _run(bad)
    assert code == 2 and isinstance(failure, TraceFormatError)
    assert str(failure).startswith(f"{bad}: ") and f"the file has {nreq} requests" in str(failure)


def test_the_undamaged_copy_stays_open_with_its_rows(tmp_path):
    good = tmp_path / "good.h5"
    shutil.copyfile(REF, good)
    with h5py.File(good, "r", locking=False) as f:  # the first request's blocks, counted here
        first = int((f["blocks"]["request"][:] == 0).sum())
    code, failure, rows = _run(good)
    assert (code, failure) == (0, None)
    assert rows == first > 0


@pytest.mark.skipif(shutil.which("script") is None, reason="needs util-linux script (a pty)")
def test_the_cli_prints_one_line_and_exits_2(tmp_path):
    bad = _damaged(tmp_path / "bad.h5", "blocks/position")
    log = tmp_path / "tty.log"
    cmd = f"{SPECTRACE} view {bad} --tab blocks"
    r = subprocess.run(
        ["script", "-qec", cmd, str(log)], capture_output=True, timeout=60, check=False
    )
    text = log.read_bytes().decode("utf-8", "replace")
    assert r.returncode == 2
    want = f"spectrace: error: {bad}: damaged column blocks/position ("
    assert want in text and "Traceback" not in text
