"""The Triton staging kernels of :mod:`spectrace.hooks.vllm.v2.stage` and :mod:`.graph_stage`
(imported only on CUDA). Both write a step's rows the same way (:func:`_put_rows`); they differ
in where the inputs come from: kernel arguments (:func:`_stage_kernel`, one launch per step
from Python) or a descriptor in pinned host memory (:func:`_ring_stage_kernel`, captured in the
drafter's CUDA graph)."""

import triton
import triton.language as tl

from .row_layout import DESC_FIELDS, META_COLS

BLOCK = 128  # rows per program

_META = tl.constexpr(META_COLS)
#: int64 words per descriptor, and each field's word (``DESC_FIELDS``' order).
DESC_W = len(DESC_FIELDS)
_DW = tl.constexpr(DESC_W)


def _field(name: str) -> tl.constexpr:
    return tl.constexpr(DESC_FIELDS.index(name))


_D_SEQ, _D_N, _D_OUT, _D_OUT_STRIDE = (
    _field("seq"),
    _field("n"),
    _field("out"),
    _field("out_stride"),
)
_D_ROW0, _D_NS, _D_NR, _D_IDX = _field("row0"), _field("ns"), _field("nr"), _field("idx")
_D_QSL, _D_POS, _D_LAST, _D_NXT = _field("qsl"), _field("positions"), _field("last"), _field("nxt")
_D_LAST_STRIDE, _D_NXT_STRIDE, _D_WIDE = _field("last_stride"), _field("nxt_stride"), _field("wide")


@triton.jit
def _put_rows(
    out_ptr,
    out_stride,
    row0,
    rows,
    m,
    ns,
    nr,
    anchor,
    pos,
    drafts_ptr,
    drafts_stride,
    K: tl.constexpr,
    KP: tl.constexpr,
):
    """Write rows ``row0 + rows`` of ``out`` (int32): the four meta columns, then ``K``
    drafts from ``drafts[rows]``."""
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
    tl.store(base[:, None] + _META + cols[None, :], d.to(tl.int32), mask=cm)


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
    _put_rows(
        out_ptr, out_stride, row0, rows, m, ns, nr, anchor, pos, drafts_ptr, drafts_stride, K, KP
    )


@triton.jit
def _ld(p, wide, bit: tl.constexpr, offs, m):
    """``p[offs]`` as int64, ``p`` an int32 (bit ``bit`` of ``wide`` clear) or int64 array."""
    is64 = ((wide >> bit) & 1) != 0
    is32 = ((wide >> bit) & 1) == 0
    v64 = tl.load(p.to(tl.pointer_type(tl.int64)) + offs, mask=m & is64, other=0)
    v32 = tl.load(p.to(tl.pointer_type(tl.int32)) + offs, mask=m & is32, other=0)
    return tl.where(is64, v64, v32.to(tl.int64))


@triton.jit
def _df(d, field: tl.constexpr):
    """Descriptor word ``field`` (an uncached load: the host rewrote it since the last run)."""
    return tl.load(d + field, cache_modifier=".cv")


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
    the host before the launch or graph replay; scalar uncached loads) names this step's
    inputs and destination; when its sequence number equals the device counter, its ``n``
    rows are staged like :func:`_stage_kernel`'s, else nothing is written and ``counter[1]``
    (lost descriptors) grows. Then ``counter[0]`` grows by one, and both counters are
    written to ``ctl`` (pinned host memory: posted writes, the host reads them)."""
    c = tl.load(counter_ptr)
    lost = tl.load(counter_ptr + 1)
    d = desc_ptr + (c % A) * _DW  # the fields' loads are independent: issued together
    ok = _df(d, _D_SEQ) == c
    n = tl.minimum(tl.where(ok, _df(d, _D_N), 0), drafts_rows)
    out_p = _df(d, _D_OUT).to(tl.pointer_type(tl.int32))
    out_stride = _df(d, _D_OUT_STRIDE)
    row0 = _df(d, _D_ROW0)
    ns_p = _df(d, _D_NS)
    nr_p = _df(d, _D_NR)
    idx_p = _df(d, _D_IDX)
    qsl_p = _df(d, _D_QSL)
    pos_p = _df(d, _D_POS)
    last_p = _df(d, _D_LAST)
    nxt_p = _df(d, _D_NXT)
    last_stride = _df(d, _D_LAST_STRIDE)
    nxt_stride = _df(d, _D_NXT_STRIDE)
    wide = _df(d, _D_WIDE)
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
        _put_rows(
            out_p, out_stride, row0, rows, m, ns, nr, anchor, pos, drafts_ptr, drafts_stride, K, KP
        )
    lost = tl.where(ok, lost, lost + 1)
    tl.store(counter_ptr, c + 1)
    tl.store(counter_ptr + 1, lost)
    tl.store(ctl_ptr, c + 1)
    tl.store(ctl_ptr + 1, lost)
