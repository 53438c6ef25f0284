"""Ulysses (DeepSpeed-Ulysses) context parallelism: all-to-all over heads.

Each rank holds a contiguous chunk of the sequence for all heads; an all-to-all turns that into
the whole sequence for H/W heads, attention (dense or dilated) runs on one device, and a second
all-to-all brings the output back to sequence chunks. q, k and v travel packed in one message (and
their gradients in one on the way back), so each direction costs one collective's latency. K/V
travel with their kv heads when W divides them, else expanded to the query heads first. Needs heads
divisible by W."""

from __future__ import annotations

import torch

from sweepbench.attention.comm import Comm
from sweepbench.attention.ops import expand_kv

Tensors = tuple[torch.Tensor, ...]


def seq_to_heads(xs: Tensors, comm: Comm) -> Tensors:
    """Each x (B, H_x, l, D), chunk r of the sequence on rank r -> (B, H_x/W, W*l, D), the heads
    of rank r over the whole sequence; one all-to-all for all of them."""
    b, _, l, d = xs[0].shape
    w = comm.size
    heads = [x.shape[1] // w for x in xs]
    # entry j: the heads rank j will hold, every x's one after another (cat writes them in place)
    parts = torch.cat([x.reshape(b, w, h, l, d).transpose(0, 1) for x, h in zip(xs, heads)], dim=2)
    got = comm.all_to_all(parts)  # entry j: sequence chunk j of my heads
    return tuple(p.permute(1, 2, 0, 3, 4).reshape(b, h, w * l, d) for p, h in zip(got.split(heads, dim=2), heads))


def heads_to_seq(xs: Tensors, comm: Comm) -> Tensors:
    """The inverse of :func:`seq_to_heads`."""
    b, _, seq, d = xs[0].shape
    w = comm.size
    heads = [x.shape[1] for x in xs]
    # entry j: sequence chunk j of my heads, every x's one after another
    parts = torch.cat([x.reshape(b, h, w, seq // w, d).permute(2, 0, 1, 3, 4) for x, h in zip(xs, heads)], dim=2)
    got = comm.all_to_all(parts)  # entry j: my chunk for the heads of rank j
    return tuple(p.transpose(0, 1).reshape(b, h * w, seq // w, d) for p, h in zip(got.split(heads, dim=2), heads))


class _Relayout(torch.autograd.Function):
    """``there(xs, comm)`` forward, its inverse ``back`` on the gradients: seq_to_heads and
    heads_to_seq are each other's backward."""

    @staticmethod
    def forward(ctx, comm: Comm, there, back, *xs):
        ctx.comm, ctx.back = comm, back
        return there(xs, comm)

    @staticmethod
    def backward(ctx, *grads):
        return None, None, None, *ctx.back(grads, ctx.comm)


def to_heads(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, comm: Comm
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v of a sequence chunk -> the whole sequence for this rank's heads (autograd-aware)."""
    if k.shape[1] % comm.size:
        k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    qh, kh, vh = _Relayout.apply(comm, seq_to_heads, heads_to_seq, q, k, v)
    return qh, kh, vh


def to_sequence(out: torch.Tensor, comm: Comm) -> torch.Tensor:
    (got,) = _Relayout.apply(comm, heads_to_seq, seq_to_heads, out)
    return got
