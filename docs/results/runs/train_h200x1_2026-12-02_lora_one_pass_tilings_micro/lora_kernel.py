"""A LoRA layer's two backward products over its output gradient g, from one read of g, as a Triton
kernel for CUDA tensors (``model._LoRAGroup``'s backward in eager steps):

- ``s (g B)``: the input side's [tokens, rank] product, written into its columns of the group's
  side-by-side matrix;
- ``s g^T (x A^T)``: B's gradient, [out, rank].

cuBLAS runs these as two GEMMs, each reading all of g ([tokens, out], 64 MiB for a 2048-wide
output at 16384 tokens), the second a reduction over the tokens (split-K, then its own reduce
kernel). Here each program reads a block of g's rows once and feeds both products: the first sums
over the block's columns within the program; the second's per-block partial sums ([programs, out,
rank] in fp32) are added, scaled and rounded by a second, small kernel.

Imported only where Triton is (it comes with torch's CUDA builds); ``TRITON_INTERPRET=1`` runs the
kernels on CPU tensors, which is how the tests check them without a GPU."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# rows of g per program (128 programs at 16384 tokens), columns per step of a program's loop; warps
# and pipeline stages of the first kernel
BLOCK_ROWS, BLOCK_COLS, WARPS, STAGES = 128, 128, 8, 3
# Triton's interpreter multiplies bf16 blocks wrongly (it reads their bits as integers): there the
# blocks are widened to fp32 first, the products' sums in fp32 either way
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _products(
    g,
    b,
    xa,
    gxa,
    part,
    n_rows,
    n_cols,
    stride_g,
    stride_xa,
    stride_gxa,
    scale,
    RANK: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    GRAD_B: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * BM + tl.arange(0, BM)
    on_rows = rows < n_rows
    ranks = tl.arange(0, RANK)
    xa_block = tl.load(xa + rows[:, None] * stride_xa + ranks[None, :], mask=on_rows[:, None], other=0.0)
    if UPCAST:
        xa_block = xa_block.to(tl.float32)
    acc = tl.zeros((BM, RANK), dtype=tl.float32)
    for n0 in range(0, n_cols, BN):
        cols = n0 + tl.arange(0, BN)
        on_cols = cols < n_cols
        g_block = tl.load(g + rows[:, None] * stride_g + cols[None, :], mask=on_rows[:, None] & on_cols[None, :], other=0.0)
        b_block = tl.load(b + cols[:, None] * RANK + ranks[None, :], mask=on_cols[:, None], other=0.0)
        if UPCAST:
            g_block, b_block = g_block.to(tl.float32), b_block.to(tl.float32)
        acc = tl.dot(g_block, b_block, acc)
        if GRAD_B:
            grad_b = tl.dot(tl.trans(g_block), xa_block)  # [BN, RANK]: this block's share of B's gradient
            tl.store(part + (pid * n_cols + cols[:, None]) * RANK + ranks[None, :], grad_b, mask=on_cols[:, None])
    tl.store(gxa + rows[:, None] * stride_gxa + ranks[None, :], (acc * scale).to(gxa.dtype.element_ty), mask=on_rows[:, None])


@triton.jit
def _sum_parts(part, out, n_parts, n_elems, scale, BLOCK: tl.constexpr):
    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    on = at < n_elems
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for p in range(0, n_parts):
        acc += tl.load(part + p * n_elems + at, mask=on, other=0.0)
    tl.store(out + at, (acc * scale).to(out.dtype.element_ty), mask=on)


def g_products(
    g: torch.Tensor,
    b: torch.Tensor,
    xa: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor,
    grad_b: bool = True,
    block_rows: int = BLOCK_ROWS,
    block_cols: int = BLOCK_COLS,
    warps: int = WARPS,
    stages: int = STAGES,
) -> torch.Tensor | None:
    """``out`` = s (g B) and, where ``grad_b``, returns s g^T xa (B's gradient, in B's dtype).

    g: [tokens, out_features], rows contiguous; b: [out_features, rank] contiguous; xa: [tokens,
    rank], rows contiguous (a column block of a wider matrix will do); out: like xa. The rank a
    power of two of at least 16 (the products' tile width)."""
    rows, cols = g.shape
    rank = b.shape[1]
    assert g.stride(1) == 1 and xa.stride(1) == 1 and out.stride(1) == 1 and b.is_contiguous()
    programs = triton.cdiv(rows, block_rows)
    part = torch.empty(programs, cols, rank, dtype=torch.float32, device=g.device) if grad_b else out
    _products[(programs,)](
        g,
        b,
        xa,
        out,
        part,
        rows,
        cols,
        g.stride(0),
        xa.stride(0),
        out.stride(0),
        scale,
        RANK=rank,
        BM=block_rows,
        BN=block_cols,
        GRAD_B=grad_b,
        UPCAST=INTERPRETED,
        num_warps=warps,
        num_stages=stages,
    )
    if not grad_b:
        return None
    result = torch.empty_like(b)
    n = cols * rank
    block = 1024
    _sum_parts[(triton.cdiv(n, block),)](part, result, programs, n, scale, BLOCK=block, num_warps=4)
    return result


def fits(g: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether :func:`g_products` takes this layer: a rank the kernel's tiles hold (a power of two,
    16 to 128) and rows it reads with unit stride."""
    rank = b.shape[1]
    return 16 <= rank <= 128 and rank & (rank - 1) == 0 and g.stride(-1) == 1
