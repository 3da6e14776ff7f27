"""Cost of spectrace's V2 capture path on a DSpark draft step replayed from a CUDA graph.

What runs, per measured step (both modes do exactly the same work except the capture):

1. the runner's side (emulated): per-step inputs written by small device ops (the anchors
   from ``last_sampled``, positions), like vLLM's eager prepare kernel before the replay;
2. ``propose``: one replay of a CUDA graph holding the reference DSpark draft step
   (``spectrace.engine.dspark``): context K/V of the k+1 newly accepted tokens per request
   written into a static KV cache (vLLM's context-KV precompute), the query block through the
   backbone, draft-vocabulary logits, the sequential Markov loop with argmax and d2t, drafts
   into a persistent ``draft_tokens`` buffer;
3. modes ``capture`` and ``launch``: spectrace's ``ProposeTap`` (``spectrace.hooks.vllm.v2.tap``)
   wraps ``propose`` and stages ``[n, 4 + k]`` int32 rows (verdict, anchor, anchor position,
   drafts) into a device ring; every ``flush_steps`` (64) steps one non-blocking copy to
   pinned memory and one event; segments whose event completed are joined (numpy, many steps
   at once) into blocks on the tap's background thread (``spectrace.hooks.vllm.v2.drainer``).
   In mode ``capture`` the staging kernel is part of the drafter's CUDA graph
   (``spectrace.hooks.vllm.v2.graph_stage``: the step is captured a second time with
   ``tap.stage_in_graph(draft_tokens)`` at its end, as DSpark's ``_sample_sequential`` calls
   it), and the tap only writes the step's descriptor to pinned memory before the replay: no
   launch from Python. Mode ``launch`` is the landed path, measured in the same run: one
   Triton launch (through the compiled launcher) from Python after each replay. With
   ``--eager`` (no graphs) mode ``capture`` launches the same kernel from the hook in Python.
   The sink is a real trace file (``--sink h5``, needs h5py; written on a background thread)
   or an in-memory counter (``--sink null``);
4. the runner's per-step host wait (emulated): like vLLM with async scheduling, the host
   waits for the step before the previous one (``event.synchronize()``), so it runs at most
   two steps ahead. That wait is the same in both modes.

Reported per configuration and mode: wall time per step, device time per step (CUDA events
around the whole loop, divided by the steps), draft tokens per second (batch x k / step
time), host time spent inside the capture path per step on the runner's thread (``tap host
us``) and on the join thread (``join us``), host synchronisations per step (explicit ``synchronize()``
calls counted by wrappers plus implicit ones reported by ``torch.cuda.set_sync_debug_mode``;
the runner's own wait is 1 per step in both modes) and the ring's ``sync_waits``. The capture
must cost under 1% of the step and add no synchronisation. The tap's host time is also given
in units of one ``data_ptr()`` call measured beside each run (``torch_call_ns``), since the
host's speed changes between runs. ``--profile`` adds the tap's thread CPU time and the median
of its parts (``record``, the descriptor ``write``, the staging ``launch``); ``--before DIR``
with modes ``before-capture``/``before-launch`` runs another checkout's tap in the same
process, interleaved with this one's (before/after figures from one run).

Where the runner thread's time goes (H200 host, 2026-12-02; hot-loop costs there: a
``data_ptr()`` 110-150 ns, ``stride()`` ~240, ``dtype`` ~110, the CUDA capture query 605, a
``TensorGuards`` check of the seven inputs ~1.1 us, the 14 ``dtype``/``stride()`` reads ~1.9 us):
in mode ``launch`` the staging launch alone is 20-34 us (Triton's compiled launcher; a torch
op's launch costs about as much there, ``torch`` in the staging micro benchmark: ~10 launches,
180-310 us), so that mode cannot reach 20 us a step on this host. In mode ``capture`` (no
launch) the tap is one Python call chain per step: the arguments (one getter per call shape),
the batch's request ids compared, the layout checked in one C call
(:class:`spectrace.hooks.vllm.v2.stage.InputLayouts`), seven ``data_ptr()``, one ``struct``
pack, one tuple into the stream (the join thread does the rest), and no CUDA call. Nothing
in it grows with the batch but the request-id comparison (a C list compare, identity first:
~50 ns at 64 ids on this project's CPU machine); the join thread's work and the h5 writer's grow
with it, off the runner's thread. Last full run (qwen3-8b, h5 sink, batch 1/8/32/64, medians,
2026-12-02): 20.0 / 18.1 / 12.9 / 11.7 us, against 22.1 / 16.5 / 12.9 / 12.0 us for main's tap
interleaved in the same process (``--before``; this cut: the seven ``data_ptr()`` as plain
method calls inside the pack, the step's bookkeeping inlined, the bench's wrappers reading the
clock first and last); a second process gave 31.5 / 20.0 / 13.5 / 16.9 against
29.9 / 24.9 / 14.6 / 18.9 us, so the per-batch spread of one process (here the first batch is
the slow one, in others batch 64) is larger than the cut. ``--profile`` splits the tap into
the descriptor ``write`` (4.4-6.8 us), the rest of ``record`` (5.4-6.8 us) and the wrapper
around it (4.8-7.4 us, the bench's timing wrappers included); the tap's thread CPU time is
nearly its wall time (14.6 / 21.0 us CPU at batch 1 / 64 against 12.6 / 18.2 wall), so what
varies is how fast the same code runs after the step's wait (cold caches), not a wait on the
join thread. The same code runs 2-3x slower in some processes, and at some batch sizes, than
in others, with or without the h5 writer thread (``--sink null``: 11.1 / 11.2 us at batch 1 /
64 in one process), which is why the tap's time is also given in ``data_ptr()`` calls measured
beside each run; the ratio to the ``--before`` tap in one process stays within 0.8-1.1 for
this cut. On this project's CPU machine the descriptor write takes 1.7 us in a hot loop
(3.0 us before: the seven pointers read through ``input_ptrs``), the whole in-graph tap ~7 us.

The in-graph kernel reads its descriptor from pinned host memory: 4.85-5.7 us of device time
per launch at batch 64 against 2.92 us with the same descriptor in device memory, i.e. ~1.9 us
is the PCIe round trip. Copying the ring to device memory inside the graph on a forked stream
beside the Markov loop (a small copy kernel, joined before the staging kernel) did not pay:
+1.02 / +0.75 / +0.50 / +0.38% against +1.12 / +0.60 / +0.42 / +0.25% without it at batch 1/8/32/64, one process interleaved; the
fork and join cost what the read saved. The launched kernel takes 1.37 us (the staging
micro benchmark, ``in-graph`` is the in-graph kernel).

Configurations (``--config``): ``tiny`` is the bundled drafter (``engine/models/dspark``,
hidden 128, fp32; random weights if it is missing), a launch-bound worst case; ``qwen3-8b`` is
a DSpark drafter of Qwen3-8B's shape with random weights (hidden 4096, 32 heads, 8 KV heads of
128, MLP 12288, 1 layer, 3 taps of 4096, target vocabulary 151936, reduced draft vocabulary
32768 with d2t, Markov rank 256, bf16).

Usage (on a CUDA machine; only torch + numpy + this repository are needed)::

    python benchmarks/bench_dspark_gpu.py                       # both configs, batch 1,8,32,64
    python benchmarks/bench_dspark_gpu.py --config tiny --batch 8 --steps 500 --json out.json

Without a CUDA device it says so and runs a short CPU smoke test of the same code (eager, no
graph; the figures are then not GPU figures). Exit status: 0 ok, 1 target missed, 2 no GPU
and ``--no-cpu-fallback``.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
import types
import warnings
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parent.parent


def import_spectrace():
    """``spectrace.engine.dspark``, ``.dspark_ckpt``, ``spectrace.hooks.vllm.session``, ``.vllm.v2.tap``: installed,
    or mapped from this checkout by hand (the package maps top-level folders into the
    ``spectrace`` namespace, so a plain PYTHONPATH cannot)."""
    try:
        from spectrace.engine import dspark  # noqa: F401
    except ImportError:
        for pkg, folder in (
            ("spectrace", None),
            ("spectrace.engine", "engine"),
            ("spectrace.hooks", "hooks"),
            ("spectrace.tracer", "tracer"),
        ):
            if pkg not in sys.modules:
                m = types.ModuleType(pkg)
                m.__path__ = [str(ROOT / folder)] if folder else []
                sys.modules[pkg] = m
    from spectrace.engine import dspark, dspark_ckpt
    from spectrace.hooks.vllm import session as hook
    from spectrace.hooks.vllm.v2 import tap as vllm_v2

    return dspark, dspark_ckpt, hook, vllm_v2


dspark, dspark_ckpt, hook, vllm_v2 = import_spectrace()


def import_before(root: Path):
    """The V2 tap module of another checkout at ``root`` (``--before``), as the package
    ``spectrace_before``: its ``hooks`` relative imports stay inside it (absolute
    ``spectrace.tracer`` imports use this checkout's tracer), so both taps run in one
    process, interleaved."""
    import importlib

    for pkg, folder in (("spectrace_before", None), ("spectrace_before.hooks", "hooks")):
        m = types.ModuleType(pkg)
        m.__path__ = [str(root / folder)] if folder else []
        sys.modules[pkg] = m
    return importlib.import_module("spectrace_before.hooks.vllm.v2.tap")


from spectrace.hooks.vllm.joiner import BlockJoiner  # noqa: E402 - after import_spectrace

# The bench's trace has no vLLM engine core behind it: skip the close-time counter report.
hook.report = lambda *a, **kw: None


# --------------------------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------------------------


def make_model(name: str, device, dtype) -> tuple[object, int]:
    """(DSparkDraftModel on device, target vocabulary)."""
    if name == "tiny":
        ckpt = ROOT / "engine" / "models" / "dspark"
        if (ckpt / "model.safetensors").exists():
            model = dspark_ckpt.load_dspark(ckpt)
        else:
            print("bench: no bundled engine/models/dspark; using random weights", file=sys.stderr)
            torch.manual_seed(0)
            model = dspark.DSparkDraftModel(
                dspark.DSparkConfig(
                    vocab_size=2048,
                    draft_vocab_size=2048,
                    hidden_size=128,
                    intermediate_size=384,
                    num_hidden_layers=1,
                    num_attention_heads=4,
                    num_key_value_heads=4,
                    head_dim=32,
                    target_hidden_size=128,
                    aux_hidden_state_layer_ids=[1, 2],
                    mask_token_id=2047,
                    block_size=4,
                    markov_rank=32,
                )
            )
        return model.to(device=device, dtype=dtype).eval(), model.cfg.vocab_size
    if name == "qwen3-8b":
        cfg = dspark.DSparkConfig(
            vocab_size=151936,
            draft_vocab_size=32768,
            hidden_size=4096,
            intermediate_size=12288,
            num_hidden_layers=1,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            target_hidden_size=4096,
            aux_hidden_state_layer_ids=[2, 18, 33],
            mask_token_id=151669,
            block_size=7,
            markov_rank=256,
            enable_confidence_head=False,
            rms_norm_eps=1e-6,
            rope_theta=1e6,
            max_position_embeddings=40960,
        )
        torch.manual_seed(0)
        with torch.device(device):
            model = dspark.DSparkDraftModel(cfg).to(dtype)
            for p in model.parameters():
                if p.is_floating_point():
                    torch.nn.init.normal_(p, 0.0, 0.02)
            ids = torch.sort(torch.randperm(cfg.vocab_size)[: cfg.draft_vocab_size]).values
            model.set_vocab_mapping(ids)
        return model.eval(), cfg.vocab_size
    raise SystemExit(f"bench: unknown config {name!r}")


class StaticDraftStep:
    """One DSpark draft step over static buffers (capturable): see the module doc, step 2.

    Buffers (device): ``kv`` per layer [B, C, kv_heads, head_dim] (the context cache, C slots,
    ``ctx_valid`` [B, C]); ``new_states`` [B, k+1, n_aux*H_t], ``new_pos``/``new_slot``
    [B, k+1]: the accepted tokens whose context K/V this step writes; ``anchor``/``anchor_pos``
    [B]; outputs ``draft_tokens`` [B, k] and ``sample_pos`` [B*k].
    """

    def __init__(self, model, batch: int, ctx: int, k: int, device, dtype) -> None:
        cfg = model.cfg
        self.model, self.b, self.c, self.k = model, batch, ctx, k
        self.sfa = bool(cfg.sample_from_anchor)
        self.nq = dspark.num_query_slots(k, self.sfa)
        self.off = dspark.sample_slot_offset(self.sfa)
        n_aux = len(cfg.aux_hidden_state_layer_ids)
        torch.manual_seed(1)
        width = n_aux * cfg.target_hidden_size
        self.kv = [
            (
                torch.empty(
                    batch, ctx, cfg.num_key_value_heads, cfg.head_dim, device=device, dtype=dtype
                ),
                torch.empty(
                    batch, ctx, cfg.num_key_value_heads, cfg.head_dim, device=device, dtype=dtype
                ),
            )
            for _ in range(cfg.num_hidden_layers)
        ]
        with torch.no_grad():  # the context cache, filled in chunks of 64 positions
            for c0 in range(0, ctx, 64):
                c1 = min(ctx, c0 + 64)
                states = torch.randn(batch, c1 - c0, width, device=device, dtype=dtype)
                pos = torch.arange(c0, c1, device=device)[None].expand(batch, -1)
                for (kc, vc), (kk, vv) in zip(self.kv, model.context_kv(states, pos)):
                    kc[:, c0:c1] = kk
                    vc[:, c0:c1] = vv
        self.new_states = torch.randn(batch, k + 1, width, device=device, dtype=dtype)
        self.new_pos = (
            (ctx - k - 1 + torch.arange(k + 1)).to(device)[None].expand(batch, -1).contiguous()
        )
        self.new_slot = self.new_pos.clone()
        self.ctx_valid = torch.ones(batch, ctx, dtype=torch.bool, device=device)
        self.anchor = torch.zeros(batch, dtype=torch.int64, device=device)
        self.anchor_pos = torch.full((batch,), ctx, dtype=torch.int64, device=device)
        self.mask_ids = torch.full(
            (batch, self.nq - 1), cfg.mask_token_id, dtype=torch.int64, device=device
        )
        self.block_ok = torch.ones(batch, self.nq, self.nq, dtype=torch.bool, device=device)
        self.qoff = torch.arange(self.nq, device=device)
        self.koff = torch.arange(1, k + 1, device=device)
        self.draft_tokens = torch.zeros(batch, k, dtype=torch.int64, device=device)
        self.sample_pos = torch.zeros(batch * k, dtype=torch.int64, device=device)

    @torch.no_grad()
    def __call__(self) -> None:
        m, b = self.model, self.b
        new_kv = m.context_kv(self.new_states, self.new_pos)
        idx = self.new_slot[:, :, None, None]
        for (kc, vc), (nk, nv) in zip(self.kv, new_kv):
            kc.scatter_(1, idx.expand_as(nk), nk)
            vc.scatter_(1, idx.expand_as(nv), nv)
        q_ids = torch.cat([self.anchor[:, None], self.mask_ids], dim=1)
        q_pos = self.anchor_pos[:, None] + self.qoff
        mask = torch.cat(
            [self.ctx_valid[:, None, :].expand(b, self.nq, self.c), self.block_ok], dim=2
        )
        hidden = m.query_forward(self.kv, q_ids, q_pos, mask)
        base = m.compute_draft_logits(hidden[:, self.off : self.off + self.k])
        self.draft_tokens.copy_(dspark.sample_sequential(base, self.anchor, m))
        self.sample_pos.copy_((self.anchor_pos[:, None] + self.koff).reshape(-1))


# --------------------------------------------------------------------------------------------
# the runner around it
# --------------------------------------------------------------------------------------------


class NullSession:
    """What ProposeTap needs from a Session, writing nothing (``--sink null``)."""

    def __init__(self) -> None:
        self.active, self.step, self.blocks = True, 0, 0
        self.joiner = BlockJoiner(self)

    def add_block(self, *a, **kw) -> None:
        self.blocks += 1

    def add_block_columns(self, columns) -> None:
        self.blocks += len(columns["request"])

    def request_row(self, req_id) -> int:
        return 0

    def on_close(self, fn) -> None:
        self._close = fn

    def fail(self, exc, where) -> None:
        raise exc

    def see_request(self, *a, **kw) -> None:
        pass

    def finish_request(self, *a, **kw) -> None:
        pass

    def close(self) -> None:
        self._close()


class Runner:
    """Emulates the V2 runner's calls around ``speculator.propose`` (module doc, 1-4)."""

    def __init__(self, step: StaticDraftStep, vocab: int, device, use_graph: bool) -> None:
        self.step_fn, self.device = step, device
        b, k = step.b, step.k
        self.max_reqs = b
        self.req_ids = [f"{i}-bench{i:04d}" for i in range(b)]
        g = torch.Generator(device="cpu").manual_seed(2)
        pool = 64
        ns = torch.randint(1, k + 2, (pool, b), generator=g, dtype=torch.int32)
        self.ns_pool = ns.to(device)
        self.nr_pool = (k + 1 - ns).to(device)
        self.last_sampled = torch.randint(0, vocab, (b, 1), generator=g).to(device)
        self.next_prefill = torch.zeros((1, b), dtype=torch.int32, device=device)
        self.idx_mapping = torch.arange(b, dtype=torch.int64, device=device)
        self.positions = (100 + torch.arange(b * (k + 1))).to(device)
        self.qsl_np = (torch.arange(b + 1) * (k + 1)).tolist()
        self.qsl = torch.tensor(self.qsl_np, dtype=torch.int32, device=device)
        self.graph = None
        if use_graph:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    step()
            torch.cuda.current_stream().wait_stream(s)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                step()
        self.t = 0
        self.events: list = []
        self._graphs: dict = {}  # hook -> the graph of the step with the hook
        self._hook = None

    def propose(
        self,
        input_batch,
        attn_metadata,
        slot_mappings,
        last_hidden_states,
        aux_hidden_states,
        num_sampled,
        num_rejected,
        last_sampled,
        next_prefill_tokens,
        temperature,
        seeds,
        dp_sync_state=None,
        dummy_run=False,
        skip_attn_for_dummy_run=False,
        mm_inputs=None,
        is_profile=False,
        num_speculative_tokens=None,
    ):
        st = self.step_fn
        st.anchor.copy_(last_sampled[input_batch.idx_mapping, 0])  # the prepare kernel's reads
        st.anchor_pos.add_(1)
        graph = self._graphs.get(self._hook, self.graph) if self._hook else self.graph
        if graph is not None:
            graph.replay()
        else:
            st()
            if self._hook is not None:  # the drafter's eager path: the hook runs in Python
                self._hook(st.draft_tokens)
        return st.draft_tokens[: input_batch.num_reqs]

    def hooked(self, hook):
        """A ``propose`` whose draft step ends with ``hook(draft_tokens)`` (spectrace's
        in-graph staging launch, as DSpark's ``_sample_sequential`` would call it), captured in
        a second graph of the same step (eager without graphs)."""
        step = self.step_fn
        if self.graph is not None and hook not in self._graphs:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):  # warmup (compiles the staging kernel)
                    step()
                    hook(step.draft_tokens)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step()
                hook(step.draft_tokens)
            self._graphs[hook] = g

        def propose(*a, **kw):
            self._hook = hook
            try:
                return self.propose(*a, **kw)
            finally:
                self._hook = None

        return propose

    def run_step(self, propose) -> None:
        i = self.t % self.ns_pool.shape[0]
        b = len(self.req_ids)
        batch = SimpleNamespace(  # new views of persistent buffers per step, like vLLM's V2
            req_ids=list(self.req_ids),
            num_reqs=b,
            idx_mapping=self.idx_mapping[:b],
            positions=self.positions[: self.qsl_np[b]],
            query_start_loc=self.qsl[: b + 1],
        )
        out = propose(
            batch,
            None,
            None,
            None,
            None,
            self.ns_pool[i],
            self.nr_pool[i],
            self.last_sampled,
            self.next_prefill,
            None,
            None,
            num_speculative_tokens=self.step_fn.k,
        )
        self.last_sampled[:, 0].copy_(out[:, -1])  # the next anchors come from this step
        if self.device.type == "cuda":
            ev = torch.cuda.Event()
            ev.record()
            self.events.append(ev)
            if len(self.events) > 2:  # async scheduling: wait for the step before the last
                self.events.pop(0).synchronize()
        self.t += 1


class SyncCounter:
    """Counts explicit synchronize() calls and implicit syncs (sync debug mode warnings)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda, self.explicit, self.implicit = cuda, 0, 0

    def __enter__(self):
        self._saved = []
        if self.cuda:
            for owner, name in (
                (torch.cuda.Event, "synchronize"),
                (torch.cuda.Stream, "synchronize"),
                (torch.cuda, "synchronize"),
            ):
                orig = getattr(owner, name)
                self._saved.append((owner, name, orig))

                def wrapped(*a, _orig=orig, **kw):
                    self.explicit += 1
                    return _orig(*a, **kw)

                setattr(owner, name, wrapped)
            self._wctx = warnings.catch_warnings(record=True)
            self._log = self._wctx.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.set_sync_debug_mode("default")
            self.implicit = sum("synchroniz" in str(w.message).lower() for w in self._log)
            self._wctx.__exit__(*exc)
        for owner, name, orig in self._saved:
            setattr(owner, name, orig)


def measure(runner: Runner, propose, steps: int, warmup: int, cuda: bool) -> dict:
    for _ in range(warmup):
        runner.run_step(propose)
    if cuda:
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with SyncCounter(cuda) as sc:
        t0 = time.perf_counter()
        if cuda:
            e0.record()
        for _ in range(steps):
            runner.run_step(propose)
        if cuda:
            e1.record()
        wall_loop = time.perf_counter() - t0
    if cuda:
        torch.cuda.synchronize()
        gpu_ms = e0.elapsed_time(e1) / steps
    else:
        gpu_ms = float("nan")
    wall = (time.perf_counter() - t0) if cuda else wall_loop
    return {
        "step_ms": wall / steps * 1e3,
        "gpu_ms": gpu_ms,
        "syncs_per_step": (sc.explicit + sc.implicit) / steps,
        "explicit_syncs": sc.explicit,
        "implicit_syncs": sc.implicit,
    }


def torch_call_ns(t, samples: int = 21, calls: int = 200) -> float:
    """Median ns of one ``t.data_ptr()`` call (loops of ``calls``; the hot path's unit of
    cost: the in-graph tap makes ~22 such torch calls per step), measured beside each run:
    the host's speed varies 2-2.5x between runs, and host times divided by this compare
    across runs."""
    ns, xs = time.perf_counter_ns, []
    rng = range(calls)
    for _ in range(samples):
        t0 = ns()
        for _ in rng:
            t.data_ptr()
        xs.append((ns() - t0) / calls)
    return sorted(xs)[samples // 2]


def bench_one(config: str, batch: int, args, device) -> list[dict]:
    """Both modes on one model and batch size, interleaved ``args.repeats`` times (off,
    capture, off, capture, ...); each figure is the median over the repeats."""
    import statistics

    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if (config == "qwen3-8b" and cuda) else torch.float32
    model, vocab = make_model(config, device, dtype)
    k = args.k or model.cfg.block_size
    step = StaticDraftStep(model, batch, args.ctx, k, device, dtype)
    runner = Runner(step, vocab, device, use_graph=cuda and not args.eager)

    def make_session():
        if args.sink != "h5":
            return NullSession()
        tmp = tempfile.mkdtemp(prefix="bench_dspark_")
        return hook.Session(
            Path(tmp) / "bench.h5",
            {"engine": "bench", "method": "dspark", "k": k, "source": "bench"},
        )

    modes = args.modes.split(",")
    taps = {m: _timed_tap(runner, make_session(), m, args) for m in modes}
    for tap, host, propose in taps.values():  # compile the kernels, start the join thread
        for _ in range(args.warmup):
            runner.run_step(propose)
        tap.drain(wait=True)
        host[:] = _fresh_host()  # host time of the interleaved runs only (warmup included)
        if tap.drainer is not None:
            tap.drainer.busy_ns = 0
    runs: dict[str, list[dict]] = {"off": [], **{m: [] for m in modes}}
    for _ in range(args.repeats):
        for mode in runs:
            propose = runner.propose if mode == "off" else taps[mode][2]
            runs[mode].append(measure(runner, propose, args.steps, args.warmup, cuda))
            runs[mode][-1]["torch_call_ns"] = torch_call_ns(step.draft_tokens)
    from spectrace.hooks.vllm.v2 import stage as v2_stage

    launches = dict(v2_stage.launch_counts)
    rows = []
    for mode, rs in runs.items():
        r = {key: statistics.median(x[key] for x in rs) for key in rs[0]}
        r["syncs_per_step"] = max(x["syncs_per_step"] for x in rs)
        r.update(
            config=config,
            batch=batch,
            k=k,
            mode=mode,
            dtype=str(dtype).replace("torch.", ""),
            graph=runner.graph is not None,
            tok_s=batch * k / (r["step_ms"] / 1e3),
            repeats=args.repeats,
        )
        rows.append(r)
    off = rows[0]
    for on in rows[1:]:
        tap, host, _ = taps[on["mode"]]
        steps = max(host[1], 1)
        joined = tap.drainer.busy_ns / 1e3 / steps if tap.drainer is not None else 0.0
        tap.session.close()  # stops the join thread, joins the rest
        on["capture_host_us"] = (host[0] - host[2]) / steps * 1e6
        on["capture_host_p50_us"] = statistics.median(host[3] or [0.0]) * 1e6
        on["capture_host_p90_us"] = sorted(host[3] or [0.0])[int(len(host[3]) * 0.9)] * 1e6
        if args.profile:  # thread CPU of the tap and its parts, median us per call
            on["profile_p50_us"] = {
                "tap_cpu": statistics.median(host[4] or [0.0]) * 1e6,
                **{n: statistics.median(v) * 1e6 for n, v in host[5].items()},
            }
        g = tap.graph
        on["graph_stage"] = None if g is None else {"captures": g.captures, "lost": g.lost}
        if g is not None and g.lost:
            raise SystemExit(f"bench: in-graph staging lost {g.lost} descriptors")
        on["join_thread_us"] = joined
        on["sync_waits"] = tap.sync_waits
        on["launch_counts"] = launches  # cumulative over the process (direct vs kernel[grid])
        on["blocks"] = tap.session.blocks
        on["overhead_pct"] = (on["step_ms"] - off["step_ms"]) / off["step_ms"] * 100
        on["gpu_overhead_pct"] = (
            (on["gpu_ms"] - off["gpu_ms"]) / off["gpu_ms"] * 100 if cuda else float("nan")
        )
        on["added_syncs_per_step"] = on["syncs_per_step"] - off["syncs_per_step"]
    del model, step, runner
    if cuda:
        torch.cuda.empty_cache()
    return rows


#: Capture modes: ``capture``, the drafter's graph stages the rows (the tap writes one
#: descriptor per step: :mod:`spectrace.hooks.vllm.v2.graph_stage`); ``launch``, the default
#: path (one staging launch from Python after each ``propose``). ``before-MODE``: the same
#: mode with the tap of the ``--before`` checkout, in the same run.
MODES = ("capture", "launch")


def _timed_tap(runner: Runner, session, mode: str, args):
    """``(tap, host, propose)``: a ProposeTap on its own speculator object wrapping
    ``runner.propose`` (which stays bare), or the hooked propose in mode ``capture``;
    ``host`` is ``[seconds in the tap's propose, calls, seconds in the original propose,
    per-step tap seconds, per-step tap thread-CPU seconds (``--profile``), parts]``
    (tap host time = the difference: everything the tap adds on the runner's thread)."""
    kw = {} if args.flush_steps is None else {"flush_steps": args.flush_steps}
    host = _fresh_host()
    inner = [runner.propose]  # the hooked propose in mode capture, once the tap exists
    cpu_ns = time.thread_time_ns if args.profile else None

    perf = time.perf_counter  # bound once: the wrappers' own time is counted as the tap's

    @functools.wraps(runner.propose)  # the signature the tap resolves
    def timed_inner(*a, **kw):  # the original propose, timed (subtracted)
        t0 = perf()  # first and last: the wrapper's bookkeeping falls inside (subtracted)
        c0 = cpu_ns() if cpu_ns else 0
        try:
            return inner[0](*a, **kw)
        finally:
            if cpu_ns:
                host[6] += cpu_ns() - c0
            host[2] += perf() - t0

    spec = SimpleNamespace(propose=timed_inner)
    mod = vllm_v2
    if mode.startswith("before-"):  # the other checkout's tap (--before), same run
        mod, mode = _BEFORE[0], mode[len("before-") :]
    tap = mod.ProposeTap(spec, session, background_join=args.join == "thread", **kw)
    if mode == "capture":  # captures the step's graph with the tap's staging launch
        inner[0] = runner.hooked(tap.stage_in_graph)
    if args.profile and mod is vllm_v2:
        _time_parts(tap)

    def timed_propose(*a, **kw):
        _PROFILED[0] = host
        inner0, cin0 = host[2], host[6]  # read before the clock: not the tap's time
        c0 = cpu_ns() if cpu_ns else 0
        t0 = perf()
        try:
            return tap.propose(*a, **kw)
        finally:
            dt = perf() - t0
            host[0] += dt
            host[1] += 1
            host[3].append(dt - (host[2] - inner0))
            if cpu_ns:
                host[4].append((cpu_ns() - c0 - (host[6] - cin0)) / 1e9)

    return tap, host, timed_propose


_BEFORE: list = [None]  # the --before checkout's tap module
_PROFILED: list = [None]  # the host list of the tap whose propose runs now (``--profile``)


def _fresh_host() -> list:
    return [0.0, 0, 0.0, [], [], {}, 0]


def _time_parts(tap) -> None:
    """``--profile``: per-call seconds of the tap's parts (``record``; the in-graph
    descriptor write; the launched staging) into the running tap's ``host[5]`` (name -> list,
    :data:`_PROFILED`); each wrapper
    adds ~0.2 us to the tap's time."""
    from spectrace.hooks.vllm.v2 import graph_stage

    def timed(name, fn):
        def wrapped(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                _PROFILED[0][5].setdefault(name, []).append(time.perf_counter() - t0)

        return wrapped

    tap.record = timed("record", tap.record)
    if not getattr(graph_stage.GraphStage.write, "_timed", False):
        graph_stage.GraphStage.write = timed("write", graph_stage.GraphStage.write)
        graph_stage.GraphStage.write._timed = True
    if not getattr(vllm_v2.stage_triton, "_timed", False):
        vllm_v2.stage_triton = timed("launch", vllm_v2.stage_triton)
        vllm_v2.stage_triton._timed = True


def stage_micro(batch: int = 64, k: int = 7, n_iter: int = 2000) -> dict:
    """Host and device microseconds per staging launch, four ways: the Triton kernel
    through its compiled launcher (what the capture path uses on CUDA), the same through
    ``kernel[grid](...)``, the torch-op fallback, and a CUDA graph holding the
    torch ops over static inputs (the alternative; its input copies not counted). Device time
    is from a graph of 50 launches replayed (pure kernel time, no launch gaps from the host)."""
    from spectrace.hooks.vllm.v2 import stage as v2_stage

    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    ns = torch.randint(1, k + 2, (batch,), generator=g, dtype=torch.int32).to(dev)
    nr = (k + 1 - ns).to(dev)
    idx = torch.arange(batch, dtype=torch.int32, device=dev)
    qsl = (torch.arange(batch + 1) * (k + 1)).to(torch.int32).to(dev)
    pos = torch.arange(batch * (k + 1), device=dev)
    last = torch.randint(0, 150000, (batch, 1), generator=g).to(dev)
    nxt = torch.zeros((1, batch), dtype=torch.int32, device=dev)
    drafts = torch.randint(0, 150000, (batch, k), generator=g).to(dev)
    ring = torch.zeros((batch * 32, 4 + k), dtype=torch.int32, device=dev)
    args = (ns, nr, idx, qsl, pos, last, nxt, drafts)

    def jit(i):  # the plain kernel[grid](...) call, as before the direct launch path
        v2_stage.DIRECT = False
        try:
            return v2_stage.stage_triton(ring, (i % 32) * batch, batch, *args)
        finally:
            v2_stage.DIRECT = True

    ways = {
        "triton": lambda i: v2_stage.stage_triton(ring, (i % 32) * batch, batch, *args),
        "triton jit": jit,
        "torch": lambda i: v2_stage.stage_torch(ring[(i % 32) * batch :], batch, *args),
    }
    static = ring[:batch]
    graph = torch.cuda.CUDAGraph()
    for _ in range(3):
        v2_stage.stage_torch(static, batch, *args)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        v2_stage.stage_torch(static, batch, *args)
    ways["torch graph"] = lambda i: graph.replay()
    out = {}
    for name, fn in ways.items():
        for i in range(50):
            fn(i)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for i in range(n_iter):
            fn(i)
            if i % 256 == 255:  # keep the launch queue short
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        host_us = (time.perf_counter() - t0) / n_iter * 1e6
        dev_us = float("nan")
        if name != "torch graph":
            g50 = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g50):
                for i in range(50):
                    fn(i)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            g50.replay()
            e0.record()
            for _ in range(10):
                g50.replay()
            e1.record()
            torch.cuda.synchronize()
            dev_us = e0.elapsed_time(e1) * 1e3 / 500
        out[name] = {"host_us": host_us, "dev_us": dev_us}
    out["in-graph"] = _in_graph_micro(ring, batch, args, drafts)
    print(
        f"staging launch, batch {batch}, k {k}: "
        + "; ".join(
            f"{n} host {v['host_us']:.1f} us, device {v['dev_us']:.2f} us" for n, v in out.items()
        )
    )
    return out


def _in_graph_micro(ring, batch: int, args: tuple, drafts) -> dict:
    """Host us per descriptor write and device us per launch of the in-graph staging kernel
    (:mod:`spectrace.hooks.vllm.v2.graph_stage`): a graph of 50 launches, replayed after the
    host wrote their 50 descriptors (``SLOTS`` bounds how many it may write ahead)."""
    from spectrace.hooks.vllm.v2.graph_stage import GraphStage

    st = GraphStage(drafts.device)
    n = min(50, GraphStage.SLOTS)
    for _ in range(3):  # compiles; eager launches write their own descriptors
        st.launch(drafts)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n):
            st.launch(drafts)

    def fill() -> float:
        t0 = time.perf_counter()
        for i in range(n):
            st.write(ring.data_ptr(), ring.stride(0), (i % 32) * batch, batch, args[:7])
        st.end_call()
        return time.perf_counter() - t0

    fill()
    graph.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    dev, host = [], []
    for _ in range(20):
        host.append(fill() / n * 1e6)
        e0.record()
        graph.replay()
        e1.record()
        torch.cuda.synchronize()
        dev.append(e0.elapsed_time(e1) * 1e3 / n)
    assert st.lost == 0, st.lost
    return {"host_us": sorted(host)[10], "dev_us": sorted(dev)[10]}


def print_table(rows: list[dict]) -> None:
    head = (
        f"{'config':<9} {'batch':>5} {'k':>2} {'mode':<8} {'graph':<5} {'step ms':>9} "
        f"{'dev ms':>8} {'draft tok/s':>12} {'syncs/step':>10} {'waits':>5} {'overhead':>9} "
        f"{'tap host us':>11} {'join us':>7}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        ov = f"{r['overhead_pct']:+8.2f}%" if "overhead_pct" in r else ""
        print(
            f"{r['config']:<9} {r['batch']:>5} {r['k']:>2} {r['mode']:<8} {str(r['graph']):<5} "
            f"{r['step_ms']:>9.4f} {r['gpu_ms']:>8.4f} {r['tok_s']:>12.0f} "
            f"{r['syncs_per_step']:>10.2f} {r.get('sync_waits', ''):>5} {ov:>9} "
            f"{r.get('capture_host_us', float('nan')):>11.1f} "
            f"{r.get('join_thread_us', float('nan')):>7.1f}"
        )


def summarize(rows: list[dict], micro: dict | None) -> None:
    """Per mode: overhead per batch, added syncs, ring waits, the tap's host us per step
    (mean, median, p90) and, with ``--profile``, its parts; the in-graph kernel's device
    share of each step."""
    modes = list(dict.fromkeys(r["mode"] for r in rows if r["mode"] != "off"))
    for mode in modes:
        rs = [r for r in rows if r["mode"] == mode]
        added = max(r["added_syncs_per_step"] for r in rs)
        waits = max(r["sync_waits"] for r in rs)
        print(f"\nmode {mode}: added host syncs per step {added:+.2f}, ring waits {waits}")
        for c in dict.fromkeys(r["config"] for r in rs):
            cr = [r for r in rs if r["config"] == c]
            print(
                f"  {c}: overhead per batch "
                + ", ".join(f"b{r['batch']} {r['overhead_pct']:+.2f}%" for r in cr)
                + "; tap host us/step median (mean, p90) [median in data_ptr() calls] "
                + ", ".join(
                    f"b{r['batch']} {r['capture_host_p50_us']:.1f} "
                    f"({r['capture_host_us']:.1f}, {r['capture_host_p90_us']:.1f}) "
                    f"[{r['capture_host_p50_us'] * 1e3 / r['torch_call_ns']:.0f}]"
                    for r in cr
                )
            )
            for r in cr:
                if "profile_p50_us" in r:
                    parts = ", ".join(f"{n} {v:.1f}" for n, v in r["profile_p50_us"].items())
                    print(f"    profile p50 us, b{r['batch']}: {parts}")
    if micro:  # device work the in-graph capture adds per step: one staging kernel
        offs = {(r["config"], r["batch"]): r["gpu_ms"] for r in rows if r["mode"] == "off"}
        dev_us = micro["in-graph"]["dev_us"]
        print(
            f"  in-graph kernel device time {dev_us:.2f} us per step (batch 64): "
            + ", ".join(f"{c} b{b} {dev_us / (ms * 1e3) * 100:.2f}%" for (c, b), ms in offs.items())
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=["tiny", "qwen3-8b", "all"], default="all")
    ap.add_argument("--batch", default="1,8,32,64", help="comma-separated batch sizes")
    ap.add_argument("--k", type=int, default=None, help="drafts per step (default: the block size)")
    ap.add_argument("--ctx", type=int, default=512, help="context tokens per request (KV cache)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved off/capture runs (median)")
    ap.add_argument(
        "--sink",
        choices=["h5", "null"],
        default=None,
        help="where captured blocks go (default: h5 when h5py imports, else null)",
    )
    ap.add_argument("--eager", action="store_true", help="no CUDA graph (for comparison)")
    ap.add_argument(
        "--flush-steps", type=int, default=None, help="steps per ring segment (default: the tap's)"
    )
    ap.add_argument(
        "--modes",
        default=",".join(MODES),
        help="capture modes, comma-separated (before-MODE: the --before checkout's tap)",
    )
    ap.add_argument(
        "--before", type=Path, default=None, help="another checkout, for modes before-MODE"
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    ap.add_argument("--no-cpu-fallback", action="store_true")
    ap.add_argument(
        "--no-micro",
        action="store_true",
        help="skip the staging-launch micro "
        "benchmark (Triton vs torch ops vs a CUDA graph of them)",
    )
    ap.add_argument(
        "--join", choices=["thread", "inline"], default="thread", help="the tap's join thread"
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also time the tap's parts and its thread CPU (adds ~1 us per step)",
    )
    ap.add_argument("--poll-ms", type=float, default=None, help="override Drainer.POLL_S")
    ap.add_argument("--switch-us", type=float, default=None, help="override Drainer.SWITCH_S")
    args = ap.parse_args(argv)
    if args.before is not None:
        _BEFORE[0] = import_before(args.before.resolve())
    from spectrace.hooks.vllm.v2.drainer import Drainer

    if args.poll_ms is not None:
        Drainer.POLL_S = args.poll_ms / 1e3
    if args.switch_us is not None:
        Drainer.SWITCH_S = args.switch_us / 1e6
    if args.sink is None:
        try:
            import h5py  # noqa: F401

            args.sink = "h5"
        except ImportError:
            args.sink = "null"
    configs = ["tiny", "qwen3-8b"] if args.config == "all" else [args.config]
    batches = [int(b) for b in args.batch.split(",")]
    if torch.cuda.is_available():
        device = torch.device("cuda")
        print(
            f"bench: {torch.cuda.get_device_name()} torch {torch.__version__}, sink {args.sink}, "
            f"ctx {args.ctx}, {args.steps} steps after {args.warmup} warmup, median of "
            f"{args.repeats} interleaved runs per mode",
            flush=True,
        )
    else:
        msg = (
            "bench: no CUDA device: this benchmark measures a CUDA-graph replay and needs a GPU. "
            "Running a CPU smoke test of the same code instead (eager, tiny, batch 2, "
            "5 steps); these are not GPU figures."
        )
        print(msg, file=sys.stderr)
        if args.no_cpu_fallback:
            return 2
        device = torch.device("cpu")
        configs, batches = ["tiny"], [2]
        args.steps, args.warmup, args.repeats = 5, 2, 1
    rows = []
    micro = stage_micro() if device.type == "cuda" and not args.no_micro else None
    for config in configs:
        for b in batches:
            rows += bench_one(config, b, args, device)
            print(f"bench: {config} batch {b} done", file=sys.stderr, flush=True)
    print_table(rows)
    summarize(rows, micro)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "staging_micro": micro}, indent=2))
    on = [r for r in rows if r["mode"] != "off"]
    added = max(r["added_syncs_per_step"] for r in on)
    waits = max(r["sync_waits"] for r in on)
    ok = device.type != "cuda" or (added <= 0 and waits == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
