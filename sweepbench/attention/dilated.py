"""Dilated attention (LongNet, Ding et al. 2023), on one device or over a context-parallel group.

A branch (w, r): the sequence is cut into segments of w tokens; inside each segment, head h keeps
every r-th token starting at offset (h mod r) (the heads split a branch's offsets between them, so
together they cover every token); each kept token attends to the kept tokens of its segment
(causally: to those not after it). Branches are merged by their log-sum-exp, which is LongNet's
weighting of each branch by its softmax denominator. A token no branch keeps for a head gets 0.

Over W ranks (any placement whose chunks are whole segments or parts of one): each rank sparsifies
its own tokens; branches whose segments fit in a local chunk are computed locally with no
communication; for the longer ones the sparsified K/V (1/r of the tokens) are all-gathered, and
each local chunk's queries attend to their segment. Backward recomputes from the merged output and
LSE (as the ring does) and reduce-scatters the gathered K/V's gradients back to their owners.
GQA kv heads are expanded before sparsifying (each head picks its own tokens)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sweepbench.attention.accum import merge_
from sweepbench.attention.comm import Comm, gather_sequence, reduce_scatter_sequence
from sweepbench.attention.ops import (Block, SdpaBackend, attend, attend_backward, expand_kv, full_blocks,
                                      new_accumulators, stash, unstash)
from sweepbench.attention.placement import Span, spans


@dataclass(frozen=True)
class Branch:
    segment: int  # w, tokens per segment
    rate: int  # r, dilation


@dataclass(frozen=True)
class DilatedOptions:
    branches: tuple[Branch, ...]
    causal: bool
    scale: float
    backend: SdpaBackend
    comm: Comm
    placement: str
    seq_len: int  # the whole sequence
    head_base: int = 0  # global index of local head 0 (Ulysses holds a slice of the heads)


def branches_of(segment_lengths: list[int], dilation_rates: list[int]) -> tuple[Branch, ...]:
    return tuple(Branch(w, r) for w, r in zip(segment_lengths, dilation_rates))


def _index(br: Branch, heads: int, head_base: int, local: list[Span], device: torch.device) -> torch.Tensor:
    """(heads, local_len / r): local positions each head keeps, span by span."""
    offs = (torch.arange(heads, device=device) + head_base) % br.rate
    parts = [s.local_start + torch.arange(0, s.length, br.rate, device=device)[None, :] + offs[:, None]
             for s in local]
    return torch.cat(parts, dim=1)


def _take(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    b, _, _, d = x.shape
    return x.gather(2, idx[None, :, :, None].expand(b, -1, -1, d))


def _segments(x: torch.Tensor, m: int) -> torch.Tensor:
    """(B, H, n*m, ...) -> (B*n, H, m, ...): each segment a batch entry."""
    b, h, l = x.shape[:3]
    return x.reshape(b, h, l // m, m, *x.shape[3:]).transpose(1, 2).reshape(b * (l // m), h, m, *x.shape[3:])


def _unsegments(x: torch.Tensor, b: int) -> torch.Tensor:
    n, h, m = x.shape[:3]
    return x.reshape(b, n // b, h, m, *x.shape[3:]).transpose(1, 2).reshape(b, h, (n // b) * m, *x.shape[3:])


def _long_blocks(br: Branch, local: list[Span], causal: bool) -> list[Block]:
    """Blocks of the local sparse queries against the gathered sparse K/V of the whole sequence."""
    blocks, r, m = [], br.rate, br.segment // br.rate
    for s in local:
        rows = slice(s.local_start // r, (s.local_start + s.length) // r)
        g0, seg0 = s.global_start // r, (s.global_start // br.segment) * m
        if not causal:
            blocks.append(Block(rows, slice(seg0, seg0 + m), False))
            continue
        if g0 > seg0:
            blocks.append(Block(rows, slice(seg0, g0), False))
        blocks.append(Block(rows, slice(g0, g0 + s.length // r), True))
    return blocks


class DilatedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, opt: DilatedOptions):  # type: ignore[override]
        local = spans(opt.placement, opt.comm.rank, opt.comm.size, opt.seq_len)
        out, lse = new_accumulators(q)
        aux = ()
        for br in opt.branches:
            idx = _index(br, q.shape[1], opt.head_base, local, q.device)
            qs, ks, vs = _take(q, idx), _take(k, idx), _take(v, idx)
            bo, bl = new_accumulators(qs)
            if br.segment <= local[0].length:
                m = br.segment // br.rate
                so, sl = _segments(bo, m), _segments(bl, m)
                aux = attend(opt.backend, _segments(qs, m), _segments(ks, m), _segments(vs, m),
                             full_blocks(m, opt.causal), scale=opt.scale, out=so, lse=sl)
                bo, bl = _unsegments(so, q.shape[0]), _unsegments(sl, q.shape[0])
            else:
                kv = _gather_sequence(opt, torch.stack([ks, vs]))
                aux = attend(opt.backend, qs, kv[0], kv[1], _long_blocks(br, local, opt.causal),
                             scale=opt.scale, out=bo, lse=bl)
            so, sl = _take(out, idx), lse.gather(2, idx[None].expand(q.shape[0], -1, -1))
            merge_(so, sl, bo, bl)
            out.scatter_(2, idx[None, :, :, None].expand_as(so), so)
            lse.scatter_(2, idx[None].expand_as(sl), sl)
        return stash(ctx, q, k, v, out, lse, (opt, aux))

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, out, lse, (opt, aux) = unstash(ctx)
        local = spans(opt.placement, opt.comm.rank, opt.comm.size, opt.seq_len)
        grads = [torch.zeros_like(x, dtype=torch.float32) for x in (q, k, v)]
        for br in opt.branches:
            idx = _index(br, q.shape[1], opt.head_base, local, q.device)
            qs, ks, vs, dos, os_ = (_take(x, idx) for x in (q, k, v, dout, out))
            ls = lse.gather(2, idx[None].expand(q.shape[0], -1, -1))
            dqs = torch.zeros_like(qs, dtype=torch.float32)
            if br.segment <= local[0].length:
                m, b = br.segment // br.rate, q.shape[0]
                dks, dvs = torch.zeros_like(dqs), torch.zeros_like(dqs)
                sq, sk, sv = _segments(dqs, m), _segments(dks, m), _segments(dvs, m)
                attend_backward(opt.backend, _segments(dos, m), _segments(qs, m), _segments(ks, m),
                                _segments(vs, m), _segments(os_, m), _segments(ls, m), full_blocks(m, opt.causal),
                                scale=opt.scale, aux=aux, dq=sq, dk=sk, dv=sv)
                dqs, dks, dvs = _unsegments(sq, b), _unsegments(sk, b), _unsegments(sv, b)
            else:
                kv = _gather_sequence(opt, torch.stack([ks, vs]))
                dkv = torch.zeros_like(kv, dtype=torch.float32)
                attend_backward(opt.backend, dos, qs, kv[0], kv[1], os_, ls, _long_blocks(br, local, opt.causal),
                                scale=opt.scale, aux=aux, dq=dqs, dk=dkv[0], dv=dkv[1])
                dks, dvs = _scatter_sequence(opt, dkv)
            for g, part in zip(grads, (dqs, dks, dvs)):
                g.scatter_add_(2, idx[None, :, :, None].expand_as(part), part)
        return grads[0].to(q.dtype), grads[1].to(k.dtype), grads[2].to(v.dtype), None


def _gather_sequence(opt: DilatedOptions, x: torch.Tensor) -> torch.Tensor:
    """Every rank's sparse local (2, B, H, l, D) -> the whole sparse sequence, in sequence order."""
    return gather_sequence(opt.comm, x, dim=3, placement=opt.placement)


def _scatter_sequence(opt: DilatedOptions, dkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of the gathered sparse K/V, summed over ranks, back to the ranks that own them."""
    mine = reduce_scatter_sequence(opt.comm, dkv, dim=3, placement=opt.placement)
    return mine[0], mine[1]


def dilated_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, comm: Comm, causal: bool,
                      scale: float, backend: SdpaBackend, placement: str, seq_len: int,
                      branches: tuple[Branch, ...], head_base: int = 0) -> torch.Tensor:
    """Dilated attention of the local queries (autograd-aware); kv heads expanded to the q heads."""
    k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    opt = DilatedOptions(branches, causal, scale, backend, comm, placement, seq_len, head_base)
    return DilatedAttention.apply(q, k, v, opt)
