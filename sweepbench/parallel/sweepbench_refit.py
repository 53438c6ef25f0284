"""The ``sweepbench`` refit implementation: this package's plan and a registered strategy."""

from __future__ import annotations

from typing import Any

import torch

from .execute import make_executor, plan_for
from .impls import IMPLS
from .layout import Layout
from .materialize import allocate_shards, build_shards, verify_shards


class NativeTransfer:
    """Source shards built from the seed on the source ranks, destination buffers on the
    destination ranks, and the strategy's executor for the plan."""

    def __init__(
        self,
        src: Layout,
        dst: Layout,
        *,
        strategy: str,
        options: dict[str, Any],
        balance: str,
        rank: int,
        device: torch.device,
        seed: int,
    ) -> None:
        self.dst, self.rank, self.seed, self.method = dst, rank, seed, strategy
        self.plan = plan_for(src, dst, strategy=strategy, balance=balance)
        self.plan_digest = self.plan.digest
        self.src_shards = build_shards(src, rank, seed=seed, device=device) if rank in src.ranks else {}
        self.dst_shards = allocate_shards(dst, rank, device=device)
        self.executor = make_executor(self.plan, strategy=strategy, **options)

    def step(self) -> None:
        self.executor.run(self.src_shards, self.dst_shards)

    def poison(self) -> None:
        for t in self.dst_shards.values():
            t.fill_(float("nan"))

    def verify(self) -> list[str]:
        return verify_shards(self.dst, self.rank, self.dst_shards, seed=self.seed)

    def traffic(self) -> tuple[int, int]:
        return self.executor.traffic()


@IMPLS.register("sweepbench")
def build(
    src: Layout,
    dst: Layout,
    *,
    strategy: str,
    options: dict[str, Any],
    balance: str,
    rank: int,
    device: torch.device,
    seed: int,
    **_: Any,
) -> NativeTransfer:
    return NativeTransfer(
        src, dst, strategy=strategy, options=options, balance=balance, rank=rank, device=device, seed=seed
    )
