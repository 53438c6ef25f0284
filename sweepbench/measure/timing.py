"""The timing loop: warm up, then time each iteration with device events (CUDA) or the host
clock (CPU, where gloo collectives are synchronous), and keep the slowest rank's time."""

from __future__ import annotations

import time
from typing import Callable

import torch
import torch.distributed as dist


def _time_cuda(step: Callable[[], None], iters: int) -> list[float]:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for start, end in zip(starts, ends):
        dist.barrier()
        start.record()
        step()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends)]


def _time_host(step: Callable[[], None], iters: int) -> list[float]:
    times = []
    for _ in range(iters):
        dist.barrier()
        tic = time.perf_counter()
        step()
        times.append(time.perf_counter() - tic)
    return times


def time_iterations(
    step: Callable[[], None], *, warmup: int, iters: int, device: torch.device
) -> list[float]:
    """Per-iteration seconds of the slowest rank (max over ranks, iteration by iteration).

    Every rank of the default group must call this with the same ``warmup`` and ``iters``."""
    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        times = _time_cuda(step, iters)
    else:
        times = _time_host(step, iters)
    t = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()
