"""measure.timing's two ways to make a sample, on real gloo process groups: a batched sample of k
calls is its time / k, the slowest rank's, with the hooks around each sample and every call
counted; the per-step path keeps its hooks around every call."""

from __future__ import annotations

import statistics
import time
from typing import Any

import pytest

SLOW_S, FAST_S = 0.004, 0.0004  # per call: rank 1 spins 10x longer than rank 0


def _spin(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def timing_job(rank: int, world_size: int, k: int, iters: int, warmup: int) -> dict[str, Any]:
    import torch

    from sweepbench.measure.timing import time_iterations

    calls = {"step": 0, "before": 0, "after": 0}
    per_call = SLOW_S if rank == 1 else FAST_S

    def step() -> None:
        calls["step"] += 1
        _spin(per_call)

    def hook(name: str) -> Any:
        return lambda: calls.__setitem__(name, calls[name] + 1)

    times = time_iterations(step, warmup=warmup, iters=iters, device=torch.device("cpu"),
                            before=hook("before"), after=hook("after"), ops_per_sample=k)
    return {"times": times, **calls}


@pytest.fixture(scope="module")
def world2(worlds: Any) -> Any:
    return worlds.get(2)


def test_a_batched_sample_is_its_time_over_k_of_the_slowest_rank(world2: Any) -> None:
    k, iters, warmup = 8, 5, 3
    per_rank = world2.run(timing_job, k, iters, warmup)
    times = per_rank[0]["times"]
    assert per_rank[1]["times"] == times  # one value per sample for every rank: the slowest rank's
    assert len(times) == iters
    # every call of the slow rank spins SLOW_S, so its sample of k calls / k is at least SLOW_S; undivided
    # it would be k * SLOW_S, and the fast rank's own time would be about FAST_S
    assert min(times) >= SLOW_S
    assert statistics.median(times) < k * SLOW_S / 3, times
    for calls in per_rank:
        assert calls["step"] == warmup + iters * k  # warm-up calls plus k calls per sample
        assert calls["before"] == calls["after"] == iters + 1  # around each sample, and once around the warm-up


def test_the_per_step_path_times_one_call_with_hooks_around_each(world2: Any) -> None:
    iters, warmup = 4, 2
    per_rank = world2.run(timing_job, 1, iters, warmup)
    times = per_rank[0]["times"]
    assert per_rank[1]["times"] == times and len(times) == iters
    assert min(times) >= SLOW_S
    for calls in per_rank:
        assert calls["step"] == warmup + iters
        assert calls["before"] == calls["after"] == warmup + iters


def test_ops_per_sample_rule() -> None:
    from sweepbench.measure.timing import SHORT_OP_BATCH, ops_per_sample

    assert ops_per_sample(0, short_ops=True) == SHORT_OP_BATCH == 20
    assert ops_per_sample(0, short_ops=False) == 1
    assert ops_per_sample(7, short_ops=True) == ops_per_sample(7, short_ops=False) == 7
