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
"""

from __future__ import annotations

META_COLS = 4  # num_sampled, num_rejected, anchor, anchor position

_kernel = None  # the Triton kernel, imported on first CUDA use (keeps CPU imports light)


def _triton_kernel():
    """``spectrace.hooks.v2_stage_triton._stage_kernel``, or False without a usable Triton."""
    global _kernel
    if _kernel is None:
        try:
            from spectrace.hooks.v2_stage_triton import BLOCK, _stage_kernel
            _kernel = (_stage_kernel, BLOCK)
        except Exception:  # no Triton, or a broken install: the torch path
            _kernel = False
    return _kernel


def triton_ok(t) -> bool:
    """True when :func:`stage_triton` can run on tensor ``t``'s device."""
    return t.is_cuda and bool(_triton_kernel())


def _column0_stride(t) -> int:
    """Element stride of ``t[:, 0]`` (2-D) or ``t`` (1-D): last_sampled's layout."""
    return t.stride(0)


def _row0_stride(t) -> int:
    """Element stride of ``t[0]`` (2-D) or ``t`` (1-D): next_prefill_tokens' layout."""
    return t.stride(1) if t.dim() == 2 else t.stride(0)


def stage_triton(out, row0: int, n: int, ns, nr, idx, qsl, positions, last, nxt,
                 drafts) -> bool:
    """Write rows ``row0 .. row0 + n - 1`` of ``out`` (int32 ``[R, >= 4 + K]``, contiguous
    rows) from one step's inputs, in one kernel launch on the current stream.

    Args: ``ns``/``nr`` int ``[>= n]`` (num_sampled/num_rejected), ``idx`` int ``[>= n]``
    (idx_mapping), ``qsl`` int ``[>= n + 1]`` (query_start_loc), ``positions`` int
    ``[tokens]``, ``last`` int ``[slots]`` or ``[slots, W]`` (last_sampled; column 0 is
    read), ``nxt`` int ``[slots]`` or ``[W, slots]`` (next_prefill_tokens; row 0), ``drafts`` int ``[>= n, K]``.

    Returns:
        False (nothing launched) when an input's layout is not what the kernel takes
        (a 1-D input with a stride other than 1, drafts with a column stride other than 1);
        the caller then uses :func:`stage_torch`.
    """
    for t in (ns, nr, idx, qsl, positions):
        if t.dim() != 1 or t.stride(0) != 1:
            return False
    if drafts.dim() != 2 or drafts.stride(1) != 1 or out.stride(1) != 1:
        return False
    last_stride, nxt_stride = _column0_stride(last), _row0_stride(nxt)
    k = int(drafts.shape[1])
    kp = 1 << max(k - 1, 0).bit_length()
    kernel, block = _triton_kernel()
    grid = ((n + block - 1) // block,)
    kernel[grid](out, out.stride(0), row0, n, ns, nr, idx, qsl, positions,
                 last, last_stride, nxt, nxt_stride, drafts, drafts.stride(0),
                 K=k, KP=kp, BLOCK=block)
    return True


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
        q_last = qsl[1:n + 1].long() - 1 - nr.long()
        out[:n, 3] = positions[q_last.clamp_min(0)].long() + 1
        out[:n, META_COLS:META_COLS + k] = drafts[:n, :k]
