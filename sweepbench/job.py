"""One Hydra job = one benchmark run: validate, launch the ranks, record what happened."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from sweepbench.config.validate import validate
from sweepbench.launch.local import JobOutcome, launch_local
from sweepbench.record.recorder import record_job
from sweepbench.sweep.tags import make_tag

log = logging.getLogger(__name__)


def job_overrides() -> list[str]:
    """The overrides that made this job, without Hydra's own."""
    return [o for o in HydraConfig.get().overrides.task if not o.startswith("hydra.")]


def sweep_group() -> str:
    """The wandb group: the sweep directory in a multirun, ``run`` for a single run."""
    hc = HydraConfig.get()
    return str(hc.sweep.dir) if hc.mode.name == "MULTIRUN" else "run"


def run(cfg: DictConfig) -> dict[str, Any]:
    """Run one job and return its metrics (also written to ``metrics.json`` in the job dir)."""
    world_size = validate(cfg)
    tag = make_tag(cfg, world_size=world_size)
    job_dir = Path(HydraConfig.get().runtime.output_dir)
    log.info("job %s: %s on %d ranks", tag, cfg.benchmark.name, world_size)
    tic = time.monotonic()
    try:
        outcome = launch_local(cfg, world_size=world_size, job_dir=job_dir)
    except Exception as err:  # a launch that could not even start is a failed job, not a failed sweep
        outcome = JobOutcome("failed", f"launch: {type(err).__name__}: {err}")
    return record_job(
        cfg, outcome, job_dir=job_dir, tag=tag, world_size=world_size, overrides=job_overrides(),
        group=sweep_group(), wall_time_s=time.monotonic() - tic,
    )

