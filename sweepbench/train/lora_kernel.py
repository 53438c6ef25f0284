"""A LoRA layer's two products over its output gradient in one pass (Triton, CUDA): given the
output's gradient ``g`` [tokens, out], the adapter's ``B`` [out, rank] and the forward's ``x A^T``
[tokens, rank], the input-side product ``s g B`` [tokens, rank] and B's gradient ``s g^T (x A^T)``
[out, rank], reading ``g`` once where two cuBLAS GEMMs each read all of it (both are bound by that
read: rank 16 against thousands of columns).

The two products sum over different dimensions (``g B`` over the output's columns, ``g^T xa`` over
the tokens), so each program takes a block of columns and a range of rows: it sums B's gradient over
its rows in registers and writes its share of ``g B`` (its columns' part) as a partial; torch then
adds the column blocks' partials and the row ranges' partials (fp32, a few MB where ``g`` is 16 to
64 MB at 16384 tokens) and applies the scale. The same products as the GEMMs, summed in another
order, in fp32.

Imported only where Triton is (it comes with torch's CUDA builds); ``TRITON_INTERPRET=1`` runs the
kernel on CPU tensors, which is how the tests check it without a GPU."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_ROWS = 64  # rows of g a program reads at a time
BLOCK_COLS = 256  # columns of g a program owns
PROGRAMS = 264  # about two per SM of an H100/H200: the row ranges are cut to reach it


@triton.jit
def _grads(
    g,
    b,
    xa,
    gxa_part,
    gb_part,
    n_rows,
    n_out,
    stride_g,
    stride_xa,
    rows_per_range,
    RANK: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
):
    col_block = tl.program_id(0)
    row_range = tl.program_id(1)
    cols = col_block * BN + tl.arange(0, BN)
    on_cols = cols < n_out
    r = tl.arange(0, RANK)
    # tiles taken to fp32 and multiplied in TF32, which holds a bf16 or fp16 value exactly: the same
    # products as a half-precision dot, and what Triton's interpreter computes right on a CPU
    b_block = tl.load(b + cols[:, None] * RANK + r[None, :], mask=on_cols[:, None], other=0.0).to(tl.float32)
    acc = tl.zeros([BN, RANK], dtype=tl.float32)
    first = row_range * rows_per_range
    for t in range(first, first + rows_per_range, BM):
        rows = (t + tl.arange(0, BM)).to(tl.int64)
        on_rows = rows < n_rows
        g_tile = tl.load(
            g + rows[:, None] * stride_g + cols[None, :], mask=on_rows[:, None] & on_cols[None, :], other=0.0
        ).to(tl.float32)
        xa_tile = tl.load(xa + rows[:, None] * stride_xa + r[None, :], mask=on_rows[:, None], other=0.0).to(tl.float32)
        acc += tl.dot(tl.trans(g_tile), xa_tile, input_precision="tf32")  # B's gradient over these rows: [BN, RANK]
        part = tl.dot(g_tile, b_block, input_precision="tf32")  # these columns' share of g B: [BM, RANK]
        tl.store(gxa_part + (col_block * n_rows + rows[:, None]) * RANK + r[None, :], part, mask=on_rows[:, None])
    tl.store(gb_part + (row_range * n_out + cols[:, None]) * RANK + r[None, :], acc, mask=on_cols[:, None])


def usable(g: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether :func:`low_rank_grads` takes these: a rank that is a multiple of 16 (the kernel's
    matrix products need it), g's rows contiguous, B contiguous, a half-precision dtype."""
    return (
        b.shape[1] % 16 == 0
        and g.stride(-1) == 1
        and b.is_contiguous()
        and g.dtype in (torch.bfloat16, torch.float16)
        and b.dtype == g.dtype
    )


def low_rank_grads(
    g: torch.Tensor,
    b: torch.Tensor,
    xa: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    *,
    want_b: bool = True,
    block_rows: int = BLOCK_ROWS,
    block_cols: int = BLOCK_COLS,
    programs: int = PROGRAMS,
) -> torch.Tensor | None:
    """``out`` <- scale * g @ b (a [tokens, rank] matrix or a column block of one); returns
    scale * g^T @ xa (B's gradient, b's dtype) where ``want_b``, else None. g: [tokens, out] with
    rows contiguous, b: [out, rank], xa: [tokens, rank] (rows contiguous)."""
    rows, n_out = g.shape
    rank = b.shape[1]
    col_blocks = triton.cdiv(n_out, block_cols)
    ranges = max(1, min(triton.cdiv(rows, block_rows), programs // col_blocks))
    rows_per_range = triton.cdiv(triton.cdiv(rows, ranges), block_rows) * block_rows
    ranges = triton.cdiv(rows, rows_per_range)
    gxa_part = torch.empty(col_blocks, rows, rank, dtype=torch.float32, device=g.device)
    gb_part = torch.empty(ranges, n_out, rank, dtype=torch.float32, device=g.device)
    _grads[(col_blocks, ranges)](
        g,
        b,
        xa,
        gxa_part,
        gb_part,
        rows,
        n_out,
        g.stride(0),
        xa.stride(0),
        rows_per_range,
        RANK=rank,
        BM=block_rows,
        BN=block_cols,
    )
    out.copy_(gxa_part.sum(0).mul_(scale) if col_blocks > 1 else gxa_part[0].mul_(scale))
    return torch.mul(gb_part.sum(0), scale).to(b.dtype) if want_b else None
