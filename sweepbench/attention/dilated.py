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

GQA kv heads are expanded before sparsifying (each head picks its own tokens).

What is per shape is built once (``_plan``, cached per shape and device): one index of every kept
(batch, head, token) of every branch into the flattened rows, so that q, k and v are gathered by
one ``index_select`` and their gradients added back by one ``index_add_`` per call. Local branches
with the same w / r kept tokens per segment are one attention call over all their segments, each a
batch entry (the seed's 2048/4096/8192 at rates 1/2/4 keep 2048 each: one call). All branches'
outputs are merged in one pass (the log-sum-exp over the entries of each row). The backward takes
the gathered q, k, v saved by the forward and calls each op once with the merged output and LSE.
No step reads a value back to the host."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from sweepbench.attention.accum import merge_
from sweepbench.attention.comm import Comm, Pending, gather_sequence, reduce_scatter_sequence
from sweepbench.attention.ops import (
    Block,
    SdpaBackend,
    attend,
    attend_backward,
    expand_kv,
    kv_in,
    new_accumulators,
    rows_in,
)
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


def _index(br: Branch, heads: int, head_base: int, local: list[Span]) -> torch.Tensor:
    """(heads, local_len / r): local positions each head keeps, span by span."""
    offs = (torch.arange(heads) + head_base) % br.rate
    parts = [s.local_start + torch.arange(0, s.length, br.rate)[None, :] + offs[:, None] for s in local]
    return torch.cat(parts, dim=1)


def _segment_index(br: Branch, heads: int, head_base: int, local: list[Span]) -> torch.Tensor:
    """(segments, heads, w / r): the local positions each head keeps, segment by segment (a local branch)."""
    m = br.segment // br.rate
    starts = torch.tensor([s.local_start + j for s in local for j in range(0, s.length, br.segment)])
    offs = (torch.arange(heads) + head_base) % br.rate
    return starts[:, None, None] + offs[None, :, None] + br.rate * torch.arange(m)[None, None, :]


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


@dataclass(frozen=True)
class _Local:
    """Local branches with the same w / r (``m``) kept tokens per segment: one attention call over
    all their segments, each a batch entry. Entries ``rows`` of the plan's index, laid out
    (B, segments, H, m)."""

    m: int
    segments: int  # per batch entry, over all the branches of the group
    rows: slice


@dataclass(frozen=True)
class _Long:
    """A branch whose segments span beyond the local chunks: its sparse local tokens (``n`` a head),
    entries ``rows`` of the plan's index laid out (B, H, n), and how its K/V travel."""

    br: Branch
    kind: str  # covering | group
    cover: Cover | None
    n: int
    rows: slice


@dataclass(frozen=True)
class _Plan:
    """What depends only on the shape: every kept (batch, head, token) of every branch as one index
    into the flattened (B*H*l) rows of q, k, v and the output, the local groups' entries first."""

    local: tuple[_Local, ...]
    long: tuple[_Long, ...]
    index: torch.Tensor  # (entries,) int64 on the device


@functools.lru_cache(maxsize=64)
def _plan(
    branches: tuple[Branch, ...],
    *,
    causal: bool,
    placement: str,
    rank: int,
    size: int,
    seq_len: int,
    exchange: str,
    head_base: int,
    batch: int,
    heads: int,
    length: int,
    device: torch.device,
) -> _Plan:
    """Built once per shape and device (the index is copied to the device once, not per call)."""
    local_spans = spans(placement, rank, size, seq_len)
    by_m: dict[int, list[torch.Tensor]] = {}
    longs: list[tuple[Branch, str, Cover | None, torch.Tensor]] = []
    for br in branches:
        if _is_local(br, local_spans):
            by_m.setdefault(br.segment // br.rate, []).append(_segment_index(br, heads, head_base, local_spans))
        elif exchange == "covering":
            assert placement == "contiguous", f"the covering exchange needs the contiguous placement, not {placement}"
            longs.append(
                (
                    br,
                    "covering",
                    cover(br, rank=rank, world_size=size, seq_len=seq_len, causal=causal),
                    _index(br, heads, head_base, local_spans),
                )
            )
        else:
            longs.append((br, "group", None, _index(br, heads, head_base, local_spans)))
    row0 = torch.arange(batch)[:, None] * (heads * length)  # (B, 1): where batch entry b's rows start
    head0 = torch.arange(heads)[:, None] * length  # (H, 1)
    parts, groups, plans, at = [], [], [], 0
    for m, idx in by_m.items():
        seg = torch.cat(idx) + head0[None]  # (S, H, m)
        flat = (row0[:, :, None, None] + seg[None]).reshape(-1)
        groups.append(_Local(m, seg.shape[0], slice(at, at + flat.numel())))
        parts.append(flat)
        at += flat.numel()
    for br, kind, cov, long_idx in longs:
        flat = (row0[:, :, None] + (long_idx + head0)[None]).reshape(-1)
        plans.append(_Long(br, kind, cov, long_idx.shape[1], slice(at, at + flat.numel())))
        parts.append(flat)
        at += flat.numel()
    return _Plan(tuple(groups), tuple(plans), torch.cat(parts).to(device))


def _merge_entries(
    o: torch.Tensor, lse: torch.Tensor, index: torch.Tensor, rows: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every branch's (entries, D) output and (entries,) LSE merged by their log-sum-exp into fp32
    (rows, D) and (rows,): out = sum of exp(lse_e - LSE) * o_e over the entries of a row, LSE their
    logsumexp (rows no entry keeps: 0 and -inf). One pass for all branches."""
    top = torch.full((rows,), float("-inf"), dtype=torch.float32, device=o.device)
    top.scatter_reduce_(0, index, lse, "amax")
    e = torch.exp(lse - top.index_select(0, index))
    total = torch.zeros_like(top).index_add_(0, index, e)
    out = torch.zeros((rows, o.shape[-1]), dtype=torch.float32, device=o.device)
    out.index_add_(0, index, o * (e / total.index_select(0, index))[:, None])
    return out, top + total.log()


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]) if x.dim() == 4 else x.reshape(-1)


class DilatedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, opt: DilatedOptions):
        b, h, n, d = q.shape
        plan = _plan(
            opt.branches,
            causal=opt.causal,
            placement=opt.placement,
            rank=opt.comm.rank,
            size=opt.comm.size,
            seq_len=opt.seq_len,
            exchange=opt.exchange,
            head_base=opt.head_base,
            batch=b,
            heads=h,
            length=n,
            device=q.device,
        )
        # q, k, v of every kept entry, gathered at once: (3, entries, D), each group a contiguous run
        sel = torch.stack([q, k, v]).view(3, b * h * n, d).index_select(1, plan.index)
        received: list[list[torch.Tensor]] = []
        pending: list[tuple[Pending, torch.Tensor] | None] = []  # a send's tensor kept alive until waited
        for lg in plan.long:  # the covering exchanges first: they run beside the local compute
            if (cov := lg.cover) is not None:
                kv = sel[1:, lg.rows].reshape(2, b, h, lg.n, d)  # a contiguous copy: what is sent
                received.append([torch.empty_like(kv) for _ in cov.srcs])
                pending.append((opt.comm.send_recv([(p, kv) for p in cov.dsts], list(zip(cov.srcs, received[-1]))), kv))
            else:
                received.append([])
                pending.append(None)
        outs, lses, auxes = [], [], []
        for g in plan.local:
            x = sel[:, g.rows].view(3, b * g.segments, h, g.m, d)
            o, lse, aux = opt.backend.forward(
                rows_in(opt.backend, x[0]),
                kv_in(opt.backend, x[1], h),
                kv_in(opt.backend, x[2], h),
                opt.causal,
                opt.scale,
            )
            outs.append(_flat(o))
            lses.append(_flat(lse))
            auxes.append([aux])
        for lg, got, wait in zip(plan.long, received, pending):
            qs, ks, vs = sel[:, lg.rows].view(3, b, h, lg.n, d)
            if lg.kind == "covering":
                o, lse, aux = opt.backend.forward(
                    rows_in(opt.backend, qs),
                    kv_in(opt.backend, ks, h),
                    kv_in(opt.backend, vs, h),
                    opt.causal,
                    opt.scale,
                )
                wait[0].wait()  # type: ignore[index]
                call_aux = [aux]
                if got:
                    o = o.float()
                    for kv in got:
                        bo, bl, aux = opt.backend.forward(
                            rows_in(opt.backend, qs),
                            kv_in(opt.backend, kv[0], h),
                            kv_in(opt.backend, kv[1], h),
                            False,
                            opt.scale,
                        )
                        merge_(o, lse, bo, bl)
                        call_aux.append(aux)
                auxes.append(call_aux)
            else:
                o, lse = new_accumulators(qs)
                kv = _gather_sequence(opt, sel[1:, lg.rows].view(2, b, h, lg.n, d))
                auxes.append(
                    [
                        attend(
                            opt.backend,
                            qs,
                            kv[0],
                            kv[1],
                            _long_blocks(
                                lg.br, spans(opt.placement, opt.comm.rank, opt.comm.size, opt.seq_len), opt.causal
                            ),
                            scale=opt.scale,
                            out=o,
                            lse=lse,
                        )
                    ]
                )
            outs.append(_flat(o))
            lses.append(_flat(lse))
        one = len(outs) == 1
        out, lse = _merge_entries(
            outs[0] if one else torch.cat(outs), lses[0] if one else torch.cat(lses), plan.index, b * h * n
        )
        out = out.view(b, h, n, d).to(q.dtype)
        ctx.save_for_backward(sel, out, lse)
        ctx.meta = (opt, plan, auxes, received)
        return out

    @staticmethod
    def backward(ctx, dout):
        sel, out, lse = ctx.saved_tensors
        opt, plan, auxes, received = ctx.meta
        b, h, n, d = out.shape
        be = opt.backend
        # dout and out of every kept entry at once, and their merged LSE
        od = torch.stack([dout, out]).view(2, b * h * n, d).index_select(1, plan.index)
        ls = lse.index_select(0, plan.index)
        grads = torch.zeros((3, b * h * n, d), dtype=torch.float32, device=out.device)
        parts: list[tuple[slice, torch.Tensor]] = []
        returns: list[tuple[torch.Tensor, list[torch.Tensor], Pending, list]] = []  # sends kept alive until done
        for lg, got, aux in zip(plan.long, received, auxes[len(plan.local) :]):  # spanning ones first: their
            qs, ks, vs = sel[:, lg.rows].view(3, b, h, lg.n, d)  # dK/dV travel meanwhile
            dos, os_ = od[:, lg.rows].view(2, b, h, lg.n, d)
            lsl = ls[lg.rows].view(b, h, lg.n)
            acc = torch.empty((3, b, h, lg.n, d), dtype=torch.float32, device=out.device)
            if lg.kind == "covering":
                sends, dqs = [], []
                for src, kv, a in zip(lg.cover.srcs, got, aux[1:]):
                    gq, gk, gv = be.backward(
                        rows_in(be, dos),
                        rows_in(be, qs),
                        kv_in(be, kv[0], h),
                        kv_in(be, kv[1], h),
                        rows_in(be, os_),
                        lsl,
                        a,
                        False,
                        opt.scale,
                    )
                    dqs.append(gq)
                    sends.append((src, torch.stack([gk, gv], out=torch.empty_like(acc[1:]))))
                back = [torch.empty_like(acc[1:]) for _ in lg.cover.dsts]
                pending = opt.comm.send_recv(sends, list(zip(lg.cover.dsts, back)))
                gq, gk, gv = be.backward(
                    rows_in(be, dos),
                    rows_in(be, qs),
                    kv_in(be, ks, h),
                    kv_in(be, vs, h),
                    rows_in(be, os_),
                    lsl,
                    aux[0],
                    opt.causal,
                    opt.scale,
                )
                torch.stack([gq, gk, gv], out=acc)
                for gq in dqs:
                    acc[0] += gq
                returns.append((acc, back, pending, sends))
            else:
                kv = _gather_sequence(opt, torch.stack([ks, vs]))
                dkv = torch.zeros_like(kv, dtype=torch.float32)
                acc[0].zero_()
                local = spans(opt.placement, opt.comm.rank, opt.comm.size, opt.seq_len)
                attend_backward(
                    be,
                    dos,
                    qs,
                    kv[0],
                    kv[1],
                    os_,
                    lsl,
                    _long_blocks(lg.br, local, opt.causal),
                    scale=opt.scale,
                    aux=aux[0],
                    dq=acc[0],
                    dk=dkv[0],
                    dv=dkv[1],
                )
                acc[1], acc[2] = _scatter_sequence(opt, dkv)
            parts.append((lg.rows, acc.view(3, -1, d)))
        for g, aux in zip(plan.local, auxes):
            x = sel[:, g.rows].view(3, b * g.segments, h, g.m, d)
            dd = od[:, g.rows].view(2, b * g.segments, h, g.m, d)
            grad = be.backward(
                rows_in(be, dd[0]),
                rows_in(be, x[0]),
                kv_in(be, x[1], h),
                kv_in(be, x[2], h),
                rows_in(be, dd[1]),
                ls[g.rows].view(b * g.segments, h, g.m),
                aux[0],
                opt.causal,
                opt.scale,
            )
            acc = torch.empty((3, b * g.segments, h, g.m, d), dtype=torch.float32, device=out.device)
            parts.append((g.rows, torch.stack(grad, out=acc).view(3, -1, d)))
        for acc, back, pending, _ in returns:  # the dK/dV the later ranks of each segment computed for ours
            pending.wait()
            for dkv in back:
                acc[1:] += dkv
        for rows, part in parts:
            grads.index_add_(1, plan.index[rows], part)
        dq, dk, dv = grads.view(3, b, h, n, d).to(out.dtype)
        return dq, dk, dv, None


def _gather_sequence(opt: DilatedOptions, x: torch.Tensor) -> torch.Tensor:
    """Every rank's sparse local (2, B, H, l, D) -> the whole sparse sequence, in sequence order."""
    return gather_sequence(opt.comm, x, dim=3, placement=opt.placement)


def _scatter_sequence(opt: DilatedOptions, dkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of the gathered sparse K/V, summed over ranks, back to the ranks that own them."""
    mine = reduce_scatter_sequence(opt.comm, dkv, dim=3, placement=opt.placement)
    return mine[0], mine[1]


def dilated_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    comm: Comm,
    causal: bool,
    scale: float,
    backend: SdpaBackend,
    placement: str,
    seq_len: int,
    branches: tuple[Branch, ...],
    head_base: int = 0,
    exchange: str = "group",
) -> torch.Tensor:
    """Dilated attention of the local queries (autograd-aware); kv heads expanded to the q heads."""
    assert exchange in EXCHANGES, f"exchange={exchange!r}; valid: {', '.join(EXCHANGES)}"
    k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    opt = DilatedOptions(branches, causal, scale, backend, comm, placement, seq_len, head_base, exchange)
    return DilatedAttention.apply(q, k, v, opt)
