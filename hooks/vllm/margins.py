"""The drafter's top-1 minus top-2 logit per draft slot, read beside vLLM's greedy draft step.

Wraps, on the V1 drafter instance (``vllm/v1/spec_decode/llm_base_proposer.py``
``SpecDecodeBaseProposer._greedy_sample``), the plain path ``compute_logits(hidden).argmax``:
the wrapper computes the same logits once, takes the same argmax and keeps
``top1 - top2`` per row (a ``[B]`` tensor). One call per draft depth, rows in the input
batch's order; the recorder takes them after ``sample_tokens`` (:meth:`MarginTap.matrix`).

Cost: the top-2 reuses the argmax vLLM takes anyway. On a CPU the margin is computed with
numpy on the logits' memory (zero-copy): top-1 is gathered at the argmax, the argmax cell is
set to ``-inf`` in place, top-2 is the row maximum, and the cell is restored. numpy runs on
the calling thread alone; torch's reductions there go through its OpenMP pool, whose barrier
waits for a core that a loaded machine has given to another process (measured beside vLLM on
2 busy cores: about 3 ms per call in torch, 40 us in numpy, for [64, 2048] float32). Off the
CPU (or for dtypes numpy lacks) the same steps run in torch (several times cheaper than
``torch.topk(2)``). Both equal ``topk(2)``'s values bit for bit (ties: a second maximal cell
stays, margin 0). On the CPU path the tap keeps each depth's logits and argmax and reduces
them after ``sample_tokens`` returned, subtracting once per engine step
(:meth:`MarginTap.host_top2`): numpy right after vLLM's torch ops costs several times more
than later in the step (measured: a 64-element add 43 us first, 4 us next), and beside vLLM
each numpy call costs 5-10 us, so calls, and when they run, are what to save. The usual
step's subtraction itself runs on the writer thread (:meth:`MarginTap.uniform_later`). The
per-step values are gathered once per engine step (:meth:`MarginTap.matrix`), not once per
depth; whether margins are wanted is read once per step too. Even so they cost a capture
on the bundled models about 1.6% of a warm ``generate`` on a CPU (one more pass over every
depth's logits; measured with ``benchmarks/bench_vllm_cpu_capture.py --breakdown``), and on a
GPU a device-to-host copy and a sync per draft step, so a capture records them only when asked
(:data:`ENV`); ``spectrace replay``, where a near tie explains a difference on an identical
prefix and no production step pays, asks for them on a CPU. The local-argmax and
heterogeneous-vocabulary paths are left alone (no margins: NaN).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

#: ``1`` records margins, ``cpu`` only when the drafter's logits are on a CPU (no sync there;
#: what ``spectrace replay`` sets by default), ``0`` or unset never (the capture's cost budget).
ENV = "SPECTRACE_MARGINS"


class MarginTap:
    """Margins of the draft steps since the last :meth:`reset`: one ``[B]`` tensor (or list)
    of top-1 minus top-2 logits per draft depth, rows in the input batch's order."""

    def __init__(self) -> None:
        #: per depth: the margins ([B] tensor or array), or a host ``(top1, top2)`` pair
        #: whose difference :meth:`_depths` takes once per engine step, or the logits
        #: :meth:`host_top2` keeps until then
        self.steps: list = []
        self._depth_rows: list[np.ndarray] | None = None  # steps on the host, float32 [B_d]
        self._grid: np.ndarray | None = None  # the same as one [depth, B] array, if uniform
        self.wanted: bool | None = None  # this step's decision (:func:`_wanted`), made once
        self._rows = np.zeros(0, np.int64)  # arange(B), kept for the next depth and step
        self._keep = True  # host_top2 keeps the logits for the end of the step
        self._checked = False  # host_top2 took a depth: later ones are not checked again

    def reset(self) -> None:
        """Forget what was recorded (called before each engine step)."""
        self.steps = []
        self._depth_rows = self._grid = self.wanted = None

    #: Logits kept for the end of the engine step up to this many cells per depth (64 MiB
    #: of float32); larger ones are reduced at once.
    KEEP_CELLS = 1 << 24

    def host_top2(self, logits, idx) -> bool:
        """Record the top-1 and top-2 of CPU float32/float64 ``logits`` [B, V] given their
        argmax ``idx`` [B] (:func:`margin_of`'s numpy steps, with the subtraction left to
        :meth:`_depths`: one per engine step, not one per depth). Returns False, recording
        nothing, for other logits (not on the host, needing grad, other dtypes or shapes).

        The tensors are kept as they are and reduced when the step's margins are first read
        (:meth:`_resolve`, after ``sample_tokens`` returned): numpy run right after vLLM's
        torch ops costs about 2.7 times more (measured beside vLLM on this 2-core machine:
        557 against 207 us per 4-depth step). vLLM drops its reference to the logits after
        the argmax, so they are this tap's alone; a drafter whose logits reuse one buffer
        (the same address at a later depth: the earlier depth's values are gone) has that
        depth's margins unknown (NaN), and its later steps are reduced at once."""
        if not self._checked:  # once: a later depth that numpy cannot take fails in
            # _top2_of, and is then reduced by margin_of (the torch steps) instead
            if (
                logits.requires_grad
                or not logits.is_cpu
                or str(logits.dtype) not in _HOST_DTYPES
                or logits.dim() != 2
                or idx.dim() != 1
            ):
                return False
            self._checked = True
        if self._keep and logits.numel() <= self.KEEP_CELLS:
            self.steps.append(_Held(logits, idx))
            return True
        try:
            self.steps.append(self._top2_of(logits, idx))
        except (TypeError, RuntimeError):  # what numpy cannot take (see _top2_of)
            return False
        return True

    def _top2_of(self, logits, idx) -> tuple[np.ndarray, np.ndarray]:
        """:func:`_top2` on the tensors' memory.

        Raises:
            TypeError, RuntimeError: logits off the host, needing grad, of another dtype
                or shape (torch's ``numpy()`` raises the same for the first three).
        """
        a, i = logits.numpy(), idx.numpy()
        if a.ndim != 2 or a.dtype not in _HOST_NP_DTYPES or i.ndim != 1:
            raise TypeError(f"logits {a.dtype} {a.shape}, argmax {i.shape}")
        if len(self._rows) != len(i):
            self._rows = np.arange(len(i))
        return _top2(a, i, self._rows)

    def _resolve(self) -> None:
        """Reduce the logits :meth:`host_top2` kept (once per step). Two kept depths at one
        address are one buffer written twice: the earlier depths' values are gone (NaN)."""
        s = self.steps
        if not any(type(t) is _Held for t in s):
            return
        last = {t.logits.data_ptr(): j for j, t in enumerate(s) if type(t) is _Held}
        out = []
        for j, t in enumerate(s):
            if type(t) is not _Held:
                out.append(t)
            elif last[t.logits.data_ptr()] != j:  # overwritten by a later depth
                self._keep = False  # later steps: reduced at once
                lost = np.full(len(t.idx), np.nan, np.float32)
                out.append((lost, lost))
            else:
                out.append(self._held_top2(t))
        self.steps = out

    def _held_top2(self, t: _Held):
        try:
            return self._top2_of(t.logits, t.idx)
        except (TypeError, RuntimeError):  # a tensor numpy cannot view: the torch steps
            return margin_of(t.logits, t.idx)

    def uniform(self, b: int, k: int) -> np.ndarray | None:
        """``matrix(arange(b), [k] * b, k)`` when the step recorded exactly ``k`` depths of
        ``b`` rows each (the usual step: a [b, k] float32 view), else None."""
        self._depths()
        g = self._grid
        return g.T if g is not None and g.shape == (k, b) else None

    def uniform_later(self, b: int, k: int) -> Callable[[], np.ndarray] | None:
        """:meth:`uniform` as a function called later (on the writer thread: the engine
        thread then makes no numpy call for the margins after the draft steps), when the
        step recorded exactly ``k`` depths of ``b`` rows each on the host
        (:meth:`host_top2`); else None. The step's top-1/top-2 arrays are the tap's own
        copies, which :meth:`reset` does not touch."""
        self._resolve()
        s = self.steps
        if len(s) != k or not all(type(t) is tuple and len(t[0]) == b for t in s):
            return None
        return functools.partial(_host_grid, list(s))

    def _depths(self) -> list[np.ndarray]:
        """The recorded depths as float32 host arrays: one transfer per engine step when
        every depth has the same rows (the usual case)."""
        if self._depth_rows is None:
            import torch

            self._resolve()
            s = self.steps
            if s and all(type(t) is tuple for t in s) and len({len(t[0]) for t in s}) == 1:
                self._grid = _host_grid(s).T
                self._depth_rows = list(self._grid)
                return self._depth_rows
            if any(type(t) is tuple for t in s):
                with np.errstate(invalid="ignore"):
                    s = [t[0] - t[1] if type(t) is tuple else t for t in s]
            uniform = bool(s) and len({len(t) for t in s}) == 1
            if uniform and all(isinstance(t, np.ndarray) for t in s):  # the CPU path
                self._grid = np.stack(s).astype(np.float32, copy=False)
                self._depth_rows = list(self._grid)
            elif uniform and all(isinstance(t, torch.Tensor) for t in s):
                self._grid = torch.stack(s).to(torch.float32).cpu().numpy()
                self._depth_rows = list(self._grid)
            else:
                self._depth_rows = [np.asarray(t.cpu() if hasattr(t, "cpu") else t, np.float32)
                                    for t in s]  # fmt: skip
        return self._depth_rows

    def take(self, row: int, k: int) -> list[float] | None:
        """Row ``row``'s margins for its ``k`` drafts, or None when not recorded."""
        d = self._depths()
        if len(d) < k or any(row >= len(s) for s in d[:k]):
            return None
        return [float(s[row]) for s in d[:k]]

    def matrix(self, rows: np.ndarray, lens: np.ndarray, width: int) -> np.ndarray | None:
        """The margins of batch rows ``rows`` for their ``lens`` drafts, as what
        :meth:`take` gives row by row: ``[n, width]`` float32, NaN where not recorded (a row
        with more drafts than recorded depths, or beyond a depth's rows, is all NaN); None
        when no row has margins.

        Args:
            rows: int [n], batch rows; lens: int [n], drafts per row (``<= width``).
        """
        d = self._depths()
        if not d or not len(rows):
            return None
        rows, lens = np.asarray(rows, np.int64), np.asarray(lens, np.int64)
        depth = len(d)
        g = self._grid
        if g is not None and int(rows.max()) < g.shape[1]:
            if width == depth and (lens == depth).all():  # usual: k drafts, k depths
                return np.ascontiguousarray(g[:, rows].T)
        if g is not None:
            m = g  # [depth, B]
            inside = rows < m.shape[1]
            vals = m[:, np.where(inside, rows, 0)].T  # [n, depth]
        else:
            inside = np.ones(len(rows), bool)
            vals = np.full((len(rows), depth), np.nan, np.float32)
            for j, s in enumerate(d):
                ok = rows < len(s)
                vals[ok, j] = s[rows[ok]]
                # take(): a row needs all of its first k depths
                inside &= ok | (lens <= j)
        have = inside & (lens <= depth)
        if not have.any():
            return None
        out = np.full((len(rows), width), np.nan, np.float32)
        w = min(width, depth)
        cells = have[:, None] & (np.arange(w)[None, :] < lens[:, None])
        out[:, :w] = np.where(cells, vals[:, :w], np.nan)
        return out


def _host_grid(pairs: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """``[B, depth]`` float32 margins of :meth:`MarginTap.host_top2`'s per-depth
    ``(top1, top2)`` pairs (each ``[B]``), subtracted in their dtype (a view of a
    ``[depth, B]`` array)."""
    with np.errstate(invalid="ignore"):  # -inf - -inf: NaN, as in margin_of
        g = np.array([t[0] for t in pairs]) - np.array([t[1] for t in pairs])
    return g.astype(np.float32, copy=False).T


class _Held(NamedTuple):
    """A depth's logits and argmax kept by :meth:`MarginTap.host_top2`."""

    logits: Any
    idx: Any


def _wanted(device_type: str) -> bool:
    v = os.environ.get(ENV, "")
    if v == "cpu":
        return device_type == "cpu"
    return v not in ("", "0")


def _torch_margin(logits, idx):
    """top1 - top2 of 2-D ``logits`` given their argmax ``idx`` [B] (a tensor on their
    device); writes one cell per row in place and restores it."""
    at = idx[:, None]
    top1 = logits.gather(1, at)
    logits.scatter_(1, at, float("-inf"))
    top2 = logits.amax(dim=-1)
    logits.scatter_(1, at, top1)
    return top1[:, 0] - top2


_HOST_DTYPES = ("torch.float32", "torch.float64")
_HOST_NP_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def margin_of(logits, idx):
    """top1 - top2 per row of vLLM's draft ``logits`` [B, V] given their argmax ``idx``
    (``logits.argmax(dim=-1)``): float32/float64 numpy [B] for CPU logits (computed with numpy
    on the tensor's memory, see the module docstring), else a tensor on their device (the
    same steps in torch; other shapes: ``topk(2)``). Equal to ``topk(2)``'s difference bit
    for bit; ``logits`` is written in place (one cell per row) and restored."""
    if logits.dim() != 2 or logits.requires_grad:
        top = logits.topk(2, dim=-1).values
        return top[..., 0] - top[..., 1]
    if logits.device.type != "cpu" or str(logits.dtype) not in _HOST_DTYPES:
        return _torch_margin(logits, idx)
    a, i = logits.numpy(), idx.numpy()
    top1, top2 = _top2(a, i, np.arange(len(i)))
    with np.errstate(invalid="ignore"):  # -inf - -inf (no finite logit) is NaN, as in topk
        return top1 - top2


def _top2(a: np.ndarray, i: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(top1, top2)`` per row of host logits ``a`` [B, V] (float32/float64) given their
    argmax ``i`` [B] and ``r = arange(B)``: the argmax cell is masked to -inf for the row
    maximum, then restored (``a`` is vLLM's own memory: one cell per row written)."""
    top1 = a[r, i]
    a[r, i] = -np.inf
    top2 = a.max(axis=1)
    a[r, i] = top1
    return top1, top2


def install_margins(drafter) -> MarginTap | None:
    """Wrap ``drafter._greedy_sample`` to record margins; None when the drafter has no
    such method (n-gram) or :data:`ENV` is unset or ``0`` when vLLM builds the drafter (a
    capture's default: no wrapper, no cost)."""
    orig = getattr(drafter, "_greedy_sample", None)
    if orig is None or os.environ.get(ENV, "") in ("", "0"):
        return None
    tap = MarginTap()

    @functools.wraps(orig)
    def _greedy_sample(hidden_states):
        if tap.wanted is None:  # decided once per engine step (MarginTap.reset)
            plain = not getattr(drafter, "use_local_argmax_reduction", False) and not getattr(
                drafter, "use_heterogeneous_vocab", False
            )
            tap.wanted = plain and _wanted(hidden_states.device.type)
        if not tap.wanted:
            return orig(hidden_states)
        logits = drafter.model.compute_logits(hidden_states)
        idx = logits.argmax(dim=-1)  # vLLM's own draft (the plain path of _greedy_sample)
        if not tap.host_top2(logits, idx):
            tap.steps.append(margin_of(logits, idx))
        return idx

    drafter._greedy_sample = _greedy_sample
    return tap
