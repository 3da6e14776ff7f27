"""The V2 capture path's chunked join (``spectrace.hooks.vllm.v2.join`` through ``ProposeTap``)
and its staging kernel.

The scenario below is driven through the real ``ProposeTap`` with a fake speculator of the V2
``propose`` signature; every expected block, output and total was derived by hand from the
join rules (``hooks/vllm/v2/join.py`` module doc), not by running the code. It runs on the CPU with
steps joined one at a time and three at a time (chunks, carries across chunks, deferred
finishes and drops), and on CUDA through the Triton staging kernel and the device ring.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from spectrace.hooks.vllm.session import Session  # noqa: E402
from spectrace.hooks.vllm.v2 import stage as v2_stage  # noqa: E402
from spectrace.hooks.vllm.v2.join import Proposals, join_chunk, trimmed_len  # noqa: E402
from spectrace.hooks.vllm.v2.tap import ProposeTap  # noqa: E402
from spectrace.tracer.store import open_trace  # noqa: E402

K = 3
SLOTS = {"a": 0, "b": 1, "c": 2, "_warmup_z": 3}
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


class Spec:
    """A speculator whose ``propose`` (vLLM 0.32's signature) returns preset drafts."""

    def __init__(self, make_propose, v2_batch) -> None:
        self.drafts = None
        self.batch = v2_batch
        self.propose = make_propose(lambda *args: self.drafts)


def step(spec: Spec, rows: list[tuple], device: str, capture: bool = False) -> None:
    """One ``propose`` call (``capture``: the whole call under a CUDA-graph capture); rows:
    (request, num_sampled, num_rejected, anchor, anchor position, drafts). The anchor goes to
    ``last_sampled`` (num_sampled > 0) or ``next_prefill_tokens``; row i's query is nr + 1
    tokens at positions pos - 1 .. so that ``positions[query_start_loc[i + 1] - 1 - nr] + 1 ==
    pos``."""
    last = torch.zeros((8, 1), dtype=torch.int64)
    nxt = torch.zeros((1, 8), dtype=torch.int32)
    positions, qsl = [], [0]
    for rid, ns, nr, anchor, pos, _ in rows:
        if ns > 0:
            last[SLOTS[rid], 0] = anchor
        else:
            nxt[0, SLOTS[rid]] = anchor
        positions += [pos - 1 + j for j in range(nr + 1)]
        qsl.append(len(positions))
    dev = torch.device(device)
    batch = spec.batch([r[0] for r in rows], [SLOTS[r[0]] for r in rows], positions, qsl, dev)
    spec.drafts = torch.tensor([r[5] for r in rows], dtype=torch.int64, device=dev)
    args = (
        batch,
        None,
        None,
        None,
        None,
        torch.tensor([r[1] for r in rows], dtype=torch.int32, device=dev),
        torch.tensor([r[2] for r in rows], dtype=torch.int32, device=dev),
        last.to(dev),
        nxt.to(dev),
        None,
        None,
    )
    if not capture:
        spec.propose(*args, num_speculative_tokens=K)
        return
    graph = torch.cuda.CUDAGraph()  # the runner capturing propose: inputs made before it
    with torch.cuda.graph(graph):
        spec.propose(*args, num_speculative_tokens=K)


class HookSpec(Spec):
    """A drafter that stages from its own step (``tap.stage_in_graph``, as DSpark's
    ``_sample_sequential`` does): the step copies the preset drafts into a persistent
    ``draft_tokens`` [8, K] and calls the hook; ``graph``: that step is captured once in a
    CUDA graph and replayed each call (the preset drafts go through a static source buffer,
    like vLLM's prepare step writes the graph's inputs)."""

    graph_mode = False

    def __init__(self, make_propose, v2_batch) -> None:
        super().__init__(make_propose, v2_batch)
        self.propose = make_propose(lambda *args: self._draft())
        self.buf = torch.full((8, K), -9, dtype=torch.int64, device="cuda")
        self.src = torch.full((8, K), -9, dtype=torch.int64, device="cuda")
        self.tap = self.graph = None

    def _body(self) -> None:
        self.buf.copy_(self.src)
        self.tap.stage_in_graph(self.buf)

    def attach(self, tap) -> None:
        self.tap = tap
        if not self.graph_mode:
            return
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warmup: eager launches (descriptors of no rows)
            self._body()
            self._body()
        torch.cuda.current_stream().wait_stream(s)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._body()

    def _draft(self):
        n = self.drafts.shape[0]
        self.src.fill_(-9)
        self.src[:n].copy_(self.drafts)
        if self.graph is not None and not torch.cuda.is_current_stream_capturing():
            self.graph.replay()
        else:
            self._body()
        return self.buf[:n]


class GraphSpec(HookSpec):
    graph_mode = True


class MixedSpec(GraphSpec):
    """A captured drafter whose calls 2, 4 and 6 run eagerly (a batch size without a graph):
    the hook launches from Python then, taking the call's descriptor."""

    def _draft(self):
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls % 2:
            return super()._draft()
        n = self.drafts.shape[0]
        self.src.fill_(-9)
        self.src[:n].copy_(self.drafts)
        self._body()
        return self.buf[:n]


def run_scenario(
    path, device: str, fakes, late_add: bool = False, spec_cls=None, **tap_kw
) -> ProposeTap:
    """Six steps of requests a, b, c (see the expected blocks in the test); ``late_add``:
    c is registered after the first step (queued while a background joiner runs);
    ``spec_cls``: the fake speculator's class (default :class:`Spec`)."""
    session = Session(path, {"k": K, "source": "vllm-hook"})
    make_propose, v2_batch, sampling = fakes
    spec = (spec_cls or Spec)(make_propose, v2_batch)
    tap = ProposeTap(spec, session, max_model_len=1000, **tap_kw)
    if hasattr(spec, "attach"):
        spec.attach(tap)
    params = sampling(max_tokens=6)
    for rid in "ab" if late_add else "abc":
        tap.add_request(rid, [1, 2], params)
    step(
        spec,
        [
            ("a", 0, 0, 100, 0, [7, 7, 7]),  # a prefill: drafts unused
            ("b", 1, 0, 200, 5, [21, 22, 23]),
        ],
        device,
    )  # b opens P_b0
    if late_add:
        tap.add_request("c", [1, 2], params)
    step(
        spec,
        [
            ("b", 3, 1, 203, 8, [31, 32, -1]),  # closes P_b0, opens P_b1 (k 2)
            ("a", 1, 0, 101, 4, [11, -1, 13]),
        ],
        device,
    )  # opens P_a1 (interior -1)
    step(
        spec,
        [
            ("a", 2, 2, 111, 6, [41, 42, 43]),  # closes P_a1, opens P_a2
            ("c", 0, 0, 300, 0, [1, 2, 3]),  # c prefill
            ("b", 1, 2, 210, 9, [-1, -1, -1]),
        ],
        device,
    )  # closes P_b1, opens nothing
    tap.drop_later("a")  # preempted: P_a2 unverified
    step(
        spec,
        [
            ("c", 1, 0, 301, 20, [51, 52, 53]),  # opens P_c3
            ("b", 1, 0, 211, 10, [61, 62, 63]),
        ],
        device,
    )  # opens P_b3
    tap.finish_later("b")  # finished: P_b3 unverified
    step(
        spec,
        [
            ("c", 4, 0, 305, 24, [71, 72, 73]),  # closes P_c3, opens P_c4
            ("a", 0, 0, 400, 0, [9, 9, 9]),  # a re-prefills
            ("_warmup_z", 1, 0, 5, 5, [5, 5, 5]),
        ],
        device,
    )  # warmup row: skipped
    step(spec, [("a", 1, 0, 401, 30, [81, 82, -1])], device)  # opens P_a5
    session.close()  # a and c still running: P_a5, P_c4 unverified
    return tap


# request, step, position, anchor, proposed, verified (None: unverified), accepted, emitted,
# batch_row, batch_size -- in write order (by the row that closed each block).
EXPECTED = [
    ("b", 0, 5, 200, [21, 22, 23], [21, 22, 23], 2, [21, 22, 203], 1, 2),
    ("a", 1, 4, 101, [11, -1, 13], [11, -1, 13], 1, [11, 111], 1, 2),
    ("b", 1, 8, 203, [31, 32], [31, 32], 0, [210], 0, 2),
    ("a", 2, 6, 111, [41, 42, 43], None, -1, None, 0, 3),
    ("b", 3, 10, 211, [61, 62, 63], None, -1, None, 1, 2),
    ("c", 3, 20, 301, [51, 52, 53], [51, 52, 53], 3, [51, 52, 53, 305], 0, 2),
    ("a", 5, 30, 401, [81, 82], None, -1, None, 0, 1),
    ("c", 4, 24, 305, [71, 72, 73], None, -1, None, 0, 3),
]
OUTPUTS = {
    "a": ([101, 11, 111, 401], "unfinished"),
    "b": ([200, 21, 22, 203, 210, 211], "length"),
    "c": ([301, 51, 52, 53, 305], "unfinished"),
}


def pad(ids, width):
    return list(ids) + [-1] * (width - len(ids))


def check_trace(path, tap: ProposeTap) -> None:
    with open_trace(path) as t:
        b = t.blocks
        names = list(t.requests.req_id)
        got = []
        for i in range(len(b)):
            ver = None if b.num_verified[i] < 0 else b.verified[i][: b.num_verified[i]].tolist()
            em = None if b.num_emitted[i] < 0 else b.emitted[i][: b.num_emitted[i]].tolist()
            got.append(
                (
                    names[b.request[i]],
                    int(b.step[i]),
                    int(b.position[i]),
                    int(b.anchor[i]),
                    b.proposed[i][: b.k[i]].tolist(),
                    ver,
                    int(b.accepted[i]),
                    em,
                    int(b.batch_row[i]),
                    int(b.batch_size[i]),
                )
            )
        assert got == EXPECTED
        assert b.proposed.shape[1] == K and b.emitted.shape[1] == K + 1
        assert b.proposed[2].tolist() == [31, 32, -1]
        assert b.verified[3].tolist() == [-1, -1, -1] and b.emitted[3].tolist() == [-1] * 4
        assert (b.proposal_source == 1).all()
        outs = {
            r: (o.tolist(), f)
            for r, o, f in zip(names, t.requests.output_ids, t.requests.finish_reason)
        }
        assert outs == OUTPUTS
        assert t.meta["checks"]["trace"] == {
            "num_drafts": 4,
            "num_draft_tokens": 11,
            "num_accepted_tokens": 6,
            "num_accepted_tokens_per_pos": [3, 2, 1],
            "blocks": 8,
        }
    assert tap.session.blocks == 8 and tap.sync_waits == 0
    assert tap.session.step == 6


@pytest.fixture
def fakes(make_propose, v2_batch, sampling):
    return make_propose, v2_batch, sampling


@pytest.mark.parametrize("cpu_flush_steps", [1, 3])
def test_chunked_join_by_hand_cpu(tmp_path, fakes, cpu_flush_steps):
    tap = run_scenario(tmp_path / "t.h5", "cpu", fakes, cpu_flush_steps=cpu_flush_steps)
    check_trace(tmp_path / "t.h5", tap)


@pytest.mark.parametrize("cpu_flush_steps", [1, 3])
def test_late_add_by_hand_cpu(tmp_path, fakes, cpu_flush_steps):
    """The clean twin of the queued registration: the same blocks with c added late."""
    tap = run_scenario(tmp_path / "t.h5", "cpu", fakes, True, cpu_flush_steps=cpu_flush_steps)
    check_trace(tmp_path / "t.h5", tap)
    assert tap.drainer is None


class _CapturedStage:
    """What ``ProposeTap._captured`` reads of a GraphStage whose call ran under a capture."""

    call_desc = True
    retracted = 0

    def capturing(self) -> bool:
        return True

    def retract(self) -> None:
        self.retracted += 1


@pytest.mark.parametrize("queued_after", [False, True])
def test_a_captured_call_takes_back_only_its_own_step_cpu(tmp_path, fakes, queued_after):
    """The step of a call found captured is the stream's last item: it is taken back (segment
    rows, step number); with a request event queued after it (never so in a propose call),
    nothing is popped and the session fails instead (strict: raises)."""
    session = Session(tmp_path / "t.h5", {"k": K, "source": "vllm-hook"})
    make_propose, v2_batch, _ = fakes
    spec = Spec(make_propose, v2_batch)
    tap = ProposeTap(spec, session, cpu_flush_steps=3)
    step(spec, [("a", 1, 0, 5, 5, [1, 2, 3]), ("b", 1, 0, 6, 6, [4, 5, 6])], "cpu")
    step(spec, [("a", 1, 0, 7, 7, [1, 2, 3])], "cpu")
    seg = tap._stream[-1][0]
    assert (len(tap._stream), seg.used, seg.steps, session.step) == (2, 3, 2, 2)
    g = _CapturedStage()
    if queued_after:
        tap.drop_later("b")
        with pytest.raises(RuntimeError, match="not the last"):
            tap._captured(g, staged=True)
        assert (len(tap._stream), seg.used, seg.steps, session.step) == (3, 3, 2, 2)
    else:
        tap._captured(g, staged=True)
        assert (len(tap._stream), seg.used, seg.steps, session.step) == (1, 2, 1, 1)
    assert g.retracted == 1


@needs_cuda
@pytest.mark.parametrize("background", [True, False])
@pytest.mark.parametrize("flush_steps", [1, 3, 32])
def test_chunked_join_by_hand_cuda(tmp_path, fakes, flush_steps, background):
    tap = run_scenario(
        tmp_path / "t.h5", "cuda", fakes, flush_steps=flush_steps, background_join=background
    )
    check_trace(tmp_path / "t.h5", tap)
    assert (tap.drainer is not None) == background
    if background:
        assert not tap.drainer.alive  # stopped at close


@needs_cuda
@pytest.mark.parametrize("piece_rows", [1, 2])
def test_background_join_in_pieces_cuda(tmp_path, fakes, monkeypatch, piece_rows):
    """The joiner thread takes 1 or 2 rows at a time (pieces end inside a step's rows and
    inside a segment): the same trace."""
    monkeypatch.setattr(ProposeTap, "PIECE_ROWS", piece_rows)
    tap = run_scenario(tmp_path / "t.h5", "cuda", fakes, True, flush_steps=3)
    check_trace(tmp_path / "t.h5", tap)


@needs_cuda
@pytest.mark.parametrize("flush_steps", [1, 3])
def test_late_add_is_queued_with_a_background_joiner_cuda(tmp_path, fakes, flush_steps):
    """c's registration comes after the joiner started: queued in order, same trace."""
    tap = run_scenario(tmp_path / "t.h5", "cuda", fakes, True, flush_steps=flush_steps)
    check_trace(tmp_path / "t.h5", tap)
    assert tap.drainer is not None and tap.drainer.runs >= 1


class StridedSpec(GraphSpec):
    """A captured drafter called with a ``num_sampled`` of stride 2 (a layout the in-graph
    kernel does not take): the tap writes descriptors of no rows and stages with torch ops
    after each call."""

    def attach(self, tap) -> None:
        super().attach(tap)
        wrapped = self.propose  # the tap's wrapper by now

        def propose(*a, **kw):
            ns = a[5]
            return wrapped(*a[:5], torch.stack([ns, ns], 1)[:, 0], *a[6:], **kw)

        self.propose = propose


@needs_cuda
@pytest.mark.parametrize("spec_cls", [GraphSpec, MixedSpec, StridedSpec])
@pytest.mark.parametrize("flush_steps", [1, 3, 32])
def test_chunked_join_staged_in_graph_cuda(tmp_path, fakes, flush_steps, spec_cls):
    """The drafter stages its rows itself (``stage_in_graph``): from a replayed CUDA graph
    (no launch from Python per step), and on its eager path after a capture; the same
    trace, no descriptor lost, no launch from the tap."""
    before = dict(v2_stage.launch_counts)
    tap = run_scenario(
        tmp_path / "t.h5", "cuda", fakes, True, spec_cls=spec_cls, flush_steps=flush_steps
    )
    check_trace(tmp_path / "t.h5", tap)
    g = tap.graph
    assert g is not None and g.armed and g.lost == 0 and g.waits == 0 and g.captures == 1
    assert g.seq == 6 and int(g.ctl_np[0]) == 6  # warmups before the capture: no descriptor
    assert sum(v2_stage.launch_counts.values()) == sum(before.values())  # none by the tap


@needs_cuda
def test_eager_drafter_keeps_the_tap_launch_cuda(tmp_path, fakes):
    """A drafter that never captures: its hook does nothing, the tap launches each step."""
    before = sum(v2_stage.launch_counts.values())
    tap = run_scenario(tmp_path / "t.h5", "cuda", fakes, True, spec_cls=HookSpec)
    check_trace(tmp_path / "t.h5", tap)
    assert not tap.graph.armed and tap.graph.seq == 0  # compiled once, never used
    assert sum(v2_stage.launch_counts.values()) - before == 6


@needs_cuda
def test_graph_stage_counts_a_replay_it_did_not_see(tmp_path, fakes):
    """A replay with no descriptor (the host lost count) writes nothing and is counted; the
    tap then fails the session at the next call (no silent shift of rows)."""
    session = Session(tmp_path / "t.h5", {"k": K, "source": "vllm-hook"})
    make_propose, v2_batch, _ = fakes
    spec = GraphSpec(make_propose, v2_batch)
    tap = ProposeTap(spec, session, max_model_len=1000, flush_steps=1)
    spec.attach(tap)
    spec.drafts = torch.zeros((1, K), dtype=torch.int64, device="cuda")
    spec.graph.replay()  # outside propose: no descriptor
    torch.cuda.synchronize()
    assert tap.graph.lost == 1
    step(spec, [("a", 1, 0, 5, 5, [1, 2, 3])], "cuda")  # the count is read after each flush
    assert tap.graph.lost_seen >= 1
    with pytest.raises(RuntimeError, match="lost count"):
        step(spec, [("a", 1, 0, 5, 5, [1, 2, 3])], "cuda")
    session.close()


@needs_cuda
@pytest.mark.parametrize("flush_steps", [1, 64])
def test_a_call_captured_by_the_runner_stages_nothing_cuda(tmp_path, fakes, flush_steps):
    """A ``propose`` call run whole under a capture (the runner capturing the drafter): the
    kernel is captured, not run, so its descriptor and step are taken back; the steps
    around it are staged as if it had not happened. By hand: step 1 is a's verdict row
    without a proposal (output [100]) and opens [1, 2, 3]; step 2 (ns 3, nr 1) verifies 3,
    accepts 2: emitted [1, 2, 103]."""
    session = Session(tmp_path / "t.h5", {"k": K, "source": "vllm-hook"})
    make_propose, v2_batch, sampling = fakes
    spec = GraphSpec(make_propose, v2_batch)
    tap = ProposeTap(spec, session, max_model_len=1000, flush_steps=flush_steps)
    spec.attach(tap)
    tap.add_request("a", [1, 2], sampling(max_tokens=50))
    step(spec, [("a", 1, 0, 100, 5, [1, 2, 3])], "cuda")
    step(spec, [("a", 9, 0, 900, 50, [9, 9, 9])], "cuda", capture=True)
    step(spec, [("a", 3, 1, 103, 8, [4, 5, 6])], "cuda")
    tap.drain(wait=True)
    g = tap.graph
    assert (g.seq, g.captures, g.lost, session.step) == (2, 2, 0, 2)
    assert tap.output_ids("a") == [100, 1, 2, 103]
    session.close()


def test_join_chunk_carry_in_and_out():
    """One chunk: request 7 closes a carried proposal; both rows open one that stays open."""
    rows = np.array(
        [
            [2, 1, 50, 12, 60, 61, -1],  # 7: nv 2, acc 1 on the carry [40, 41];
            #    opens [60, 61]
            [1, 0, 70, 3, 80, -1, 82],
        ],  # 9: no carry; opens [80, -1, 82]
        dtype=np.int32,
    )
    carry = Proposals(
        np.array([4]),
        np.array([10]),
        np.array([33]),
        np.array([[40, 41, -1]]),
        np.array([2]),
        np.array([111]),
        np.array([0]),
        np.array([1]),
    )
    res = join_chunk(
        np.array([7, 9]),
        rows,
        np.array([5, 5]),
        np.array([0, 1]),
        np.array([2, 2]),
        np.array([222, 222]),
        np.array([7]),
        carry,
    )
    b = res.blocks
    assert b["request"].tolist() == [7] and b["step"].tolist() == [4]
    assert b["proposed"].tolist() == [[40, 41]] and b["verified"].tolist() == [[40, 41]]
    assert b["accepted"].tolist() == [1] and b["emitted"].tolist() == [[40, 50]]
    assert b["t_ns"].tolist() == [111] and b["batch_size"].tolist() == [1]
    assert res.out_rows.tolist() == [0, 1] and res.out_len.tolist() == [2, 1]
    assert res.out_tokens[0, :2].tolist() == [40, 50] and res.out_tokens[1, 0] == 70
    assert res.open_rows.tolist() == [0, 1]
    assert res.open.drafts.tolist() == [[60, 61, -1], [80, -1, 82]]
    assert res.open.k.tolist() == [2, 3] and res.open.position.tolist() == [12, 3]
    assert res.open.step.tolist() == [5, 5] and sorted(res.seen.tolist()) == [7, 9]


def test_trimmed_len():
    d = np.array([[1, 2, 3], [1, -1, 3], [1, 2, -1], [-1, -1, -1], [-1, 5, -1]])
    assert trimmed_len(d).tolist() == [3, 3, 2, 0, 2]


def _staging_inputs(n: int, k: int, seed: int):
    """Random staging inputs on CUDA and a torch reference of the rows they give."""
    g = torch.Generator().manual_seed(seed)
    slots = n + 5
    ns = torch.randint(0, k + 2, (slots,), generator=g, dtype=torch.int32)
    nr = torch.randint(0, k + 1, (slots,), generator=g, dtype=torch.int32)
    idx = torch.randperm(slots, generator=g)[:n].to(torch.int32)
    q = torch.randint(1, k + 2, (n,), generator=g)
    qsl = torch.cat([torch.zeros(1, dtype=torch.int64), q.cumsum(0)]).to(torch.int32)
    positions = torch.randint(0, 10**6, (int(qsl[-1]),), generator=g)
    last = torch.randint(0, 150000, (slots, 1), generator=g)
    nxt = torch.randint(0, 150000, (1, slots), generator=g, dtype=torch.int32)
    drafts = torch.randint(-1, 150000, (slots, k), generator=g)
    host = (ns, nr, idx, qsl, positions, last, nxt, drafts)
    ref = torch.full((n, 4 + k), -7, dtype=torch.int64)
    v2_stage.stage_torch(ref, n, *host)
    return [t.cuda() for t in host], ref


@needs_cuda
@pytest.mark.parametrize("n,k", [(1, 4), (77, 7), (300, 16)])
def test_triton_staging_equals_torch(n, k):
    inputs, ref = _staging_inputs(n, k, seed=n)
    assert v2_stage.triton_ok(inputs[-1])
    ring = torch.full((n + 9, 4 + k), -7, dtype=torch.int32, device="cuda")
    assert v2_stage.stage_triton(ring, 9, n, *inputs)
    got = ring.cpu()
    assert (got[:9] == -7).all()
    assert torch.equal(got[9:].long(), ref)


@needs_cuda
@pytest.mark.parametrize("offset", [0, 1])  # 1: ns/nr start 4 bytes in (unaligned pointers)
def test_direct_launch_writes_what_the_triton_call_writes(monkeypatch, offset):
    """The compiled-launcher path writes exactly the rows ``kernel[grid](...)`` writes (and the
    torch reference), for aligned and unaligned inputs (different specialisations)."""
    n, k = 77, 7
    inputs, ref = _staging_inputs(n + offset, k, seed=5 + offset)
    if offset:  # rows 1.. of every per-row input: the same rows the reference holds from 1
        inputs = [inputs[0][1:], inputs[1][1:], inputs[2][1:]] + inputs[3:]
        inputs[3] = inputs[3][1:]
        ref = None
    rings = [torch.full((n + 9, 4 + k), -7, dtype=torch.int32, device="cuda") for _ in range(3)]
    monkeypatch.setattr(v2_stage, "DIRECT", False)
    jit0 = v2_stage.launch_counts["jit"]
    assert v2_stage.stage_triton(rings[0], 9, n, *inputs)  # the plain Triton call
    assert v2_stage.launch_counts["jit"] == jit0 + 1
    monkeypatch.setattr(v2_stage, "DIRECT", True)
    v2_stage.stage_triton(rings[1], 9, n, *inputs)  # learns this key's CompiledKernel
    direct0 = v2_stage.launch_counts["direct"]
    assert v2_stage.stage_triton(rings[2], 9, n, *inputs)  # the direct launch
    assert v2_stage.launch_counts["direct"] == direct0 + 1
    got = [r.cpu() for r in rings]
    assert torch.equal(got[2], got[0]) and torch.equal(got[1], got[0])
    assert (got[0][:9] == -7).all()
    if ref is not None:
        assert torch.equal(got[0][9:].long(), ref)


@needs_cuda
def test_launch_hook_sends_launches_through_triton(monkeypatch):
    """With a Triton launch hook installed (a profiler), launches take the normal path, so
    the hook sees them; without it, the direct path resumes."""
    from triton import knobs

    inputs, ref = _staging_inputs(8, 4, seed=11)
    ring = torch.full((8, 8), -7, dtype=torch.int32, device="cuda")
    v2_stage.stage_triton(ring, 0, 8, *inputs)  # key known from here on
    seen = []
    hook = knobs.runtime.launch_enter_hook
    if hasattr(hook, "add"):  # Triton 3.6: a HookChain
        hook.add(seen.append)
        undo = lambda: hook.remove(seen.append)  # noqa: E731
    else:  # Triton 3.9: None or a callable
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", seen.append)
        undo = lambda: None  # noqa: E731
    try:
        counts = dict(v2_stage.launch_counts)
        v2_stage.stage_triton(ring, 0, 8, *inputs)
        assert v2_stage.launch_counts["jit"] == counts["jit"] + 1
        assert v2_stage.launch_counts["direct"] == counts["direct"] and len(seen) == 1
    finally:
        undo()
    counts = dict(v2_stage.launch_counts)
    v2_stage.stage_triton(ring, 0, 8, *inputs)
    assert v2_stage.launch_counts["direct"] == counts["direct"] + 1
    assert torch.equal(ring.cpu().long(), ref)


def _layout_inputs(n: int = 3, slots: int = 5):
    """CPU staging inputs of the kernels' layout: ns/nr/idx/qsl/positions 1-D unit stride,
    last_sampled ``[slots, 2]`` (column 0 read), next_prefill_tokens ``[1, slots]``."""
    ns = torch.arange(n, dtype=torch.int32)
    nr = torch.arange(n, dtype=torch.int64)
    idx = torch.arange(n, dtype=torch.int32)
    qsl = torch.arange(n + 1, dtype=torch.int32)
    positions = torch.arange(4 * n, dtype=torch.int64)
    last = torch.zeros((slots, 2), dtype=torch.int64)
    nxt = torch.zeros((1, slots), dtype=torch.int32)
    return [ns, nr, idx, qsl, positions, last, nxt]


def test_input_layout_reads_pointers_and_row_strides():
    """Clean twin of the layouts rejected below: the seven pointers in the kernels' order,
    last_sampled's column 0 steps by its row stride (2), next_prefill_tokens' row 0 by 1."""
    inputs = _layout_inputs()
    lay = v2_stage.input_layout(tuple(inputs))
    assert lay == (*[t.data_ptr() for t in inputs], 2, 1)
    inputs[6] = torch.zeros(5, dtype=torch.int32)  # 1-D next_prefill_tokens
    inputs[5] = torch.zeros(5, dtype=torch.int64)  # 1-D last_sampled
    assert v2_stage.input_layout(tuple(inputs))[7:] == (1, 1)


@pytest.mark.parametrize(
    "i,bad",
    [
        (0, lambda: torch.arange(6, dtype=torch.int32)[::2]),  # ns with stride 2
        (4, lambda: torch.zeros((2, 6), dtype=torch.int64)),  # 2-D positions
        (5, lambda: torch.zeros((5, 2, 1), dtype=torch.int64)),  # 3-D last_sampled
    ],
)
def test_input_layout_rejects_what_the_kernels_do_not_take(i, bad):
    inputs = _layout_inputs()
    inputs[i] = bad()
    assert v2_stage.input_layout(tuple(inputs)) is None


# desc_layout of _layout_inputs() by hand: int64 inputs nr (bit 1), positions (bit 4) and
# last (bit 5) -> wide 2 + 16 + 32 = 50; last [5, 2] steps 2 a row, nxt [1, 5] steps 1.
_DESC_LAY = (2, 1, 50, 0)


@pytest.fixture(params=["guards", "plain"])
def layouts(request):
    """An InputLayouts using torch's one-call check (where torch has it), or the plain reads."""
    lays = v2_stage.InputLayouts()
    if request.param == "plain":
        lays._guards = None
    elif lays._guards is None:
        pytest.skip("this torch has no TensorGuards")
    return lays


def test_input_layouts_give_the_descriptor_fields(layouts):
    """Clean twin of the re-strided/retyped cases below: the same answer at every call."""
    inputs = tuple(_layout_inputs())
    assert [layouts.of(inputs) for _ in range(3)] == [_DESC_LAY] * 3


def test_input_layouts_see_a_buffer_restrided_in_place(layouts):
    """Same tensor objects, one re-strided in place after its layout was seen: never trusted
    by identity, so the layout the kernel does not take is seen (None), and the old one again
    once the stride is back."""
    inputs = tuple(_layout_inputs(n=6))
    assert layouts.of(inputs) == _DESC_LAY
    inputs[0].as_strided_((3,), (2,))  # ns, stride 2 now
    assert layouts.of(inputs) is None
    inputs[0].as_strided_((6,), (1,))
    assert layouts.of(inputs) == _DESC_LAY


def test_input_layouts_see_a_new_dtype_and_give_up_guards_that_keep_failing(layouts):
    """ns int32 -> int64 sets wide bit 0 (50 + 1); alternating layouts past MISSES leave
    the plain reads only, with the same answers."""
    a = tuple(_layout_inputs())
    b = (a[0].long(), *a[1:])
    for _ in range(v2_stage.InputLayouts.MISSES + 2):
        assert layouts.of(a) == _DESC_LAY
        assert layouts.of(b) == (2, 1, 51, 0)
    assert layouts.guard is None


@pytest.mark.parametrize(
    "args,kwargs,want",
    [
        # all 11 required positionally, k by keyword: defaults for dummy_run/is_profile
        (
            tuple("abcdefghijk"),
            {"num_speculative_tokens": 3},
            ("a", "f", "g", "h", "i", 3, False, False),
        ),
        # clean twin with every parameter positional (17): each read from its position
        (tuple("abcdefghijklmnopq"), {}, ("a", "f", "g", "h", "i", "q", "m", "p")),
        # keywords for everything past input_batch; unknown keywords ignored
        (
            ("a",),
            {
                "num_sampled": 5,
                "num_rejected": 6,
                "last_sampled": 7,
                "next_prefill_tokens": 8,
                "dummy_run": True,
                "seeds": 0,
                "temperature": 1,
            },
            ("a", 5, 6, 7, 8, None, True, False),
        ),
    ],
)
def test_record_args_reads_positions_keywords_and_defaults(args, kwargs, want, make_propose):
    from spectrace.hooks.vllm.v2.layout import RecordArgs, propose_layout

    # conftest's fake has vLLM 0.32's BaseSpeculator.propose parameters (self left out)
    read = RecordArgs(propose_layout(make_propose(lambda *a: None)))
    assert tuple(read(args, kwargs)) == want
    assert tuple(read(args, kwargs)) == want  # the cached getter gives the same
