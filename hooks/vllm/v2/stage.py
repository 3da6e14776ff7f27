"""Staging of one V2 ``propose`` step into a row block: one Triton launch on CUDA, torch ops
elsewhere.

Each row i (request ``input_batch.req_ids[i]``, slot ``idx_mapping[i]``) of a step becomes
``int32 [4 + K]``::

    num_sampled[i], num_rejected[i],
    anchor   = last_sampled[slot] if num_sampled[i] > 0 else next_prefill_tokens[slot],
    position = positions[query_start_loc[i + 1] - 1 - num_rejected[i]] + 1,
    drafts[i, :K]

These are the reads of vLLM 0.32's V2 prepare step (``vllm/v1/worker/gpu/spec_decode/``,
the DFlash/DSpark ``prepare_inputs`` kernels read the same anchor and position); token ids and
positions fit int32, which halves the device-to-host traffic. The Triton kernel
(:func:`stage_triton`) does all gathers in one launch and writes straight into a row range of
the caller's device ring; :func:`stage_torch` is the same with torch ops (CPU devices, and the
fallback where Triton is missing or an input has a layout the kernel does not take).

Launch cost. ``kernel[grid](...)`` spends ~20 us of host time in Triton's Python
(``JITFunction.run``: argument binding, specialisation, cache key, launch metadata) before its
compiled launcher runs. :func:`stage_triton` calls that compiled launcher directly
(``CompiledKernel.run``, with the arguments ``JITFunction.run`` passes it in Triton 3.3 to
3.9: grid, stream, function, packed metadata, launch metadata, the two launch hooks, then every
kernel parameter in order, constexprs included) once the normal call has returned the
``CompiledKernel`` for the same specialisation key (:func:`_spec_key`). Anything unexpected
(a launch hook installed, a pre-run hook, a missing attribute, an error from the launcher, a
Triton outside 3.x) sends the launch through ``kernel[grid](...)``.

Two of Triton's knobs that the specialisation key holds (``knobs.runtime.debug``,
``knobs.compilation.instrumentation_mode``) are descriptors that read the environment on every
access: the direct path reads them once per :data:`KNOB_REFRESH` launches (:func:`_knob_state`),
so a change of ``TRITON_DEBUG`` mid-run takes effect within that many launches. The launch hooks
are checked at every launch.
"""

from __future__ import annotations

from .row_layout import META_COLS

_kernel = None  # the Triton kernel, imported on first CUDA use (keeps CPU imports light)


def _triton_kernel():
    """``spectrace.hooks.vllm.v2.stage_triton._stage_kernel``, or False without a usable Triton."""
    global _kernel
    if _kernel is None:
        try:
            from .stage_triton import BLOCK, _stage_kernel

            _kernel = (_stage_kernel, BLOCK)
        except Exception:  # no Triton, or a broken install: the torch path
            _kernel = False
    return _kernel


def triton_ok(t) -> bool:
    """True when :func:`stage_triton` can run on tensor ``t``'s device."""
    return t.is_cuda and bool(_triton_kernel())


_UNIT = (1,)


def _row_strides(strides: tuple) -> tuple | None:
    """The kernels' rule on the seven inputs' ``stride()`` tuples (:func:`input_ptrs`'
    order): ``(last_stride, nxt_stride)``, the element stride of ``last_sampled``'s column
    0 (its ``stride(0)``) and of ``next_prefill_tokens``' row 0 (its last stride; 1-D or
    2-D), or None when the first five are not 1-D with stride 1 or ``last``/``nxt`` not 1-D
    or 2-D."""
    s_ns, s_nr, s_idx, s_qsl, s_pos, ls, xs = strides
    if s_ns != _UNIT or s_nr != _UNIT or s_idx != _UNIT or s_qsl != _UNIT or s_pos != _UNIT:
        return None
    if not (0 < len(ls) < 3 and 0 < len(xs) < 3):
        return None
    return ls[0], xs[-1]


def input_layout(inputs: tuple) -> tuple | None:
    """Pointers and row strides of one step's staging inputs, as both staging kernels take
    them (:func:`stage_triton`; the in-graph descriptor of :mod:`.graph_stage` reads the
    same through :func:`desc_layout`).

    Args:
        inputs: ``(ns, nr, idx, qsl, positions, last, nxt)``, the tensors of
            :func:`stage_triton` (int32 or int64 each).
    Returns:
        ``(ptr_ns, ptr_nr, ptr_idx, ptr_qsl, ptr_positions, ptr_last, ptr_nxt, last_stride,
        nxt_stride)``, flat: the seven ``data_ptr()`` in :func:`input_ptrs`' order and
        :func:`_row_strides`' two strides; None when an input's layout is not the kernels'
        (see :func:`_row_strides`).
    """
    lay = _row_strides(tuple([t.stride() for t in inputs]))
    return None if lay is None else (*input_ptrs(inputs), *lay)


def layout_key(inputs: tuple) -> tuple:
    """What :func:`desc_layout` is a function of: the seven inputs' dtypes, then their
    ``stride()`` tuples (the dimension counts with them), in :func:`input_ptrs`' order."""
    # off the hot path (a guard miss): written plainly
    return tuple([t.dtype for t in inputs]) + tuple([t.stride() for t in inputs])


def desc_layout(key: tuple) -> tuple | None:
    """The in-graph descriptor's fields after the seven pointers (``DESC_FIELDS``:
    ``last_stride``, ``nxt_stride``, ``wide``, ``spare``) for a :func:`layout_key`; None when
    the kernels do not take that layout (:func:`_row_strides`) or an input is neither int32
    nor int64 (``wide`` bit i: input i is int64)."""
    import torch

    lay = _row_strides(key[7:])
    if lay is None:
        return None
    wide = 0
    for i, dt in enumerate(key[:7]):
        if dt is torch.int64:
            wide |= 1 << i
        elif dt is not torch.int32:
            return None
    return (*lay, wide, 0)


class InputLayouts:
    """:func:`desc_layout` of each step's inputs, with their dtypes and strides checked
    afresh at every call (nothing is trusted by tensor identity: a re-strided or retyped
    buffer gets its own layout, or None).

    The check is one C call where torch has it: a ``TensorGuards`` of the last layout seen
    (``torch._C._dynamo.guards``, the check ``torch.compile`` runs on a compiled
    function's tensors: each tensor's dtype, device, dimensions, requires-grad, dispatch keys
    and, as given here, its exact strides, sizes left free), ~0.7 us for the seven inputs
    where the 14 ``dtype``/``stride()`` reads cost ~1.7 us on this project's CPU machine.
    When it fails (another layout, or another dispatch state) the layout is read the plain
    way (:func:`layout_key`, looked up per key) and a guard of it is made; after
    :attr:`MISSES` failures, or without the class, only the plain way is used.

    Attributes:
        guard: the ``TensorGuards`` of the last layout read, or None (the hot path of
            :meth:`.graph_stage.GraphStage.write` runs :meth:`of`'s check itself).
        lay: that layout's :func:`desc_layout`.
    """

    MISSES = 8  # failed guard checks before guards are given up (layouts should not churn)
    KEYS = 64  # distinct layouts remembered (the cache is emptied past that)

    def __init__(self) -> None:
        self._by_key: dict[tuple, tuple | None] = {}
        self.guard = None  # a TensorGuards of the last layout, or None
        self.lay: tuple | None = None  # that layout's desc_layout
        self._misses = 0
        self._guards = _tensor_guards()  # the class, or None: the plain way only

    def of(self, inputs: tuple) -> tuple | None:
        """:func:`desc_layout` of ``inputs`` (``(ns, nr, idx, qsl, positions, last, nxt)``)."""
        guard = self.guard
        if guard is not None and guard.check(*inputs):
            return self.lay
        return self.read(inputs)

    def read(self, inputs: tuple) -> tuple | None:
        """The plain way, then a guard of the layout read (when guards are in use)."""
        key = layout_key(inputs)
        if key in self._by_key:
            lay = self._by_key[key]
        else:
            if len(self._by_key) >= self.KEYS:
                self._by_key.clear()
            lay = self._by_key[key] = desc_layout(key)
        if self.guard is not None:
            self._misses += 1
        self.guard, self.lay = None, lay
        if lay is not None and self._guards is not None and self._misses < self.MISSES:
            try:
                self.guard = self._guards(
                    *inputs,
                    dynamic_dims_sizes=[[None] * len(st) for st in key[7:]],
                    dynamic_dims_strides=[list(st) for st in key[7:]],
                )
            except Exception:  # another torch's signature: the plain way from now on
                self._guards = None
        return lay


def _tensor_guards():
    """``torch._C._dynamo.guards.TensorGuards``, or None where this torch lacks it."""
    try:
        import torch

        return torch._C._dynamo.guards.TensorGuards
    except Exception:
        return None


def input_ptrs(inputs: tuple) -> tuple:
    """The ``data_ptr()`` of ``(ns, nr, idx, qsl, positions, last, nxt)``, in that order."""
    ns, nr, idx, qsl, positions, last, nxt = inputs
    return (
        ns.data_ptr(),
        nr.data_ptr(),
        idx.data_ptr(),
        qsl.data_ptr(),
        positions.data_ptr(),
        last.data_ptr(),
        nxt.data_ptr(),
    )


#: Launch counts by path (tests and benchmarks read them; never reset by this module).
launch_counts = {"direct": 0, "jit": 0}
#: ``False`` forces every launch through ``kernel[grid](...)`` (A/B checks).
DIRECT = True

_I32 = 1 << 31
#: Direct launches between two reads of Triton's knobs (see the module doc).
KNOB_REFRESH = 256
_knobs_cache: list = [0, None]  # [launches left before the next read, (debug, instr)]
_launchers: dict = {}  # specialisation key -> (run, function, packed metadata), or None: JIT
_triton_rt = None  # (driver, knobs) once the kernel is imported; False: no direct path


def _runtime():
    """``(triton.runtime.driver.active, triton.knobs)`` for a Triton 3.x, else False."""
    global _triton_rt
    if _triton_rt is None:
        try:
            import triton
            from triton import knobs
            from triton.runtime import driver

            major = int(triton.__version__.split(".")[0])
            _triton_rt = (driver.active, knobs) if major == 3 else False
        except Exception:  # an older Triton (no knobs module) or a broken install
            _triton_rt = False
    return _triton_rt


def _hooks_idle(kernel, knobs) -> bool:
    """True when no launch hook (profilers use them) and no pre-run hook is installed: the
    direct launch then does what ``JITFunction.run`` does (Triton 3.6 keeps empty
    ``HookChain`` objects, 3.9 ``None``)."""
    rt = knobs.runtime
    for hook in (rt.launch_enter_hook, rt.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return False
    return not getattr(kernel, "pre_run_hooks", None)


def _knob_state(knobs) -> tuple:
    """``(debug, instrumentation mode)``, re-read every :data:`KNOB_REFRESH` calls."""
    c = _knobs_cache
    if c[0] <= 0 or c[1] is None:
        c[1] = (knobs.runtime.debug, getattr(knobs.compilation, "instrumentation_mode", None))
        c[0] = KNOB_REFRESH
    c[0] -= 1
    return c[1]


def _spec_key(dev: int, tensors: tuple, ptrs: tuple, k: int, knob_state: tuple) -> tuple:
    """A key at least as fine as Triton's specialisation of the staging kernel.

    Triton specialises a launch on: each pointer's dtype and 16-byte alignment, each
    specialised integer's value class (``== 1``, ``% 16 == 0``, 32/64-bit), the constexprs
    (K, KP, BLOCK) and the compile options (``debug``, ``instrumentation_mode`` from knobs);
    the kernel cache is per device. This key holds the device, every tensor's dtype and
    strides (the integer arguments are strides), the alignment of every pointer, K and
    those knobs, so two launches with the same key use the same ``CompiledKernel``.
    """
    out, ns, nr, idx, qsl, positions, last, nxt, drafts = tensors
    aligned = (
        not (
            ptrs[0] | ptrs[1] | ptrs[2] | ptrs[3] | ptrs[4] | ptrs[5] | ptrs[6] | ptrs[7] | ptrs[8]
        )
        & 15
    )
    return (
        dev,
        k,
        aligned or tuple([p & 15 == 0 for p in ptrs]),
        knob_state[0],
        knob_state[1],
        out.dtype,
        ns.dtype,
        nr.dtype,
        idx.dtype,
        qsl.dtype,
        positions.dtype,
        last.dtype,
        nxt.dtype,
        drafts.dtype,
        out.stride(),
        ns.stride(),
        nr.stride(),
        idx.stride(),
        qsl.stride(),
        positions.stride(),
        last.stride(),
        nxt.stride(),
        drafts.stride(),
    )


def _ends_ok(out, drafts) -> bool:
    """The kernel's layout of ``out`` and ``drafts``: 2-D, unit column stride (the inputs'
    layout is :func:`input_layout`'s)."""
    return drafts.dim() == 2 and drafts.stride(1) == 1 and out.dim() == 2 and out.stride(1) == 1


def stage_triton(out, row0: int, n: int, ns, nr, idx, qsl, positions, last, nxt, drafts) -> bool:
    """Write rows ``row0 .. row0 + n - 1`` of ``out`` (int32 ``[R, >= 4 + K]``, contiguous
    rows) from one step's inputs, in one kernel launch on the current stream.

    Args: ``ns``/``nr`` int ``[>= n]`` (num_sampled/num_rejected), ``idx`` int ``[>= n]``
    (idx_mapping), ``qsl`` int ``[>= n + 1]`` (query_start_loc), ``positions`` int
    ``[tokens]``, ``last`` int ``[slots]`` or ``[slots, W]`` (last_sampled; column 0 is
    read), ``nxt`` int ``[slots]`` or ``[W, slots]`` (next_prefill_tokens; row 0),
    ``drafts`` int ``[>= n, K]``; all on the current CUDA device.

    The launch goes through Triton's compiled launcher directly when a ``CompiledKernel`` for
    this specialisation (:func:`_spec_key`) is known and no hook is installed, else through
    ``kernel[grid](...)`` (which compiles on first use); both launch the same binary with the
    same arguments. ``launch_counts`` counts the two paths.

    Returns:
        False (nothing launched) when an input's layout is not what the kernel takes
        (a 1-D input with a stride other than 1, drafts with a column stride other than 1);
        the caller then uses :func:`stage_torch`.
    """
    tensors = (out, ns, nr, idx, qsl, positions, last, nxt, drafts)
    kernel, block = _triton_kernel()
    k = drafts.shape[1]
    rt = _runtime() if DIRECT else False
    key = None
    if (
        rt
        and row0 + n < _I32
        and out.is_cuda
        and ns.is_cuda
        and nr.is_cuda
        and idx.is_cuda
        and qsl.is_cuda
        and positions.is_cuda
        and last.is_cuda
        and nxt.is_cuda
        and drafts.is_cuda
    ):
        key, launched = _launch_direct(rt, kernel, block, tensors, row0, n, k)
        if launched:
            return True
    lay = input_layout(tensors[1:8])
    if lay is None or not _ends_ok(out, drafts):
        return False
    strides = (out.stride(0), lay[7], lay[8], drafts.stride(0))
    kp = 1 << max(k - 1, 0).bit_length()
    compiled = kernel[((n + block - 1) // block,)](
        out,
        strides[0],
        row0,
        n,
        ns,
        nr,
        idx,
        qsl,
        positions,
        last,
        strides[1],
        nxt,
        strides[2],
        drafts,
        strides[3],
        K=k,
        KP=kp,
        BLOCK=block,
    )
    launch_counts["jit"] += 1
    if key is not None and key not in _launchers:
        _launchers[key] = _direct_entry(compiled, strides, kp)
    return True


def _launch_direct(rt, kernel, block: int, tensors: tuple, row0: int, n: int, k: int):
    """Launch through the compiled launcher cached for this specialisation, if any.

    Returns ``(key, launched)``: the specialisation key (for the caller to cache the launcher
    of a normal launch) and whether the kernel ran. An unexpected launcher disables direct
    launches from then on (the caller launches normally).
    """
    drv, knobs = rt
    out, drafts = tensors[0], tensors[8]
    ptrs = (out.data_ptr(), *input_ptrs(tensors[1:8]), drafts.data_ptr())
    dev = drv.get_current_device()
    key = _spec_key(dev, tensors, ptrs, k, _knob_state(knobs))
    entry = _launchers.get(key)
    if entry is None or not _hooks_idle(kernel, knobs):
        return key, False
    run, function, packed, strides, kp = entry
    args = (
        ptrs[0],
        strides[0],
        row0,
        n,
        *ptrs[1:7],
        strides[1],
        ptrs[7],
        strides[2],
        ptrs[8],
        strides[3],
        k,
        kp,
        block,
    )  # the kernel's parameter order
    try:
        run(
            (n + block - 1) // block,
            1,
            1,
            drv.get_current_stream(dev),
            function,
            packed,
            None,
            None,
            None,
            *args,
        )
    except Exception:  # an unexpected launcher: launch normally from now on
        _disable_direct()
        return key, False
    launch_counts["direct"] += 1
    return key, True


def _direct_entry(compiled, strides: tuple, kp: int):
    """What a direct launch needs from the ``CompiledKernel`` the normal call returned, or
    None (this key always launches normally) when it lacks any of it."""
    try:
        run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
    except Exception:
        return None
    return (run, function, packed, strides, kp) if callable(run) else None


def _disable_direct() -> None:
    """Every later launch goes through ``kernel[grid](...)``."""
    global _triton_rt
    _launchers.clear()
    _knobs_cache[1] = None
    _triton_rt = False


def stage_torch(out, n: int, ns, nr, idx, qsl, positions, last, nxt, drafts) -> None:
    """The torch-op version of :func:`stage_triton`: writes ``out[:n, :4 + K]`` (``out``
    is the destination row block itself, any integer dtype, any device)."""
    import torch

    last = last[:, 0] if last.dim() == 2 else last
    nxt = nxt[0] if nxt.dim() == 2 else nxt
    ns, nr = ns[:n], nr[:n]
    k = int(drafts.shape[1])
    with torch.inference_mode():
        i = idx[:n].long()
        out[:n, 0] = ns
        out[:n, 1] = nr
        out[:n, 2] = torch.where(ns > 0, last[i].long(), nxt[i].long())
        q_last = qsl[1 : n + 1].long() - 1 - nr.long()
        out[:n, 3] = positions[q_last.clamp_min(0)].long() + 1
        out[:n, META_COLS : META_COLS + k] = drafts[:n, :k]
