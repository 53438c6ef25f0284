"""Rank functions of tests/attention/test_dilated.py (module level, so that spawned gloo ranks
import them): the dilated engine run on a group of the first ``size`` ranks through a Comm that
records every exchange it makes, checked against the explicit-math reference."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from sweepbench.attention import Comm
from tests.attention.cases import check_case

_GROUPS: dict[int, Any] = {}


class Recorded(Comm):
    """Real communication, each call written down: point to point as (peers sent to with bytes,
    peers received from), collectives by name."""

    def __init__(self, group: Any) -> None:
        super().__init__(group)
        self.p2p: list[tuple[list[tuple[int, int]], list[int]]] = []
        self.collectives: list[str] = []

    def send_recv(self, sends, recvs):
        self.p2p.append(([(p, x.numel() * x.element_size()) for p, x in sends], [p for p, _ in recvs]))
        return super().send_recv(sends, recvs)

    def all_gather(self, x):
        self.collectives.append("all_gather")
        return super().all_gather(x)

    def reduce_scatter(self, x):
        self.collectives.append("reduce_scatter")
        return super().reduce_scatter(x)


def recorded(rank: int, world_size: int, size: int, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each case on the first ``size`` ranks (the others idle): its error against the reference,
    the exchanges it made and the bytes this rank sent (``Comm.traffic``)."""
    if size not in _GROUPS:  # every rank of the world takes part in making a group
        _GROUPS[size] = dist.new_group(list(range(size)))
    if rank >= size:
        return []
    out = []
    for case in cases:
        comm = Recorded(_GROUPS[size])
        error = check_case(rank, size, case, comm=comm)
        out.append({"error": error, "p2p": comm.p2p, "collectives": comm.collectives,
                    "sent": comm.traffic.sent_bytes})
    return out

