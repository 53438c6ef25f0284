"""The link floor of a reshard case: what must cross a link, whatever the strategy.

The job first probes its links (``probe_links``, with messages the size of the
cases' tensor unless ``probe_bytes`` says otherwise: ``p2p_gbps``, each rank sending and receiving
at once; ``broadcast_gbps``, rank 0 to every rank). The floor of a case holds for
any strategy and balance mode, so ``fraction_of_link`` compares them directly. From the case's
plan with one route per region (fan-out) and senders balanced by size:

* p2p bound = the busiest rank's bytes / ``p2p_gbps``, where a rank's bytes are the larger of
  what it must send (each distinct region once, however many ranks need it) and what it must
  receive;
* broadcast bound = the bytes that the busiest destination rank must receive of regions that
  several destination ranks need / ``broadcast_gbps``;
* ``link_floor_s`` = the larger of the two (``floor_bound`` says which), ``fraction_of_link`` =
  ``link_floor_s`` / median time.

So for 1-to-m with a replicated destination (m >= 2) the floor is the tensor's bytes / broadcast
bandwidth (what each destination must receive, at broadcast speed); with sharded destinations it
is the tensor's bytes / p2p bandwidth (the source must send all of it once); 1-to-1 is a p2p
copy. ``effective_gbps`` = the busiest rank's bytes / median time. A fraction of 1 is at the link;
a few percent above 1 is the probe's own noise (the probe is a median of 5 iterations)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sweepbench.parallel.plan import Plan


@dataclass(frozen=True)
class Floor:
    """What must cross a link in a case, whatever the strategy (see the module docstring)."""

    busiest_rank_bytes: int
    fanout_recv_bytes: int
    moved_bytes: int

    @classmethod
    def of(cls, plan: Plan) -> Floor:
        send: dict[int, int] = {}
        recv: dict[int, int] = {}
        fan: dict[int, int] = {}
        for route in plan.routes:
            if route.is_local:
                continue
            send[route.src] = send.get(route.src, 0) + route.nbytes
            for rank, _ in route.dsts:
                recv[rank] = recv.get(rank, 0) + route.nbytes
                if len(route.dsts) > 1:
                    fan[rank] = fan.get(rank, 0) + route.nbytes
        busiest = max([*send.values(), *recv.values()], default=0)
        return cls(busiest, max(fan.values(), default=0), plan.moved_bytes)

    def seconds(self, link: dict[str, Any]) -> tuple[float, str]:
        # nothing to move needs no link (a one-rank world has none: its rates are None)
        p2p = self.busiest_rank_bytes / (link["p2p_gbps"] * 1e9) if self.busiest_rank_bytes else 0.0
        bcast = self.fanout_recv_bytes / (link["broadcast_gbps"] * 1e9) if self.fanout_recv_bytes else 0.0
        return (bcast, "broadcast") if bcast > p2p else (p2p, "p2p")
