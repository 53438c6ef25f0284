"""``broadcast``: one-to-many transfers through sub-group collectives.

A bucket needed by several receivers is sent once: ``dist.broadcast`` over the
group {sender} + receivers.  With ``local_allgather=True`` (Alpa's cross-mesh
trick) the sender instead scatters 1/k of the bucket to each of its k receivers
point-to-point, and the receivers rebuild it with an all-gather among themselves,
so each byte crosses from the source ranks to the destination ranks only once.
One-to-one buckets go point-to-point.  Sub-groups are created in ``setup`` in plan
order on every rank and cached (see ``comm.subgroup``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from sweepbench.collective.ops import all_gather_tensor

from .comm import DEFAULT_BUCKET_BYTES, Bucket, Executor, Shards, make_buckets, p2p_wait, subgroup
from .plan import Plan
from .strategies import STRATEGIES


@STRATEGIES.register("broadcast")
class Broadcast(Executor):
    fanout = True

    def __init__(
        self,
        plan: Plan,
        *,
        group: Any = None,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        local_allgather: bool = False,
    ) -> None:
        self.local_allgather = bool(local_allgather)
        super().__init__(plan, group=group, bucket_bytes=bucket_bytes)

    def _members(self, b: Bucket) -> tuple[int, ...]:
        return b.dsts if self.local_allgather else tuple(sorted((b.src,) + b.dsts))

    def setup(self) -> None:
        # every rank creates every sub-group, in the same (plan) order
        self.groups: dict[tuple[int, ...], Any] = {}
        for b in make_buckets(self.plan, self.bucket_bytes):
            if len(b.dsts) > 1:
                members = self._members(b)
                self.groups[members] = subgroup(members)

    def _chunk(self, b: Bucket) -> int:
        return -(-b.numel // len(b.dsts))

    def run(self, src_shards: Shards, dst_shards: Shards) -> None:
        self.copy_local(src_shards, dst_shards)
        ops: list[dist.P2POp] = []
        recvs: list[tuple[Bucket, torch.Tensor]] = []
        bcasts: list[tuple[Bucket, torch.Tensor]] = []
        gathers: list[tuple[Bucket, torch.Tensor]] = []
        for i, b in enumerate(self.buckets):
            sender = b.src == self.rank
            if len(b.dsts) == 1:  # one-to-one
                if sender:
                    ops.append(dist.P2POp(dist.isend, self.pack(i, b, src_shards), b.dsts[0], self.group))
                else:
                    target = self.recv_target(i, b, dst_shards)
                    ops.append(dist.P2POp(dist.irecv, target, b.src, self.group))
                    recvs.append((b, target))
            elif not self.local_allgather:
                data = self.pack(i, b, src_shards) if sender else self.recv_target(i, b, dst_shards)
                bcasts.append((b, data))
            else:  # scatter chunk k to dsts[k], all-gather among dsts
                c = self._chunk(b)
                if sender:
                    data = self.pack(i, b, src_shards, pad_to=c * len(b.dsts))
                    ops += [
                        dist.P2POp(dist.isend, data[k * c : (k + 1) * c], d, self.group) for k, d in enumerate(b.dsts)
                    ]
                else:
                    k = b.dsts.index(self.rank)
                    target = self.recv_target(i, b, dst_shards, pad_to=c * len(b.dsts))
                    ops.append(dist.P2POp(dist.irecv, target[k * c : (k + 1) * c], b.src, self.group))
                    gathers.append((b, target))
        p2p_wait(ops)
        works = [
            dist.broadcast(data, src=b.src, group=self.groups[self._members(b)], async_op=True) for b, data in bcasts
        ]
        for b, target in gathers:
            c = self._chunk(b)
            k = b.dsts.index(self.rank)
            mine = target[k * c : (k + 1) * c].clone()
            works.append(all_gather_tensor(target[: c * len(b.dsts)], mine, group=self.groups[b.dsts], async_op=True))
        for w in works:
            if w is not None:
                w.wait()
        for b, target in recvs + [x for x in bcasts if x[0].src != self.rank] + gathers:
            self.unpack(b, target, dst_shards)
