"""Ulysses (DeepSpeed-Ulysses) context parallelism: all-to-all over heads.

Each rank holds a contiguous chunk of the sequence for all heads; an all-to-all turns that into
the whole sequence for H/W heads, attention (dense or dilated) runs on one device, and a second
all-to-all brings the output back to sequence chunks. K/V travel with their kv heads when W
divides them, else expanded to the query heads first. Needs heads divisible by W."""

from __future__ import annotations

import torch

from sweepbench.attention.comm import Comm
from sweepbench.attention.ops import expand_kv


class _Relayout(torch.autograd.Function):
    """``there(x, comm)`` forward, its inverse ``back`` on the gradient: seq_to_heads and
    heads_to_seq are each other's backward."""

    @staticmethod
    def forward(ctx, x, comm: Comm, there, back):
        ctx.comm, ctx.back = comm, back
        return there(x, comm)

    @staticmethod
    def backward(ctx, g):
        return ctx.back(g, ctx.comm), None, None, None


def seq_to_heads(x: torch.Tensor, comm: Comm) -> torch.Tensor:
    """(B, H, l, D) on each rank, chunk r of the sequence -> (B, H/W, W*l, D), heads of rank r."""
    b, h, l, d = x.shape
    w = comm.size
    parts = x.reshape(b, w, h // w, l, d).transpose(0, 1)  # entry j: the heads rank j will hold
    got = comm.all_to_all(parts.contiguous())  # entry j: sequence chunk j of my heads
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // w, w * l, d)


def heads_to_seq(x: torch.Tensor, comm: Comm) -> torch.Tensor:
    """The inverse of :func:`seq_to_heads`."""
    b, hw, seq, d = x.shape
    w = comm.size
    parts = x.reshape(b, hw, w, seq // w, d).permute(2, 0, 1, 3, 4)  # entry j: sequence chunk j
    got = comm.all_to_all(parts.contiguous())  # entry j: my chunk for the heads of rank j
    return got.transpose(0, 1).reshape(b, hw * w, seq // w, d)


def to_heads(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: Comm
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v of a sequence chunk -> the whole sequence for this rank's heads (autograd-aware)."""
    if k.shape[1] % comm.size:
        k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    return tuple(_Relayout.apply(x, comm, seq_to_heads, heads_to_seq) for x in (q, k, v))


def to_sequence(out: torch.Tensor, comm: Comm) -> torch.Tensor:
    return _Relayout.apply(out, comm, heads_to_seq, seq_to_heads)
