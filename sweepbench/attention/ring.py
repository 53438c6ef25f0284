"""Ring attention: K/V travel around the ring, queries stay; backward is a second ring, reversed.

Forward, on rank r of W: K and V (only the kv heads) are sent on W-1 times with batched async p2p
(``Comm.ring_exchange``, both tensors in one batch) into a spare pair of buffers while the current
step computes (``overlap``); step s holds the K/V of rank r-s, so the forward ends holding rank
r+1's, which it keeps for the backward. Each step is one kernel call per block of the placement's
schedule (``SCHEDULES``: the zigzag gives one call per step, a causal one on the own K/V, a
rectangular one on the others); blocks are LSE-merged (``accum.Merged``: the first as the kernel gave
it, the last merge written in the output dtype, fp32 math).

Backward visits the K/V in the reverse order: rank r+1's first (kept from the forward, no
transfer), then r+2, ... and its own last, rotating K/V and the dK/dV accumulator towards rank r-1.
The accumulator of a K/V thus reaches its owner after W-1 sends, each overlapped with the next
step's compute, and the last step (the own K/V) sends nothing: no transfer is left exposed at the
end, and at W=2 the backward moves only one dK/dV. An accumulator holding one step's gradient
travels in the input dtype (it is one kernel's output), a sum of several in fp32. It spans only the
rows of that K/V the blocks so far attended to (``_key_rows``; the receiver works the span out from
the same schedule): at W=2 with the zigzag, rank 1's dK/dV of rank 0's K/V is its first half only,
the kernel's output sent as it is (no zero-filled full-length buffer).
``ring_naive`` is this code with contiguous placement and no overlap: each exchange is waited for
at once; ``ring_lp`` is ``ring`` with every travelling dK/dV in the input dtype (bf16 on GPUs: half
the bytes of the fp32 sums, rounded once per hop; the fp32 sums stay ``ring``'s)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from sweepbench.attention.accum import Merged, RowSum
from sweepbench.attention.comm import Comm, Pending
from sweepbench.attention.ops import Block, SdpaBackend, block_grads, kv_in, rows_in, stash, unstash
from sweepbench.core import Registry

Schedule = Callable[[int, int, int, bool], list[Block]]  # (rank, src, local_len, causal)
ALL = slice(None)
# placement -> the blocks each ring step computes
SCHEDULES: Registry[Schedule] = Registry("ring schedule", ordered=True)


@SCHEDULES.register("contiguous")
def _contiguous(rank: int, src: int, n: int, causal: bool) -> list[Block]:
    if not causal:
        return [Block(ALL, ALL, False)]
    if src == rank:
        return [Block(ALL, ALL, True)]
    return [Block(ALL, ALL, False)] if src < rank else []  # later chunks are masked out


@SCHEDULES.register("zigzag")
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


@dataclass(frozen=True)
class RingOptions:
    placement: str
    overlap: bool
    causal: bool
    scale: float
    backend: SdpaBackend
    comm: Comm
    # the travelling dK/dV in the input dtype at every step (``ring_lp``): half the backward's gradient
    # bytes in bf16, one rounding to it per hop; False: a sum of several steps travels in fp32
    grads_in_input_dtype: bool = False


KV = tuple[torch.Tensor, torch.Tensor]


def _exchange(opt: RingOptions, send: KV, recv: KV, *, reverse: bool = False) -> Pending:
    pending = opt.comm.ring_exchange((send[0].contiguous(), send[1].contiguous()), recv, reverse=reverse)
    if not opt.overlap:
        pending.wait()
    return pending


def _key_rows(opt: RingOptions, ranks: list[int], src: int, n: int) -> slice:
    """The rows of rank ``src``'s K/V that the blocks of ``ranks`` attend to: the hull of their key
    slices (all rows where they attend to none)."""
    spans = [b.k.indices(n)[:2] for r in ranks for b in SCHEDULES[opt.placement](r, src, n, opt.causal)]
    return slice(min(a for a, _ in spans), max(e for _, e in spans)) if spans else slice(0, n)


def _within(rows: slice, span: slice, n: int) -> slice:
    """``rows`` (of all n rows) as rows of the tensor that holds ``span``."""
    a, e, _ = rows.indices(n)
    return slice(a - span.start, e - span.start)


def _shape(like: torch.Tensor, rows: slice) -> tuple[int, ...]:
    """``like``'s shape with ``rows``' number of rows (dim 2)."""
    return (*like.shape[:2], rows.stop - rows.start, *like.shape[3:])


def _sized(like: torch.Tensor, rows: slice, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(_shape(like, rows), dtype=dtype, device=like.device)


def _empty(like: KV) -> KV:
    """Contiguous receive buffers shaped like ``like`` (whatever its strides)."""
    return (
        torch.empty(like[0].shape, dtype=like[0].dtype, device=like[0].device),
        torch.empty(like[1].shape, dtype=like[1].dtype, device=like[1].device),
    )


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, opt: RingOptions):
        schedule = SCHEDULES[opt.placement]
        w, r, n = opt.comm.size, opt.comm.rank, q.shape[2]
        cur, spare = (k, v), None
        merged, aux = Merged(q), None
        for s in range(w):
            pending = None
            if s < w - 1:
                nxt = spare or _empty(cur)
                pending = _exchange(opt, cur, nxt)
            blocks = schedule(r, (r - s) % w, n, opt.causal)
            for i, b in enumerate(blocks):
                o, lse, step_aux = opt.backend.forward(
                    rows_in(opt.backend, q[:, :, b.q]),
                    kv_in(opt.backend, cur[0][:, :, b.k], q.shape[1]),
                    kv_in(opt.backend, cur[1][:, :, b.k], q.shape[1]),
                    b.causal,
                    opt.scale,
                )
                merged.add(b.q, o, lse, last=s == w - 1 and i == len(blocks) - 1)
                aux = step_aux if aux is None else aux
            if pending is not None:
                pending.wait()
                spare, cur = (cur if s else None), nxt  # never write into the caller's k, v
        kept = cur if w > 1 else None  # rank r+1's K/V: the backward's first step
        return stash(ctx, q, k, v, *merged.result(), (opt, aux, kept))

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, (opt, aux, kept) = unstash(ctx)
        schedule = SCHEDULES[opt.placement]
        w, r, n = opt.comm.size, opt.comm.rank, q.shape[2]
        dout = dout.contiguous()
        dq = RowSum(q.shape, device=q.device)
        cur, spare = (kept if w > 1 else (k, v)), None
        got: KV | None = None  # the dK/dV accumulator of the current K/V, from rank r+1
        got_rows = ALL  # the rows of that K/V it spans (ranks r+1..r+s attended to them)
        got_pending: Pending | None = None
        for s in range(w):
            own = s == w - 1  # the last step: this rank's own K/V, whose gradient stays here
            kv_pending = None
            if s < w - 2:
                nxt = spare or _empty(cur)
                kv_pending = _exchange(opt, cur, nxt, reverse=True)
            src = (r + 1 + s) % w
            blocks = schedule(r, src, n, opt.causal)
            assert len(blocks) <= 1, "one block per step: a travelling dK/dV is one kernel's output after step 0"
            # this K/V's accumulator after this step: the rows ranks r..r+s attended to (all rows at the owner)
            span = slice(0, n) if own else _key_rows(opt, [(r + j) % w for j in range(s + 1)], src, n)
            dk, dv = RowSum(_shape(k, span), device=k.device), RowSum(_shape(v, span), device=v.device)
            for b in blocks:
                gq, gk, gv = block_grads(opt.backend, dout, q, cur[0], cur[1], out, lse, b, scale=opt.scale, aux=aux)
                dq.add(b.q, gq)
                dk.add(_within(b.k, span, n), gk)
                dv.add(_within(b.k, span, n), gv)
            if got_pending is not None:
                got_pending.wait()
                assert got is not None
                dk.add(_within(got_rows, span, n), got[0])
                dv.add(_within(got_rows, span, n), got[1])
            # one term (step 0) stays in the input dtype; a sum of several travels in fp32 (in the
            # input dtype with grads_in_input_dtype)
            dtype = k.dtype if own or s == 0 or opt.grads_in_input_dtype else torch.float32
            grads = (dk.result(dtype), dv.result(dtype))
            if not own:  # rank r+1's accumulator of the next K/V, over the rows ranks r+1..r+1+s attended to
                got_rows = _key_rows(opt, [(r + 1 + j) % w for j in range(s + 1)], (src + 1) % w, n)
                got = (_sized(k, got_rows, dtype), _sized(v, got_rows, dtype))
                got_pending = _exchange(opt, grads, got, reverse=True)
            if kv_pending is not None:
                kv_pending.wait()
                spare, cur = (cur if cur[0] is not k else None), nxt
            elif s == w - 2:
                cur = (k, v)
        return dq.result(q.dtype), grads[0], grads[1], None


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    comm: Comm,
    causal: bool,
    scale: float,
    backend: SdpaBackend,
    placement: str,
    overlap: bool,
    grads_in_input_dtype: bool = False,
) -> torch.Tensor:
    return RingAttention.apply(
        q, k, v, RingOptions(placement, overlap, causal, scale, backend, comm, grads_in_input_dtype)
    )
