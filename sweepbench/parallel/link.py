"""The physical limit, measured in the job itself: a short probe of the point-to-point and
broadcast bandwidth among the job's ranks, so a result can say how close it came to the link.

On GPUs the probe also measures the copy engines: every rank pulls a buffer straight out of the
next rank's memory (CUDA IPC, one device-to-device memcpy), so a strategy that moves bytes with
copies instead of NCCL (``ipc``) is held to a floor measured the same way it moves them.
``link_gbps`` is the faster of the two, the bandwidth a link floor should use."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from sweepbench.measure.stats import summarize
from sweepbench.measure.timing import time_iterations


def _ring_step(send: torch.Tensor, recv: torch.Tensor, rank: int, world: int):
    def step() -> None:
        ops = [dist.P2POp(dist.isend, send, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    return step


def probe_links(*, nbytes: int, device: torch.device, warmup: int = 2, iters: int = 5) -> dict[str, Any]:
    """Per-rank p2p bandwidth (every rank sends ``nbytes`` to the next and receives from the
    previous at once: the ceiling for a rank's ingress and egress) and broadcast bandwidth from
    rank 0, in GB/s (1e9 B/s), checked on known data. Every rank of the default group calls it."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:  # one rank has no link: its rates are unknown (null in the record), not infinite
        return {"p2p_gbps": None, "broadcast_gbps": None, "link_gbps": None, "probe_bytes": nbytes}
    numel = nbytes // 4
    send = torch.full((numel,), float(rank + 1), device=device)
    recv = torch.zeros(numel, device=device)
    p2p = summarize(
        time_iterations(
            _ring_step(send, recv, rank, world), warmup=warmup, iters=iters, device=device, record_gpu=False
        )
    )
    assert torch.all(recv == float((rank - 1) % world + 1)), "link probe: p2p data arrived wrong"
    buf = torch.full((numel,), 7.0, device=device) if rank == 0 else torch.zeros(numel, device=device)
    bcast = summarize(
        time_iterations(lambda: dist.broadcast(buf, src=0), warmup=warmup, iters=iters, device=device, record_gpu=False)
    )
    assert torch.all(buf == 7.0), "link probe: broadcast data arrived wrong"
    out = {
        "p2p_gbps": nbytes / p2p["median_s"] / 1e9,
        "broadcast_gbps": nbytes / bcast["median_s"] / 1e9,
        "probe_bytes": nbytes,
    }
    if device.type == "cuda":
        out["copy_gbps"] = _probe_copy(send, recv, rank, world, device, warmup, iters)
    out["link_gbps"] = max(out["p2p_gbps"], out.get("copy_gbps", 0.0))
    return out


def _probe_copy(
    send: torch.Tensor, recv: torch.Tensor, rank: int, world: int, device: torch.device, warmup: int, iters: int
) -> float:
    """GB/s of a ring of peer pulls (rank r copies rank r+1's buffer into its own), among the ranks
    of this rank's node: the copy-engine ceiling of a rank's ingress and egress. 0 when the next
    rank is on another node (no IPC there)."""
    from sweepbench.parallel import cuda_ipc

    nodes = cuda_ipc.node_ids()
    peer = (rank + 1) % world
    same = nodes[peer] == nodes[rank]
    send.fill_(float(rank + 1))
    # the exchange (an NCCL all-gather, after the fill on every rank's stream) also orders the
    # peer's fill before our pulls; nobody writes the pulled buffers afterwards
    views = cuda_ipc.exchange({"probe": send}, wanted_from={peer} if same else set())

    def pull() -> None:
        if same:
            recv.copy_(views[peer]["probe"])

    stats = summarize(time_iterations(pull, warmup=warmup, iters=iters, device=device, record_gpu=False))
    assert not same or torch.all(recv == float(peer + 1)), "link probe: copy-engine data arrived wrong"
    ok = torch.tensor([1.0 if same else 0.0], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return send.numel() * send.element_size() / stats["median_s"] / 1e9 if ok.item() else 0.0
