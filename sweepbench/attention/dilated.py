"""Dilated attention (LongNet, Ding et al. 2023), on one device or over a context-parallel group.

A branch (w, r): the sequence is cut into segments of w tokens; inside each segment, head h keeps
every r-th token starting at offset (h mod r) (the heads split a branch's offsets between them, so
together they cover every token); each kept token attends to the kept tokens of its segment
(causally: to those not after it). Branches are merged by their log-sum-exp, which is LongNet's
weighting of each branch by its softmax denominator. A token no branch keeps for a head gets 0.

Over W ranks each rank sparsifies its own tokens. A branch whose segments lie whole inside the
rank's chunks is computed locally with no communication. For a longer branch, how the sparsified
K/V (1/r of the tokens) travel is the ``exchange``:

- ``covering`` (LongNet's distributed form, contiguous placement): a segment of w tokens covers
  the g = w / (L/W) consecutive ranks holding it, and only they exchange: each sends its sparse
  K/V to the ranks of its segment that attend to it (causal: the later ones; else all), point to
  point, started before the local branches are computed so that the transfer runs beside them.
  The received K/V are kept for the backward, whose dK/dV of them (fp32) go back to their owners
  the same way. A segment inside one rank sends nothing, so with segments no longer than a chunk
  a step moves no bytes at all.
- ``group`` (the whole-group gather of the reference code, any placement): the sparse K/V of the
  whole sequence are all-gathered over every rank, each local chunk's queries attend to their
  segment, and the gathered K/V's gradients are reduce-scattered back (the backward gathers again).

GQA kv heads are expanded before sparsifying (each head picks its own tokens)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sweepbench.attention.accum import merge_
from sweepbench.attention.comm import Comm, Pending, gather_sequence, reduce_scatter_sequence
from sweepbench.attention.ops import (Aux, Block, SdpaBackend, attend, attend_backward, expand_kv, full_blocks,
                                      new_accumulators, stash, unstash)
from sweepbench.attention.placement import Span, spans

EXCHANGES = ("covering", "group")


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
    exchange: str = "group"  # covering | group: how a branch longer than a chunk moves its K/V


def branches_of(segment_lengths: list[int], dilation_rates: list[int]) -> tuple[Branch, ...]:
    return tuple(Branch(w, r) for w, r in zip(segment_lengths, dilation_rates))


@dataclass(frozen=True)
class Cover:
    """The ranks of this rank's segment (``covering``): whose sparse K/V it receives (``srcs``) and
    to whom it sends its own (``dsts``), in rank order."""

    srcs: tuple[int, ...]
    dsts: tuple[int, ...]


def cover(br: Branch, *, rank: int, world_size: int, seq_len: int, causal: bool) -> Cover:
    """Rank ``rank``'s peers for branch ``br`` under the contiguous placement, where the branch's
    segments span g = w / chunk whole chunks (ranks first..first+g-1)."""
    chunk = seq_len // world_size
    assert br.segment % chunk == 0, f"segment {br.segment} is not a multiple of the chunk of {chunk} tokens"
    g = br.segment // chunk
    first = rank - rank % g
    before, after = tuple(range(first, rank)), tuple(range(rank + 1, first + g))
    return Cover(before, after) if causal else Cover(before + after, before + after)


def _is_local(br: Branch, local: list[Span]) -> bool:
    return all(s.length % br.segment == 0 and s.global_start % br.segment == 0 for s in local)


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


@dataclass
class _Sparse:
    """One branch's sparse view of the local tokens, and the K/V its segment's other ranks sent."""

    br: Branch
    idx: torch.Tensor
    kind: str  # local | covering | group
    cover: Cover | None = None
    received: list[torch.Tensor] | None = None  # (2, B, H, l/r, D) per rank of cover.srcs
    sent: torch.Tensor | None = None  # this rank's (2, B, H, l/r, D), alive until its sends are done
    pending: Pending | None = None


def _plan(opt: DilatedOptions, local: list[Span], heads: int, device: torch.device) -> list[_Sparse]:
    out = []
    for br in opt.branches:
        idx = _index(br, heads, opt.head_base, local, device)
        if _is_local(br, local):
            out.append(_Sparse(br, idx, "local"))
        elif opt.exchange == "covering":
            assert opt.placement == "contiguous", f"the covering exchange needs the contiguous placement, " \
                                                  f"not {opt.placement}"
            out.append(_Sparse(br, idx, "covering", cover(br, rank=opt.comm.rank, world_size=opt.comm.size,
                                                          seq_len=opt.seq_len, causal=opt.causal)))
        else:
            out.append(_Sparse(br, idx, "group"))
    return out


def _merge_branch(out: torch.Tensor, lse: torch.Tensor, idx: torch.Tensor, bo: torch.Tensor,
                  bl: torch.Tensor) -> None:
    so, sl = _take(out, idx), lse.gather(2, idx[None].expand(out.shape[0], -1, -1))
    merge_(so, sl, bo, bl)
    out.scatter_(2, idx[None, :, :, None].expand_as(so), so)
    lse.scatter_(2, idx[None].expand_as(sl), sl)


def _forward_branch(opt: DilatedOptions, sp: _Sparse, qs: torch.Tensor, ks: torch.Tensor, vs: torch.Tensor,
                    local: list[Span]) -> tuple[torch.Tensor, torch.Tensor, Aux]:
    bo, bl = new_accumulators(qs)
    if sp.kind == "local":
        m = sp.br.segment // sp.br.rate
        so, sl = _segments(bo, m), _segments(bl, m)
        aux = attend(opt.backend, _segments(qs, m), _segments(ks, m), _segments(vs, m),
                     full_blocks(m, opt.causal), scale=opt.scale, out=so, lse=sl)
        return _unsegments(so, qs.shape[0]), _unsegments(sl, qs.shape[0]), aux
    if sp.kind == "covering":
        n = qs.shape[2]
        aux = attend(opt.backend, qs, ks, vs, full_blocks(n, opt.causal), scale=opt.scale, out=bo, lse=bl)
        sp.pending.wait()  # type: ignore[union-attr]
        for kv in sp.received:  # type: ignore[union-attr]
            aux = attend(opt.backend, qs, kv[0], kv[1], full_blocks(n, False), scale=opt.scale, out=bo, lse=bl)
        return bo, bl, aux
    kv = _gather_sequence(opt, torch.stack([ks, vs]))
    aux = attend(opt.backend, qs, kv[0], kv[1], _long_blocks(sp.br, local, opt.causal),
                 scale=opt.scale, out=bo, lse=bl)
    return bo, bl, aux


class DilatedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, opt: DilatedOptions):  # type: ignore[override]
        local = spans(opt.placement, opt.comm.rank, opt.comm.size, opt.seq_len)
        out, lse = new_accumulators(q)
        plan = _plan(opt, local, q.shape[1], q.device)
        sparse = [(_take(q, sp.idx), _take(k, sp.idx), _take(v, sp.idx)) for sp in plan]
        for sp, (_, ks, vs) in zip(plan, sparse):  # the covering exchanges first: they run beside the compute
            if sp.kind == "covering":
                sp.sent = torch.stack([ks, vs])
                sp.received = [torch.empty_like(sp.sent) for _ in sp.cover.srcs]  # type: ignore[union-attr]
                sp.pending = opt.comm.send_recv([(d, sp.sent) for d in sp.cover.dsts],  # type: ignore[union-attr]
                                                list(zip(sp.cover.srcs, sp.received)))  # type: ignore[union-attr]
        aux: Aux = ()
        for sp, xs in sorted(zip(plan, sparse), key=lambda p: p[0].kind == "covering"):  # covering ones last
            bo, bl, aux = _forward_branch(opt, sp, *xs, local)
            _merge_branch(out, lse, sp.idx, bo, bl)
        for sp in plan:
            sp.pending, sp.sent = None, None
        return stash(ctx, q, k, v, out, lse, (opt, aux, plan))

    @staticmethod
    def backward(ctx, dout):  # type: ignore[override]
        q, k, v, out, lse, (opt, aux, plan) = unstash(ctx)
        local = spans(opt.placement, opt.comm.rank, opt.comm.size, opt.seq_len)
        grads = [torch.zeros_like(x, dtype=torch.float32) for x in (q, k, v)]
        returns: list[tuple[_Sparse, list, list[torch.Tensor], Pending]] = []  # sends kept alive until done
        for sp in sorted(plan, key=lambda p: p.kind != "covering"):  # covering first: their dK/dV travel meanwhile
            qs, ks, vs, dos, os_ = (_take(x, sp.idx) for x in (q, k, v, dout, out))
            ls = lse.gather(2, sp.idx[None].expand(q.shape[0], -1, -1))
            dqs = torch.zeros_like(qs, dtype=torch.float32)
            dks, dvs = torch.zeros_like(dqs), torch.zeros_like(dqs)
            if sp.kind == "local":
                m, b = sp.br.segment // sp.br.rate, q.shape[0]
                sq, sk, sv = _segments(dqs, m), _segments(dks, m), _segments(dvs, m)
                attend_backward(opt.backend, _segments(dos, m), _segments(qs, m), _segments(ks, m),
                                _segments(vs, m), _segments(os_, m), _segments(ls, m), full_blocks(m, opt.causal),
                                scale=opt.scale, aux=aux, dq=sq, dk=sk, dv=sv)
                dqs, dks, dvs = _unsegments(sq, b), _unsegments(sk, b), _unsegments(sv, b)
            elif sp.kind == "covering":
                n = qs.shape[2]
                sends = []
                for src, kv in zip(sp.cover.srcs, sp.received):  # type: ignore[union-attr, arg-type]
                    dkv = torch.zeros_like(kv, dtype=torch.float32)
                    attend_backward(opt.backend, dos, qs, kv[0], kv[1], os_, ls, full_blocks(n, False),
                                    scale=opt.scale, aux=aux, dq=dqs, dk=dkv[0], dv=dkv[1])
                    sends.append((src, dkv))
                back = [torch.empty((2, *dks.shape), dtype=torch.float32, device=q.device)
                        for _ in sp.cover.dsts]  # type: ignore[union-attr]
                pending = opt.comm.send_recv(sends, list(zip(sp.cover.dsts, back)))  # type: ignore[union-attr]
                attend_backward(opt.backend, dos, qs, ks, vs, os_, ls, full_blocks(n, opt.causal),
                                scale=opt.scale, aux=aux, dq=dqs, dk=dks, dv=dvs)
                returns.append((sp, sends, back, pending))
            else:
                kv = _gather_sequence(opt, torch.stack([ks, vs]))
                dkv = torch.zeros_like(kv, dtype=torch.float32)
                attend_backward(opt.backend, dos, qs, kv[0], kv[1], os_, ls, _long_blocks(sp.br, local, opt.causal),
                                scale=opt.scale, aux=aux, dq=dqs, dk=dkv[0], dv=dkv[1])
                dks, dvs = _scatter_sequence(opt, dkv)
            for g, part in zip(grads, (dqs, dks, dvs)):
                g.scatter_add_(2, sp.idx[None, :, :, None].expand_as(part), part)
        for sp, _, back, pending in returns:  # the dK/dV the later ranks of each segment computed for ours
            pending.wait()
            for dkv in back:
                idx = sp.idx[None, :, :, None].expand_as(dkv[0])
                grads[1].scatter_add_(2, idx, dkv[0])
                grads[2].scatter_add_(2, idx, dkv[1])
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
                      branches: tuple[Branch, ...], head_base: int = 0, exchange: str = "group") -> torch.Tensor:
    """Dilated attention of the local queries (autograd-aware); kv heads expanded to the q heads."""
    assert exchange in EXCHANGES, f"exchange={exchange!r}; valid: {', '.join(EXCHANGES)}"
    k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    opt = DilatedOptions(branches, causal, scale, backend, comm, placement, seq_len, head_base, exchange)
    return DilatedAttention.apply(q, k, v, opt)
