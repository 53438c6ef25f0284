"""Timing one planned weight transfer, shared by the refit and reshard benchmarks.

Each iteration poisons the destination shards (NaN), runs the executor (timed, slowest rank),
then checks every destination shard bit for bit against the matching slice of the source
weights; ``verified`` is true only if every rank checked every iteration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from sweepbench.benchmarks.base import RankContext, VerificationError
from sweepbench.config.schema import BenchmarkConfig
from sweepbench.parallel import BALANCE, STRATEGIES

if TYPE_CHECKING:  # torch and the executors are imported where a transfer runs, on the ranks
    import torch

    from sweepbench.parallel import Layout, Plan


@dataclass
class TransferConfig(BenchmarkConfig):
    """The options every transfer benchmark (refit, reshard) has."""

    strategy: str = "send_recv"  # send_recv | broadcast | naive (backend=nvshmem uses the nvshmem transport)
    balance: str = "size"  # which source replica sends: none (first holder) | size (least loaded) | order (round robin)
    local_allgather: bool = False  # broadcast only: one copy per destination mesh, then all-gather inside it
    bucket_bytes: int = 64 << 20  # small pieces are packed into buckets of at most this many bytes
    seed: int = 0  # values are a deterministic function of (seed, parameter, element)
    probe_bytes: int = 0  # link probe message size; 0 = the benchmark's default (see its module docstring)
    warmup: int = 2
    iters: int = 5


# Strategy-specific executor options, and the transport a backend imposes.
STRATEGY_OPTIONS: dict[str, Callable[[Any, torch.device], dict[str, Any]]] = {
    "broadcast": lambda cfg, device: {"local_allgather": cfg.local_allgather},
    "nvshmem": lambda cfg, device: {"device": device},
}
BACKEND_STRATEGY = {"nvshmem": "nvshmem"}


def check_transfer_options(b: Any) -> None:
    """The options every transfer benchmark has: strategy, balance, bucket_bytes."""
    if b.strategy not in STRATEGIES or b.strategy in BACKEND_STRATEGY.values():
        valid = [s for s in STRATEGIES if s not in BACKEND_STRATEGY.values()]
        raise ValueError(f"benchmark.strategy={b.strategy!r}; valid: {', '.join(valid)} "
                         f"(the nvshmem transport is chosen with backend=nvshmem)")
    if b.balance not in BALANCE:
        raise ValueError(f"benchmark.balance={b.balance!r}; valid: {', '.join(BALANCE)}")
    if b.bucket_bytes < 1:
        raise ValueError(f"benchmark.bucket_bytes={b.bucket_bytes} must be >= 1")


def transfer_strategy(backend: str, strategy: str) -> str:
    """The executor a job uses: the configured strategy, unless the backend imposes its own."""
    return BACKEND_STRATEGY.get(backend, strategy)


@dataclass
class TimedTransfer:
    plan: Plan
    options: dict[str, Any]
    times_s: list[float]
    traffic: list[tuple[int, int]]  # (bytes sent, bytes received) of every rank
    verified: bool


def time_transfer(src: Layout, dst: Layout, *, ctx: RankContext, cfg: Any, strategy: str,
                  label: str) -> TimedTransfer:
    """Every rank of the default group calls this with the same layouts; ``cfg`` is the
    benchmark config (balance, bucket_bytes, seed, warmup, iters, local_allgather)."""
    import torch.distributed as dist

    from sweepbench.measure import time_iterations
    from sweepbench.parallel import allocate_shards, build_shards, make_executor, plan_for, verify_shards

    plan = plan_for(src, dst, strategy=strategy, balance=cfg.balance)
    src_shards = build_shards(src, ctx.rank, seed=cfg.seed, device=ctx.device) if ctx.rank in src.ranks else {}
    dst_shards = allocate_shards(dst, ctx.rank, device=ctx.device)
    options = STRATEGY_OPTIONS.get(strategy, lambda c, d: {})(cfg, ctx.device)
    executor = make_executor(plan, strategy=strategy, bucket_bytes=cfg.bucket_bytes, **options)
    checks = {"n": 0}

    def poison() -> None:
        for t in dst_shards.values():
            t.fill_(float("nan"))

    def verify() -> None:
        problems = verify_shards(dst, ctx.rank, dst_shards, seed=cfg.seed)
        if problems:
            raise VerificationError(f"{label} ({src.describe()} -> {dst.describe()}, {strategy}, balance "
                                    f"{cfg.balance}): {len(problems)} shards wrong, first: {problems[0]}")
        checks["n"] += 1

    times = time_iterations(lambda: executor.run(src_shards, dst_shards), warmup=cfg.warmup,
                            iters=cfg.iters, device=ctx.device, before=poison, after=verify)
    everyone: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, (*executor.traffic(), checks["n"] == cfg.warmup + cfg.iters))
    return TimedTransfer(plan, options, times, [(s, r) for s, r, _ in everyone], all(ok for *_, ok in everyone))
