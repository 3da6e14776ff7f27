"""The DSpark hook (``spectrace.hooks.vllm.v2.dspark``) on a fake DSpark speculator: the inner
record agrees with what ``propose`` hands out, a disagreement is caught, layout errors name
what is missing, and ``attach_v2`` adds the tap."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from spectrace.engine import dspark  # noqa: E402
from spectrace.hooks.vllm.common import SpecTraceLayoutError  # noqa: E402
from spectrace.hooks.vllm.session import Session  # noqa: E402
from spectrace.hooks.vllm.v2.dspark import (  # noqa: E402
    DSparkTap,
    SpecTraceConsistencyError,
    dspark_layout,
)
from spectrace.tracer.store import open_trace  # noqa: E402

K = 4


class FakeDSparkSpeculator:
    """The attributes vLLM 0.32's DSparkSpeculator has; ``propose`` runs the Markov loop of a
    tiny drafter (greedy) into ``draft_tokens`` via ``_sample_sequential``."""

    def __init__(
        self, model, make_propose, k=K, sample_from_anchor=True, max_reqs=8, corrupt=False
    ):
        self.model = model
        # vLLM's propose signature, from the one copy in tests/hooks/conftest.py.
        self.propose = make_propose(self._propose)
        self.num_speculative_steps = k
        self.sample_from_anchor = sample_from_anchor
        self.num_query_per_req = k if sample_from_anchor else k + 1
        nq = self.num_query_per_req
        self.input_buffers = SimpleNamespace(
            input_ids=torch.zeros(max_reqs * nq, dtype=torch.int32)
        )
        self._anchor_idx = torch.arange(max_reqs) * nq
        self.sample_pos = torch.zeros(max_reqs * k, dtype=torch.int64)
        self.draft_tokens = torch.zeros((max_reqs, k), dtype=torch.int64)
        self.corrupt = corrupt
        self.g = torch.Generator().manual_seed(0)

    def _sample_sequential(self, num_reqs, head_hidden):
        anchors = self.input_buffers.input_ids[self._anchor_idx[:num_reqs]]
        base = torch.randn(
            num_reqs, self.num_speculative_steps, self.model.cfg.draft_vocab_size, generator=self.g
        )
        self.draft_tokens[:num_reqs] = dspark.sample_sequential(base, anchors, self.model)

    def _propose(
        self, input_batch, num_sampled, num_rejected, last_sampled, next_prefill_tokens, _k
    ):
        n, k = input_batch.num_reqs, self.num_speculative_steps
        for i in range(n):
            slot = int(input_batch.idx_mapping[i])
            anchor = last_sampled[slot, 0] if num_sampled[i] > 0 else next_prefill_tokens[0, slot]
            self.input_buffers.input_ids[self._anchor_idx[i]] = anchor
            q_end = int(input_batch.query_start_loc[i + 1])
            pos = int(input_batch.positions[q_end - 1 - int(num_rejected[i])]) + 1
            self.sample_pos[i * k : (i + 1) * k] = pos + 1 + torch.arange(k)
        self._sample_sequential(n, None)
        out = self.draft_tokens[:n]
        if self.corrupt:  # what propose hands out is not what the Markov loop wrote
            out = out.clone()
            out[:, -1] = 0
        return out


@pytest.fixture
def fake_dspark(make_propose, tiny_dspark):
    """``fake_dspark(cls=FakeDSparkSpeculator, **kw)`` -> a fake speculator around a tiny
    drafter, its ``propose`` built with vLLM's signature."""

    def make(cls=None, **kw):
        return (cls or FakeDSparkSpeculator)(tiny_dspark(), make_propose, **kw)

    return make


def drive(spec, session_path: Path, steps: int = 6, corrupt_at: int | None = None):
    from spectrace.hooks.vllm.v2.tap import ProposeTap

    session = Session(session_path, {"k": K, "source": "vllm-hook", "method": "dspark"})
    tap = ProposeTap(spec, session)
    dtap = DSparkTap(spec, tap, session, inner=True)
    params = SimpleNamespace(max_tokens=100, eos_token_id=None, stop_token_ids=None)
    rids = ["a-1", "b-2"]
    for i, r in enumerate(rids):
        tap.add_request(r, [1, 2, 3 + i], params)
    last = torch.zeros((8, 1), dtype=torch.int64)
    lens = {r: 3 for r in rids}
    for s in range(steps):
        order = rids if s % 2 else rids[::-1]
        positions, qsl = [], [0]
        for r in order:
            n_q = 3 if s == 0 else K + 1
            positions += list(
                range(lens[r] - (0 if s == 0 else 1), lens[r] - (0 if s == 0 else 1) + n_q)
            )
            qsl.append(len(positions))
        ns = [1 if s == 0 else 2] * 2
        nr = [0 if s == 0 else K - 1] * 2
        for r in order:
            lens[r] += ns[0]
            last[rids.index(r), 0] = 10 + s
        batch = SimpleNamespace(
            req_ids=order,
            num_reqs=2,
            idx_mapping=torch.tensor([rids.index(r) for r in order]),
            positions=torch.tensor(positions),
            query_start_loc=torch.tensor(qsl),
        )
        spec.propose(
            batch,
            {},
            {},
            None,
            None,
            torch.tensor(ns, dtype=torch.int32),
            torch.tensor(nr, dtype=torch.int32),
            last,
            torch.zeros((1, 8), dtype=torch.int32),
            None,
            None,
            num_speculative_tokens=K,
        )
    session.close()
    return dtap


@pytest.mark.parametrize("sfa", [True, False])
def test_dspark_tap_inner_record_agrees(tmp_path, sfa, fake_dspark):
    spec = fake_dspark(sample_from_anchor=sfa)
    dtap = drive(spec, tmp_path / "t.h5")
    assert dtap.summary() == {
        "status": "ok",
        "steps_checked": 6,
        "steps_mismatched": 0,
        "steps_unchecked": 0,
        "sync_waits": 0,
    }
    with open_trace(tmp_path / "t.h5") as t:
        assert t.meta["layout"]["sample_from_anchor"] is sfa
        assert t.meta["layout"]["query_slots_per_request"] == (K if sfa else K + 1)
        assert t.meta["dspark_inner_check"]["status"] == "ok"
        assert len(t.blocks) == 12


def test_dspark_tap_finds_a_disagreement(tmp_path, monkeypatch, fake_dspark):
    monkeypatch.setenv("SPECTRACE_STRICT", "1")
    spec = fake_dspark(corrupt=True)
    with pytest.raises(SpecTraceConsistencyError, match="drafts: mismatch at row 0"):
        drive(spec, tmp_path / "t.h5")


def test_dspark_layout_errors_name_vllm_and_what_is_missing(fake_dspark):
    spec = fake_dspark()
    del spec._anchor_idx
    with pytest.raises(
        SpecTraceLayoutError,
        match=r"^vLLM \S+: FakeDSparkSpeculator lacks _anchor_idx; known layout",
    ):
        dspark_layout(spec)
    spec = fake_dspark()
    spec.num_query_per_req = K + 2
    with pytest.raises(SpecTraceLayoutError, match="neither the N-slot nor the 1\\+N layout"):
        dspark_layout(spec)
    spec = fake_dspark()
    del spec.sample_from_anchor
    with pytest.raises(SpecTraceLayoutError, match="sample_from_anchor"):
        dspark_layout(spec)
    spec.draft_model_config = SimpleNamespace(hf_config=SimpleNamespace(dspark_bonus_anchor=True))
    spec.num_query_per_req = K + 1
    assert dspark_layout(spec)["sample_from_anchor"] is False


def test_attach_v2_adds_the_dspark_tap(tmp_path, monkeypatch, fake_dspark):
    from spectrace.hooks.vllm.v2 import dspark as vllm_dspark
    from spectrace.hooks.vllm.v2.attach import attach_v2

    class DSparkSpeculator(FakeDSparkSpeculator):
        pass

    runner = SimpleNamespace(
        speculator=fake_dspark(cls=DSparkSpeculator),
        add_requests=lambda *a: None,
        finish_requests=lambda *a: None,
        shutdown=lambda *a: None,
        model_config=SimpleNamespace(enforce_eager=True),
    )
    made = []
    orig = vllm_dspark.DSparkTap.__init__
    monkeypatch.setattr(
        vllm_dspark.DSparkTap,
        "__init__",
        lambda self, *a, **kw: made.append(kw) or orig(self, *a, **kw),
    )
    session = attach_v2(runner, tmp_path / "a.h5", {"k": K, "layout": {"runner": "v2"}})
    assert made == [{"inner": True}]
    assert session.meta["layout"] == {
        "runner": "v2",
        "sample_from_anchor": True,
        "query_slots_per_request": K,
        "speculator": "DSparkSpeculator",
    }
    session.close()
