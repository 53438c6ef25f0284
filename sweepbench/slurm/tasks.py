"""Inside a SLURM job (``hydra/launcher=slurm``): every SLURM task is one rank.

submitit started one task per rank (``srun``), so the job function spawns nothing here: this
process joins the process group as its rank through the env:// rendezvous (MASTER_ADDR = the
address of the allocation's first node, MASTER_PORT derived from the job id), and only rank 0
records the job.
The other ranks return None, or re-raise what failed them so SLURM sees the task fail (and,
with ``srun --kill-on-bad-exit``, ends the job: rank 0 may then die before it records, and the
sweep driver records the job from SLURM's state and the ranks' stderr instead). Rank 0 that
fails records the job, then fails its task too (``RankZeroFailed``): its peers may be waiting
on it (a rendezvous it never served, a collective it never joins) and would otherwise hold the
allocation until ``launch.timeout_s``.

A SLURM restart of the job (``scontrol requeue``, a preemption, a requeue on time-out) runs
this again with SLURM_RESTART_COUNT incremented: rank 0 first clears what the previous attempt
left (metrics.json, env.json, the wandb run), so the rerun's output replaces it."""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig

from sweepbench.core import JobOutcome
from sweepbench.launch.faults import restart_count
from sweepbench.launch.rank import redirect_output, run_rank
from sweepbench.launch.rank_errors import clear_rank_errors, first_raised, last_line, note_rank_error
from sweepbench.record.atomic import write_json_atomic
from sweepbench.record.env import capture_env

log = logging.getLogger(__name__)

# below Linux's ephemeral range (32768-60999 by default), from which the kernel picks the ports of
# outgoing connections and of gloo's listeners: a rendezvous port drawn from it can be taken
MIN_PORT, MAX_PORT = 20000, 32767
TASKS_ARE_RANKS = "SWEEPBENCH_TASKS_ARE_RANKS"  # set by the launcher's task function in each task


def in_rank_task() -> bool:
    """True in a task that sweepbench's SLURM launcher started as one rank of its job (on SLURM,
    or through submitit's local executor). A job run by any other launcher spawns its ranks."""
    return os.environ.get(TASKS_ARE_RANKS) == "1" and bool(os.environ.get("SUBMITIT_EXECUTOR"))


@dataclass(frozen=True)
class TaskLayout:
    """Where this task sits in its job, from SLURM's (or submitit's) environment."""

    rank: int
    world_size: int
    local_rank: int
    ranks_per_node: int
    job_id: str
    master_addr: str
    master_port: int


GROUP_SLOT = "SWEEPBENCH_GROUP_SLOT"  # which job of its allocation's group this is (0 = the first)


def master_port(job_id: str, restart: int, slot: int = 0) -> int:
    """A port per job and attempt, so jobs sharing a node (and a rerun) do not collide; the jobs
    an allocation runs one after the other (``sweep.jobs_per_allocation``) get one per slot."""
    seed = f"{job_id}/{restart}" if slot == 0 else f"{job_id}/{restart}/{slot}"
    return random.Random(seed).randint(MIN_PORT, MAX_PORT)


def node_address(node: str) -> str:
    """The address SLURM itself reaches ``node`` at (its NodeAddr, per ``scontrol show node``).

    Rank 0's node is the rendezvous, and a node's name need not resolve where its ranks run
    (nodes named apart from their hosts, no DNS entry for them); SLURM's own address for the
    node always works. The name itself when scontrol cannot say."""
    try:
        out = subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return node
    found = re.search(r"(?:^|\s)NodeAddr=(\S+)", out.stdout) if out.returncode == 0 else None
    return found.group(1) if found else node


def task_layout() -> TaskLayout:
    """This task's rank layout; exports MASTER_ADDR/PORT, RANK, WORLD_SIZE, LOCAL_RANK for env://.

    Every task sees all of its node's GPUs (the request is per node), so a rank's device is
    its local rank; CUDA_VISIBLE_DEVICES is left alone."""
    import submitit
    from submitit.helpers import TorchDistributedEnvironment

    dist_env = TorchDistributedEnvironment()
    job_id = str(submitit.JobEnvironment().job_id)
    dist_env.master_port = master_port(job_id, restart_count(), int(os.environ.get(GROUP_SLOT) or 0))
    if os.environ.get("SUBMITIT_EXECUTOR") == "slurm":  # (submitit's local executor: this machine)
        dist_env.master_addr = node_address(dist_env.master_addr)
    dist_env.export(set_cuda_visible_devices=False, overwrite=True)
    return TaskLayout(
        rank=dist_env.rank,
        world_size=dist_env.world_size,
        local_rank=dist_env.local_rank,
        ranks_per_node=dist_env.local_world_size,
        job_id=job_id,
        master_addr=dist_env.master_addr,
        master_port=dist_env.master_port,
    )


def start_rank_log(job_dir: Path, rank: int) -> None:
    """Send this task's output to ``<job>/logs/rank<N>.log`` (as a local job does), appending:
    an attempt's header line tells a rerun's output from the previous attempt's, and says on
    which host and with which interpreter (``launch.python``) this rank runs."""
    redirect_output(job_dir / "logs" / f"rank{rank}.log")
    job = os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID") or "?"
    print(
        f"===== {datetime.now().isoformat(timespec='seconds')} rank {rank}: job {job}, "
        f"start {restart_count() + 1} (SLURM_RESTART_COUNT={restart_count()}) on {socket.gethostname()}, "
        f"python {sys.executable} =====",
        flush=True,
    )


def start_attempt(job_dir: Path) -> None:
    """Rank 0, first thing: drop the previous attempt's records (metrics.json, env.json, error
    notes, the wandb run), then write this attempt's env.json (a job that dies still says where
    it ran)."""
    for name in ("metrics.json", "env.json"):
        (job_dir / name).unlink(missing_ok=True)
    clear_rank_errors(job_dir)
    shutil.rmtree(job_dir / "wandb", ignore_errors=True)
    write_json_atomic(job_dir / "env.json", capture_env())


class RankZeroFailed(RuntimeError):
    """Rank 0 recorded its job as failed (or timed out) and fails its SLURM task, so that
    ``srun --kill-on-bad-exit`` ends the ranks still waiting on it."""


def _is_time_out(err: BaseException) -> bool:
    """submitit raises UncompletedJobError in rank 0 when SLURM's time-limit warning arrives
    and the job is not requeued (max_num_timeout spent)."""
    return type(err).__name__ == "UncompletedJobError" and "timed-out" in str(err)


def run_slurm_tasks(
    cfg: DictConfig, *, world_size: int, job_dir: Path, record: Callable[[JobOutcome], dict[str, Any]]
) -> dict[str, Any] | None:
    """Run this task as its rank of the job; rank 0 records and returns the metrics."""
    layout = task_layout()
    rank = layout.rank
    if rank == 0:
        start_attempt(job_dir)
    if layout.world_size != world_size:
        error = (
            f"the SLURM job has {layout.world_size} tasks but the job's world size is {world_size}: "
            f"one task per rank is needed (do not set hydra.launcher.nodes/tasks_per_node; "
            f"use launch.ranks_per_node / launch.gpus_per_node)"
        )
        return record(JobOutcome("failed", error)) if rank == 0 else None
    log.info(
        "rank %d of %d (local rank %d, %d per node), rendezvous %s:%d",
        rank,
        world_size,
        layout.local_rank,
        layout.ranks_per_node,
        layout.master_addr,
        layout.master_port,
    )
    try:
        payload = run_rank(
            cfg,
            rank=rank,
            world_size=world_size,
            local_rank=layout.local_rank,
            ranks_per_node=layout.ranks_per_node,
            store=None,
            job_dir=job_dir,
        )
    except Exception as err:
        note_rank_error(job_dir, rank, err)
        if rank != 0:
            raise
        if _is_time_out(err):
            outcome = JobOutcome("timeout", f"SLURM time limit reached and the job was not requeued ({err})")
        else:
            outcome = JobOutcome("failed", first_raised(job_dir) or f"rank 0: {last_line(str(err))}")
        record(outcome)
        raise RankZeroFailed(f"rank 0 recorded the job as {outcome.status}: {outcome.error}") from err
    if rank != 0:
        return None
    if payload is None:
        return record(JobOutcome("failed", "rank 0 finished without a result"))
    return record(JobOutcome("ok", payload=payload))
