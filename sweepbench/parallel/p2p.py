"""``send_recv``: batched point-to-point transfers of flat buckets."""

from __future__ import annotations

import torch
import torch.distributed as dist

from .comm import Bucket, Executor, Shards
from .strategies import STRATEGIES


@STRATEGIES.register("send_recv")
class SendRecv(Executor):
    """Every remote bucket is one isend per receiver / one irecv, all issued in one
    ``batch_isend_irecv``; small routes share a bucket per (src, dst) pair.  Works with
    plans of either fanout (a multi-receiver bucket is sent to each receiver)."""

    def setup(self) -> None:
        self.stages = [list(range(len(self.buckets)))]  # one batched send/recv of every bucket

    def run(self, src_shards: Shards, dst_shards: Shards) -> None:
        inflight = [self._issue(stage, src_shards, dst_shards) for stage in self.stages]
        # the local copies run on this stream while NCCL moves the remote pieces on its own
        self.copy_local(src_shards, dst_shards)
        for recvs, works in inflight:
            for work in works:
                work.wait()
            for b, target in recvs:
                self.unpack(b, target, dst_shards)

    def _issue(
        self, stage: list[int], src_shards: Shards, dst_shards: Shards
    ) -> tuple[list[tuple[Bucket, torch.Tensor]], list[dist.Work]]:
        """Pack this rank's buckets of ``stage`` and issue them as one batched send/recv."""
        ops: list[dist.P2POp] = []
        recvs: list[tuple[Bucket, torch.Tensor]] = []
        for i in stage:
            b = self.buckets[i]
            if b.src == self.rank:
                data = self.pack(i, b, src_shards)
                ops += [dist.P2POp(dist.isend, data, peer, self.group) for peer in b.dsts]
            else:
                target = self.recv_target(i, b, dst_shards)
                ops.append(dist.P2POp(dist.irecv, target, b.src, self.group))
                recvs.append((b, target))
        return recvs, (dist.batch_isend_irecv(ops) if ops else [])


@STRATEGIES.register("pipeline")
class Pipelined(SendRecv):
    """``send_recv`` with packing pipelined against the transfers. Stage k holds the k-th bucket of
    every (sender, receivers) channel and is its own batched send/recv, issued as soon as this
    rank has packed its part: a sender packs stage k+1 while stage k is on the wire, a receiver
    unpacks stage k while stage k+1 arrives, and both directions of a pair move in every stage.
    Stages come from the plan, the same on every rank, so the p2p calls of each pair match."""

    def setup(self) -> None:
        seen: dict[tuple[int, tuple[int, ...]], int] = {}
        stages: dict[int, list[int]] = {}
        for i, b in enumerate(self.buckets):
            k = seen[(b.src, b.dsts)] = seen.get((b.src, b.dsts), -1) + 1
            stages.setdefault(k, []).append(i)
        self.stages = [stages[k] for k in sorted(stages)]
