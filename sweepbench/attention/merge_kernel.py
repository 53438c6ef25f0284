"""The LSE merge of ``accum.merge_`` as one Triton kernel, for CUDA tensors: each program reads a tile of
rows of both outputs and their LSEs, and writes the merged rows (fp32 math, one rounding to ``out``'s
dtype) and the new LSE in place. The eager form takes two passes over the rows with an fp32 temporary,
both through PyTorch's non-vectorised kernels (the weight is broadcast over the head dim): 0.3 ms of
the ring's rank 1 at W=2, 16K, on an H100, against 0.06 ms for this kernel (docs/results/attention_h100x1.md).
Triton compiles it once per machine (its disk cache); torch.compile of the same math cost each process
4-12 s.

Imported only where Triton is (it comes with torch's CUDA builds); ``TRITON_INTERPRET=1`` runs the
kernel on CPU tensors, which is how the tests check it without a GPU."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_ROWS = 32  # rows per program: 32 x 128 values of each output (8 KiB in bf16)


@triton.jit
def _merge(
    out,
    lse,
    bout,
    blse,
    rows,
    heads,
    so_b,
    so_h,
    so_l,
    sl_b,
    sl_h,
    sl_l,
    sb_b,
    sb_h,
    sb_l,
    sc_b,
    sc_h,
    sc_l,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    bh = tl.program_id(1).to(tl.int64)  # offsets in int64: a (B, H, L, D) tensor may pass 2^31 elements
    b, h = bh // heads, bh % heads
    r = r.to(tl.int64)
    on_r = r < rows
    d = tl.arange(0, BLOCK_D)
    on = on_r[:, None] & (d < D)[None, :]
    p_lse = lse + b * sl_b + h * sl_h + r * sl_l
    l_old = tl.load(p_lse, mask=on_r, other=0.0)
    l_blk = tl.load(blse + b * sc_b + h * sc_h + r * sc_l, mask=on_r, other=0.0)
    w = tl.sigmoid(l_blk - l_old)[:, None]  # exp(l_blk - logaddexp(l_old, l_blk))
    top = tl.maximum(l_old, l_blk)
    p_out = out + b * so_b + h * so_h + r[:, None] * so_l + d[None, :]
    o = tl.load(p_out, mask=on, other=0.0).to(tl.float32)
    x = tl.load(bout + b * sb_b + h * sb_h + r[:, None] * sb_l + d[None, :], mask=on, other=0.0).to(tl.float32)
    tl.store(p_out, (x * w + o * (1 - w)).to(out.dtype.element_ty), mask=on)
    tl.store(p_lse, top + tl.log(tl.exp(l_old - top) + tl.exp(l_blk - top)), mask=on_r)


def fits(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor) -> bool:
    """The kernel's layout: (B, H, L, D) outputs with packed rows' last dim, (B, H, L) fp32 LSEs, any
    other strides (a row slice of an accumulator is fine)."""
    return (
        out.dim() == 4
        and block_out.shape == out.shape
        and lse.shape == block_lse.shape == out.shape[:3]
        and out.stride(-1) == 1
        and block_out.stride(-1) == 1
        and lse.dtype == block_lse.dtype == torch.float32
        and out.dtype in (torch.float32, torch.bfloat16, torch.float16)
    )


def merge(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor) -> None:
    """``accum.merge_``'s math in one kernel, in place (``fits`` must hold)."""
    b, h, rows, d = out.shape
    if out.numel() == 0:
        return
    grid = (triton.cdiv(rows, _ROWS), b * h)
    _merge[grid](
        out,
        lse,
        block_out,
        block_lse,
        rows,
        h,
        *out.stride()[:3],
        *lse.stride(),
        *block_out.stride()[:3],
        *block_lse.stride(),
        D=d,
        BLOCK_D=triton.next_power_of_2(d),
        BLOCK_R=_ROWS,
    )
