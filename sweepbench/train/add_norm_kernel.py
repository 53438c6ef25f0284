"""The residual add and the RMSNorm that reads its sum, as one Triton kernel each way, for CUDA
tensors (``fused=liger``'s blocks, ``fused.add_norm``):

- forward: ``total = residual + update`` (rounded to the stream's dtype, as torch's add rounds it)
  and ``out = total * rstd * weight`` in one pass: two tensors read, two written, and the inverse
  RMS of each row (fp32) kept for the backward;
- backward: the norm's input gradient plus the gradient the sum gets from its other reader (the
  next residual add) in one pass: three tensors read, one written, which both the residual and the
  update receive; where the weight trains, each program also sums ``grad * total * rstd`` over its
  rows and the programs' sums are added by torch.

Torch's pair is four kernels: the add, its fused RMSNorm forward, the RMSNorm backward and the
autograd engine's sum of the two gradients of the total (11 passes over a [tokens, hidden] tensor
against these kernels' 8). liger-kernel's fused add + RMSNorm has the same forward; its backward
runs one program per SM over its share of the rows in sequence, which measured slower than torch's
pair on an H200 (``bench/gpu/step_parts.py --only add_norm``); here each program takes
:data:`ROWS` rows.

Imported only where Triton is (it comes with torch's CUDA builds); ``TRITON_INTERPRET=1`` runs the
kernels on CPU tensors, which is how the tests check them without a GPU."""

from __future__ import annotations

import os
from typing import Any

import torch
import triton
import triton.language as tl

LOWRANK_ROWS, LOWRANK_COLS = 16, 256  # the low-rank forward's rows per program (tl.dot's least) and columns a step
ROWS = 8  # rows per program of the backward: 2048 programs at 16384 rows, a [programs, hidden] fp32 weight-gradient partial


@triton.jit
def _forward(res, upd, w, total, out, rstd, n_cols, out_stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    on = cols < n_cols
    at = row * n_cols + cols
    summed = tl.load(res + at, mask=on, other=0.0).to(tl.float32) + tl.load(upd + at, mask=on, other=0.0).to(tl.float32)
    rounded = summed.to(total.dtype.element_ty)
    tl.store(total + at, rounded, mask=on)
    x = rounded.to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(rstd + row, r)
    weight = tl.load(w + cols, mask=on, other=0.0).to(tl.float32)
    tl.store(out + row * out_stride + cols, (x * r * weight).to(out.dtype.element_ty), mask=on)


@triton.jit
def _backward(
    grad_out,
    total,
    w,
    rstd,
    grad_total,
    grad_in,
    w_part,
    n_rows,
    n_cols,
    HAS_GRAD_TOTAL: tl.constexpr,
    W_GRAD: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    on_cols = cols < n_cols
    weight = tl.load(w + cols, mask=on_cols, other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in tl.static_range(ROWS):
        row = pid * ROWS + i
        on = on_cols & (row + tl.zeros([BLOCK], dtype=tl.int64) < n_rows)  # the last program's rows past the end
        at = row * n_cols + cols
        g = tl.load(grad_out + at, mask=on, other=0.0).to(tl.float32)
        r = tl.load(rstd + tl.minimum(row, n_rows - 1))  # (a row past the end reads the last: masked below)
        x_hat = tl.load(total + at, mask=on, other=0.0).to(tl.float32) * r
        gw = g * weight
        dx = (gw - x_hat * (tl.sum(gw * x_hat, axis=0) / n_cols)) * r
        if HAS_GRAD_TOTAL:
            dx += tl.load(grad_total + at, mask=on, other=0.0).to(tl.float32)
        tl.store(grad_in + at, dx.to(grad_in.dtype.element_ty), mask=on)
        if W_GRAD:
            acc += g * x_hat
    if W_GRAD:
        tl.store(w_part + pid * n_cols + cols, acc, mask=on_cols)


@triton.jit
def _forward_lowrank(
    res,
    upd,
    xa,
    b,
    w,
    total,
    out,
    rstd,
    n_rows,
    n_cols,
    rank,
    scale,
    eps,
    ROWS: tl.constexpr,
    COLS: tl.constexpr,
    RANK: tl.constexpr,
    FP32_DOT: tl.constexpr,
):
    """The forward with a low-rank addend: total = residual + update + scale * xa B^T (xa [rows, rank],
    B [cols, rank]), each program ROWS rows, COLS columns a step: the sum, its squares, then (a second
    pass over the total it just wrote, from cache) the norm."""
    pid = tl.program_id(0).to(tl.int64)
    rows = pid * ROWS + tl.arange(0, ROWS)
    on_rows = rows < n_rows
    ks = tl.arange(0, RANK)
    on_k = ks < rank
    xa_t = tl.load(xa + rows[:, None] * rank + ks[None, :], mask=on_rows[:, None] & on_k[None, :], other=0.0)
    if FP32_DOT:  # Triton's interpreter: its bf16 dot is not a GPU's
        xa_t = xa_t.to(tl.float32)
    sumsq = tl.zeros([ROWS], dtype=tl.float32)
    for c0 in range(0, n_cols, COLS):
        cols = c0 + tl.arange(0, COLS)
        on = on_rows[:, None] & (cols < n_cols)[None, :]
        at = rows[:, None] * n_cols + cols[None, :]
        b_t = tl.load(b + cols[None, :] * rank + ks[:, None], mask=on_k[:, None] & (cols < n_cols)[None, :], other=0.0)
        if FP32_DOT:
            b_t = b_t.to(tl.float32)
        low = tl.dot(xa_t, b_t)  # [ROWS, COLS], fp32
        summed = tl.load(res + at, mask=on, other=0.0).to(tl.float32) + tl.load(upd + at, mask=on, other=0.0).to(
            tl.float32
        )
        rounded = (summed + scale * low).to(total.dtype.element_ty)
        tl.store(total + at, rounded, mask=on)
        x = rounded.to(tl.float32)
        sumsq += tl.sum(x * x, axis=1)
    r = 1.0 / tl.sqrt(sumsq / n_cols + eps)
    tl.store(rstd + rows, r, mask=on_rows)
    tl.debug_barrier()  # the totals this program's threads stored, visible to all of them
    for c0 in range(0, n_cols, COLS):
        cols = c0 + tl.arange(0, COLS)
        on = on_rows[:, None] & (cols < n_cols)[None, :]
        at = rows[:, None] * n_cols + cols[None, :]
        x = tl.load(total + at, mask=on, other=0.0).to(tl.float32)
        weight = tl.load(w + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        tl.store(out + at, (x * r[:, None] * weight[None, :]).to(out.dtype.element_ty), mask=on)


def _warps(block: int) -> int:
    return min(16, max(4, block // 256))


class AddRMSNorm(torch.autograd.Function):
    """(rms_norm(residual + update) * weight, residual + update) for CUDA tensors of the same shape
    and dtype, the weight of the last dimension's size; the gradient of the sum reaches the residual
    and the update alike. ``room`` > 0: the norm's output is written as the first columns of rows
    that many columns wider (its rows that far apart), the spare columns left for its reader to fill
    (``model.lora_room``: q, k and v's LoRA layers put x A^T there)."""

    @staticmethod
    def forward(
        ctx: Any, residual: torch.Tensor, update: torch.Tensor, weight: torch.Tensor, eps: float, room: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        shape, n = residual.shape, residual.shape[-1]
        res, upd = residual.contiguous().view(-1, n), update.contiguous().view(-1, n)
        total = torch.empty_like(res)
        out = res.new_empty(res.shape[0], n + room)[:, :n]
        rstd = torch.empty(res.shape[0], dtype=torch.float32, device=res.device)
        block = triton.next_power_of_2(n)
        _forward[(res.shape[0],)](
            res, upd, weight, total, out, rstd, n, n + room, eps, BLOCK=block, num_warps=_warps(block)
        )
        ctx.save_for_backward(total, weight, rstd)
        ctx.set_materialize_grads(False)
        return out.view(shape), total.view(shape)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor | None, grad_total: torch.Tensor | None) -> tuple[Any, ...]:
        total, weight, rstd = ctx.saved_tensors
        grad, w_grad = _norm_backward(total, weight, rstd, grad_out, grad_total, bool(ctx.needs_input_grad[2]))
        return grad, grad, w_grad, None, None


def _norm_backward(
    total: torch.Tensor,
    weight: torch.Tensor,
    rstd: torch.Tensor,
    grad_out: torch.Tensor | None,
    grad_total: torch.Tensor | None,
    w_grad: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The sum's gradient (the norm's input gradient plus ``grad_total``; it reaches each addend
    alike) and the weight's where ``w_grad``; ``total`` [rows, n] as the forward kept it."""
    if grad_out is None:  # only the sum was used
        return grad_total, None
    rows, n = total.shape
    g = grad_out.contiguous().view(rows, n)
    dt = grad_total.contiguous().view(rows, n) if grad_total is not None else g  # (not read without it)
    grad = torch.empty_like(total)
    programs = triton.cdiv(rows, ROWS)
    part = torch.empty(programs, n, dtype=torch.float32, device=total.device) if w_grad else rstd
    block = triton.next_power_of_2(n)
    _backward[(programs,)](
        g,
        total,
        weight,
        rstd,
        dt,
        grad,
        part,
        rows,
        n,
        HAS_GRAD_TOTAL=grad_total is not None,
        W_GRAD=w_grad,
        ROWS=ROWS,
        BLOCK=block,
        num_warps=_warps(block),
    )
    return grad.view(grad_out.shape), part.sum(0).to(weight.dtype) if w_grad else None


class AddLoRARMSNorm(torch.autograd.Function):
    """:class:`AddRMSNorm` of residual + update + scale * xa B^T: an output projection's LoRA update
    (xa = x A^T, [..., rank]; B [width, rank]) added inside the norm's kernel, where it was its own
    [tokens, width] product written into the projection's output and read back by the base GEMM.
    Backward: the sum's gradient g reaches the residual and the update alike; xa gets scale g B and
    B scale g^T xa (two GEMMs, as the projection's own backward computed them)."""

    @staticmethod
    def forward(
        ctx: Any,
        residual: torch.Tensor,
        update: torch.Tensor,
        xa: torch.Tensor,
        b: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        shape, n, rank = residual.shape, residual.shape[-1], xa.shape[-1]
        res, upd = residual.contiguous().view(-1, n), update.contiguous().view(-1, n)
        xa2, b2 = xa.contiguous().view(-1, rank), b.contiguous()
        total, out = torch.empty_like(res), torch.empty_like(res)
        rstd = torch.empty(res.shape[0], dtype=torch.float32, device=res.device)
        _forward_lowrank[(triton.cdiv(res.shape[0], LOWRANK_ROWS),)](
            res,
            upd,
            xa2,
            b2,
            weight,
            total,
            out,
            rstd,
            res.shape[0],
            n,
            rank,
            scale,
            eps,
            ROWS=LOWRANK_ROWS,
            COLS=LOWRANK_COLS,
            RANK=max(16, triton.next_power_of_2(rank)),
            FP32_DOT=os.environ.get("TRITON_INTERPRET") == "1",
            num_warps=4,
        )
        ctx.save_for_backward(total, weight, rstd, xa2, b2)
        ctx.scale, ctx.xa_shape = scale, xa.shape
        ctx.set_materialize_grads(False)
        return out.view(shape), total.view(shape)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor | None, grad_total: torch.Tensor | None) -> tuple[Any, ...]:
        total, weight, rstd, xa2, b2 = ctx.saved_tensors
        grad, w_grad = _norm_backward(total, weight, rstd, grad_out, grad_total, bool(ctx.needs_input_grad[4]))
        if grad is None:
            return None, None, None, None, w_grad, None, None
        g2, nothing = grad.reshape(total.shape), grad.new_empty(())
        grad_xa = (
            torch.addmm(nothing, g2, b2, beta=0, alpha=ctx.scale).view(ctx.xa_shape)
            if ctx.needs_input_grad[2]
            else None
        )
        grad_b = torch.addmm(nothing, g2.t(), xa2, beta=0, alpha=ctx.scale) if ctx.needs_input_grad[3] else None
        return grad, grad, grad_xa, grad_b, w_grad, None, None
