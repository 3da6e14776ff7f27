"""Each request's emitted token ids, as the V2 join produces them (numpy chunks)."""

from __future__ import annotations

import numpy as np


class EmittedIds:
    """Tap-local request id -> the emitted ids joined so far, kept as numpy chunks (one per
    request and join), so the Python work per join is one append per distinct request."""

    def __init__(self) -> None:
        self._out: dict[int, list[np.ndarray]] = {}

    def add(self, req: np.ndarray, tokens: np.ndarray, lens: np.ndarray) -> None:
        """Append each verdict row's emitted ids to its request's chunks, in row order.

        Args:
            req: int64 ``[V]`` tap-local ids of the verdict rows (chunk order).
            tokens: int64 ``[V, K + 1]`` emitted ids per row, ``lens[i]`` of them valid.
            lens: int64 ``[V]``.
        """
        if not len(req):
            return
        order = np.argsort(req, kind="stable")  # per request, rows stay in chunk order
        req, tokens, lens = req[order], tokens[order], lens[order]
        flat = tokens[np.arange(tokens.shape[1])[None, :] < lens[:, None]]
        starts = np.flatnonzero(np.r_[True, req[1:] != req[:-1]])
        offs = np.r_[0, np.cumsum(lens)]
        bounds = offs[np.r_[starts, len(req)]].tolist()
        out = self._out
        for j, r in enumerate(req[starts].tolist()):
            chunks = out.get(r)
            if chunks is None:
                chunks = out[r] = []
            chunks.append(flat[bounds[j] : bounds[j + 1]])

    def ids(self, i: int) -> list[int]:
        """Request ``i``'s emitted ids so far, as a list."""
        chunks = self._out.get(i)
        return np.concatenate(chunks).tolist() if chunks else []

    def forget(self, i: int) -> None:
        """Free request ``i``'s ids (it finished)."""
        self._out.pop(i, None)

    def by_name(self, names: list[str]) -> dict[str, list[int]]:
        """Request id (``names[i]``) -> emitted ids so far."""
        return {names[i]: np.concatenate(c).tolist() for i, c in self._out.items() if c}
