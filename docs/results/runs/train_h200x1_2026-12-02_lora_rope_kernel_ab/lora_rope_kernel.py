"""q and k of a LoRA attention with their rotary embedding, the low-rank update added inside the
rotation's kernel, for CUDA tensors (``fused=liger``'s attentions with LoRA on wq, wk and wv):

- forward: q = rope(x W_q^T + s (x A_q^T) B_q^T), and k alike: the base GEMM writes its output,
  and one Triton pass per output adds the low-rank product (a [tokens, rank] x [rank, head] product
  per head, on the tensor cores) and rotates it in place, where the low-rank product was a GEMM
  writing the whole output, the base GEMM's epilogue read it back, and liger's RoPE kernel then
  read and wrote the output again;
- backward: one pass per output turns the gradient back through the rotation and, from the same
  registers, sums s (g B) (the [tokens, rank] product the A gradients and dx's low-rank term take),
  where that product was a GEMM reading the whole gradient again.

v, B's and A's gradients and dx are as :class:`model._LoRAGroup` computes them. The tables are the
model's own (cos, sin: [positions, head_dim / 2]; token t of the flattened batch at position t mod
positions), applied in the rotate-half order the fused model's wq and wk are permuted to
(``fused.to_rotate_half``): each head's first half (h1) and second half (h2) become
h1 cos - h2 sin and h2 cos + h1 sin.

Imported only where Triton is (it comes with torch's CUDA builds); ``TRITON_INTERPRET=1`` runs the
kernels on CPU tensors, which is how the tests check them without a GPU."""

from __future__ import annotations

import os
from typing import Any

import torch
import triton
import triton.language as tl

from sweepbench.train.model import _mm_scaled, _rank_cols

ROWS = 64  # tokens per program
# Triton's interpreter multiplies bf16 blocks wrongly (it reads their bits as integers): there the
# blocks are widened to fp32 first
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _forward(
    y,
    xa,
    b,
    cos,
    sin,
    n_rows,
    seq,
    stride_xa,
    scale,
    HEADS: tl.constexpr,
    HALF: tl.constexpr,
    RANK: tl.constexpr,
    BM: tl.constexpr,
    UPCAST: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    on = rows < n_rows
    pos = rows % seq
    ranks = tl.arange(0, RANK)
    half = tl.arange(0, HALF)
    xa_block = tl.load(xa + rows[:, None] * stride_xa + ranks[None, :], mask=on[:, None], other=0.0)
    if UPCAST:
        xa_block = xa_block.to(tl.float32)
    c = tl.load(cos + pos[:, None] * HALF + half[None, :], mask=on[:, None], other=0.0).to(tl.float32)
    s = tl.load(sin + pos[:, None] * HALF + half[None, :], mask=on[:, None], other=0.0).to(tl.float32)
    width = HEADS * 2 * HALF
    for h in range(HEADS):
        c1 = h * 2 * HALF + half
        c2 = c1 + HALF
        b1 = tl.load(b + c1[None, :] * RANK + ranks[:, None])  # [RANK, HALF]: B's rows of this half, transposed
        b2 = tl.load(b + c2[None, :] * RANK + ranks[:, None])
        if UPCAST:
            b1, b2 = b1.to(tl.float32), b2.to(tl.float32)
        at1 = rows[:, None] * width + c1[None, :]
        at2 = rows[:, None] * width + c2[None, :]
        y1 = tl.load(y + at1, mask=on[:, None], other=0.0).to(tl.float32) + scale * tl.dot(xa_block, b1)
        y2 = tl.load(y + at2, mask=on[:, None], other=0.0).to(tl.float32) + scale * tl.dot(xa_block, b2)
        tl.store(y + at1, (y1 * c - y2 * s).to(y.dtype.element_ty), mask=on[:, None])
        tl.store(y + at2, (y2 * c + y1 * s).to(y.dtype.element_ty), mask=on[:, None])


@triton.jit
def _backward(
    g,
    g_in,
    b,
    cos,
    sin,
    gxa,
    n_rows,
    seq,
    stride_gxa,
    scale,
    HEADS: tl.constexpr,
    HALF: tl.constexpr,
    RANK: tl.constexpr,
    BM: tl.constexpr,
    UPCAST: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    on = rows < n_rows
    pos = rows % seq
    ranks = tl.arange(0, RANK)
    half = tl.arange(0, HALF)
    c = tl.load(cos + pos[:, None] * HALF + half[None, :], mask=on[:, None], other=0.0).to(tl.float32)
    s = tl.load(sin + pos[:, None] * HALF + half[None, :], mask=on[:, None], other=0.0).to(tl.float32)
    width = HEADS * 2 * HALF
    acc = tl.zeros((BM, RANK), dtype=tl.float32)
    for h in range(HEADS):
        c1 = h * 2 * HALF + half
        c2 = c1 + HALF
        at1 = rows[:, None] * width + c1[None, :]
        at2 = rows[:, None] * width + c2[None, :]
        g1 = tl.load(g + at1, mask=on[:, None], other=0.0).to(tl.float32)
        g2 = tl.load(g + at2, mask=on[:, None], other=0.0).to(tl.float32)
        p1 = (g1 * c + g2 * s).to(g_in.dtype.element_ty)  # the rotation's transpose
        p2 = (g2 * c - g1 * s).to(g_in.dtype.element_ty)
        tl.store(g_in + at1, p1, mask=on[:, None])
        tl.store(g_in + at2, p2, mask=on[:, None])
        b1 = tl.load(b + c1[:, None] * RANK + ranks[None, :])  # [HALF, RANK]
        b2 = tl.load(b + c2[:, None] * RANK + ranks[None, :])
        if UPCAST:
            p1, p2, b1, b2 = p1.to(tl.float32), p2.to(tl.float32), b1.to(tl.float32), b2.to(tl.float32)
        acc = tl.dot(p1, b1, acc)
        acc = tl.dot(p2, b2, acc)
    tl.store(gxa + rows[:, None] * stride_gxa + ranks[None, :], (acc * scale).to(gxa.dtype.element_ty), mask=on[:, None])


def _launch_args(t: torch.Tensor, b: torch.Tensor, cos: torch.Tensor, head_dim: int) -> dict[str, Any]:
    return dict(HEADS=t.shape[1] // head_dim, HALF=head_dim // 2, RANK=b.shape[1], BM=ROWS, UPCAST=INTERPRETED)


class LoRARopeQKV(torch.autograd.Function):
    """(rope(q), rope(k), v) of three LoRA layers reading x (W, A, B each, frozen W), as [B, S, heads,
    head_dim]; see the module's docstring."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        scales: tuple[float, float, float],
        cos: torch.Tensor,
        sin: torch.Tensor,
        head_dim: int,
        *params: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        bsz, seq, d = x.shape
        x2 = x.reshape(-1, d)
        cos, sin = cos.contiguous(), sin.contiguous()
        a_all = torch.cat(params[1::3])  # [sum of ranks, in]
        xa_all = x2 @ a_all.t()
        cols = _rank_cols(params)
        outs = []
        for i, scale in enumerate(scales):
            weight, _, b = params[3 * i : 3 * i + 3]
            xa = xa_all[:, cols[i]]
            if i < 2:
                y = x2 @ weight.t()
                grid = (triton.cdiv(y.shape[0], ROWS),)
                _forward[grid](y, xa, b, cos, sin, y.shape[0], cos.shape[0], xa.stride(0), scale,
                               **_launch_args(y, b, cos, head_dim))
            else:  # v: the low-rank product written into the output, the base GEMM adding onto it
                y = x2.new_empty(x2.shape[0], weight.shape[0])
                torch.mm(xa, b.t(), out=y)
                torch.addmm(y, x2, weight.t(), beta=scale, out=y)
            outs.append(y.view(bsz, seq, -1, head_dim))
        ctx.scales, ctx.head_dim = scales, head_dim
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, xa_all, a_all, cos, sin, *params)
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        x, xa_all, a_all, cos, sin, *params = ctx.saved_tensors
        x2 = x.reshape(-1, x.shape[-1])
        gxa_all = torch.empty_like(xa_all)
        cols = _rank_cols(params)
        grad_bs: list[torch.Tensor | None] = []
        terms: list[tuple[torch.Tensor, torch.Tensor]] = []
        for i, (scale, g) in enumerate(zip(ctx.scales, grads)):
            weight, _, b = params[3 * i : 3 * i + 3]
            if g is None:
                gxa_all[:, cols[i]].zero_()
                grad_bs.append(None)
                continue
            g2 = g.contiguous().view(-1, weight.shape[0])
            if i < 2:  # back through the rotation, s (g B) from the same pass
                g_in = torch.empty_like(g2)
                out = gxa_all[:, cols[i]]
                grid = (triton.cdiv(g2.shape[0], ROWS),)
                _backward[grid](g2, g_in, b, cos, sin, out, g2.shape[0], cos.shape[0], out.stride(0), scale,
                                **_launch_args(g2, b, cos, ctx.head_dim))
                g2 = g_in
            else:
                _mm_scaled(g2, b, scale, out=gxa_all[:, cols[i]])
            grad_bs.append(_mm_scaled(g2.t(), xa_all[:, cols[i]], scale) if ctx.needs_input_grad[5 + 3 * i + 2] else None)
            terms.append((g2, weight))
        wants_a = [ctx.needs_input_grad[5 + 3 * i + 1] and grads[i] is not None for i in range(3)]
        grad_a_all = gxa_all.t() @ x2 if any(wants_a) else None
        dx: torch.Tensor | None = None
        if ctx.needs_input_grad[0] and terms:
            dx = torch.mm(gxa_all, a_all)
            for g2, weight in sorted(terms, key=lambda t: t[1].shape[0]):
                dx.addmm_(g2, weight)
            dx = dx.view(x.shape)
        param_grads: list[torch.Tensor | None] = []
        for i, c in enumerate(cols):
            grad_a = grad_a_all[c] if grad_a_all is not None and wants_a[i] else None
            param_grads += [None, grad_a, grad_bs[i]]
        return (dx, None, None, None, None, *param_grads)


def fits(x: torch.Tensor, params: list[torch.Tensor], head_dim: int) -> bool:
    """Whether the kernels take these layers: ranks a power of two from 16 to 128, a head dim of at
    least 32 (halves of 16 or more for the tensor cores), contiguous B's."""
    ranks = [a.shape[0] for a in params[1::3]]
    return (
        x.is_cuda or INTERPRETED
    ) and head_dim >= 32 and head_dim & (head_dim - 1) == 0 and all(
        16 <= r <= 128 and r & (r - 1) == 0 for r in ranks
    ) and all(b.is_contiguous() for b in params[2::3])
