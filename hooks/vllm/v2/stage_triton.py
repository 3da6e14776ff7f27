"""The Triton staging kernel of :mod:`spectrace.hooks.vllm.v2.stage` (imported only on CUDA)."""

import triton
import triton.language as tl

BLOCK = 128  # rows per program


@triton.jit(do_not_specialize=["row0", "n"])
def _stage_kernel(
    out_ptr,
    out_stride,
    row0,
    n,
    ns_ptr,
    nr_ptr,
    idx_ptr,
    qsl_ptr,
    pos_ptr,
    last_ptr,
    last_stride,
    nxt_ptr,
    nxt_stride,
    drafts_ptr,
    drafts_stride,
    K: tl.constexpr,
    KP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = rows < n
    ns = tl.load(ns_ptr + rows, mask=m, other=0).to(tl.int64)
    nr = tl.load(nr_ptr + rows, mask=m, other=0).to(tl.int64)
    slot = tl.load(idx_ptr + rows, mask=m, other=0).to(tl.int64)
    last = tl.load(last_ptr + slot * last_stride, mask=m & (ns > 0), other=0)
    nxt = tl.load(nxt_ptr + slot * nxt_stride, mask=m & (ns <= 0), other=0)
    anchor = tl.where(ns > 0, last.to(tl.int64), nxt.to(tl.int64))
    q = tl.load(qsl_ptr + rows + 1, mask=m, other=1).to(tl.int64) - 1 - nr
    pos = tl.load(pos_ptr + tl.maximum(q, 0), mask=m, other=0).to(tl.int64) + 1
    base = out_ptr + (row0 + rows).to(tl.int64) * out_stride
    tl.store(base + 0, ns.to(tl.int32), mask=m)
    tl.store(base + 1, nr.to(tl.int32), mask=m)
    tl.store(base + 2, anchor.to(tl.int32), mask=m)
    tl.store(base + 3, pos.to(tl.int32), mask=m)
    cols = tl.arange(0, KP)
    cm = m[:, None] & (cols[None, :] < K)
    d = tl.load(
        drafts_ptr + rows[:, None].to(tl.int64) * drafts_stride + cols[None, :], mask=cm, other=-1
    )
    tl.store(base[:, None] + 4 + cols[None, :], d.to(tl.int32), mask=cm)  # META_COLS


#: int64 words per descriptor of :mod:`.graph_stage` (the field order of ``DESC_FIELDS``).
DESC_W = 16


@triton.jit
def _ld(p, wide, bit: tl.constexpr, offs, m):
    """``p[offs]`` as int64, ``p`` an int32 (bit ``bit`` of ``wide`` clear) or int64 array."""
    is64 = ((wide >> bit) & 1) != 0
    is32 = ((wide >> bit) & 1) == 0
    v64 = tl.load(p.to(tl.pointer_type(tl.int64)) + offs, mask=m & is64, other=0)
    v32 = tl.load(p.to(tl.pointer_type(tl.int32)) + offs, mask=m & is32, other=0)
    return tl.where(is64, v64, v32.to(tl.int64))


@triton.jit
def _ring_stage_kernel(
    desc_ptr,
    ctl_ptr,
    counter_ptr,
    drafts_ptr,
    drafts_stride,
    drafts_rows,
    A: tl.constexpr,
    K: tl.constexpr,
    KP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program: the descriptor ``desc[counter[0] % A]`` (pinned host memory, written by
    the host before the launch or graph replay; read in one uncached load) names this step's
    inputs and destination; when its sequence number equals the device counter, its ``n``
    rows are staged like :func:`_stage_kernel`'s, else nothing is written and ``counter[1]``
    (lost descriptors) grows. Then ``counter[0]`` grows by one, and both counters are
    written to ``ctl`` (pinned host memory: posted writes, the host reads them)."""
    c = tl.load(counter_ptr)
    lost = tl.load(counter_ptr + 1)
    d = desc_ptr + (c % A) * 16  # DESC_W; uncached scalar loads, issued together
    ok = tl.load(d, cache_modifier=".cv") == c
    n = tl.minimum(tl.where(ok, tl.load(d + 1, cache_modifier=".cv"), 0), drafts_rows)
    out_p = tl.load(d + 2, cache_modifier=".cv").to(tl.pointer_type(tl.int32))
    out_stride = tl.load(d + 3, cache_modifier=".cv")
    row0 = tl.load(d + 4, cache_modifier=".cv")
    ns_p = tl.load(d + 5, cache_modifier=".cv")
    nr_p = tl.load(d + 6, cache_modifier=".cv")
    idx_p = tl.load(d + 7, cache_modifier=".cv")
    qsl_p = tl.load(d + 8, cache_modifier=".cv")
    pos_p = tl.load(d + 9, cache_modifier=".cv")
    last_p = tl.load(d + 10, cache_modifier=".cv")
    last_stride = tl.load(d + 11, cache_modifier=".cv")
    nxt_p = tl.load(d + 12, cache_modifier=".cv")
    nxt_stride = tl.load(d + 13, cache_modifier=".cv")
    wide = tl.load(d + 14, cache_modifier=".cv")
    cols = tl.arange(0, KP)
    for b in range(0, n, BLOCK):
        rows = b + tl.arange(0, BLOCK)
        m = rows < n
        ns = _ld(ns_p, wide, 0, rows, m)
        nr = _ld(nr_p, wide, 1, rows, m)
        slot = _ld(idx_p, wide, 2, rows, m)
        last = _ld(last_p, wide, 5, slot * last_stride, m & (ns > 0))
        nxt = _ld(nxt_p, wide, 6, slot * nxt_stride, m & (ns <= 0))
        anchor = tl.where(ns > 0, last, nxt)
        q = _ld(qsl_p, wide, 3, rows + 1, m) - 1 - nr
        pos = _ld(pos_p, wide, 4, tl.maximum(q, 0), m) + 1
        base = out_p + (row0 + rows).to(tl.int64) * out_stride
        tl.store(base + 0, ns.to(tl.int32), mask=m)
        tl.store(base + 1, nr.to(tl.int32), mask=m)
        tl.store(base + 2, anchor.to(tl.int32), mask=m)
        tl.store(base + 3, pos.to(tl.int32), mask=m)
        cm = m[:, None] & (cols[None, :] < K)
        dr = tl.load(
            drafts_ptr + rows[:, None].to(tl.int64) * drafts_stride + cols[None, :],
            mask=cm,
            other=-1,
        )
        tl.store(base[:, None] + 4 + cols[None, :], dr.to(tl.int32), mask=cm)  # META_COLS
    lost = tl.where(ok, lost, lost + 1)
    tl.store(counter_ptr, c + 1)
    tl.store(counter_ptr + 1, lost)
    tl.store(ctl_ptr, c + 1)
    tl.store(ctl_ptr + 1, lost)
