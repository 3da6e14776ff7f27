"""Late /meta items for a trace file that no process writes any more."""

from __future__ import annotations

import json
import os

import h5py

from ..errors import InputError

_STR = h5py.string_dtype("utf-8")


def amend_meta(path: str | os.PathLike, **items) -> None:
    """Merge ``items`` into the /meta of a trace file that no process writes any more (e.g.
    ``capture vllm`` adds how the command ended to the files the plugin wrote).

    Raises:
        InputError: the file cannot be opened for writing or has no JSON /meta object.
    """
    try:
        with h5py.File(path, "r+", locking=False) as f:
            raw = f["meta"][()]
            meta = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else raw)
            if not isinstance(meta, dict):
                raise ValueError("/meta is not a JSON object")
            meta.update(items)
            del f["meta"]
            f.create_dataset("meta", data=json.dumps(meta, sort_keys=True, default=str), dtype=_STR)
    except (OSError, KeyError, ValueError) as exc:
        raise InputError(f"{path}: cannot update the trace metadata ({exc})") from None
