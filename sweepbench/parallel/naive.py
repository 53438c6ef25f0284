"""``naive`` baseline: gather the full weights on the first source rank, then broadcast
every full tensor to all destination ranks, which slice out their own shards.  It
ignores the plan's routes (only its layouts matter): the point is to show what
planning buys."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from .boxes import box_numel, box_slices
from .comm import Executor, Shards, p2p_wait, subgroup
from .specs import torch_dtype
from .strategies import STRATEGIES


@STRATEGIES.register("naive")
class Naive(Executor):
    def setup(self) -> None:
        self.root = self.plan.src.ranks[0]
        self.members = tuple(sorted({self.root, *self.plan.dst.ranks}))
        self.bgroup = subgroup(self.members)
        # (param, global box, holder, holder's local box): the root if it holds the box,
        # else the box's first holder
        self.gather = []
        for spec in self.plan.src.params:
            for box, holders in self.plan.src.owners(spec.name):
                holder, lbox = next((h for h in holders if h[0] == self.root), holders[0])
                self.gather.append((spec.name, box, holder, lbox))

    def run(self, src_shards: Shards, dst_shards: Shards) -> None:
        full: dict[str, torch.Tensor] = {}
        if self.rank == self.root:
            like = next(iter(src_shards.values()))
            for spec in self.plan.src.params:
                dt = src_shards[spec.name].dtype if spec.name in src_shards else torch_dtype(spec.dtype)
                full[spec.name] = torch.empty(spec.shape, dtype=dt, device=like.device)
        ops, pending = [], []
        for name, box, holder, lbox in self.gather:
            if self.rank == self.root and holder == self.root:
                full[name][box_slices(box)].copy_(src_shards[name][box_slices(lbox)])
            elif self.rank == self.root:
                tmp = torch.empty_like(full[name][box_slices(box)])
                ops.append(dist.P2POp(dist.irecv, tmp, holder, self.group))
                pending.append((name, box, tmp))
            elif self.rank == holder:
                ops.append(
                    dist.P2POp(dist.isend, src_shards[name][box_slices(lbox)].contiguous(), self.root, self.group)
                )
        p2p_wait(ops)
        for name, box, tmp in pending:
            full[name][box_slices(box)].copy_(tmp)
        if self.rank not in self.members:
            return
        like = next(iter(dst_shards.values())) if dst_shards else next(iter(src_shards.values()))
        for spec in self.plan.dst.params:
            t = full.get(spec.name)
            if t is None:
                dt = dst_shards[spec.name].dtype if spec.name in dst_shards else like.dtype
                t = torch.empty(spec.shape, dtype=dt, device=like.device)
            dist.broadcast(t, src=self.root, group=self.bgroup)
            info = self.plan.dst.shards(self.rank).get(spec.name)
            for piece in info.pieces if info else ():
                dst_shards[spec.name][box_slices(piece.local_box)].copy_(t[box_slices(piece.global_box)])

    def traffic(self) -> tuple[int, int]:
        item = {p.name: p.itemsize for p in self.plan.src.params}

        def gathered(pred: Callable[[int], bool]) -> int:
            return sum(box_numel(box) * item[n] for n, box, h, _ in self.gather if h != self.root and pred(h))

        model = self.plan.model_bytes
        if self.rank == self.root:
            return model * (len(self.members) - 1), gathered(lambda h: True)
        return gathered(lambda h: h == self.rank), (model if self.rank in self.members else 0)
