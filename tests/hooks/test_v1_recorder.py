"""The V1 recorder's step-at-a-time join (hooks/vllm/v1_join.py, columns.py) on a fake
runner with vLLM 0.32's attribute layout (no vLLM needed)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from spectrace.hooks.vllm.columns import ColumnWriter, concat_columns
from spectrace.hooks.vllm.v1 import V1Recorder
from spectrace.tracer.store import open_trace


def _emit(batch, i: int, emit: list[int]) -> list[int]:
    """Append ``emit`` to row ``i``'s tokens (what vLLM's runner does after sampling)."""
    n = int(batch.num_tokens_no_spec[i])
    batch.token_ids_cpu[i, n : n + len(emit)] = emit
    batch.num_tokens_no_spec[i] = n + len(emit)
    return emit


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
            sampled.append(_emit(b, i, emit))
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


class VaryingRunner(Runner):
    """Row i of call c accepts ``ACC[c][i]`` of the drafts it verifies (emitted widths 1..3
    differ between steps); after call 1 row 1 is handed back ``[99, 98]`` to verify instead
    of its proposal. Step s proposes ``[10s+1, 10s+2]`` and ``[10s+3, 10s+4]``."""

    ACC = {1: [2, 0], 2: [0, 1], 3: [1, 2]}

    def sample_tokens(self):
        b, md = self.input_batch, self.execute_model_state.spec_decode_metadata
        ver = None if md is None else np.asarray(md.draft_token_ids).reshape(2, 2)
        sampled = []
        for i in range(2):
            acc = self.ACC[self.step][i] if ver is not None else 0
            emit = (ver[i, :acc].tolist() if ver is not None else []) + [100 + self.step]
            sampled.append(_emit(b, i, emit))
        self.step += 1
        s = self.step
        self._draft_token_ids = np.array([[10 * s + 1, 10 * s + 2], [10 * s + 3, 10 * s + 4]])
        flat = self._draft_token_ids.copy()
        if s == 2:
            flat[1] = [99, 98]
        md = SimpleNamespace(num_draft_tokens=[2, 2], draft_token_ids=flat.ravel())
        self.execute_model_state = SimpleNamespace(spec_decode_metadata=md)
        return SimpleNamespace(req_ids=list(b.req_ids), sampled_token_ids=sampled)


def _batch_sizes(monkeypatch) -> list[int]:
    """Steps per same-batch ``ClosedStep.batch`` call, appended as they are made (the
    columns made at close: FLUSH_S is an hour)."""
    from spectrace.hooks.vllm.v1_join import ClosedStep

    monkeypatch.setattr(ColumnWriter, "FLUSH_S", 3600.0)
    sizes: list[int] = []
    batch = ClosedStep.batch
    monkeypatch.setattr(ClosedStep, "batch", lambda steps: sizes.append(len(steps)) or batch(steps))
    return sizes


def test_steps_handed_over_together_equal_the_hand_derived_blocks(tmp_path, monkeypatch):
    """Three same-batch steps closed on the fast path are made into columns in one batch
    (at close: FLUSH_S is an hour) with emitted widths that differ per step; the values are
    the per-block ones derived by hand, the not-a-prefix verification is counted."""
    sizes = _batch_sizes(monkeypatch)
    r = VaryingRunner()
    rec = V1Recorder(r, tmp_path / "t.h5", {"k": 2})
    for _ in range(4):
        r.sample_tokens()
    rec.session.close()
    assert sizes == [3]
    t = open_trace(tmp_path / "t.h5")
    b = t.blocks
    assert [t.requests.req_id[i] for i in b.request] == ["a", "b"] * 4
    assert b.step.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert b.proposed.tolist() == [[11, 12], [13, 14], [21, 22], [23, 24], [31, 32], [33, 34],
                                   [41, 42], [43, 44]]  # fmt: skip
    assert b.verified.tolist() == [[11, 12], [13, 14], [21, 22], [99, 98], [31, 32], [33, 34],
                                   [-1, -1], [-1, -1]]  # fmt: skip
    assert b.num_verified.tolist() == [2, 2, 2, 2, 2, 2, -1, -1]
    assert b.accepted.tolist() == [2, 0, 0, 1, 1, 2, -1, -1]
    assert b.num_emitted.tolist() == [3, 1, 1, 2, 2, 3, -1, -1]
    assert b.emitted.tolist() == [
        [11, 12, 101], [101, -1, -1], [102, -1, -1], [99, 102, -1], [31, 103, -1],
        [33, 34, 103], [-1, -1, -1], [-1, -1, -1],
    ]  # fmt: skip
    assert b.position.tolist() == [3, 3, 6, 4, 7, 6, 9, 9]
    assert b.anchor.tolist() == [100, 100, 101, 101, 102, 102, 103, 103]
    assert b.batch_row.tolist() == [0, 1] * 4
    assert t.meta["verified_not_prefix_of_proposed"] == 1


def test_a_block_open_outside_the_batch_keeps_the_same_batch_path(tmp_path, monkeypatch):
    """A block of request ``z``, not in the batch (preempted, or finished while vLLM's
    removal call is still to come), stays open beside the same-batch steps: they still
    close whole (one batch of 3 steps at close), and every block, z's too, is the one
    derived by hand (the same steps without z: test_step_join_mixed_with_row_drops)."""
    sizes = _batch_sizes(monkeypatch)
    r = Runner()
    rec = V1Recorder(r, tmp_path / "t.h5", {"k": 2})
    rec.joiner.propose("z", 0, 5, 9, [7, 8])
    for _ in range(4):
        r.sample_tokens()
    rec.session.close()
    assert sizes == [3]
    t = open_trace(tmp_path / "t.h5")
    b = t.blocks
    # steps 0-2 closed by steps 1-3; a's and b's step-3 proposals and z's open at close
    assert [t.requests.req_id[i] for i in b.request] == ["a", "b"] * 4 + ["z"]
    assert b.step.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 0]
    assert b.proposed.tolist() == [[11, 12]] * 2 + [[21, 22]] * 2 + [[31, 32]] * 2 + [
        [41, 42]
    ] * 2 + [[7, 8]]
    assert b.num_verified.tolist() == [2] * 6 + [-1] * 3
    assert b.accepted.tolist() == [1] * 6 + [-1] * 3
    assert (
        b.emitted[:, :2].tolist()
        == [[11, 101]] * 2 + [[21, 102]] * 2 + [[31, 103]] * 2 + [[-1, -1]] * 3
    )
    assert b.anchor.tolist() == [100, 100, 101, 101, 102, 102, 103, 103, 9]
    assert b.position.tolist() == [3, 3, 5, 5, 7, 7, 9, 9, 5]
    assert b.batch_row.tolist() == [0, 1] * 4 + [-1]
    assert b.batch_size.tolist() == [2] * 8 + [-1]


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


# -- margins: the fused top-2, the per-step matrix, and the recorder's path through them ----


def test_torch_margin_equals_topk_and_restores_the_logits():
    """The torch path of ``margin_of`` (GPU logits, dtypes numpy lacks)."""
    import torch

    from spectrace.hooks.vllm.margins import _torch_margin

    def top2_margin(x):
        idx = x.argmax(dim=-1)
        return idx, _torch_margin(x, idx)

    inf = float("inf")
    logits = torch.tensor(
        [
            [1.0, 5.0, 3.0, 4.5],  # argmax 1, margin 0.5
            [4.0, 4.0, 0.0, 1.0],  # tie: argmax 0 (first), margin 0
            [-inf, -inf, -inf, -inf],  # no finite logit: -inf - -inf = NaN (as topk)
            [inf, 1.0, 2.0, 0.0],  # argmax 0, margin inf
        ]
    )
    before = logits.clone()
    idx, margin = top2_margin(logits)
    assert idx.tolist() == [1, 0, 0, 0]
    assert margin[[0, 1, 3]].tolist() == [0.5, 0.0, inf] and torch.isnan(margin[2])
    assert torch.equal(logits, before)
    x = torch.randn(64, 2048, generator=torch.Generator().manual_seed(0))
    top = torch.topk(x, 2, dim=-1).values
    idx, margin = top2_margin(x)
    assert torch.equal(idx, x.argmax(dim=-1)) and torch.equal(margin, top[:, 0] - top[:, 1])


def test_margin_of_cpu_logits_equals_topk_as_numpy_and_restores_them():
    import torch

    from spectrace.hooks.vllm.margins import margin_of

    inf = float("inf")
    logits = torch.tensor(
        [
            [1.0, 5.0, 3.0, 4.5],  # argmax 1, margin 0.5
            [4.0, 4.0, 0.0, 1.0],  # tie: margin 0
            [-inf, -inf, -inf, -inf],  # NaN, as topk
            [inf, 1.0, 2.0, 0.0],  # inf
        ]
    )
    before = logits.clone()
    m = margin_of(logits, logits.argmax(dim=-1))
    assert isinstance(m, np.ndarray) and m.dtype == np.float32
    assert m[[0, 1, 3]].tolist() == [0.5, 0.0, inf] and np.isnan(m[2])
    assert torch.equal(logits, before)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):  # bfloat16: the torch path
        x = torch.randn(64, 2048, generator=torch.Generator().manual_seed(1)).to(dtype)
        top = torch.topk(x, 2, dim=-1).values
        m = margin_of(x, x.argmax(dim=-1))
        want = (top[:, 0] - top[:, 1]).float().numpy()
        assert np.array_equal(np.asarray(torch.as_tensor(m).float()), want)


def test_margin_matrix_equals_take_row_by_row():
    import torch

    from spectrace.hooks.vllm.margins import MarginTap

    tap = MarginTap()
    tap.steps = [torch.tensor([0.5, 1.5, 2.5, 3.5]), torch.tensor([10.0, 11.0, 12.0, 13.0])]
    rows, lens = np.array([0, 2, 3]), np.array([2, 1, 2])
    nan = np.nan
    want = np.array([[0.5, 10.0, nan], [2.5, nan, nan], [3.5, 13.0, nan]], np.float32)
    assert np.array_equal(tap.matrix(rows, lens, 3), want, equal_nan=True)
    assert np.array_equal(tap.matrix(rows, lens, 2), want[:, :2], equal_nan=True)
    assert tap.take(2, 1) == [2.5] and tap.take(0, 3) is None
    # depths of different rows (the second depth ran on 2 rows): rows beyond it have none
    tap.reset()
    tap.steps = [torch.tensor([0.5, 1.5, 2.5]), torch.tensor([10.0, 11.0])]
    got = tap.matrix(np.array([0, 2]), np.array([2, 1]), 2)
    assert np.array_equal(got, np.array([[0.5, 10.0], [2.5, nan]], np.float32), equal_nan=True)
    assert tap.matrix(np.array([2]), np.array([2]), 2) is None  # needs depth 2 of row 2
    assert tap.matrix(np.array([0]), np.array([3]), 3) is None  # 3 drafts, 2 depths


def test_ragged_pads_with_minus_one():
    from spectrace.hooks.vllm.v1_join import ragged

    m, n = ragged([[1, 2], [3], []])
    assert m.tolist() == [[1, 2], [3, -1], [-1, -1]] and n.tolist() == [2, 1, 0]
    m, n = ragged([[1], [2]])
    assert m.tolist() == [[1], [2]] and n.tolist() == [1, 1]
    m, n = ragged([[], []])
    assert m.shape == (2, 0) and n.tolist() == [0, 0]


class MarginRunner(Runner):
    """:class:`Runner` with a drafter whose ``_greedy_sample`` the recorder wraps; every step
    runs it k=2 times on logits whose top-1 minus top-2 is ``step + depth / 4`` in row 0 and
    ``0`` (a tie) in row 1, and proposes its argmaxes."""

    def __init__(self) -> None:
        super().__init__()
        import torch

        self.drafter = SimpleNamespace(
            model=SimpleNamespace(compute_logits=lambda h: h.clone()),
            _greedy_sample=lambda h: h.argmax(dim=-1),
        )
        self._torch = torch

    def sample_tokens(self):
        out = super().sample_tokens()
        ids = []
        for depth in range(2):
            gap = self.step + depth / 4
            h = self._torch.tensor([[0.0, 5.0 + gap, 5.0], [7.0, 1.0, 7.0]])
            ids.append(self.drafter._greedy_sample(h))  # row 0 -> 1, row 1 -> 0 (first max)
        self._draft_token_ids = self._torch.stack(ids, dim=1) + 10 * self.step
        md = SimpleNamespace(num_draft_tokens=[2, 2], draft_token_ids=self._draft_token_ids.ravel())
        self.execute_model_state = SimpleNamespace(spec_decode_metadata=md)
        return out


@pytest.mark.parametrize("env", ["1", "cpu"])  # cpu: the fake drafter's logits are on one
def test_recorder_writes_the_drafter_margins(tmp_path, monkeypatch, env):
    monkeypatch.setenv("SPECTRACE_MARGINS", env)
    r = MarginRunner()
    rec = V1Recorder(r, tmp_path / "t.h5", {"k": 2})
    for _ in range(3):
        r.sample_tokens()
    rec.session.close()
    b = open_trace(tmp_path / "t.h5").blocks
    # proposals of steps 1-3 (the runner's step counter after each call), two rows each
    assert b.proposed.tolist() == [[11, 11], [10, 10], [21, 21], [20, 20], [31, 31], [30, 30]]
    assert b.draft_margin.tolist() == [[1.0, 1.25], [0.0, 0.0], [2.0, 2.25], [0.0, 0.0],
                                       [3.0, 3.25], [0.0, 0.0]]  # fmt: skip
    assert b.num_verified.tolist() == [2, 2, 2, 2, -1, -1]  # the last step's: unverified


@pytest.mark.parametrize("env", [None, "0"])
def test_twin_a_default_capture_records_no_margins(tmp_path, monkeypatch, env):
    # margins cost a capture about 1.6% of a warm generate on a CPU: only when asked
    if env is None:
        monkeypatch.delenv("SPECTRACE_MARGINS", raising=False)
    else:
        monkeypatch.setenv("SPECTRACE_MARGINS", env)
    r = MarginRunner()
    rec = V1Recorder(r, tmp_path / "t.h5", {"k": 2})
    assert rec.margins is None  # no wrapper: vLLM's own _greedy_sample runs
    for _ in range(3):
        r.sample_tokens()
    rec.session.close()
    b = open_trace(tmp_path / "t.h5").blocks
    assert b.proposed.tolist() == [[11, 11], [10, 10], [21, 21], [20, 20], [31, 31], [30, 30]]
    assert np.isnan(b.draft_margin).all() and b.draft_margin.shape == (6, 2)


class ListRunner(Runner):
    """:class:`Runner` proposing lists as n-gram does: row 0 one id (accepted at the next
    step), row 1 nothing (it emits the bonus only)."""

    def sample_tokens(self):
        b, d = self.input_batch, self._draft_token_ids
        sampled = []
        for i in range(2):
            emit = (list(d[i]) if d is not None else []) + [100 + self.step]
            sampled.append(_emit(b, i, emit))
        self.step += 1
        self._draft_token_ids = [[10 * self.step + 1], []]
        md = SimpleNamespace(
            num_draft_tokens=[1, 0], draft_token_ids=np.array([10 * self.step + 1])
        )
        self.execute_model_state = SimpleNamespace(spec_decode_metadata=md)
        return SimpleNamespace(req_ids=list(b.req_ids), sampled_token_ids=sampled)


def test_recorder_list_proposals_skip_empty_rows(tmp_path):
    r = ListRunner()
    rec = V1Recorder(r, tmp_path / "t.h5", {"k": 2})
    for _ in range(3):
        r.sample_tokens()
    rec.session.close()
    t = open_trace(tmp_path / "t.h5")
    b = t.blocks
    assert [t.requests.req_id[i] for i in b.request] == ["a", "a", "a"]
    assert b.proposed[:, 0].tolist() == [11, 21, 31] and b.k.tolist() == [1, 1, 1]
    assert b.num_verified.tolist() == [1, 1, -1] and b.verified[:, 0].tolist() == [11, 21, -1]
    assert b.accepted.tolist() == [1, 1, -1]  # the draft, then the bonus
    assert b.emitted[:, :2].tolist() == [[11, 101], [21, 102], [-1, -1]]


# -- the scheduler's counting ---------------------------------------------------------------


def test_counting_reads_keywords_and_positional_arguments_alike():
    from spectrace.hooks.vllm.engine_core import patch_scheduler

    class Scheduler:  # vLLM 0.32's signature (vllm/v1/core/sched/scheduler.py)
        def make_spec_decoding_stats(
            self,
            spec_decoding_stats,
            num_draft_tokens,
            num_accepted_tokens,
            num_invalid_spec_tokens,
            request_id,
        ):
            return None

    module = SimpleNamespace(Scheduler=Scheduler)
    patch_scheduler(module)
    seen = []
    s = Scheduler.__new__(Scheduler)
    s._spectrace_counters = SimpleNamespace(observe=lambda d, a: seen.append((d, a)))
    s.make_spec_decoding_stats(
        None, num_draft_tokens=4, num_accepted_tokens=2, num_invalid_spec_tokens={"r": 1},
        request_id="r",
    )  # fmt: skip
    s.make_spec_decoding_stats(None, 4, 3, None, "q")
    s.make_spec_decoding_stats(None, 0, 0, num_invalid_spec_tokens=None, request_id="z")
    assert seen == [(3, 2), (4, 3)]  # 4 drafts - 1 invalid; zero drafts: not counted


class PrefillRunner(Runner):
    """:class:`Runner` whose row 1 emits nothing at call 1 (a prefill chunk: its tokens
    unchanged), so that step's blocks take the general path; every other step is the
    usual one (every row emitted, [2, 2] proposals)."""

    def sample_tokens(self):
        if self.step != 1:
            return super().sample_tokens()
        b, d = self.input_batch, self._draft_token_ids
        sampled = [_emit(b, 0, [int(d[0, 0]), 101]), []]
        self.step = s = 2
        self._draft_token_ids = np.array([[10 * s + 1, 10 * s + 2]] * 2, dtype=np.int64)
        md = SimpleNamespace(num_draft_tokens=[2, 2], draft_token_ids=self._draft_token_ids.ravel())
        self.execute_model_state = SimpleNamespace(spec_decode_metadata=md)
        return SimpleNamespace(req_ids=list(b.req_ids), sampled_token_ids=sampled)


def test_a_row_without_a_token_takes_the_general_path_with_the_same_rules(tmp_path, monkeypatch):
    """The usual step opens its blocks on the short path (``_open_all``); a step where a row
    emitted nothing falls back to the general one: that row's block is written unverified
    and it opens none. Values derived by hand from the runner's rules."""
    fast = []
    orig = V1Recorder._open_all
    monkeypatch.setattr(V1Recorder, "_open_all", lambda self, *a: fast.append(orig(self, *a))
                        or fast[-1])  # fmt: skip
    r = PrefillRunner()
    rec = V1Recorder(r, tmp_path / "t.h5", {"k": 2})
    for _ in range(3):
        r.sample_tokens()
    rec.session.close()
    assert fast == [True, False, True]
    t = open_trace(tmp_path / "t.h5")
    b = t.blocks
    assert [t.requests.req_id[i] for i in b.request] == ["a", "b", "a", "a", "b"]
    assert b.step.tolist() == [0, 0, 1, 2, 2]
    assert b.proposed.tolist() == [[11, 12], [11, 12], [21, 22], [31, 32], [31, 32]]
    assert b.num_verified.tolist() == [2, -1, 2, -1, -1]
    assert b.accepted.tolist() == [1, -1, 1, -1, -1]
    assert b.emitted[:, :2].tolist() == [[11, 101], [-1, -1], [21, 102], [-1, -1], [-1, -1]]
    # row 1: 100 at 3 (call 0), nothing at call 1, 21 and 102 at 4 and 5 (call 2)
    assert b.anchor.tolist() == [100, 100, 101, 102, 102]
    assert b.position.tolist() == [3, 3, 5, 7, 5]
    assert b.batch_row.tolist() == [0, 1, 0, 0, 1]


def test_host_top2_margins_equal_margin_of_once_subtracted_per_step():
    """The recorder's CPU path keeps (top-1, top-2) per depth and subtracts once per step:
    the same float32 values as :func:`margin_of` per depth (ties 0, no finite logit NaN);
    logits numpy cannot take (bfloat16, needing grad) are refused, recording nothing."""
    import torch

    from spectrace.hooks.vllm.margins import MarginTap

    inf = float("inf")
    edge = torch.tensor([[1.0, 5.0, 3.0, 4.5], [4.0, 4.0, 0.0, 1.0], [-inf] * 4,
                         [inf, 1.0, 2.0, 0.0]])  # fmt: skip
    for dtype in (torch.float32, torch.float64):
        tap = MarginTap()
        x = edge.to(dtype)
        before = x.clone()
        assert tap.host_top2(x, x.argmax(dim=-1))
        assert torch.equal(x, before)  # restored
        y = torch.tensor([[0.0, 2.0, 1.75, 0.0]] * 4, dtype=dtype)
        assert tap.host_top2(y, y.argmax(dim=-1))
        assert tap.uniform_later(4, 3) is None and tap.uniform_later(5, 2) is None
        got = tap.uniform(4, 2)
        assert got.dtype == np.float32 and got.shape == (4, 2)
        assert got[[0, 1, 3], 0].tolist() == [0.5, 0.0, inf] and np.isnan(got[2, 0])
        assert got[:, 1].tolist() == [0.25] * 4
        assert tap.uniform(4, 3) is None and tap.uniform(5, 2) is None
        assert torch.equal(x, before)  # restored after the reduction too
        later = tap.uniform_later(4, 2)  # the same, made when called (the writer thread)
        tap.reset()
        assert np.array_equal(later(), got, equal_nan=True) and later().dtype == np.float32
    tap = MarginTap()
    z = torch.randn(3, 8, generator=torch.Generator().manual_seed(2))
    assert not tap.host_top2(z.to(torch.bfloat16), z.argmax(dim=-1))
    assert not tap.host_top2(z.clone().requires_grad_(True), z.argmax(dim=-1))
    assert tap.steps == []
    # a depth from margin_of (an array) beside a host pair: each as margin_of gives it
    tap.steps = [np.array([1.0, 2.0], np.float32)]
    w = torch.tensor([[3.0, 1.0], [0.0, 0.5]])
    assert tap.host_top2(w, w.argmax(dim=-1))
    assert tap.take(0, 2) == [1.0, 2.0] and tap.take(1, 2) == [2.0, 0.5]


def test_host_top2_logits_in_one_reused_buffer_leave_that_depth_unknown():
    """host_top2 keeps the logits until the step's margins are read; a drafter writing
    every depth into one buffer (the same address) leaves the overwritten depth NaN, the
    later one exact, and later steps reduced at once (the twin with distinct buffers:
    test_host_top2_margins_equal_margin_of_once_subtracted_per_step)."""
    import torch

    from spectrace.hooks.vllm.margins import MarginTap

    tap = MarginTap()
    buf = torch.tensor([[1.0, 4.0, 2.0], [3.0, 0.0, 2.5]])
    assert tap.host_top2(buf, buf.argmax(dim=-1))
    buf.copy_(torch.tensor([[0.0, 1.0, 5.0], [2.0, 2.0, 1.0]]))  # depth 1, same memory
    assert tap.host_top2(buf, buf.argmax(dim=-1))
    got = tap.uniform(2, 2)
    assert np.isnan(got[:, 0]).all() and got[:, 1].tolist() == [4.0, 0.0]
    tap.reset()
    fresh = torch.tensor([[1.0, 4.0, 2.0], [3.0, 0.0, 2.5]])
    assert tap.host_top2(fresh, fresh.argmax(dim=-1))  # reduced at once now
    fresh.fill_(0.0)
    assert tap.uniform(2, 1)[:, 0].tolist() == [2.0, 0.5]
