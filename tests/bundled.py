"""Edited copies of the bundled traces (``traces/``) for bug-shaped tests. Test modules
import it by name, as :mod:`inproc`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np


def keep_block_rows(f: h5py.File, keep: np.ndarray) -> None:
    """Keep the /blocks rows ``keep`` (bool [blocks]) of open file ``f``, every column."""
    g = f["blocks"]
    for name in list(g):
        a = g[name][:][keep]
        del g[name]
        g.create_dataset(name, data=a, maxshape=(None, *a.shape[1:]), chunks=True)


def edited_copy(
    src: Path, dst: Path, keep=None, meta: dict | None = None, drop_meta: tuple[str, ...] = ()
) -> Path:
    """``src`` copied to ``dst`` keeping the /blocks rows ``keep`` selects (bool [blocks];
    all when None), /meta items replaced by ``meta`` and ``drop_meta`` removed."""
    shutil.copyfile(src, dst)
    with h5py.File(dst, "r+") as f:
        m = json.loads(f["meta"][()])
        m.update(meta or {})
        for key in drop_meta:
            m.pop(key, None)
        del f["meta"]
        f["meta"] = json.dumps(m)
        if keep is not None:
            keep_block_rows(f, keep)
    return dst
