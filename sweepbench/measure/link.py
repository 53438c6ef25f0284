"""The physical limit, measured in the job itself: a short probe of the point-to-point and
broadcast bandwidth among the job's ranks, so a result can say how close it came to the link."""

from __future__ import annotations

import torch
import torch.distributed as dist

from sweepbench.measure.stats import summarize
from sweepbench.measure.timing import time_iterations


def _ring_step(send: torch.Tensor, recv: torch.Tensor, rank: int, world: int):
    def step() -> None:
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % world),
               dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    return step


def probe_links(*, nbytes: int, device: torch.device, warmup: int = 2, iters: int = 5) -> dict[str, float]:
    """Per-rank p2p bandwidth (every rank sends ``nbytes`` to the next and receives from the
    previous at once: the ceiling for a rank's ingress and egress) and broadcast bandwidth from
    rank 0, in GB/s (1e9 B/s), checked on known data. Every rank of the default group calls it."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        return {"p2p_gbps": float("inf"), "broadcast_gbps": float("inf"), "probe_bytes": nbytes}
    numel = nbytes // 4
    send = torch.full((numel,), float(rank + 1), device=device)
    recv = torch.zeros(numel, device=device)
    p2p = summarize(time_iterations(_ring_step(send, recv, rank, world), warmup=warmup, iters=iters,
                                    device=device))
    assert torch.all(recv == float((rank - 1) % world + 1)), "link probe: p2p data arrived wrong"
    buf = torch.full((numel,), 7.0, device=device) if rank == 0 else torch.zeros(numel, device=device)
    bcast = summarize(time_iterations(lambda: dist.broadcast(buf, src=0), warmup=warmup, iters=iters,
                                      device=device))
    assert torch.all(buf == 7.0), "link probe: broadcast data arrived wrong"
    return {"p2p_gbps": nbytes / p2p["median_s"] / 1e9, "broadcast_gbps": nbytes / bcast["median_s"] / 1e9,
            "probe_bytes": nbytes}
