"""The drafter's top-1 minus top-2 logit per draft slot, read beside vLLM's greedy draft step.

Wraps, on the V1 drafter instance (``vllm/v1/spec_decode/llm_base_proposer.py``
``SpecDecodeBaseProposer._greedy_sample``), the plain path ``compute_logits(hidden).argmax``:
the wrapper computes the same logits once, takes the same argmax and keeps
``top1 - top2`` per row. One call per draft depth, rows in the input batch's order; the
recorder takes them after ``sample_tokens`` (:meth:`MarginTap.take`).

Cost: on a CPU nothing but a top-2 over logits that exist anyway; on a GPU ``.tolist()`` is a
device-to-host copy and a sync per draft step, so it is off there unless
``SPECTRACE_MARGINS=1`` (``0`` turns it off everywhere). The local-argmax and
heterogeneous-vocabulary paths are left alone (no margins: NaN).
"""

from __future__ import annotations

import functools
import os

#: ``1`` records margins, ``0`` never; unset: only on a CPU device (no sync cost there).
ENV = "SPECTRACE_MARGINS"


class MarginTap:
    """Margins of the draft steps since the last :meth:`take`: a list of per-depth rows."""

    def __init__(self) -> None:
        self.steps: list[list[float]] = []

    def reset(self) -> None:
        """Forget what was recorded (called before each engine step)."""
        self.steps = []

    def take(self, row: int, k: int) -> list[float] | None:
        """Row ``row``'s margins for its ``k`` drafts, or None when not recorded."""
        if len(self.steps) < k or any(row >= len(s) for s in self.steps[:k]):
            return None
        return [float(s[row]) for s in self.steps[:k]]


def _wanted(device_type: str) -> bool:
    v = os.environ.get(ENV)
    if v is not None:
        return v not in ("", "0")
    return device_type == "cpu"


def install_margins(drafter) -> MarginTap | None:
    """Wrap ``drafter._greedy_sample`` to record margins; None when the drafter has no
    such method (n-gram) or margins are off by :data:`ENV`."""
    orig = getattr(drafter, "_greedy_sample", None)
    if orig is None or os.environ.get(ENV) == "0":
        return None
    tap = MarginTap()

    @functools.wraps(orig)
    def _greedy_sample(hidden_states):
        plain = not getattr(drafter, "use_local_argmax_reduction", False) and not getattr(
            drafter, "use_heterogeneous_vocab", False
        )
        if not plain or not _wanted(hidden_states.device.type):
            return orig(hidden_states)
        import torch

        logits = drafter.model.compute_logits(hidden_states)
        top = torch.topk(logits, 2, dim=-1).values
        tap.steps.append((top[:, 0] - top[:, 1]).tolist())
        return logits.argmax(dim=-1)

    drafter._greedy_sample = _greedy_sample
    return tap
