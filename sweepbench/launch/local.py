"""Local launch: the job spawns its ranks (torch.multiprocessing, no torchrun) and supervises them.

A rank that raises or dies takes its job down (the others are terminated); a job that outlives
``launch.timeout_s`` is killed. Either way the outcome is reported, never raised."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import DictConfig, OmegaConf

from sweepbench.launch.rank import spawned_rank_main
from sweepbench.launch.rank_errors import clear_rank_errors, first_raised, last_line
from sweepbench.record.atomic import read_json

POLL_S = 0.2


@dataclass
class JobOutcome:
    status: str  # ok | failed | timeout
    error: str | None = None
    payload: dict[str, Any] = field(default_factory=dict)


def _describe(err: Exception) -> str:
    if isinstance(err, mp.ProcessRaisedException):
        return f"rank {err.error_index}: {last_line(str(err))}"
    if isinstance(err, mp.ProcessExitedException):
        how = f"signal {err.signal_name}" if err.signal_name else f"exit code {err.exit_code}"
        return f"rank {err.error_index} died ({how})"
    return f"{type(err).__name__}: {err}"


def _kill_all(context: mp.ProcessContext) -> None:
    for proc in context.processes:
        if proc.is_alive():
            proc.kill()
    for proc in context.processes:
        proc.join(timeout=10)


def launch_local(cfg: DictConfig, *, world_size: int, job_dir: Path) -> JobOutcome:
    payload_path = job_dir / ".rank0_payload.json"
    payload_path.unlink(missing_ok=True)
    clear_rank_errors(job_dir)
    store = dist.TCPStore(cfg.launch.master_addr, 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=cfg.launch.timeout_s))
    context = mp.start_processes(
        spawned_rank_main,
        args=(OmegaConf.to_container(cfg, resolve=True), str(job_dir), cfg.launch.master_addr,
              store.port, world_size),
        nprocs=world_size, join=False, start_method="spawn",
    )
    deadline = time.monotonic() + cfg.launch.timeout_s
    try:
        while not context.join(timeout=POLL_S):
            if time.monotonic() > deadline:
                _kill_all(context)
                return JobOutcome("timeout", f"job exceeded launch.timeout_s={cfg.launch.timeout_s:g}s; "
                                             f"all {world_size} ranks were killed")
    except Exception as err:  # a rank raised or died; torch has terminated the others
        _kill_all(context)
        first = first_raised(job_dir) if isinstance(err, mp.ProcessRaisedException) else None
        return JobOutcome("failed", first or _describe(err))
    payload = read_json(payload_path)
    payload_path.unlink(missing_ok=True)
    if payload is None:
        return JobOutcome("failed", "rank 0 finished without reporting a result")
    return JobOutcome("ok", payload=payload)
