"""Refit a tiny dense / MoE model between training and inference layouts with every
strategy, in a real 8-process gloo world, verified bit for bit."""

from __future__ import annotations

import pytest

from sweepbench.parallel import plan_for

from . import jobs
from .cases import REFIT_CASES, STRATEGY_CONFIGS, refit_layouts
from .world import World


def _assert_clean(results: list[dict]) -> None:  # type: ignore[type-arg]
    problems = [
        f"{case} {strategy}/{balance} {opts}: {p}"
        for rank_result in results for case, strategy, balance, opts, ps in rank_result["results"] for p in ps
    ]
    assert not problems, "\n".join(problems[:20])
    assert len(results[0]["results"]) > 0


@pytest.mark.parametrize("case", REFIT_CASES, ids=[c[0] for c in REFIT_CASES])
def test_refit_every_strategy(world8: World, case) -> None:  # type: ignore[no-untyped-def]
    results = world8.run(jobs.refit_job, [case[0]], 11)
    _assert_clean(results)
    assert len(results[0]["results"]) == len(STRATEGY_CONFIGS)


def test_every_rank_derives_the_same_plan(world8: World) -> None:
    out = world8.run(jobs.digest_job)
    gathered = out[0]
    assert all(o == gathered for o in out)  # every rank saw the same all_gather result
    assert all(d == gathered[0] for d in gathered), "plan digests differ between ranks"
    # ...and the same as this (differently hash-seeded) process computes
    expected = [plan_for(*refit_layouts(c), strategy=s, balance=b).digest
                for c in REFIT_CASES for s, b, _ in STRATEGY_CONFIGS]
    assert gathered[0] == expected


def test_execute_entry_point_reuses_executor(world8: World) -> None:
    out = world8.run(jobs.execute_job, 5)
    assert all(problems == [] and reused for problems, reused in out)


@pytest.mark.parametrize("strategy", ["nvshmem", "ipc"])
def test_gpu_only_strategies_refuse_cpu(world8: World, strategy: str) -> None:
    messages = world8.run(jobs.gpu_only_job, strategy)
    assert all(m.startswith(f"strategy '{strategy}' needs CUDA") for m in messages), messages
