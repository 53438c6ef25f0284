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


def gc_job(rank: int, world_size: int) -> dict[str, Any]:
    """A step that leaves reference cycles behind, as a big model's Python code does: a collection is
    due after a few calls. Records when the collector ran (gc.callbacks) relative to the samples."""
    import gc

    import torch

    from sweepbench.measure.timing import time_iterations

    state = {"phase": "warmup", "timed_calls": 0}
    runs: list[tuple[str, int]] = []

    def on_gc(event: str, info: dict[str, Any]) -> None:
        if event == "start":
            runs.append((state["phase"], info["generation"]))

    def step() -> None:
        for _ in range(3000):  # cyclic garbage: two lists pointing at each other
            a: list[Any] = []
            b = [a]
            a.append(b)
        if state["phase"] == "timed":
            state["timed_calls"] += 1

    calls = {"before": 0}

    def before() -> None:  # called once per warm-up call, then once per sample: the third opens the timing
        calls["before"] += 1
        if calls["before"] > 2:
            state["phase"] = "timed"

    gc.callbacks.append(on_gc)
    try:
        assert gc.isenabled()
        time_iterations(step, warmup=2, iters=10, device=torch.device("cpu"), before=before)
        enabled_after = gc.isenabled()
    finally:
        gc.callbacks.remove(on_gc)
    return {"runs": runs, "timed_calls": state["timed_calls"], "enabled_after": enabled_after}


def test_no_garbage_collection_while_timing(world2: Any) -> None:
    """The collector runs (a full collection after the warm-up) but never while samples are taken; it is
    on again afterwards. Without this, 30000 cycles in 10 samples trigger several collections there."""
    for rank in world2.run(gc_job):
        assert rank["timed_calls"] == 10 and rank["enabled_after"]
        assert ("warmup", 2) in rank["runs"], rank["runs"]  # gc.collect() once the warm-up is done
        assert not [r for r in rank["runs"] if r[0] == "timed"], rank["runs"]


def ordering_job(rank: int, world_size: int, k: int) -> dict[str, Any]:
    """Rank 1's ``before`` is slow; every ``step`` start of rank 0 is stamped, and every end of rank 1's
    ``before``: a peer that writes into rank 1's buffers must not start before rank 1's reset ends."""
    import torch

    from sweepbench.measure.timing import time_iterations

    before_ends: list[float] = []
    step_starts: list[float] = []

    def before() -> None:
        if rank == 1:
            time.sleep(0.05)
        before_ends.append(time.time())

    def step() -> None:
        step_starts.append(time.time())

    time_iterations(step, warmup=3, iters=2, device=torch.device("cpu"), before=before, ops_per_sample=k)
    return {"before_ends": before_ends, "step_starts": step_starts}


@pytest.mark.parametrize("k", [1, 4])
def test_no_rank_steps_before_every_rank_has_run_its_before_hook_warm_up_included(world2: Any, k: int) -> None:
    fast, slow = world2.run(ordering_job, k)
    # each of rank 0's first calls after a before hook (warm-up ones included) starts after rank 1's hook ended
    starts = fast["step_starts"]  # k > 1: the 3 warm-up calls run after one hook, then a sample of k after each
    firsts = starts if k == 1 else [starts[0], *starts[3::k]]
    assert len(slow["before_ends"]) == len(firsts)
    for ended, started in zip(slow["before_ends"], firsts):
        assert started >= ended, (started, ended)


def phases_job(rank: int, world_size: int, iters: int, warmup: int) -> dict[str, Any]:
    import torch

    from sweepbench.measure.timing import time_phases

    order: list[str] = []
    first, second = (SLOW_S, FAST_S) if rank == 1 else (FAST_S, 3 * SLOW_S)

    def step(name: str, seconds: float) -> Any:
        def run() -> None:
            order.append(name)
            _spin(seconds)

        return run

    times = time_phases([step("fwd", first), step("bwd", second)], warmup=warmup, iters=iters,
                        device=torch.device("cpu"), before=lambda: order.append("before"))
    return {"times": times, "order": order}


def test_phases_of_one_iteration_are_timed_apart_in_order_the_slowest_rank_each(world2: Any) -> None:
    """A forward then the backward over its graph, each its own sample: every rank reports the
    slowest rank's time of each step (rank 1's first step, rank 0's second), and each iteration
    runs ``before`` then the steps in order, warm-up iterations included."""
    iters, warmup = 4, 2
    per_rank = world2.run(phases_job, iters, warmup)
    fwd, bwd = per_rank[0]["times"]
    assert per_rank[1]["times"] == [fwd, bwd] and len(fwd) == len(bwd) == iters
    assert min(fwd) >= SLOW_S and statistics.median(fwd) < 2 * SLOW_S, fwd  # rank 1's, not the sum of both
    assert min(bwd) >= 3 * SLOW_S and statistics.median(bwd) < 4 * SLOW_S, bwd  # rank 0's
    for r in per_rank:
        assert r["order"] == ["before", "fwd", "bwd"] * (warmup + iters)
