"""Shared execution machinery: strategy registry, executor base class, sub-group
cache, and flat buckets that pack many small routes into one message."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from .boxes import box_numel, box_slices
from .plan import Plan, Route

Shards = Mapping[str, torch.Tensor]
DEFAULT_BUCKET_BYTES = 32 << 20


# ---------------------------------------------------------------------------- groups

_GROUPS: dict[tuple[int, ...], Any] = {}
_GROUPS_OF: Any = None  # the default group that _GROUPS' groups belong to


def subgroup(ranks: Iterable[int]) -> Any:
    """Process group over global ``ranks`` (cached; WORLD when it is every rank).

    ``dist.new_group`` must be called by every rank of the default group in the same
    order, so call this on all ranks with the same sequence of rank sets (executors
    derive that sequence from the plan, which is identical everywhere). The cache holds
    for one default group: a process that makes a new one (a kept rank's next job,
    ``launch.keep_ranks``) gets new groups, the old ones having gone with their world."""
    global _GROUPS_OF
    key = tuple(sorted(set(ranks)))
    if key == tuple(range(dist.get_world_size())):
        return dist.group.WORLD
    if _GROUPS_OF is not dist.group.WORLD:
        _GROUPS.clear()
        _GROUPS_OF = dist.group.WORLD
    if key not in _GROUPS:
        _GROUPS[key] = dist.new_group(list(key))
    return _GROUPS[key]


# ---------------------------------------------------------------------------- buckets


@dataclass(frozen=True)
class Bucket:
    """Routes from ``src`` to the same remote receivers ``dsts`` (sorted), packed back to
    back: route ``i`` occupies elements ``[offsets[i], offsets[i] + numel_i)``."""

    src: int
    dsts: tuple[int, ...]
    routes: tuple[Route, ...]
    offsets: tuple[int, ...]
    numel: int

    def involves(self, rank: int) -> bool:
        return rank == self.src or rank in self.dsts


@functools.lru_cache(maxsize=64)
def make_buckets(plan: Plan, bucket_bytes: int) -> tuple[Bucket, ...]:
    """Remote routes grouped by (sender, receivers, dtype) in plan order and packed
    greedily into buckets of at most ``bucket_bytes`` (a larger route gets its own)."""
    channels: dict[tuple[int, tuple[int, ...], str], list[Route]] = {}
    for r in plan.routes:
        if not r.is_local:
            key = (r.src, tuple(sorted(d for d, _ in r.dsts)), plan.dst.param(r.param).dtype)
            channels.setdefault(key, []).append(r)
    out: list[Bucket] = []
    for (src, dsts, _), routes in channels.items():
        cur: list[Route] = []
        size = 0

        def flush() -> None:
            offsets, n = [], 0
            for r in cur:
                offsets.append(n)
                n += box_numel(r.global_box)
            out.append(Bucket(src, dsts, tuple(cur), tuple(offsets), n))

        for r in routes:
            if cur and size + r.nbytes > bucket_bytes:
                flush()
                cur, size = [], 0
            cur.append(r)
            size += r.nbytes
        if cur:
            flush()
    return tuple(out)


# ---------------------------------------------------------------------------- executor base


class Executor:
    """Runs one plan on this rank.  ``__init__`` is collective (``setup`` creates
    sub-groups, then a barrier), so every rank of the default group constructs it, in the same
    order; ``run`` is called by every rank too (ranks with nothing to do return at once
    or only join the collectives they belong to)."""

    fanout: ClassVar[bool] = False  # True: needs a plan built with make_plan(..., fanout=True)

    def __init__(self, plan: Plan, *, group: Any = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        if self.fanout and not plan.fanout:
            raise ValueError(f"strategy {type(self).__name__} needs a plan from make_plan(..., fanout=True)")
        if bucket_bytes < 1:
            raise ValueError(f"bucket_bytes={bucket_bytes} must be >= 1")
        self.plan = plan
        self.group = group
        self.rank = dist.get_rank()
        self.bucket_bytes = int(bucket_bytes)
        self.local_routes = tuple(r for r in plan.routes if r.is_local and r.src == self.rank)
        self.buckets = tuple(b for b in make_buckets(plan, self.bucket_bytes) if b.involves(self.rank))
        self._bufs: dict[tuple[int, int], torch.Tensor] = {}
        self.setup()
        # also makes sure no batched p2p call is a (NCCL) group's first operation
        if group is None or dist.get_rank(group) >= 0:
            dist.barrier(group=group)

    # -- to override
    def setup(self) -> None:
        """Collective preparation (e.g. creating sub-groups), run by every rank."""

    def run(self, src_shards: Shards, dst_shards: Shards) -> None:
        raise NotImplementedError

    # -- helpers
    def copy_local(self, src_shards: Shards, dst_shards: Shards) -> None:
        for r in self.local_routes:
            dst_shards[r.param][box_slices(r.dsts[0][1])].copy_(src_shards[r.param][box_slices(r.src_box)])

    def buffer(self, key: tuple[int, int], numel: int, like: torch.Tensor) -> torch.Tensor:
        buf = self._bufs.get(key)
        if buf is None or buf.dtype != like.dtype or buf.device != like.device:
            buf = self._bufs[key] = torch.empty(numel, dtype=like.dtype, device=like.device)
        return buf

    def pack(self, i: int, b: Bucket, shards: Shards, pad_to: int = 0) -> torch.Tensor:
        """Flat tensor holding bucket ``b``'s data on its sender (a view, no copy, when
        the bucket is one contiguous region and no padding is asked)."""
        first = shards[b.routes[0].param]
        if len(b.routes) == 1 and not pad_to:
            view = first[box_slices(b.routes[0].src_box)]
            if view.is_contiguous():
                return view.view(-1)
        buf = self.buffer((i, 0), max(pad_to, b.numel), first)
        for r, off in zip(b.routes, b.offsets):
            buf[off : off + box_numel(r.global_box)].view(r.shape).copy_(shards[r.param][box_slices(r.src_box)])
        return buf

    def recv_target(self, i: int, b: Bucket, shards: Shards, pad_to: int = 0) -> torch.Tensor:
        """Flat tensor to receive bucket ``b`` into on a receiver (the destination view
        itself when that is possible, else a staging buffer that ``unpack`` copies out)."""
        first = shards[b.routes[0].param]
        if len(b.routes) == 1 and not pad_to:
            view = first[box_slices(b.routes[0].dst_box(self.rank))]
            if view.is_contiguous():
                return view.view(-1)
        return self.buffer((i, 1), max(pad_to, b.numel), first)

    def unpack(self, b: Bucket, target: torch.Tensor, shards: Shards) -> None:
        for r, off in zip(b.routes, b.offsets):
            dst = shards[r.param][box_slices(r.dst_box(self.rank))]
            if dst.data_ptr() != target.data_ptr() or dst.numel() != target.numel():
                dst.copy_(target[off : off + box_numel(r.global_box)].view(r.shape))

    def traffic(self) -> tuple[int, int]:
        """(bytes this rank sends, bytes it receives) over the wire, logically."""
        sent = sum(r.nbytes * len(r.dsts) for b in self.buckets if b.src == self.rank for r in b.routes)
        recv = sum(r.nbytes for b in self.buckets if self.rank in b.dsts for r in b.routes)
        return sent, recv


def p2p_wait(ops: list[dist.P2POp]) -> None:
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
