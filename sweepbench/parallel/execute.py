"""Entry points: build an executor for a plan by strategy name, or run one directly."""

from __future__ import annotations

from typing import Any

from .comm import Executor, Shards
from .layout import Layout
from .plan import Plan, make_plan
from .strategies import STRATEGIES

_EXECUTORS: dict[tuple[Any, ...], Executor] = {}


def strategy_fanout(strategy: str) -> bool:
    """Whether ``strategy`` wants a plan built with ``make_plan(..., fanout=True)``."""
    return bool(STRATEGIES.get(strategy).fanout)


def plan_for(src: Layout, dst: Layout, *, strategy: str, balance: str = "none") -> Plan:
    """The cached plan that suits ``strategy`` (fanout plan for one-to-many strategies)."""
    return make_plan(src, dst, balance=balance, fanout=strategy_fanout(strategy))


def make_executor(plan: Plan, *, strategy: str, group: Any = None, **options: Any) -> Executor:
    """Collective: every rank of the default group must call it, in the same order.
    Options: ``bucket_bytes`` (all), ``local_allgather`` (broadcast),
    ``symm_backend`` / ``device`` (nvshmem)."""
    return STRATEGIES.get(strategy)(plan, group=group, **options)


def execute(
    plan: Plan, src_shards: Shards, dst_shards: Shards, *, strategy: str, group: Any = None, **options: Any
) -> Executor:
    """Move ``src_shards`` (this rank's shards of ``plan.src``, may be empty) into
    ``dst_shards`` (this rank's preallocated shards of ``plan.dst``).  Every rank of the
    default group calls it; the executor (and its sub-groups) is built on first use
    and cached per (plan, strategy, options, group)."""
    key = (plan, strategy, tuple(sorted(options.items())), id(group))
    ex = _EXECUTORS.get(key)
    if ex is None:
        ex = _EXECUTORS[key] = make_executor(plan, strategy=strategy, group=group, **options)
    ex.run(src_shards, dst_shards)
    return ex


def clear_cache() -> None:
    """Forget cached executors (their buffers are freed; sub-groups stay cached)."""
    _EXECUTORS.clear()
