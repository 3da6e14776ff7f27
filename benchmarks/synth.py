"""Synthetic trace pairs of any size for the TUI benchmark (vectorised, deterministic).

Shape of a real serving run: requests run in waves of ``concurrency`` (the engine's batch),
each request drafts one block per engine step, so a request's blocks are interleaved with its
wave's other requests. Both engines use the same drafter quality function ``q(position)`` (the
number of leading correct drafts at an anchor position), so on identical content they draft
from the same positions and propose the same ids; then differences are seeded:

* in every ``bug_every``-th request "theirs" proposes a wrong id in slot ``bug_slot`` from
  anchor position ``bug_from`` on (a draft mismatch: acceptance and positions then differ);
* in every ``diverge_every``-th request "theirs" emits a different token at output index
  ``diverge_at`` (content divergence: later blocks are not comparable).

Usage: ``python benchmarks/synth.py OUT_DIR --requests 10000 --blocks 1000``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from spectrace.tracer.store import TraceWriter

VOCAB = 32000
PROMPT = 16


def _truth(r: np.ndarray, n: int) -> np.ndarray:
    """The reference text of requests ``r``: [len(r), n] ids, a hash of (request, index)."""
    i = np.arange(n, dtype=np.int64)
    return ((r[:, None] * 1_000_003 + i[None, :] * 7919 + 12345) * 2654435761 % VOCAB).astype(
        np.int32
    )


def _quality(pos: np.ndarray, r: np.ndarray, k: int) -> np.ndarray:
    """Correct leading drafts at anchor position ``pos`` of request ``r`` (0..k)."""
    h = (pos.astype(np.int64) * 40503 + r.astype(np.int64) * 9973) % 997
    return np.minimum(h % (k + 2), k).astype(np.int64)


def write_side(
    path: Path,
    side: str,
    requests: int,
    blocks: int,
    k: int,
    concurrency: int,
    bug_every: int,
    bug_slot: int,
    bug_from: int,
    diverge_every: int,
    diverge_at: int,
) -> int:
    """Write one engine's trace; returns the number of blocks written."""
    r = np.arange(requests, dtype=np.int64)
    # Sequential in steps, vectorised over requests.
    pos = np.full(requests, PROMPT - 1, np.int64)
    maxlen = PROMPT + blocks * (k + 1) + 2
    truth = _truth(r, maxlen)
    truth[:, 0], truth[:, 1] = r % VOCAB, r // VOCAB  # unique prompts (the hash collides)
    if side == "theirs" and diverge_every:
        d = r[r % diverge_every == diverge_every - 1]
        truth[d, PROMPT + diverge_at] = (truth[d, PROMPT + diverge_at] + 1) % VOCAB
    P = np.zeros((blocks, requests), np.int32)
    A = np.zeros((blocks, requests), np.int16)
    PR = np.zeros((blocks, requests, k), np.int32)
    slots = np.arange(k)
    for s in range(blocks):
        q = _quality(pos, r, k)
        tgt = truth[r[:, None], pos[:, None] + 1 + slots[None, :]]
        wrong = (tgt + 1 + slots[None, :]) % VOCAB
        prop = np.where(slots[None, :] < q[:, None], tgt, wrong)
        if side == "theirs" and bug_every:
            bug = (r % bug_every == 0) & (pos >= bug_from)
            prop[bug, bug_slot] = (tgt[bug, bug_slot] + 77) % VOCAB
        ok = prop == tgt
        acc = np.cumprod(ok, axis=1).sum(axis=1)
        P[s], A[s], PR[s] = pos, acc, prop
        pos = pos + acc + 1
    out_len = pos - (PROMPT - 1)  # tokens emitted after the prompt (last bonus included)
    meta = {
        "engine": f"synthetic-{side}",
        "engine_version": "0",
        "method": "draft_model",
        "k": k,
        "source": "reference",
        "sampling": {"temperature": 0.0},
        "layout": {"sample_from_anchor": True},
        "target_model": "synthetic-target",
        "draft_model": "synthetic-draft",
    }
    with TraceWriter(path, meta, flush_interval=0) as w:
        for i in range(requests):
            w.request(
                f"{side}-{i}",
                prompt_ids=truth[i, :PROMPT],
                output_ids=truth[i, PROMPT : PROMPT + out_len[i]],
                finish_reason="length",
            )
        waves = [(w0, min(w0 + concurrency, requests)) for w0 in range(0, requests, concurrency)]
        step0 = 0
        for w0, w1 in waves:
            n = w1 - w0
            rows = blocks * n
            req = np.tile(np.arange(w0, w1, dtype=np.int32), blocks)
            steps = np.repeat(np.arange(step0, step0 + blocks, dtype=np.int32), n)
            pos_w = P[:, w0:w1].reshape(rows)
            acc_w = A[:, w0:w1].reshape(rows)
            prop_w = PR[:, w0:w1].reshape(rows, k)
            anchor = truth[req.astype(np.int64), pos_w.astype(np.int64)]
            emit = np.full((rows, k + 1), -1, np.int32)
            tix = pos_w[:, None].astype(np.int64) + 1 + np.arange(k + 1)[None, :]
            tv = truth[req[:, None].astype(np.int64), tix]
            emit = np.where(np.arange(k + 1)[None, :] <= acc_w[:, None], tv, -1).astype(np.int32)
            w.add_blocks(
                {
                    "request": req,
                    "step": steps,
                    "position": pos_w.astype(np.int32),
                    "anchor": anchor,
                    "k": np.full(rows, k, np.int16),
                    "proposed": prop_w,
                    "num_verified": np.full(rows, k, np.int16),
                    "verified": prop_w,
                    "accepted": acc_w,
                    "num_emitted": (acc_w + 1).astype(np.int16),
                    "emitted": emit,
                    "t_ns": (steps.astype(np.int64) * 1_000_000),
                }
            )
            step0 += blocks
        for s in range(0, min(step0, 200)):
            w.add_phase(s, "draft", 1.0 + (s % 7) * 0.1)
            w.add_phase(s, "verify", 3.0 + (s % 5) * 0.2)
    return requests * blocks


def make_pair(
    out: Path,
    requests: int = 100,
    blocks: int = 100,
    k: int = 4,
    concurrency: int = 64,
    bug_every: int = 7,
    bug_slot: int = 2,
    bug_from: int = 200,
    diverge_every: int = 5,
    diverge_at: int = 150,
) -> tuple[Path, Path]:
    """Write ``out/ours.h5`` and ``out/theirs.h5``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    kw = dict(
        requests=requests,
        blocks=blocks,
        k=k,
        concurrency=concurrency,
        bug_every=bug_every,
        bug_slot=bug_slot,
        bug_from=bug_from,
        diverge_every=diverge_every,
        diverge_at=diverge_at,
    )
    a, b = out / "ours.h5", out / "theirs.h5"
    write_side(a, "ours", **kw)
    write_side(b, "theirs", **kw)
    return a, b


def main() -> None:
    """Command line: write a pair."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--requests", type=int, default=10000)
    ap.add_argument("--blocks", type=int, default=1000)
    ap.add_argument("--k", type=int, default=4)
    a = ap.parse_args()
    t0 = time.perf_counter()
    make_pair(a.out, a.requests, a.blocks, a.k)
    print(
        f"wrote {a.out}/ours.h5 and theirs.h5: {a.requests * a.blocks} blocks each "
        f"in {time.perf_counter() - t0:.1f} s"
    )


if __name__ == "__main__":
    main()
