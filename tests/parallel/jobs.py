"""Functions run on every rank of a :class:`~world.World` (module level, so picklable)."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from sweepbench.parallel import (
    allocate_shards,
    build_shards,
    execute,
    make_executor,
    plan_for,
    verify_shards,
)

from .cases import MODELS, REFIT_CASES, RESHARD_CASES, STRATEGY_CONFIGS, refit_layouts, reshard_layouts

Result = tuple[str, str, str, str, list[str]]  # case, strategy, balance, options, problems


def _run_pairs(rank: int, pairs: list[tuple[str, Any, Any]], configs: list[tuple[str, str, dict[str, Any]]],
               seed: int, runs: int = 2) -> tuple[list[Result], list[str]]:
    results: list[Result] = []
    digests: list[str] = []
    for case_id, src, dst in pairs:
        src_shards = build_shards(src, rank, seed=seed)
        for strategy, balance, opts in configs:
            plan = plan_for(src, dst, strategy=strategy, balance=balance)
            digests.append(plan.digest)
            ex = make_executor(plan, strategy=strategy, **opts)
            problems: list[str] = []
            for _ in range(runs):  # the second run reuses the executor's buffers
                dst_shards = allocate_shards(dst, rank, fill=float("nan"))
                ex.run(src_shards, dst_shards)
                problems += verify_shards(dst, rank, dst_shards, seed=seed)
            problems += [f"source corrupted: {p}" for p in verify_shards(src, rank, src_shards, seed=seed)]
            results.append((case_id, strategy, balance, repr(opts), problems))
    return results, digests


def _gather_digests(digests: list[str]) -> list[list[str]]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, digests)
    return out


def refit_job(rank: int, world_size: int, case_ids: list[str], seed: int) -> dict[str, Any]:
    cases = [c for c in REFIT_CASES if c[0] in case_ids]
    pairs = [(c[0], *refit_layouts(c)) for c in cases]
    results, digests = _run_pairs(rank, pairs, STRATEGY_CONFIGS, seed)
    return {"results": results, "digests": _gather_digests(digests)}


def reshard_job(rank: int, world_size: int, case_ids: list[str], seed: int) -> dict[str, Any]:
    cases = [c for c in RESHARD_CASES if c[0] in case_ids]
    pairs = [(c[0], *reshard_layouts(c)) for c in cases]
    results, digests = _run_pairs(rank, pairs, STRATEGY_CONFIGS, seed)
    return {"results": results, "digests": _gather_digests(digests)}


def gpu_only_job(rank: int, world_size: int, strategy: str) -> str:
    """A GPU-only strategy (nvshmem, ipc) must refuse CPU-only setups with a RuntimeError on every rank."""
    src, dst = reshard_layouts(RESHARD_CASES[0])
    plan = plan_for(src, dst, strategy=strategy)
    try:
        make_executor(plan, strategy=strategy)
    except RuntimeError as e:
        return str(e)
    return "no error"


def digest_job(rank: int, world_size: int) -> list[list[str]]:
    digests = [plan_for(*refit_layouts(c), strategy=s, balance=b).digest
               for c in REFIT_CASES for s, b, _ in STRATEGY_CONFIGS]
    return _gather_digests(digests)


def execute_job(rank: int, world_size: int, seed: int) -> tuple[list[str], bool]:
    """The cached ``execute`` entry point: two calls, one executor."""
    src, dst = refit_layouts(REFIT_CASES[6])
    plan = plan_for(src, dst, strategy="broadcast", balance="size")
    src_shards = build_shards(src, rank, seed=seed)
    problems: list[str] = []
    executors = []
    for _ in range(2):
        dst_shards = allocate_shards(dst, rank, fill=float("nan"))
        executors.append(execute(plan, src_shards, dst_shards, strategy="broadcast", bucket_bytes=4096))
        problems += verify_shards(dst, rank, dst_shards, seed=seed)
    return problems, executors[0] is executors[1]


def megatron_job(rank: int, world_size: int, case: tuple[Any, ...], seed: int) -> dict[str, Any]:
    """megatron-core's refit between the case's layouts (gloo copy service): two poisoned,
    swapped and checked iterations, and this rank's traffic."""
    import torch

    from sweepbench.parallel.impls import IMPLS

    src, dst = refit_layouts(case)
    transfer = IMPLS.get("megatron")(src, dst, model=MODELS[case[1]], backend="gloo", rank=rank,
                                     device=torch.device("cpu"), seed=seed)
    problems: list[str] = []
    for _ in range(2):
        transfer.poison()
        if transfer.dst_boxes and not transfer.verify():
            problems.append("poisoned weights passed the check")
        transfer.step()
        problems += transfer.verify()
    return {"problems": problems, "traffic": transfer.traffic(), "digest": transfer.plan_digest}
