"""One Hydra job = one benchmark run: validate, launch the ranks, record what happened.

How the ranks start is looked up in ``LAUNCH_MODES``: the first mode that applies runs the job.
Inside a multi-task submitit job (``hydra/launcher=slurm``) this process already is one rank;
otherwise the job spawns its ranks locally."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from sweepbench.core import JobOutcome
from sweepbench.launch.local import launch_local
from sweepbench.launch.preflight import job_backend, on_backend, validate
from sweepbench.launch.rank import process_age_s
from sweepbench.record.recorder import record_job
from sweepbench.slurm.tasks import in_rank_task, run_slurm_tasks
from sweepbench.sweep.tags import make_tag

log = logging.getLogger(__name__)

Record = Callable[[JobOutcome], dict[str, Any]]


def job_overrides() -> list[str]:
    """The overrides that made this job, without Hydra's own."""
    return [o for o in HydraConfig.get().overrides.task if not o.startswith("hydra.")]


def sweep_group() -> str:
    """The wandb group: the sweep directory in a multirun, ``run`` for a single run."""
    hc = HydraConfig.get()
    return str(hc.sweep.dir) if hc.mode == RunMode.MULTIRUN else "run"


def run_local(cfg: DictConfig, *, world_size: int, job_dir: Path, record: Record) -> dict[str, Any]:
    """Spawn the job's ranks on this machine (told the backend it gives them: ``job_backend``) and
    record the outcome."""
    backend = job_backend(cfg, world_size)
    try:
        outcome = launch_local(on_backend(cfg, backend), world_size=world_size, job_dir=job_dir)
    except Exception as err:  # a launch that could not even start is a failed job, not a failed sweep
        outcome = JobOutcome("failed", f"launch: {type(err).__name__}: {err}")
    outcome.payload.setdefault("backend", backend)  # recorded even where no rank reported
    return record(outcome)


@dataclass(frozen=True)
class LaunchMode:
    name: str
    applies: Callable[[], bool]
    run: Callable[..., dict[str, Any] | None]  # (cfg, *, world_size, job_dir, record)
    # this process is rank 0 itself: the job's wall time starts when the process did, so that it
    # holds rank 0's start-up (recorder.WALL_PHASES' "start", timed from the process's start)
    in_rank: bool = False


LAUNCH_MODES: tuple[LaunchMode, ...] = (
    LaunchMode("slurm", in_rank_task, run_slurm_tasks, in_rank=True),  # one submitit/SLURM task per rank
    LaunchMode("local", lambda: True, run_local),
)


def launch_mode() -> LaunchMode:
    return next(mode for mode in LAUNCH_MODES if mode.applies())


@dataclass(frozen=True)
class Planned:
    """A job as its sweep's plan found it (``sweep.driver.plan_jobs``): valid, fitting this
    machine, tagged."""

    tag: str
    world_size: int


_PLANNED: dict[str, Planned] = {}  # a job's directory -> its plan, for the local jobs this process planned


def expect_planned(job_dir: Path, planned: Planned) -> None:
    """The job Hydra's basic launcher runs next in this process into ``job_dir`` was planned here:
    it takes its world size and tag from the plan, its config checked once, before any rank."""
    _PLANNED[os.path.abspath(job_dir)] = planned


def run(cfg: DictConfig) -> dict[str, Any] | None:
    """Run one job and return its metrics (also written to ``metrics.json`` in the job dir);
    None on the ranks of a SLURM job that do not record (all but rank 0)."""
    mode = launch_mode()
    job_dir = Path(HydraConfig.get().runtime.output_dir)
    planned = _PLANNED.pop(os.path.abspath(job_dir), None) if mode.name == "local" else None
    if planned is None:  # a single run, or a SLURM task (its request was checked when planned)
        world_size = validate(cfg, here=mode.name == "local")
        tag = make_tag(cfg, world_size=world_size)
    else:
        world_size, tag = planned.world_size, planned.tag
    log.info("job %s: %s on %d ranks (%s launch)", tag, cfg.benchmark.name, world_size, mode.name)
    tic = time.monotonic() - ((process_age_s() or 0.0) if mode.in_rank else 0.0)

    def record(outcome: JobOutcome) -> dict[str, Any]:
        return record_job(
            cfg,
            outcome,
            job_dir=job_dir,
            tag=tag,
            world_size=world_size,
            overrides=job_overrides(),
            group=sweep_group(),
            wall_time_s=time.monotonic() - tic,
        )

    return mode.run(cfg, world_size=world_size, job_dir=job_dir, record=record)
