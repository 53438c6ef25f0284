"""Timing one planned weight transfer, shared by the refit and reshard benchmarks.

Each iteration poisons the destination weights (NaN), runs the transfer (timed, slowest rank),
then checks every destination shard bit for bit against the matching slice of the source
weights; ``verified`` is true only if every rank checked every iteration. The transfer comes
from a registered implementation (``sweepbench.parallel.impls``: ours with a strategy, or a peer
such as megatron-core's refit), all timed and checked by this one loop."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from sweepbench.config.schema import BenchmarkConfig
from sweepbench.config.validate import resolve_backend
from sweepbench.core import RankContext, VerificationError
from sweepbench.parallel import BALANCE, STRATEGIES
from sweepbench.parallel.strategies import GPU_ONLY

if TYPE_CHECKING:  # torch and the executors are imported where a transfer runs, on the ranks
    import torch

    from sweepbench.parallel import Layout, Plan


@dataclass
class TransferConfig(BenchmarkConfig):
    """The options every transfer benchmark (refit, reshard) has."""

    # send_recv | pipeline | ipc (GPU) | broadcast | naive (backend=nvshmem uses the nvshmem transport)
    strategy: str = "send_recv"
    balance: str = "size"  # which source replica sends: none (first holder) | size (least loaded) | order (round robin)
    local_allgather: bool = False  # broadcast only: one copy per destination mesh, then all-gather inside it
    bucket_bytes: int = 64 << 20  # small pieces are packed into buckets of at most this many bytes
    seed: int = 0  # values are a deterministic function of (seed, parameter, element)
    probe_bytes: int = 0  # link probe message size; 0 = the benchmark's default (see its module docstring)


# Strategy-specific executor options, and the transport a backend imposes.
STRATEGY_OPTIONS: dict[str, Callable[[Any, torch.device], dict[str, Any]]] = {
    "broadcast": lambda cfg, device: {"local_allgather": cfg.local_allgather},
    "nvshmem": lambda cfg, device: {"device": device},
}
BACKEND_STRATEGY = {"nvshmem": "nvshmem"}


def check_transfer_options(b: Any, *, backend: str) -> None:
    """The options every transfer benchmark has: strategy (and whether ``backend``, as configured,
    can run it), balance, bucket_bytes."""
    if b.strategy not in STRATEGIES or b.strategy in BACKEND_STRATEGY.values():
        valid = [s for s in STRATEGIES if s not in BACKEND_STRATEGY.values()]
        raise ValueError(
            f"benchmark.strategy={b.strategy!r}; valid: {', '.join(valid)} "
            f"(the nvshmem transport is chosen with backend=nvshmem)"
        )
    BALANCE.check(b.balance, key="benchmark.balance")
    if b.bucket_bytes < 1:
        raise ValueError(f"benchmark.bucket_bytes={b.bucket_bytes} must be >= 1")
    resolved = resolve_backend(backend)
    check_strategy_backend(transfer_strategy(resolved, b.strategy), resolved)


def check_strategy_backend(strategy: str, backend: str) -> None:
    """A GPU-only strategy (CUDA IPC, symmetric memory) on gloo is refused, as backend=nvshmem is
    without a GPU. ``backend`` is the resolved one (never ``auto``)."""
    if strategy in GPU_ONLY and backend == "gloo":
        raise ValueError(
            f"benchmark.strategy={strategy} needs GPUs (it moves bytes between GPU memories), but "
            f"the backend is gloo; use send_recv or pipeline on CPU, or backend=nccl on GPUs"
        )


def transfer_strategy(backend: str, strategy: str) -> str:
    """The executor a job uses: the configured strategy, unless the backend imposes its own."""
    return BACKEND_STRATEGY.get(backend, strategy)


@dataclass
class TimedTransfer:
    plan: Plan | None  # ours (None for a peer implementation, which plans by itself)
    plan_digest: str  # the implementation's plan, identified (the same on every rank)
    method: str  # what moved the bytes (strategy, or a peer's copy service)
    options: dict[str, Any]
    times_s: list[float]
    traffic: list[tuple[int, int]]  # (bytes sent, bytes received) of every rank
    verified: bool


def time_transfer(
    src: Layout, dst: Layout, *, ctx: RankContext, cfg: Any, strategy: str, label: str, impl: str = "sweepbench"
) -> TimedTransfer:
    """Every rank of the default group calls this with the same layouts; ``cfg`` is the
    benchmark config (balance, bucket_bytes, seed, warmup, iters, local_allgather)."""
    import torch.distributed as dist

    from sweepbench.measure import time_iterations
    from sweepbench.parallel.impls import IMPLS

    options = STRATEGY_OPTIONS.get(strategy, lambda c, d: {})(cfg, ctx.device)
    transfer = IMPLS.get(impl)(
        src,
        dst,
        model=ctx.cfg.model,
        strategy=strategy,
        options={"bucket_bytes": cfg.bucket_bytes, **options},
        balance=cfg.balance,
        backend=ctx.backend,
        rank=ctx.rank,
        device=ctx.device,
        seed=cfg.seed,
    )
    checks = {"n": 0}

    def verify() -> None:
        problems = transfer.verify()
        if problems:
            raise VerificationError(
                f"{label} ({src.describe()} -> {dst.describe()}, {impl} {transfer.method}, "
                f"balance {cfg.balance}): {len(problems)} shards wrong, first: {problems[0]}"
            )
        checks["n"] += 1

    times = time_iterations(
        transfer.step, warmup=cfg.warmup, iters=cfg.iters, device=ctx.device, before=transfer.poison, after=verify
    )
    everyone: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, (*transfer.traffic(), checks["n"] == cfg.warmup + cfg.iters))
    return TimedTransfer(
        getattr(transfer, "plan", None),
        transfer.plan_digest,
        transfer.method,
        options,
        times,
        [(s, r) for s, r, _ in everyone],
        all(ok for *_, ok in everyone),
    )
