"""Llama-3-style context parallelism: all-gather K/V, keep Q local.

Each rank all-gathers the packed K/V (only the kv heads) of the whole sequence once, then its
local queries (zigzag placement, so causal work is balanced) attend to the keys before them: per
local chunk, the earlier keys in full and the chunk's own keys causally, merged by LSE. Backward
computes dK/dV for the whole sequence locally and reduce-scatters them back to their owners.
Nothing overlaps here: this is the simple schedule the ring is compared with."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sweepbench.attention.comm import Comm, gather_sequence, reduce_scatter_sequence
from sweepbench.attention.ops import Block, SdpaBackend, attend, attend_backward, new_accumulators, stash, unstash
from sweepbench.attention.placement import spans


@dataclass(frozen=True)
class AllGatherOptions:
    causal: bool
    scale: float
    backend: SdpaBackend
    comm: Comm
    placement: str


def _blocks(opt: AllGatherOptions, local_len: int) -> list[Block]:
    seq_len = local_len * opt.comm.size
    if not opt.causal:
        return [Block(slice(None), slice(None), False)]
    blocks = []
    for s in spans(opt.placement, opt.comm.rank, opt.comm.size, seq_len):
        rows = slice(s.local_start, s.local_start + s.length)
        if s.global_start:
            blocks.append(Block(rows, slice(0, s.global_start), False))
        blocks.append(Block(rows, slice(s.global_start, s.global_start + s.length), True))
    return blocks


class AllGatherAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, opt: AllGatherOptions):
        kv = gather_sequence(opt.comm, torch.stack([k, v]), dim=3, placement=opt.placement)
        out, lse = new_accumulators(q)
        aux = attend(opt.backend, q, kv[0], kv[1], _blocks(opt, q.shape[2]), scale=opt.scale, out=out, lse=lse)
        return stash(ctx, q, k, v, out, lse, (opt, aux))

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, (opt, aux) = unstash(ctx)
        kv = gather_sequence(opt.comm, torch.stack([k, v]), dim=3, placement=opt.placement)
        dq = torch.zeros_like(q, dtype=torch.float32)
        dkv = torch.zeros_like(kv, dtype=torch.float32)
        attend_backward(
            opt.backend,
            dout.contiguous(),
            q,
            kv[0],
            kv[1],
            out,
            lse,
            _blocks(opt, q.shape[2]),
            scale=opt.scale,
            aux=aux,
            dq=dq,
            dk=dkv[0],
            dv=dkv[1],
        )
        mine = reduce_scatter_sequence(opt.comm, dkv, dim=3, placement=opt.placement)
        return dq.to(q.dtype), mine[0].to(k.dtype), mine[1].to(v.dtype), None


def allgather_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    comm: Comm,
    causal: bool,
    scale: float,
    backend: SdpaBackend,
    placement: str,
) -> torch.Tensor:
    return AllGatherAttention.apply(q, k, v, AllGatherOptions(causal, scale, backend, comm, placement))
