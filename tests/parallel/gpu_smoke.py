"""GPU check of the engine over NCCL (and the nvshmem and ipc strategies): not collected by pytest.

Run on a machine with N GPUs (every case whose ranks fit in N runs)::

    PYTHONPATH=.:tests torchrun --standalone --nproc-per-node=N -m parallel.gpu_smoke

Prints one line per (case, strategy) on rank 0 plus timings of a mid-size refit,
and exits non-zero when any shard is not bit-exact.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from sweepbench.parallel import (
    allocate_shards,
    build_shards,
    make_executor,
    model_layout,
    plan_for,
    verify_shards,
)

from .cases import REFIT_CASES, RESHARD_CASES, STRATEGY_CONFIGS, refit_layouts, reshard_layouts

GPU_CONFIGS: list[tuple[str, str, dict[str, Any]]] = STRATEGY_CONFIGS + [
    ("nvshmem", "size", {}),
    ("nvshmem", "none", {"symm_backend": "CUDA", "bucket_bytes": 4096}),
    ("ipc", "size", {}),
    ("ipc", "none", {"bucket_bytes": 4096}),
]


def _say(msg: str) -> None:
    if dist.get_rank() == 0:
        print(msg, flush=True)


def _check(pairs: list[tuple[str, Any, Any]], device: torch.device) -> int:
    rank, failures = dist.get_rank(), 0
    for case_id, src, dst in pairs:
        src_shards = build_shards(src, rank, seed=3, device=device)
        for strategy, balance, opts in GPU_CONFIGS:
            if strategy == "nvshmem" and opts.get("symm_backend", "NVSHMEM") != _SYMM_BACKEND[0]:
                continue  # torch allows one symmetric-memory backend per process
            plan = plan_for(src, dst, strategy=strategy, balance=balance)
            try:
                ex = make_executor(plan, strategy=strategy, **opts)
                problems: list[str] = []
                for _ in range(3):
                    dst_shards = allocate_shards(dst, rank, device=device, fill=float("nan"))
                    ex.run(src_shards, dst_shards)
                    torch.cuda.synchronize()
                    problems += verify_shards(dst, rank, dst_shards, seed=3)
            except RuntimeError as e:
                problems = [f"RuntimeError: {e}"]
            everyone: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, problems)
            bad = [p for ps in everyone for p in ps]
            failures += bool(bad)
            _say(f"{'FAIL' if bad else 'ok  '} {case_id:32s} {strategy:9s} {balance:5s} {opts} {bad[:2]}")
    return failures


_SYMM_BACKEND = ["NVSHMEM"]


def _timings(device: torch.device) -> None:
    """Refit a mid-size model (tp=W training layout -> dp=W inference layout, collocated)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    cfg = dict(name="mid", num_layers=8, hidden_size=2048, num_heads=16, num_kv_heads=8,
               ffn_hidden_size=8192, vocab_size=32768, dtype="bfloat16", num_experts=0)
    src, dst = model_layout(cfg, tp=world), model_layout(cfg, dp=world)
    src_shards = build_shards(src, rank, seed=0, device=device)
    dst_shards = allocate_shards(dst, rank, device=device)
    for strategy, balance, opts in GPU_CONFIGS:
        if strategy == "nvshmem" and opts.get("symm_backend", "NVSHMEM") != _SYMM_BACKEND[0]:
            continue
        plan = plan_for(src, dst, strategy=strategy, balance=balance)
        try:
            ex = make_executor(plan, strategy=strategy, **opts)
            ex.run(src_shards, dst_shards)  # warm-up
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(3):
                ex.run(src_shards, dst_shards)
            torch.cuda.synchronize()
            dt = (time.perf_counter() - t0) / 3
            ok = not verify_shards(dst, rank, dst_shards, seed=0)
            _say(f"time {strategy:9s} {balance:5s} {opts}: {dt * 1e3:8.2f} ms, "
                 f"{plan.model_bytes / 2**20:.0f} MiB model, {plan.moved_bytes / dt / 2**30:.1f} GiB/s moved, "
                 f"exact={ok}")
        except RuntimeError as e:
            _say(f"time {strategy}: RuntimeError {e}")


def main() -> int:
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    import torch.distributed._symmetric_memory as symm_mem

    # one symmetric-memory backend per process: SMOKE_SYMM_BACKEND=CUDA checks the other one
    _SYMM_BACKEND[0] = os.environ.get("SMOKE_SYMM_BACKEND") or (
        "NVSHMEM" if symm_mem.is_nvshmem_available() else "CUDA")
    world = dist.get_world_size()
    _say(f"torch {torch.__version__}, {world} GPUs, nvshmem available: {symm_mem.is_nvshmem_available()}, "
         f"symmetric-memory backend used: {_SYMM_BACKEND[0]}")
    pairs = [(c[0], *refit_layouts(c)) for c in REFIT_CASES
             if max(max(c[2]), max(c[4])) < world]
    pairs += [(c[0], *reshard_layouts(c)) for c in RESHARD_CASES if max(c[3] + c[6]) < world]
    failures = _check(pairs, device)
    _timings(device)
    _say(f"{failures} failing (case, strategy) pairs")
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
