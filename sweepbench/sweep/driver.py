"""The sweep driver: expand the grid, validate and tag every job before any starts, check the
sweep directory and lock it, skip jobs already done (resume), launch the rest, then aggregate
the whole directory's results. With ``sweep.repeats=N`` the launch is N passes, round 1 of every
job, then round 2, ... (see ``rounds``). Ctrl-C/SIGTERM during a local sweep stop it cleanly
(see ``interrupt``)."""

from __future__ import annotations

import shlex
import shutil
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

from sweepbench.config.validate import check_repeats
from sweepbench.job import Planned, expect_planned
from sweepbench.launch import interrupt, preload, status
from sweepbench.launch.interpreter import check_interpreter
from sweepbench.launch.preflight import cpu_fallback_note, fit_note, job_backend, validate_config
from sweepbench.record.atomic import write_atomic
from sweepbench.record.readback import SweepRecords, read_sweep
from sweepbench.record.recorder import WALL_PHASES
from sweepbench.sweep import resume, rounds
from sweepbench.sweep.compose import JobComposer
from sweepbench.sweep.errors import error_line, exit_bad_input
from sweepbench.sweep.report import print_plan
from sweepbench.sweep.sweepdir import SweepLock, check_writable
from sweepbench.sweep.tags import check_not_collapsed, make_tag


@dataclass
class PlannedJob:
    overrides: list[str]
    tag: str
    world_size: int
    cfg: DictConfig  # resolved job config, without the hydra node
    fit: str = ""  # why it would not run where it would run ("" if it would): a dry run lists it, a run skips it
    backend: str = ""  # the backend it runs with (``backend=auto`` resolved for this machine; "" on a cluster)

    @property
    def launch_overrides(self) -> list[str]:
        return self.round_overrides(None)

    def round_overrides(self, round_: int | None) -> list[str]:
        # quoted: a tag may hold '='
        return [*self.overrides, f"hydra.sweep.subdir='{rounds.unit_subdir(self.tag, round_)}'"]


def runs_locally(sweeper: Any) -> bool:
    """Do the jobs' ranks start on this machine (Hydra's basic launcher: sweepbench's local launch)?"""
    return isinstance(sweeper.launcher, BasicLauncher)


ON_UNFIT = ("skip", "refuse")
EXIT_SKIPPED = 3  # every job that ran finished ok, but some did not fit and were skipped


def cluster_gpus_per_node(sweeper: Any, cfg: DictConfig) -> int:
    """GPUs per node a cluster job asks for (``launch.gpus_per_node``, else the launcher preset's)."""
    return int(cfg.launch.gpus_per_node or sweeper.config.hydra.launcher.get("gpus_per_node") or 0)


def plan_jobs(sweeper: Any, arguments: list[str]) -> list[PlannedJob]:
    """Compose, validate and tag every job of the grid; exit 2 on the first bad one. A job that is
    valid but does not fit where it would run (this machine, or the cluster's request) is kept
    with the reason as its fit note (a dry run lists it, a run skips it), unless
    ``sweep.on_unfit=refuse``; a grid none of whose jobs fits is refused (exit 2)."""
    loader = sweeper.hydra_context.config_loader
    parser = OverridesParser.create(config_loader=loader)
    try:
        grid = BasicSweeper.split_arguments(parser.parse_overrides(arguments), None)[0]
    except HydraException as err:
        exit_bad_input(error_line(err))
    local, dry_run = runs_locally(sweeper), bool(sweeper.config.sweep.dry_run)
    refuse = sweeper.config.sweep.on_unfit == "refuse"
    composer = JobComposer(loader, sweeper.config)
    jobs: dict[str, PlannedJob] = {}
    for overrides in grid:
        try:
            cfg = composer.compose(list(overrides))
            world_size = validate_config(cfg, plan=True)
            fit = fit_note(cfg, world_size, local=local, gpus_per_node=cluster_gpus_per_node(sweeper, cfg))
            if fit and refuse and not dry_run:
                raise ValueError(fit + " (sweep.on_unfit=refuse)")
            tag = make_tag(cfg, world_size=world_size)
            if local:
                check_interpreter(str(cfg.launch.python or ""))
            if tag in jobs:  # the same job twice, unless only sweep-wide settings differ: refused
                check_not_collapsed(jobs[tag].cfg, cfg)
        except (ValueError, HydraException) as err:
            where = " ".join(overrides) or "(defaults)"
            exit_bad_input(f"{error_line(err)} (in job: {where})")
        backend = job_backend(cfg, world_size) if local else ""
        jobs.setdefault(tag, PlannedJob(list(overrides), tag, world_size, cfg, fit, backend))
    planned = list(jobs.values())
    if not dry_run and all(j.fit for j in planned):  # nothing would run: bad input, as one job's refusal
        where = " ".join(planned[0].overrides) or "(defaults)"
        exit_bad_input(f"{planned[0].fit} (in job: {where})")
    return planned


def print_unfit(jobs: list[PlannedJob]) -> None:
    """Before a run: the jobs it skips, each with why; and the jobs ``backend=auto`` puts on the
    CPU of a machine with GPUs."""
    skipped = [j for j in jobs if j.fit]
    if skipped:
        print(
            f"sweepbench: skipping {len(skipped)} of {len(jobs)} jobs that cannot run where they would, each "
            f"with why (sweep.on_unfit=refuse refuses the sweep instead):",
            flush=True,
        )
        for job in skipped:
            print(f"  {job.tag}: {job.fit}", flush=True)
    fallback = [(j, note) for j in jobs if not j.fit and (note := cpu_fallback_note(j.cfg, j.world_size))]
    if fallback:
        more = f" (and {len(fallback) - 1} more jobs)" if len(fallback) > 1 else ""
        print(f"sweepbench: {fallback[0][0].tag}{more}: {fallback[0][1]}", flush=True)


def _save_sweep_config(sweeper: Any, sweep_dir: Path) -> None:
    try:
        write_atomic(sweep_dir / "multirun.yaml", OmegaConf.to_yaml(sweeper.config))
    except OSError as err:
        exit_bad_input(
            f"hydra.sweep.dir={sweep_dir} cannot be written: {err.strerror or err}; choose another hydra.sweep.dir"
        )


def _resume_command(sweep_dir: Path) -> str:
    argv = [a for a in sys.argv[1:] if not a.startswith("hydra.sweep.dir=")]
    return shlex.join(["python", "-m", "sweepbench", *argv, f"hydra.sweep.dir={sweep_dir}"])


def run_sweep(sweeper: Any, arguments: list[str]) -> list[Any]:
    opts = sweeper.config.sweep
    try:
        check_repeats(opts.repeats)
    except ValueError as err:
        exit_bad_input(str(err))
    if opts.on_unfit not in ON_UNFIT:
        exit_bad_input(f"sweep.on_unfit={opts.on_unfit!r} is not valid; choose one of {', '.join(ON_UNFIT)}")
    jobs = plan_jobs(sweeper, arguments)
    sweep_dir = Path(sweeper.config.hydra.sweep.dir)
    if opts.dry_run:
        print_plan(jobs, sweep_dir=sweep_dir, hydra_overrides=list(sweeper.config.hydra.overrides.hydra))
        describe = getattr(sweeper.launcher, "describe", None)  # e.g. the SLURM request of each job
        if callable(describe):
            describe([j.launch_overrides for j in jobs if not j.fit])
        return []
    check_writable(sweep_dir, exit_bad_input)
    with SweepLock(sweep_dir, exit_bad_input):
        return _run_locked(sweeper, jobs, sweep_dir)


def _rank_imports(jobs: list[PlannedJob]) -> list[str]:
    """The modules the ranks of these jobs' benchmarks import in each job (``Benchmark.rank_imports``)."""
    from sweepbench.benchmarks.registry import get_benchmark

    names = dict.fromkeys(j.cfg.benchmark.name for j in jobs)
    return list(dict.fromkeys(m for name in names for m in get_benchmark(name).rank_imports))


def _launch_rounds(
    sweeper: Any, jobs: list[PlannedJob], todo: list[rounds.Unit], crashed: dict[rounds.Unit, str]
) -> list[Any]:
    """Launch the rounds of ``todo``, round by round (all of round 1, then round 2, ...); a stop
    asked for ends it after the running job. Jobs that raised go to ``crashed`` ({round: error})."""
    by_tag = {j.tag: j for j in jobs}
    returns: list[Any] = []
    num = 0
    for r in dict.fromkeys(r for _, r in todo):
        batch = [tag for tag, rr in todo if rr == r]
        # where the ranks start here, one job a call: a job whose files cannot be written (a full
        # disk: Hydra saves the job's config before it runs) fails alone, and the rest still run
        for part in [[t] for t in batch] if runs_locally(sweeper) else [batch]:
            try:
                done = list(sweeper.launcher.launch([by_tag[t].round_overrides(r) for t in part], initial_job_idx=num))
            except OSError as err:
                done = []
                crashed.update({(t, r): f"{type(err).__name__}: {err}" for t in part})
            num += len(part)
            returns += done
            crashed.update(
                {(t, r): _crash_message(ret) for t, ret in zip(part, done) if ret.status == JobStatus.FAILED}
            )
            if interrupt.requested() is not None:
                return returns
    return returns


def _run_locked(sweeper: Any, jobs: list[PlannedJob], sweep_dir: Path) -> list[Any]:
    from sweepbench.sweep.aggregate import aggregate_sweep
    from sweepbench.sweep.report import print_summary

    _save_sweep_config(sweeper, sweep_dir)
    print_unfit(jobs)
    skipped = {j.tag: j.fit for j in jobs if j.fit}
    every, jobs = jobs, [j for j in jobs if not j.fit]
    repeats = int(sweeper.config.sweep.repeats)
    records = read_sweep(sweep_dir)  # the jobs' records, read once: what ran is read again after it ran
    done, why = resume.resume_plan(records, jobs, force=sweeper.config.sweep.force, repeats=repeats)
    line = resume.describe(done, why, repeats=repeats)
    if line:
        print(line, flush=True)
    # round order: all of round 1, then round 2, ...; in a round, the grid's order
    todo = [(j.tag, r) for r in rounds.rounds_of(repeats) for j in jobs if (j.tag, r) in why]
    resumed = {j.tag for j in jobs if not any((j.tag, r) in why for r in rounds.rounds_of(repeats))}
    resume.retire_old_metrics(sweep_dir, todo)
    if runs_locally(sweeper):  # Hydra runs each job in this process: it takes its plan, not checked again
        by_tag = {j.tag: j for j in jobs}
        for tag, r in todo:
            expect_planned(rounds.unit_dir(sweep_dir, tag, r), Planned(tag, by_tag[tag].world_size))
    restore = interrupt.install() if runs_locally(sweeper) else (lambda: None)
    progress = status.begin([status.unit_label(tag, r) for tag, r in todo])
    crashed: dict[rounds.Unit, str] = {}
    returns: list[Any] = []
    stopped_by: int | None = None
    try:
        # the fork server's imports overlap the first job's launch; started once the stop handlers
        # are in place (a signal meanwhile is a stop asked for, as during a job)
        if runs_locally(sweeper) and todo:
            preload.start_server(sweeper.config, extra=_rank_imports(jobs))
        if todo:
            returns = _launch_rounds(sweeper, jobs, todo, crashed)
        stopped_by = interrupt.requested()
    except interrupt.SweepInterrupted as stop:
        stopped_by = stop.signum
    finally:
        restore()
        status.end()
        preload.release_kept()  # launch.keep_ranks: the sweep's ranks leave with it
    first_crash = {tag: msg for (tag, _), msg in reversed(list(crashed.items()))}
    not_run: dict[str, str] = {}
    rounds_not_run: dict[tuple[str, int], str] = {}
    if stopped_by is not None:  # the units this run never started: not run, never "failed"
        stop_note = f"not started: the sweep was stopped by {signal.Signals(stopped_by).name} first"
        never = [(tag, r) for tag, r in todo if status.unit_label(tag, r) not in progress.started]
        unstarted = {tag for tag, _ in never}
        not_run = {tag: stop_note for tag in unstarted}
        rounds_not_run = {(tag, r): stop_note for tag, r in never if r is not None}
        for tag in unstarted:
            forget_unstarted(sweep_dir / tag)
    records.reread(todo)  # for all that follows: the rounds, results.csv, the summary, the ranking, the page
    if repeats > 1:
        try:
            rounds.write_combined(
                records,
                [j.tag for j in jobs],
                repeats=repeats,
                crashed={(t, r): m for (t, r), m in crashed.items() if r is not None},
                not_run=rounds_not_run,
            )
        except OSError as err:
            print(f"sweepbench: the jobs' records of their rounds were not combined: {err}", file=sys.stderr)
    table = aggregate_sweep(
        sweep_dir, every, resumed=resumed, crashed=first_crash, skipped=skipped, not_run=not_run, records=records
    )
    sweep, answers = _rank(sweep_dir, records)
    print_summary(table, sweep_dir=sweep_dir, records=records, answers=answers)
    print_measuring_fraction(table)
    print_gpu_state(table)
    try:  # the HTML report (sweepbench.report): a failure to write it never fails the sweep
        from sweepbench.report import write_sweep_report

        if isinstance(answers, Exception):
            raise answers
        print(f"sweepbench: report {write_sweep_report(sweep_dir, sweep=sweep, answers=answers)}")
    except Exception as err:
        print(f"sweepbench: no report.html ({type(err).__name__}: {err})", file=sys.stderr)
    if stopped_by is not None:
        name = signal.Signals(stopped_by).name
        finished = int((table["this_run"] & (table["status"] == "ok")).sum())
        ran = len({tag for tag, _ in todo})
        print(
            f"sweepbench: interrupted by {name}: {finished} of {ran} jobs of this run finished ok; "
            f"resume with: {_resume_command(sweep_dir)}",
            file=sys.stderr,
        )
        sys.exit(128 + stopped_by)
    grid = table[table["this_run"] | table["resumed"]]  # jobs of earlier grids do not decide the exit code
    failed = grid[~grid["status"].isin(["ok", "skipped"])]
    if len(failed):
        print(
            f"sweepbench: {len(failed)} of {len(grid)} jobs did not finish ok "
            f"({table.attrs.get('not_written') or 'see ' + str(sweep_dir / 'results.csv')})",
            file=sys.stderr,
        )
        sys.exit(1)
    if skipped:
        reasons = list(dict.fromkeys(skipped.values()))
        named = reasons[0] if len(reasons) == 1 else f"{len(reasons)} reasons"
        print(
            f"sweepbench: {len(skipped)} of {len(grid)} jobs skipped, they cannot run where they would "
            f"({named}; each job's in {sweep_dir / 'results.csv'}); every job that ran finished ok",
            file=sys.stderr,
        )
        sys.exit(EXIT_SKIPPED)
    return [returns]


def _rank(sweep_dir: Path, records: SweepRecords) -> tuple[Any, list[Any] | Exception]:
    """The jobs' records as a report reads them and their ranking (``report.answer``), made once
    for the summary and the page; where they cannot be made, the error instead (each of the two
    then says so in one line; neither fails the sweep)."""
    from sweepbench.report.answer import answer_jobs
    from sweepbench.report.load import load_sweep

    try:
        sweep = load_sweep(sweep_dir, records=records)
        return sweep, answer_jobs(sweep.jobs)
    except Exception as err:
        return None, err


def forget_unstarted(job_dir: Path) -> None:
    """A job that never started may still have a directory: Hydra makes it (its .hydra/ and the
    job's log) before the job's own stop check. Holding nothing of a run, it goes."""
    hydra_only = {".hydra", "sweepbench.log"}
    if job_dir.is_dir() and {p.name for p in job_dir.iterdir()} <= hydra_only:
        shutil.rmtree(job_dir, ignore_errors=True)


def print_measuring_fraction(table: Any) -> None:
    """One line: how much of the jobs' wall time this run spent in timed samples."""
    ran = table[table["this_run"] & (table["status"] == "ok")] if "timed_s" in table else table.iloc[0:0]
    wall = float(ran["wall_time_s"].sum()) if len(ran) else 0.0
    if wall <= 0:
        return
    timed = float(ran["timed_s"].sum())
    each = ran["measuring_fraction"].dropna()
    spread = f"; per job {each.min():.1%} to {each.max():.1%}" if len(each) > 1 else ""
    print(
        f"sweepbench: measuring fraction {timed / wall:.1%}: {timed:.2f} s timed of {wall:.1f} s job wall "
        f"time ({len(ran)} jobs ok this run{spread})"
    )
    went = {name: ran[f"wall_{key}_s"] for key, name in WALL_PHASES.items()}  # aggregate writes them with timed_s
    if all(v.notna().all() for v in went.values()):  # every job told where its time went
        print("sweepbench: job wall time went to " + ", ".join(f"{name} {v.sum():.1f} s" for name, v in went.items()))


def _span(values: Any, unit: str) -> str:
    low, high = values.min(), values.max()
    return f"{low:g}{unit}" if low == high else f"{low:g}{unit} to {high:g}{unit}"


def print_gpu_state(table: Any) -> None:
    """One line where this run's jobs recorded how their GPUs ran the timed samples (metrics.json's
    ``gpu_state``; nothing on CPUs): the spread of their SM clocks and of the share of readings at
    the power cap, so that a gap of a few percent between jobs is read beside the clocks they ran at."""
    if "gpu_sm_mhz_median" not in table or "this_run" not in table:
        return
    ran = table[table["this_run"] & (table["status"] == "ok")].dropna(subset=["gpu_sm_mhz_median"])
    if not len(ran):
        return
    capped = ran["gpu_power_capped_pct"].dropna()
    print(
        f"sweepbench: GPUs in the timed samples ({len(ran)} jobs): median SM clock {_span(ran['gpu_sm_mhz_median'], ' MHz')}"
        + (f", at the power cap in {_span(capped, '%')} of readings" if len(capped) else "")
        + " (metrics.json gpu_state; a gap of a few percent between jobs can be the clock's)"
    )


def _crash_message(job_return: Any) -> str:
    err = job_return._return_value
    return f"{type(err).__name__}: {err}"
