"""Context parallel for training: each cp rank holds shards of every sequence and attention
runs as a ring over the cp group, through the attention engine's kernels (``sweepbench.attention``:
``shard_sequence`` splits a sequence the load-balanced way causal attention needs, ``placement_of``
says which positions a rank holds, ``cp_attention`` runs the ring). RoPE uses the positions the
rank holds; the loss is each rank's mean over its shard, averaged over the cp ranks with the
gradients (cp ranks hold the same weights: FSDP/DDP span dp x cp)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import torch
from torch.distributed.device_mesh import DeviceMesh

from sweepbench.train.plan import TrainPlan


@dataclass
class ContextParallel:
    shard: Callable[[torch.Tensor], torch.Tensor]  # [B, S] -> this rank's [B, S/cp] (dim 1)
    positions: torch.Tensor  # the positions of this rank's tokens, on the device
    attn_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    impl: str

    def describe(self) -> dict[str, Any]:
        return {"impl": self.impl, "engine": "sweepbench.attention"}


def build_context_parallel(plan: TrainPlan, mesh: DeviceMesh, opts: Any, *,
                           device: torch.device) -> ContextParallel | None:
    if plan.cp == 1:
        return None
    from sweepbench.attention import cp_attention, placement_of, shard_sequence

    group = mesh["cp"].get_group()
    rank = mesh["cp"].get_local_rank()
    positions = placement_of(plan.seq_len, rank=rank, world=plan.cp, impl=opts.cp_impl)
    return ContextParallel(
        shard=lambda x: shard_sequence(x, rank=rank, world=plan.cp, impl=opts.cp_impl, dim=1),
        positions=torch.as_tensor(positions, device=device),
        attn_fn=partial(cp_attention, impl=opts.cp_impl, group=group, causal=True),
        impl=opts.cp_impl)
