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
