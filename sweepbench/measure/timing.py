"""The timing loop: warm up, then time each iteration with device events (CUDA) or the host
clock (CPU, where gloo collectives are synchronous), and keep the slowest rank's time."""

from __future__ import annotations

import time
from typing import Callable

import torch
import torch.distributed as dist


Hook = Callable[[], None]

# fault.kind=slow (launch.faults): every timed iteration of this rank takes this many times as long
_slowdown = 1.0


def slow_down(factor: float) -> None:
    global _slowdown
    _slowdown = factor


def _slowed(step: Hook, device: torch.device) -> Hook:
    """``step`` followed, inside the timed region, by a wait of (factor - 1) x its own time. The
    wait spins rather than sleeps: a sleep overshoots short iterations (timer slack, waking up on
    a busy machine), a spin adds what it says."""
    def slow_step() -> None:
        tic = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        toc = time.perf_counter()
        until = toc + (_slowdown - 1) * (toc - tic)
        while time.perf_counter() < until:
            pass

    return slow_step


def _nothing() -> None:
    pass


def _time_cuda(step: Hook, iters: int, before: Hook, after: Hook) -> list[float]:
    times = []
    for _ in range(iters):
        before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        dist.barrier()
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
        after()
    return times


def _time_host(step: Hook, iters: int, before: Hook, after: Hook) -> list[float]:
    times = []
    for _ in range(iters):
        before()
        dist.barrier()
        tic = time.perf_counter()
        step()
        times.append(time.perf_counter() - tic)
        after()
    return times


def time_iterations(
    step: Hook, *, warmup: int, iters: int, device: torch.device,
    before: Hook = _nothing, after: Hook = _nothing,
) -> list[float]:
    """Per-iteration seconds of the slowest rank (max over ranks, iteration by iteration).

    ``before`` and ``after`` run around every iteration, warm-up included, outside the timed
    region (e.g. poison the output before, verify it after). Every rank of the default group must
    call this with the same ``warmup`` and ``iters``."""
    for _ in range(warmup):
        before()
        step()
        after()
    if _slowdown != 1:
        step = _slowed(step, device)
    if device.type == "cuda":
        torch.cuda.synchronize()
        times = _time_cuda(step, iters, before, after)
    else:
        times = _time_host(step, iters, before, after)
    t = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()
