"""Rank functions for the engine tests (module level, so spawned gloo ranks can run them): each
builds the whole-sequence inputs from a seed, runs one impl on its own tokens, and compares its
output and dq/dk/dv with the explicit-math reference on the same tokens."""

from __future__ import annotations

from typing import Any

import torch

from sweepbench.attention import Comm, cp_attention, placement_of, shard_sequence
from sweepbench.attention.reference import math_attention, math_dilated_attention

BATCH, HEAD_DIM = 2, 8


def inputs(seq: int, heads: int, kv_heads: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(BATCH, heads, seq, HEAD_DIM), (BATCH, kv_heads, seq, HEAD_DIM), (BATCH, kv_heads, seq, HEAD_DIM),
              (BATCH, heads, seq, HEAD_DIM)]
    return [torch.randn(s, generator=g, dtype=torch.float64).float() for s in shapes]


def reference(q, k, v, dout, *, causal: bool, pattern: str, segs: list[int], rates: list[int]):
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    scale = HEAD_DIM ** -0.5
    out = (math_dilated_attention(q, k, v, causal=causal, scale=scale, segment_lengths=segs, dilation_rates=rates)
           if pattern == "dilated" else math_attention(q, k, v, causal=causal, scale=scale))
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


def check_case(rank: int, world_size: int, case: dict[str, Any], *, comm: Comm | None = None) -> float:
    """Max abs error of this rank's output and grads against the reference (raises if too big)."""
    q, k, v, dout = inputs(case["seq"], case["heads"], case["kv_heads"])
    segs, rates = case.get("segs", []), case.get("rates", [])
    ref = reference(q, k, v, dout, causal=case["causal"], pattern=case["pattern"], segs=segs, rates=rates)
    placement = placement_of(case["impl"], case["pattern"])
    mine = [shard_sequence(x, dim=2, rank=rank, world_size=world_size, placement=placement) for x in (q, k, v, dout)]
    lq, lk, lv = (x.clone().requires_grad_() for x in mine[:3])
    comm = comm or Comm.solo()
    out = cp_attention(lq, lk, lv, impl=case["impl"], causal=case["causal"], comm=comm, pattern=case["pattern"],
                       segment_lengths=segs, dilation_rates=rates)
    out.backward(mine[3])
    worst = 0.0
    for name, got, want in zip(("out", "dq", "dk", "dv"), (out, lq.grad, lk.grad, lv.grad), ref):
        want = shard_sequence(want, dim=2, rank=rank, world_size=world_size, placement=placement)
        err = (got.detach() - want).abs().max().item()
        assert torch.allclose(got.detach(), want, atol=2e-5, rtol=1e-4), \
            f"{case} rank {rank}: {name} differs from the reference by {err:.3g}"
        worst = max(worst, err)
    return worst


_GROUPS: dict[int, Any] = {}


def _first_ranks(rank: int, size: int) -> Any | None:
    """The group of the world's first ``size`` ranks (made once, every rank of the world taking part),
    for a rank in it; None for the others, which idle."""
    import torch.distributed as dist

    if size not in _GROUPS:
        _GROUPS[size] = dist.new_group(list(range(size)))
    return _GROUPS[size] if rank < size else None


def check_cases(rank: int, world_size: int, size: int, cases: list[dict[str, Any]]) -> list[float]:
    """Run ``cases`` on the first ``size`` ranks of the world (a subgroup); the others idle."""
    group = _first_ranks(rank, size)
    if group is None:
        return []
    comm = Comm(group)
    return [check_case(rank, size, case, comm=comm) for case in cases]


def torch_cp_layout(rank: int, world_size: int, seq_len: int) -> list[int]:
    """The tokens torch's context_parallel gives this rank (its load balancer, on CPU/gloo: only the
    layout is exercised here; its attention runs on CUDA only)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.experimental import context_parallel

    from sweepbench.attention.torch_cp import torch_cp_context

    with torch_cp_context(Comm(), seq_len=seq_len, device=torch.device("cpu")):
        pass  # asserts torch's placement is our zigzag
    pos = torch.arange(seq_len)[None]
    with context_parallel(DeviceMesh.from_group(dist.group.WORLD, "cpu"), buffers=[pos], buffer_seq_dims=[1],
                          no_restore_buffers={pos}):
        return pos[0].tolist()



def ring_traffic(rank: int, world_size: int, size: int, views: bool) -> dict[str, Any]:
    """One causal zigzag ring fwd+bwd on the first ``size`` ranks through cpu_flash (``views``: as
    registered, or made to take contiguous operands): per kernel call, which 4-D operands it got as
    a view into a larger tensor (not copied); the rows of every exchange sent and received; and
    the error against the reference."""
    import dataclasses

    from sweepbench.attention.ops import get_backend
    from sweepbench.attention.ring import ring_attention

    group = _first_ranks(rank, size)
    if group is None:
        return {}
    seq, heads = 32, 2
    traffic: list[tuple[str, int, int]] = []  # (direction, rows sent, rows received)
    calls: list[tuple[str, list[bool]]] = []

    class Spy(Comm):
        def ring_exchange(self, send, recv, *, reverse=False):
            traffic.append(("bwd" if reverse else "fwd", send[0].shape[2], recv[0].shape[2]))
            return super().ring_exchange(send, recv, reverse=reverse)

    def viewed(*xs: torch.Tensor) -> list[bool]:
        return [x.untyped_storage().nbytes() > x.numel() * x.element_size() for x in xs if x.dim() == 4]

    real = dataclasses.replace(get_backend("cpu_flash"), views=views)

    def fwd(q_, k_, v_, *a):
        calls.append(("fwd", viewed(q_, k_, v_)))
        return real.forward(q_, k_, v_, *a)

    def bwd(dout_, q_, k_, v_, out_, *a):
        calls.append(("bwd", viewed(dout_, q_, k_, v_, out_)))
        return real.backward(dout_, q_, k_, v_, out_, *a)

    q, k, v, dout = inputs(seq, heads, heads)
    ref = reference(q, k, v, dout, causal=True, pattern="dense", segs=[], rates=[])
    mine = [shard_sequence(x, dim=2, rank=rank, world_size=size, placement="zigzag") for x in (q, k, v, dout)]
    lq, lk, lv = (x.clone().requires_grad_() for x in mine[:3])
    out = ring_attention(lq, lk, lv, comm=Spy(group), causal=True, scale=HEAD_DIM ** -0.5,
                         backend=dataclasses.replace(real, forward=fwd, backward=bwd), placement="zigzag",
                         overlap=True)
    out.backward(mine[3])
    err = max((got.detach() - shard_sequence(want, dim=2, rank=rank, world_size=size, placement="zigzag")).abs().max()
              .item() for got, want in zip((out, lq.grad, lk.grad, lv.grad), ref))
    return {"calls": calls, "traffic": traffic, "error": err}


def ring_grad_dtypes(rank: int, world_size: int, size: int, impl: str) -> dict[str, Any]:
    """One causal zigzag ring fwd+bwd of ``impl`` (``ring`` or ``ring_lp``) in bf16 on the first
    ``size`` ranks: the dtype and bytes of every message this rank sent in the backward (K/V and
    dK/dV), and the largest error of out/dq/dk/dv against the fp32 reference."""
    group = _first_ranks(rank, size)
    if group is None:
        return {}
    sent: list[tuple[str, int]] = []

    class Spy(Comm):
        def ring_exchange(self, send, recv, *, reverse=False):
            if reverse:
                sent.append((str(send[0].dtype), sum(x.numel() * x.element_size() for x in send)))
            return super().ring_exchange(send, recv, reverse=reverse)

    q, k, v, dout = inputs(64, 4, 2)
    ref = reference(q, k, v, dout, causal=True, pattern="dense", segs=[], rates=[])
    mine = [shard_sequence(x, dim=2, rank=rank, world_size=size, placement="zigzag").bfloat16() for x in (q, k, v, dout)]
    lq, lk, lv = (x.clone().requires_grad_() for x in mine[:3])
    out = cp_attention(lq, lk, lv, impl=impl, causal=True, comm=Spy(group), pattern="dense")
    out.backward(mine[3])
    err = max((got.detach().float() - shard_sequence(want, dim=2, rank=rank, world_size=size, placement="zigzag"))
              .abs().max().item() for got, want in zip((out, lq.grad, lk.grad, lv.grad), ref))
    return {"sent": sent, "error": err}


def ulysses_messages(rank: int, world_size: int, kv_heads: int) -> dict[str, Any]:
    """Ulysses fwd+bwd at W=4 (dense, causal, 8 heads) through a comm that logs every all-to-all it makes
    (its entry's bytes, i.e. what goes to one peer), and the largest error against the reference."""
    calls: list[int] = []

    class Spy(Comm):
        def all_to_all(self, x):
            calls.append(x[0].numel() * x[0].element_size())
            return super().all_to_all(x)

    comm = Spy()
    err = check_case(rank, world_size, {"impl": "ulysses", "causal": True, "pattern": "dense", "seq": 64, "heads": 8,
                                        "kv_heads": kv_heads}, comm=comm)
    return {"calls": calls, "sent": comm.traffic.sent_bytes, "error": err}
