"""Resharding plans: which rank sends which region of which parameter to whom.

Every rank computes the same plan from the two layouts alone (no communication).
For each parameter, every destination piece is intersected with the source
pieces (the distinct source boxes partition the tensor); each non-empty
intersection is a *route* from one sender to one or more receivers:

* a receiver that itself holds the region in the source layout copies it
  locally (always preferred);
* otherwise the sender is picked among the region's source holders by a
  registered load-balance mode (``none`` first holder, ``size`` least bytes
  assigned so far, ``order`` round robin per holder set);
* ``fanout=False``: one route per remote receiver (each picks its own sender);
  ``fanout=True``: one route per region carrying all remote receivers (for
  one-to-many strategies: broadcast, local all-gather).
"""

from __future__ import annotations

import functools
import hashlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Protocol

from sweepbench.core import Registry

from .boxes import Box, Piece, box_numel, intersect
from .layout import Layout


@dataclass(frozen=True)
class Route:
    """Region ``global_box`` of ``param``: sender ``src`` reads it at ``src_box`` of its
    source shard; each receiver ``(rank, box)`` writes it at ``box`` of its destination
    shard.  A local copy is a route whose only receiver is ``src`` itself."""

    param: str
    global_box: Box
    src: int
    src_box: Box
    dsts: tuple[tuple[int, Box], ...]
    nbytes: int

    @property
    def is_local(self) -> bool:
        return len(self.dsts) == 1 and self.dsts[0][0] == self.src

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in self.global_box)

    def dst_box(self, rank: int) -> Box:
        return dict(self.dsts)[rank]


class Balancer(Protocol):
    def choose(self, holders: tuple[int, ...], nbytes: int) -> int: ...


BALANCE: Registry[type] = Registry("load-balance mode")


@BALANCE.register("none")
class FirstHolder:
    """Always the first holder in source-layout order."""

    def choose(self, holders: tuple[int, ...], nbytes: int) -> int:
        return holders[0]


@BALANCE.register("size")
class LeastBytes:
    """The holder with the fewest bytes assigned so far (ties: layout order)."""

    def __init__(self) -> None:
        self.assigned: dict[int, int] = defaultdict(int)

    def choose(self, holders: tuple[int, ...], nbytes: int) -> int:
        pick = min(holders, key=lambda r: self.assigned[r])
        self.assigned[pick] += nbytes
        return pick


@BALANCE.register("order")
class RoundRobin:
    """Round robin over the holders, with one counter per holder set."""

    def __init__(self) -> None:
        self.turn: dict[tuple[int, ...], int] = defaultdict(int)

    def choose(self, holders: tuple[int, ...], nbytes: int) -> int:
        pick = holders[self.turn[holders] % len(holders)]
        self.turn[holders] += 1
        return pick


@dataclass(frozen=True, eq=False)
class Plan:
    src: Layout
    dst: Layout
    balance: str
    fanout: bool
    routes: tuple[Route, ...]
    send_bytes: dict[int, int] = field(default_factory=dict)
    recv_bytes: dict[int, int] = field(default_factory=dict)

    @property
    def model_bytes(self) -> int:
        return sum(p.nbytes for p in self.dst.params)

    @property
    def moved_bytes(self) -> int:
        """Bytes delivered to ranks that did not hold them (one count per receiver)."""
        return sum(r.nbytes * len(r.dsts) for r in self.routes if not r.is_local)

    @property
    def local_bytes(self) -> int:
        return sum(r.nbytes for r in self.routes if r.is_local)

    @functools.cached_property
    def digest(self) -> str:
        """Stable hash of the routes (identical on every rank for the same inputs)."""
        return hashlib.sha256(repr((self.balance, self.fanout, self.routes)).encode()).hexdigest()[:16]

    def summary(self) -> dict[str, object]:
        return {
            "src": self.src.describe(),
            "dst": self.dst.describe(),
            "balance": self.balance,
            "fanout": self.fanout,
            "routes": len(self.routes),
            "model_bytes": self.model_bytes,
            "moved_bytes": self.moved_bytes,
            "local_bytes": self.local_bytes,
            "max_send_bytes": max(self.send_bytes.values(), default=0),
            "max_recv_bytes": max(self.recv_bytes.values(), default=0),
            "digest": self.digest,
        }


def _check_compatible(src: Layout, dst: Layout) -> None:
    s = {p.name: (p.shape, p.dtype) for p in src.params}
    d = {p.name: (p.shape, p.dtype) for p in dst.params}
    if s != d:
        bad = sorted(set(s) ^ set(d)) or sorted(n for n in s if s[n] != d[n])
        raise ValueError(
            f"src and dst layouts hold different params (first: {bad[0]!r}: src {s.get(bad[0])} vs dst {d.get(bad[0])})"
        )


def make_plan(src: Layout, dst: Layout, *, balance: str = "none", fanout: bool = False) -> Plan:
    """The (cached) plan moving every param from ``src`` to ``dst``."""
    BALANCE.get(balance)
    return _make_plan(src, dst, balance, bool(fanout))


@functools.lru_cache(maxsize=64)
def _make_plan(src: Layout, dst: Layout, balance: str, fanout: bool) -> Plan:
    _check_compatible(src, dst)
    chooser: Balancer = BALANCE.get(balance)()
    routes: list[Route] = []
    sent: dict[int, int] = defaultdict(int)
    recv: dict[int, int] = defaultdict(int)
    for spec in dst.params:
        src_owners = src.owners(spec.name)
        for dbox, receivers in dst.owners(spec.name):
            for sbox, holders in src_owners:
                region = intersect(sbox, dbox)
                if region is None:
                    continue
                nbytes = box_numel(region) * spec.itemsize
                held = {r: Piece(sbox, lb).to_local(region) for r, lb in holders}
                remote = []
                for rank, lbox in receivers:
                    dbox_local = Piece(dbox, lbox).to_local(region)
                    if rank in held:
                        routes.append(Route(spec.name, region, rank, held[rank], ((rank, dbox_local),), nbytes))
                    else:
                        remote.append((rank, dbox_local))
                batches = [tuple(remote)] if fanout and remote else [(x,) for x in remote]
                for dsts in batches:
                    sender = chooser.choose(tuple(held), nbytes * len(dsts))
                    routes.append(Route(spec.name, region, sender, held[sender], dsts, nbytes))
                    sent[sender] += nbytes * len(dsts)
                    for rank, _ in dsts:
                        recv[rank] += nbytes
    return Plan(src, dst, balance, fanout, tuple(routes), dict(sent), dict(recv))


def check_plan(plan: Plan) -> None:
    """Raise AssertionError unless every destination element is written exactly once
    and every sender holds what it sends (O(routes^2) per shard: for tests/debug)."""
    by_shard: dict[tuple[int, str], list[Box]] = defaultdict(list)
    for r in plan.routes:
        held = plan.src.shards(r.src)[r.param]
        assert any(
            Piece(p.global_box, p.local_box).to_local(r.global_box) == r.src_box
            and intersect(p.global_box, r.global_box) == r.global_box
            for p in held.pieces
        ), r
        for rank, box in r.dsts:
            by_shard[(rank, r.param)].append(box)
    for rank in plan.dst.ranks:
        for name, info in plan.dst.shards(rank).items():
            boxes = by_shard.pop((rank, name), [])
            total = box_numel(tuple((0, n) for n in info.local_shape))
            assert sum(box_numel(b) for b in boxes) == total, (rank, name)
            for i, a in enumerate(boxes):
                assert all(intersect(a, b) is None for b in boxes[i + 1 :]), (rank, name, a)
    assert not by_shard, f"routes to shards the dst layout does not have: {sorted(by_shard)[:3]}"
