"""The V1 recorder's step-at-a-time join (hooks/vllm/v1_join.py, columns.py) on a fake
runner with vLLM 0.32's attribute layout (no vLLM needed)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from spectrace.hooks.vllm.columns import ColumnWriter, concat_columns
from spectrace.hooks.vllm.v1 import V1Recorder
from spectrace.tracer.store import open_trace


class Runner:
    """Two requests, k=2; every step each row accepts its first draft and emits a bonus
    ``100 + step``; the drafter then proposes ``[10 * step + 1, 10 * step + 2]``."""

    def __init__(self) -> None:
        self.req_ids = ["a", "b"]
        self.requests = {
            r: SimpleNamespace(
                prompt_token_ids=[1, 2, 3], sampling_params=None, output_token_ids=[]
            )
            for r in self.req_ids
        }
        self.input_batch = SimpleNamespace(
            req_ids=self.req_ids,
            token_ids_cpu=np.zeros((2, 64), dtype=np.int64),
            num_tokens_no_spec=np.full(2, 3, dtype=np.int64),
        )
        self.execute_model_state = SimpleNamespace(spec_decode_metadata=None)
        self._draft_token_ids = None
        self.step = 0

    def sample_tokens(self):
        b, d = self.input_batch, self._draft_token_ids
        sampled = []
        for i in range(2):
            emit = ([int(d[i, 0])] if d is not None else []) + [100 + self.step]
            n = int(b.num_tokens_no_spec[i])
            b.token_ids_cpu[i, n : n + len(emit)] = emit
            b.num_tokens_no_spec[i] = n + len(emit)
            sampled.append(emit)
        self.step += 1
        s = self.step
        self._draft_token_ids = np.array([[10 * s + 1, 10 * s + 2]] * 2, dtype=np.int64)
        md = SimpleNamespace(num_draft_tokens=[2, 2], draft_token_ids=self._draft_token_ids.ravel())
        self.execute_model_state = SimpleNamespace(spec_decode_metadata=md)
        return SimpleNamespace(req_ids=list(b.req_ids), sampled_token_ids=sampled)

    def shutdown(self) -> None:
        pass


def test_step_join_mixed_with_row_drops(tmp_path, monkeypatch):
    """Every step handed to the writer thread (FLUSH_S = 0) while a finished request's open
    proposal is written row-wise in between: one write order, nothing lost."""
    monkeypatch.setattr(ColumnWriter, "FLUSH_S", 0.0)
    r = Runner()
    rec = V1Recorder(r, tmp_path / "t.h5", {"k": 2})
    for _ in range(3):
        r.sample_tokens()
    rec.session.finish_request("a", [100, 11, 101], "length")  # its step-3 proposal: dropped
    r.sample_tokens()
    rec.session.close()
    t = open_trace(tmp_path / "t.h5")
    b = t.blocks
    req = [t.requests.req_id[i] for i in b.request]
    # Recorder steps 0-3. a: verified at 1, 2 (proposed at 0, 1), its step-2 proposal
    # dropped by finish_request (row-wise, written before step 3's columns), its step-3 one
    # at close; b: verified at 1, 2, 3, its step-3 proposal open at close.
    assert req == ["a", "b", "a", "b", "a", "b", "a", "b"]
    assert b.step.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert b.proposed.tolist() == [[11, 12]] * 2 + [[21, 22]] * 2 + [[31, 32]] * 2 + [[41, 42]] * 2
    assert b.num_verified.tolist() == [2, 2, 2, 2, -1, 2, -1, -1]
    assert b.accepted.tolist() == [1, 1, 1, 1, -1, 1, -1, -1]
    assert (b.emitted[:, 2:] == -1).all()  # stored k+1 wide, -1 padded
    assert b.emitted[:, :2].tolist() == [
        [11, 101], [11, 101], [21, 102], [21, 102], [-1, -1], [31, 103], [-1, -1], [-1, -1]
    ]  # fmt: skip
    # anchor: the last token emitted by the proposing step, at index num_tokens - 1
    assert b.anchor.tolist() == [100, 100, 101, 101, 102, 102, 103, 103]
    assert b.position.tolist() == [3, 3, 5, 5, 7, 7, 9, 9]
    assert b.batch_row.tolist() == [0, 1] * 4
    assert b.batch_size.tolist() == [2] * 8


def test_concat_columns_fills_a_column_only_some_parts_carry():
    a = {
        "request": np.array([0]),
        "proposed": np.array([[1, 2]]),
        "target_margin": np.array([0.5], np.float32),
    }
    b = {"request": np.array([1, 2]), "proposed": np.array([[3, 4, 5], [6, 7, 8]])}
    out = concat_columns([a, b])
    assert out["request"].tolist() == [0, 1, 2]
    assert out["proposed"].tolist() == [[1, 2, -1], [3, 4, 5], [6, 7, 8]]
    assert out["target_margin"][0] == np.float32(0.5)
    assert np.isnan(out["target_margin"][1:]).all()
