"""The sweep driver: expand the grid, validate and tag every job before any starts, check the
sweep directory and lock it, skip jobs already done (resume), launch the rest, then aggregate
the whole directory's results. Ctrl-C/SIGTERM during a local sweep stop it cleanly (see
``interrupt``)."""

from __future__ import annotations

import shlex
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_launcher import BasicLauncher
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobStatus
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from sweepbench.launch import interrupt, status
from sweepbench.launch.preflight import fit_note, validate_config
from sweepbench.record.atomic import write_atomic
from sweepbench.sweep import resume
from sweepbench.sweep.compose import JobComposer
from sweepbench.sweep.errors import error_line, exit_bad_input
from sweepbench.sweep.report import print_plan
from sweepbench.sweep.sweepdir import SweepLock, check_writable
from sweepbench.sweep.tags import make_tag


@dataclass
class PlannedJob:
    overrides: list[str]
    tag: str
    world_size: int
    cfg: DictConfig  # resolved job config, without the hydra node
    fit: str = ""  # why it would not run from this machine ("" if it would); only a dry run keeps such a job

    @property
    def launch_overrides(self) -> list[str]:
        return [*self.overrides, f"hydra.sweep.subdir='{self.tag}'"]  # quoted: a tag may hold '='



def runs_locally(sweeper: Any) -> bool:
    """Do the jobs' ranks start on this machine (Hydra's basic launcher: sweepbench's local launch)?"""
    return isinstance(sweeper.launcher, BasicLauncher)


def plan_jobs(sweeper: Any, arguments: list[str]) -> list[PlannedJob]:
    """Compose, validate and tag every job of the grid; exit 2 on the first bad one (a dry run
    keeps a job that only does not fit this machine, with the reason as its fit note)."""
    loader = sweeper.hydra_context.config_loader
    parser = OverridesParser.create(config_loader=loader)
    try:
        grid = BasicSweeper.split_arguments(parser.parse_overrides(arguments), None)[0]
    except HydraException as err:
        exit_bad_input(error_line(err))
    local, dry_run = runs_locally(sweeper), bool(sweeper.config.sweep.dry_run)
    composer = JobComposer(loader, sweeper.config)
    jobs: dict[str, PlannedJob] = {}
    for overrides in grid:
        try:
            cfg = composer.compose(list(overrides))
            world_size = validate_config(cfg)
            fit = fit_note(cfg, world_size, local=local)
            if fit and not dry_run:
                raise ValueError(fit)
            tag = make_tag(cfg, world_size=world_size)
        except (ValueError, HydraException) as err:
            where = " ".join(overrides) or "(defaults)"
            exit_bad_input(f"{error_line(err)} (in job: {where})")
        jobs.setdefault(tag, PlannedJob(list(overrides), tag, world_size, cfg, fit))
    return list(jobs.values())


def _save_sweep_config(sweeper: Any, sweep_dir: Path) -> None:
    try:
        write_atomic(sweep_dir / "multirun.yaml", OmegaConf.to_yaml(sweeper.config))
    except OSError as err:
        exit_bad_input(f"hydra.sweep.dir={sweep_dir} cannot be written: {err.strerror or err}; "
                       f"choose another hydra.sweep.dir")


def _resume_command(sweep_dir: Path) -> str:
    argv = [a for a in sys.argv[1:] if not a.startswith("hydra.sweep.dir=")]
    return shlex.join(["python", "-m", "sweepbench", *argv, f"hydra.sweep.dir={sweep_dir}"])


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
    check_writable(sweep_dir, exit_bad_input)
    with SweepLock(sweep_dir, exit_bad_input):
        return _run_locked(sweeper, jobs, sweep_dir)


def _run_locked(sweeper: Any, jobs: list[PlannedJob], sweep_dir: Path) -> list[Any]:
    from sweepbench.sweep.aggregate import aggregate_sweep
    from sweepbench.sweep.report import print_summary

    _save_sweep_config(sweeper, sweep_dir)
    resumed, why = resume.resume_plan(sweep_dir, jobs, force=sweeper.config.sweep.force)
    line = resume.describe(resumed, why)
    if line:
        print(line, flush=True)
    todo = [j for j in jobs if j.tag not in resumed]
    resume.retire_old_metrics(sweep_dir, (j.tag for j in todo))
    restore = interrupt.install() if runs_locally(sweeper) else (lambda: None)
    status.begin([j.tag for j in todo])
    returns: list[Any] = []
    stopped_by: int | None = None
    try:
        if todo:
            returns = list(sweeper.launcher.launch([j.launch_overrides for j in todo], initial_job_idx=0))
        stopped_by = interrupt.requested()
    except interrupt.SweepInterrupted as stop:
        stopped_by = stop.signum
    finally:
        restore()
        status.end()
    crashed = {j.tag: _crash_message(r) for j, r in zip(todo, returns) if r.status == JobStatus.FAILED}
    table = aggregate_sweep(sweep_dir, jobs, resumed=resumed, crashed=crashed)
    print_summary(table, sweep_dir=sweep_dir)
    try:  # the HTML report (sweepbench.report): a failure to write it never fails the sweep
        from sweepbench.report import write_sweep_report

        print(f"sweepbench: report {write_sweep_report(sweep_dir)}")
    except Exception as err:
        print(f"sweepbench: no report.html ({type(err).__name__}: {err})", file=sys.stderr)
    if stopped_by is not None:
        name = signal.Signals(stopped_by).name
        finished = int((table["this_run"] & (table["status"] == "ok")).sum())
        print(f"sweepbench: interrupted by {name}: {finished} of {len(todo)} jobs of this run finished ok; "
              f"resume with: {_resume_command(sweep_dir)}", file=sys.stderr)
        sys.exit(128 + stopped_by)
    grid = table[table["this_run"] | table["resumed"]]  # jobs of earlier grids do not decide the exit code
    failed = grid[grid["status"] != "ok"]
    if len(failed):
        print(f"sweepbench: {len(failed)} of {len(grid)} jobs did not finish ok "
              f"(see {sweep_dir / 'results.csv'})", file=sys.stderr)
        sys.exit(1)
    return [returns]


def _crash_message(job_return: Any) -> str:
    err = job_return._return_value
    return f"{type(err).__name__}: {err}"
