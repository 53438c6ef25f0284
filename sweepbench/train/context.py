"""Context parallel for training, through the attention engine (``sweepbench.attention``).

Each cp rank holds shards of every sequence, laid out the way the kernel expects
(``placement_of(impl)``: zigzag for the load-balanced ring, rank r holding chunks r and 2W-1-r);
attention runs as ``cp_attention`` over the cp group (autograd-aware), RoPE uses the global
positions of the rank's tokens, and the loss is each rank's mean over its shard, averaged over the
cp ranks together with the gradients (cp ranks hold the same weights: FSDP/DDP span dp x cp)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import torch
from torch.distributed.device_mesh import DeviceMesh

from sweepbench.core import NotOnThisMachine
from sweepbench.train.config import TrainJob
from sweepbench.train.plan import TrainPlan


@dataclass
class ContextParallel:
    shard: Callable[[torch.Tensor], torch.Tensor]  # [B, S] -> this rank's [B, S/cp] (dim 1)
    positions: torch.Tensor  # the global positions of this rank's tokens, on the device
    attn_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    impl: str
    placement: str

    def describe(self) -> dict[str, Any]:
        return {"impl": self.impl, "placement": self.placement, "engine": "sweepbench.attention.cp_attention"}


def build_context_parallel(
    plan: TrainPlan, mesh: DeviceMesh, opts: Any, *, device: torch.device
) -> ContextParallel | None:
    if plan.cp == 1:
        return None
    from sweepbench.attention import cp_attention, placement_of, positions, shard_sequence

    group, rank = mesh["cp"].get_group(), mesh["cp"].get_local_rank()
    placement = placement_of(opts.cp_impl)
    return ContextParallel(
        shard=partial(shard_sequence, dim=1, rank=rank, world_size=plan.cp, placement=placement),
        positions=positions(placement, rank, plan.cp, plan.seq_len).to(device),
        attn_fn=partial(cp_attention, impl=opts.cp_impl, group=group, causal=True),
        impl=opts.cp_impl,
        placement=placement,
    )


def check_cp(job: TrainJob, plan: TrainPlan, device_type: str) -> None:
    """Can the attention engine run this layout's context parallel? (torch-free, before any rank)"""
    if plan.cp == 1:
        return
    from sweepbench.attention.registry import IMPLS, why_not

    impl = job.knobs.cp_impl
    if impl not in IMPLS or IMPLS[impl].context:
        usable = ", ".join(name for name, spec in IMPLS.items() if not spec.context)
        needs = ", ".join(name for name, spec in IMPLS.items() if spec.context)
        raise ValueError(
            f"benchmark.cp_impl={impl!r} cannot train here; valid: {usable} "
            f"({needs} needs a context around forward and backward the train engine does not open)"
        )
    case: dict[str, Any] = dict(
        world_size=plan.cp, num_heads=job.model.num_heads // plan.tp, pattern="dense", causal=True
    )
    for ignore_device, error in ((True, ValueError), (False, NotOnThisMachine)):
        reason = why_not(impl, device_type=device_type, ignore_device=ignore_device, **case)
        if reason:
            raise error(f"benchmark.cp_impl={impl} with parallelism.cp={plan.cp}: {reason}")
