"""Ring attention: K/V travel around the ring, queries stay; backward is a second ring.

Forward, on rank r of W: K and V are packed once into one buffer (2, B, kv_heads, L, D) and
rotated W-1 times with batched async p2p (``Comm.ring_exchange``) into the other half of a double
buffer while the current block computes (``overlap``); each step's blocks (which depend on the
placement, see ``SCHEDULES``) are merged into fp32 output/LSE accumulators. GQA rotates only the
kv heads (they are expanded per block, after the transfer).

Backward: K/V rotate again the same way; each step computes its blocks' gradients from the global
output and LSE, adds dK/dV into the fp32 accumulator that travels with that K/V (received from the
previous rank while the block computed) and sends it on; after W sends the accumulators are back
with the ranks that own those K/V. ``ring_naive`` is this code with contiguous placement and no
overlap: each exchange starts after the step's compute and is waited for at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from sweepbench.attention.comm import Comm, Pending
from sweepbench.attention.ops import Block, SdpaBackend, attend, attend_backward, new_accumulators, stash, unstash

Schedule = Callable[[int, int, int, bool], list[Block]]  # (rank, src, local_len, causal)
ALL = slice(None)


def _contiguous(rank: int, src: int, n: int, causal: bool) -> list[Block]:
    if not causal:
        return [Block(ALL, ALL, False)]
    if src == rank:
        return [Block(ALL, ALL, True)]
    return [Block(ALL, ALL, False)] if src < rank else []  # later chunks are masked out


def _zigzag(rank: int, src: int, n: int, causal: bool) -> list[Block]:
    """Rank r holds chunks (r, 2W-1-r): with its own K/V, causal over both (chunk order is kept);
    from an earlier rank, all queries see that rank's first chunk only; from a later rank, only
    the second query chunk sees both of its chunks. Every step is the same amount of work."""
    if not causal:
        return [Block(ALL, ALL, False)]
    half = n // 2
    if src == rank:
        return [Block(ALL, ALL, True)]
    if src < rank:
        return [Block(ALL, slice(0, half), False)]
    return [Block(slice(half, n), ALL, False)]


SCHEDULES: dict[str, Schedule] = {"contiguous": _contiguous, "zigzag": _zigzag}


@dataclass(frozen=True)
class RingOptions:
    placement: str
    overlap: bool
    causal: bool
    scale: float
    backend: SdpaBackend
    comm: Comm


def _exchange(comm: Comm, send: torch.Tensor, recv: torch.Tensor, *, now: bool) -> Pending:
    pending = comm.ring_exchange(send, recv)
    if now:
        pending.wait()
    return pending


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, opt: RingOptions):  # type: ignore[override]
        comm, schedule = opt.comm, SCHEDULES[opt.placement]
        w, r, n = comm.size, comm.rank, q.shape[2]
        bufs = [torch.stack([k, v]), torch.empty((2, *k.shape), dtype=k.dtype, device=k.device)]
        out, lse = new_accumulators(q)
        aux = None
        for s in range(w):
            cur, nxt = bufs[s % 2], bufs[(s + 1) % 2]
            pending = _exchange(comm, cur, nxt, now=False) if s < w - 1 and opt.overlap else None
            blocks = schedule(r, (r - s) % w, n, opt.causal)
            step_aux = attend(opt.backend, q, cur[0], cur[1], blocks, scale=opt.scale, out=out, lse=lse,
                              fresh=s == 0)  # step 0 covers every row exactly once
            aux = step_aux if aux is None else aux
            if s < w - 1:
                pending = pending or _exchange(comm, cur, nxt, now=True)
                pending.wait()
        return stash(ctx, q, k, v, out, lse, (opt, aux))

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, out, lse, (opt, aux) = unstash(ctx)
        comm, schedule = opt.comm, SCHEDULES[opt.placement]
        w, r, n = comm.size, comm.rank, q.shape[2]
        dout = dout.contiguous()
        dq = torch.zeros_like(q, dtype=torch.float32)
        bufs = [torch.stack([k, v]), torch.empty((2, *k.shape), dtype=k.dtype, device=k.device)]
        dkv_bufs = [torch.empty((2, *k.shape), dtype=torch.float32, device=k.device) for _ in range(2)]
        dkv_pending: Pending | None = None
        for s in range(w):
            cur, nxt = bufs[s % 2], bufs[(s + 1) % 2]
            kv_pending = _exchange(comm, cur, nxt, now=False) if s < w - 1 and opt.overlap else None
            grads = torch.zeros((2, *k.shape), dtype=torch.float32, device=k.device)
            blocks = schedule(r, (r - s) % w, n, opt.causal)
            attend_backward(opt.backend, dout, q, cur[0], cur[1], out, lse, blocks, scale=opt.scale,
                            aux=aux, dq=dq, dk=grads[0], dv=grads[1])
            if s == 0:
                dkv = grads
            else:  # the accumulator of these K/V, received from the previous rank meanwhile
                assert dkv_pending is not None
                dkv_pending.wait()
                dkv = dkv_bufs[s % 2]
                dkv += grads
            if w > 1:
                dkv_pending = _exchange(comm, dkv, dkv_bufs[(s + 1) % 2], now=not opt.overlap)
            if s < w - 1:
                kv_pending = kv_pending or _exchange(comm, cur, nxt, now=True)
                kv_pending.wait()
        if w > 1:
            assert dkv_pending is not None
            dkv_pending.wait()
            dkv = dkv_bufs[w % 2]
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, comm: Comm, causal: bool, scale: float,
                   backend: SdpaBackend, placement: str, overlap: bool) -> torch.Tensor:
    return RingAttention.apply(q, k, v, RingOptions(placement, overlap, causal, scale, backend, comm))
