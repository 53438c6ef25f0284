"""The sweep driver: expand the grid, validate and tag every job before any starts, skip jobs
already done (resume), launch the rest, then aggregate the sweep's results."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobStatus
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict

from sweepbench.config.validate import validate
from sweepbench.record.atomic import read_json
from sweepbench.record.recorder import METRICS_FILE
from sweepbench.sweep.aggregate import aggregate_sweep
from sweepbench.sweep.report import print_plan, print_summary
from sweepbench.sweep.tags import make_tag


@dataclass
class PlannedJob:
    overrides: list[str]
    tag: str
    world_size: int
    cfg: DictConfig  # resolved job config, without the hydra node

    @property
    def launch_overrides(self) -> list[str]:
        return [*self.overrides, f"hydra.sweep.subdir={self.tag}"]


def error_line(err: BaseException) -> str:
    """The error's message and, for Hydra's wrapped OmegaConf errors, its cause's first line."""
    text = str(err)
    cause = str(err.__cause__ or "").strip()
    if cause:
        text += f" ({cause.splitlines()[0]})"
    return text


def exit_bad_input(message: str) -> NoReturn:
    """Bad input: one line on stderr, exit 2."""
    line = " ".join(part.strip() for part in message.splitlines() if part.strip())
    print(f"sweepbench: error: {line}", file=sys.stderr)
    sys.exit(2)


def plan_jobs(sweeper: Any, arguments: list[str]) -> list[PlannedJob]:
    """Compose, validate and tag every job of the grid; exit 2 on the first bad one."""
    loader = sweeper.hydra_context.config_loader
    parser = OverridesParser.create(config_loader=loader)
    try:
        grid = BasicSweeper.split_arguments(parser.parse_overrides(arguments), None)[0]
    except HydraException as err:
        exit_bad_input(error_line(err))
    jobs: dict[str, PlannedJob] = {}
    for overrides in grid:
        try:
            cfg = loader.load_sweep_config(master_config=sweeper.config, sweep_overrides=list(overrides))
            with open_dict(cfg):
                del cfg["hydra"]
            world_size = validate(cfg)
            tag = make_tag(cfg, world_size=world_size)
        except (ValueError, HydraException) as err:
            where = " ".join(overrides) or "(defaults)"
            exit_bad_input(f"{error_line(err)} (in job: {where})")
        jobs.setdefault(tag, PlannedJob(list(overrides), tag, world_size, cfg))
    return list(jobs.values())


def is_done(sweep_dir: Path, tag: str) -> bool:
    metrics = read_json(sweep_dir / tag / METRICS_FILE)
    return bool(metrics) and metrics.get("status") == "ok" and metrics.get("tag") == tag


def run_sweep(sweeper: Any, arguments: list[str]) -> list[Any]:
    jobs = plan_jobs(sweeper, arguments)
    opts = sweeper.config.sweep
    sweep_dir = Path(sweeper.config.hydra.sweep.dir)
    if opts.dry_run:
        print_plan(jobs, sweep_dir=sweep_dir, hydra_overrides=list(sweeper.config.hydra.overrides.hydra))
        describe = getattr(sweeper.launcher, "describe", None)  # e.g. the SLURM request of each job
        if callable(describe):
            describe([j.launch_overrides for j in jobs])
        return []
    sweep_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(sweeper.config, sweep_dir / "multirun.yaml")
    resumed = {j.tag for j in jobs if not opts.force and is_done(sweep_dir, j.tag)}
    todo = [j for j in jobs if j.tag not in resumed]
    returns = []
    if todo:
        returns = list(sweeper.launcher.launch([j.launch_overrides for j in todo], initial_job_idx=0))
    crashed = {j.tag: _crash_message(r) for j, r in zip(todo, returns) if r.status == JobStatus.FAILED}
    table = aggregate_sweep(sweep_dir, jobs, resumed=resumed, crashed=crashed)
    print_summary(table, sweep_dir=sweep_dir)
    failed = table[table["status"] != "ok"]
    if len(failed):
        print(f"sweepbench: {len(failed)} of {len(table)} jobs did not finish ok "
              f"(see {sweep_dir / 'results.csv'})", file=sys.stderr)
        sys.exit(1)
    return [returns]


def _crash_message(job_return: Any) -> str:
    err = job_return._return_value
    return f"{type(err).__name__}: {err}"
