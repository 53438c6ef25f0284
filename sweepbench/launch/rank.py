"""What every rank runs: join the process group, run the benchmark, report from rank 0."""

from __future__ import annotations

import os
import sys
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from sweepbench.benchmarks.base import RankContext
from sweepbench.benchmarks.registry import get_benchmark
from sweepbench.config.validate import GPU_BACKENDS, resolve_backend
from sweepbench.launch.faults import maybe_inject_fault
from sweepbench.launch.rank_errors import note_rank_error
from sweepbench.measure.memory import memory_peaks, reset_peaks


def redirect_output(log_path: Path) -> None:
    """Send this process's stdout and stderr (file descriptors too) to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def rank_device(backend: str, local_rank: int) -> torch.device:
    if backend in GPU_BACKENDS:
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def run_rank(
    cfg: DictConfig, *, rank: int, world_size: int, local_rank: int, ranks_per_node: int,
    store: dist.Store | None = None, job_dir: Path | None = None,
) -> dict[str, Any] | None:
    """Run the benchmark on this rank; rank 0 returns the job's payload, other ranks None.

    With ``store`` None the process group rendezvous through MASTER_ADDR/MASTER_PORT (SLURM)."""
    backend = resolve_backend(cfg.backend.name)
    device = rank_device(backend, local_rank)
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // ranks_per_node))
    pg_backend = "nccl" if backend == "nvshmem" else backend  # nvshmem rides on an NCCL group
    dist.init_process_group(
        pg_backend, store=store, rank=rank, world_size=world_size,
        timeout=timedelta(seconds=cfg.launch.timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    # No try/finally around the group: a rank that fails leaves its group to its own exit. Destroying
    # it first would close the peers' connections before this rank has reported its error, and a
    # peer's "connection closed" could then be reported as the job's failure instead of the cause.
    ctx = RankContext(rank=rank, world_size=world_size, local_rank=local_rank, device=device,
                      backend=backend, cfg=cfg, job_dir=job_dir)
    maybe_inject_fault(cfg, rank)
    reset_peaks(device)
    result = get_benchmark(cfg.benchmark.name)(ctx).run()
    memory = [None] * world_size
    dist.all_gather_object(memory, memory_peaks(device))
    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        return None
    return {"result": asdict(result), "memory_per_rank": memory, "backend": backend,
            "device": str(device.type)}


def spawned_rank_main(local_rank: int, cfg_container: dict, job_dir: str, master_addr: str,
                      port: int, world_size: int) -> None:
    """Entry of a rank spawned by the local launcher (torch.multiprocessing)."""
    from sweepbench.record.atomic import write_json_atomic

    redirect_output(Path(job_dir) / "logs" / f"rank{local_rank}.log")
    cfg = OmegaConf.create(cfg_container)
    store = dist.TCPStore(master_addr, port, is_master=False,
                          timeout=timedelta(seconds=cfg.launch.timeout_s))
    try:
        payload = run_rank(cfg, rank=local_rank, world_size=world_size, local_rank=local_rank,
                           ranks_per_node=world_size, store=store, job_dir=Path(job_dir))
    except Exception as err:
        note_rank_error(Path(job_dir), local_rank, err)
        raise
    if payload is not None:
        write_json_atomic(Path(job_dir) / ".rank0_payload.json", payload)
