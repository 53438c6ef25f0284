"""The sweep driver's side of ``hydra/launcher=slurm``: compose each job, compute its own SLURM
request (jobs of one sweep differ in world size), submit jobs of equal requests as one job
array through submitit, wait while saying how the sweep progresses, then make sure every job
dir is complete: a job that died hard (os._exit, SIGKILL, OOM, segfault) or hit its time limit
gets a failed (or timeout) metrics.json holding SLURM's state and the tail of its stderr, and
a wandb run, written here; no job's death raises, so every other job's result is kept."""

from __future__ import annotations

import copy
import dataclasses
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, run_job, setup_globals
from omegaconf import DictConfig, open_dict

from sweepbench.core import JobOutcome
from sweepbench.launch import preload
from sweepbench.launch.preflight import cluster_note, validate
from sweepbench.launch.rank_errors import first_raised
from sweepbench.record import ENV_FILE, METRICS_FILE
from sweepbench.record.atomic import read_json, write_json_atomic
from sweepbench.record.env import capture_env
from sweepbench.record.recorder import record_job
from sweepbench.slurm.groups import GroupTask, chunks, clear_notes, group_outcome
from sweepbench.slurm.request import SlurmRequest, executor_init, executor_parameters, job_request
from sweepbench.slurm.tasks import TASKS_ARE_RANKS, start_rank_log
from sweepbench.slurm.watch import WATCHERS, Tracked, died_how, stderr_tail, wait_all
from sweepbench.sweep.tags import make_tag

LABELS = {"slurm": "slurm", "local": "submitit-local"}
OWN_ERROR_CHARS = 400  # of a rank's own error message, in a failed job's error


def say(message: str) -> None:
    print(f"sweepbench: {message}", flush=True)


class TaskFunction:
    """What every task of a job runs (pickled by submitit): compose the job's config as the
    driver did and run it through Hydra's run_job as one rank. Checkpointable: on a time-out or
    a preemption submitit requeues it as it is (a benchmark restarts from scratch)."""

    def __init__(self, hydra_context: Any, config: DictConfig, task_function: Any) -> None:
        self.hydra_context = hydra_context
        self.config = config
        self.task_function = task_function
        self.singleton_state = Singleton.get_state()

    def __call__(self, overrides: Sequence[str], job_num: int, request: SlurmRequest) -> JobReturn:
        import submitit

        os.environ[TASKS_ARE_RANKS] = "1"  # sweepbench.job: this process is one rank, spawn none
        Singleton.set_state(self.singleton_state)
        setup_globals()
        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        env = submitit.JobEnvironment()
        rank = env.global_rank
        with open_dict(cfg):
            cfg.hydra.job.id = env.job_id
            cfg.hydra.job.num = job_num
            cfg.launch.ranks_per_node = request.tasks_per_node
            cfg.launch.gpus_per_node = request.gpus_per_node
            if rank != 0:
                cfg.hydra.output_subdir = None  # rank 0 writes .hydra/
        start_rank_log(Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir), rank)
        ret = run_job(
            hydra_context=self.hydra_context,
            task_function=self.task_function,
            config=cfg,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
            configure_logging=rank == 0,
        )
        if ret.status == JobStatus.FAILED:  # rank 0 after recording (RankZeroFailed), or any other rank
            raise ret._return_value  # the task fails: SLURM (srun --kill-on-bad-exit) ends the job
        return ret

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


@dataclass
class JobSpec:
    overrides: list[str]
    num: int
    cfg: DictConfig  # the job's config, without the hydra node
    tag: str
    world_size: int
    job_dir: Path
    request: SlurmRequest

    @property
    def user_overrides(self) -> list[str]:
        return [o for o in self.overrides if not o.startswith("hydra.")]


def plan_job(launcher: Any, overrides: Sequence[str], num: int) -> JobSpec:
    full = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
    job_dir = Path(str(full.hydra.sweep.dir)) / str(full.hydra.sweep.subdir)
    cfg = copy.deepcopy(full)
    with open_dict(cfg):
        del cfg["hydra"]
    world_size = validate(cfg, here=False)  # checked against the cluster's request, not this host
    request = job_request(cfg, world_size, launcher.params)
    unfit = cluster_note(cfg, request.gpus_per_node)
    if unfit:
        raise ValueError(unfit)
    return JobSpec(list(overrides), num, cfg, make_tag(cfg, world_size=world_size), world_size, job_dir, request)


def plan_all(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[JobSpec]:
    """Every job's request, before anything is submitted; a bad one: one line, exit 2."""
    from sweepbench.sweep.errors import error_line, exit_bad_input

    specs = []
    for i, overrides in enumerate(job_overrides):
        try:
            specs.append(plan_job(launcher, overrides, initial_job_idx + i))
        except ValueError as err:
            exit_bad_input(
                f"{error_line(err)} (in job: {' '.join(o for o in overrides if not o.startswith('hydra.'))})"
            )
    return specs


def _groups(specs: list[JobSpec]) -> dict[SlurmRequest, list[JobSpec]]:
    groups: dict[SlurmRequest, list[JobSpec]] = {}
    for spec in specs:
        groups.setdefault(spec.request, []).append(spec)
    return groups


def _executor(launcher: Any, request: SlurmRequest) -> Any:
    import submitit

    executor = submitit.AutoExecutor(**executor_init(launcher.cluster, launcher.params, request))
    executor.update_parameters(**executor_parameters(launcher.cluster, launcher.params, request))
    return executor


def describe_jobs(launcher: Any, job_overrides: Sequence[Sequence[str]]) -> None:
    """Dry run: each job's request and the submission script it would get; submits nothing."""
    label = LABELS[launcher.cluster]
    for request, specs in _groups(plan_all(launcher, job_overrides, 0)).items():
        for spec in specs:
            say(f"{label} request {spec.tag}: {request.describe()}")
        per_allocation = int(specs[0].cfg.sweep.jobs_per_allocation)
        if per_allocation > 1:  # the script is the allocations'
            groups = chunks(specs, per_allocation)
            request = dataclasses.replace(request, timeout_min=request.timeout_min * max(len(g) for g in groups))
            say(
                f"{label}: these {len(specs)} job(s) go in {len(groups)} allocation(s) of up to {per_allocation} "
                f"jobs each, one after the other: {request.describe()}"
            )
        try:
            inner = _executor(launcher, request)._executor
            script = inner._make_submission_file_text(inner._submitit_command_str, "dry-run")
        except RuntimeError as err:  # e.g. no srun on this machine
            script = f"# (no submission script: {err})"
        if script:
            print(
                f"# {label} submission script for {len(specs)} job(s) (an array of them if several):\n{script}",
                flush=True,
            )


def launch_jobs(launcher: Any, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
    specs = plan_all(launcher, job_overrides, initial_job_idx)
    label = LABELS[launcher.cluster]
    task = TaskFunction(launcher.hydra_context, launcher.config, launcher.task_function)
    group_name = str(launcher.config.hydra.sweep.dir)
    tracked: dict[str, Tracked] = {}
    rejected: dict[str, JobReturn] = {}
    per_allocation = int(specs[0].cfg.sweep.jobs_per_allocation) if specs else 1
    for request, group in _groups(specs).items():
        for spec in group:  # a stale record must not pass for this run's
            (spec.job_dir / METRICS_FILE).unlink(missing_ok=True)
            clear_notes(spec.job_dir)
        try:
            if per_allocation == 1:
                jobs = _executor(launcher, request).map_array(
                    task, [s.overrides for s in group], [s.num for s in group], [request] * len(group)
                )
                placed = [(job, request.describe()) for job in jobs]
            else:
                placed = _submit_groups(launcher, task, request, chunks(group, per_allocation))
        except Exception as err:  # e.g. sbatch refused the request: these jobs fail, the others go on
            error = f"submission failed: {type(err).__name__}: {' '.join(str(err).split())}"
            rejected.update({spec.tag: _record_unsubmitted(spec, error, group_name) for spec in group})
            continue
        for spec, (job, describe) in zip(group, placed):
            tracked[spec.tag] = Tracked(job, spec.tag, spec.job_dir, spec.world_size)
            say(f"submitted {spec.tag} as {label} job {job.job_id}: {describe}")
    order = [tracked[s.tag] for s in specs if s.tag in tracked]
    try:
        if order:
            say(f"{label} logs: {Path(str(launcher.params['submitit_folder'])).parent}/<job id>/ and <job dir>/logs/")
            wait_all(
                order,
                WATCHERS[launcher.cluster](),
                poll_s=float(launcher.params.get("poll_s") or 5),
                label=label,
                say=say,
            )
    except KeyboardInterrupt:
        ids = " ".join(str(t.job.job_id) for t in order if not t.finished)
        say(f"interrupted; jobs still queued or running: {ids or 'none'} (cancel: scancel {ids})")
        raise
    return [
        rejected[s.tag] if s.tag in rejected else finish(s, tracked[s.tag], label=label, group=group_name)
        for s in specs
    ]


def _submit_groups(
    launcher: Any, task: TaskFunction, request: SlurmRequest, groups: list[list[JobSpec]]
) -> list[tuple[Any, str]]:
    """One array task (one allocation) per group, its time limit the per-job one x the group's
    size; (the allocation's job, what to say) for each job of the groups, in order."""
    size = max(len(g) for g in groups)
    allocation = dataclasses.replace(request, timeout_min=request.timeout_min * size)
    jobs = _executor(launcher, allocation).map_array(
        GroupTask(task),
        [[s.overrides for s in g] for g in groups],
        [[s.num for s in g] for g in groups],
        [request] * len(groups),
        [[str(s.job_dir) for s in g] for g in groups],
        [request.timeout_min * 60] * len(groups),
        [preload.keeps(g[0].cfg, on_gpus=request.gpus_per_node > 0) for g in groups],
    )
    return [
        (
            job,
            f"{allocation.describe()}, job {i + 1} of {len(g)} in this allocation "
            f"(per-job limit {request.timeout_min} min)",
        )
        for g, job in zip(groups, jobs)
        for i in range(len(g))
    ]


def _by_driver(spec: JobSpec, why: str) -> str:
    """env.json's note when the driver writes it: its own environment, not the ranks'."""
    ranks = f"; the ranks' interpreter was launch.python={spec.request.python}" if spec.request.python else ""
    return f"the sweep driver: {why} (this is the driver's environment{ranks})"


def _record_unsubmitted(spec: JobSpec, error: str, group: str) -> JobReturn:
    say(f"{spec.tag}: failed ({error})")
    env = {**capture_env(), "recorded_by": _by_driver(spec, "the job was not submitted")}
    record_job(
        spec.cfg,
        JobOutcome("failed", error),
        job_dir=spec.job_dir,
        tag=spec.tag,
        world_size=spec.world_size,
        overrides=spec.user_overrides,
        group=group,
        wall_time_s=0.0,
        env=env,
        extra={"slurm": {"job_id": None, "state": "NOT_SUBMITTED", "exit_code": None, "logs": None}},
    )
    return JobReturn(overrides=spec.overrides, cfg=spec.cfg, status=JobStatus.FAILED, _return_value=RuntimeError(error))


def _task0_return(t: Tracked) -> JobReturn | None:
    from submitit.core.utils import pickle_load

    path = t.job.task(0).paths.result_pickle
    try:
        outcome, value = pickle_load(path) if path.exists() else (None, None)
    except Exception:
        return None
    return value if outcome == "success" and isinstance(value, JobReturn) else None


def _failure(
    spec: JobSpec, t: Tracked, metrics: dict[str, Any] | None, ret0: JobReturn | None, label: str
) -> tuple[str, str, str]:
    """(status, error, summary) of a job that did not finish ok: how SLURM ended it (and how its
    first task died, per srun), what the job itself saw, then the tail of its stderr."""
    state = t.info.state
    status = "timeout" if state == "TIMEOUT" or (metrics or {}).get("status") == "timeout" else "failed"
    how = f"{'SLURM' if label == 'slurm' else label} job {t.job.job_id} {state}"
    if t.info.exit_code and t.info.exit_code != "0:0":
        how += f" (exit code {t.info.exit_code})"
    if t.never:
        how += f": SLURM would never start it ({t.never}), so the sweep cancelled it"
    elif state == "TIMEOUT":
        how += f": time limit of {spec.request.timeout_min} min reached"
    elif grouped := group_outcome(spec.job_dir):
        status = grouped.status
        how += f"; {grouped.how}"
    elif died := died_how(t):
        how += f": {died}"
    seen = (metrics or {}).get("error") or first_raised(spec.job_dir)
    if not seen and ret0 is not None and ret0.status == JobStatus.FAILED:
        seen = f"rank 0: {type(ret0._return_value).__name__}: {ret0._return_value}"
    if seen and len(seen) > OWN_ERROR_CHARS:
        seen = seen[:OWN_ERROR_CHARS] + "..."
    parts = [how, seen, f"stderr tail: {stderr_tail(t) or '(empty)'}"]
    return status, "; ".join(p for p in parts if p), how


def finish(spec: JobSpec, t: Tracked, *, label: str, group: str) -> JobReturn:
    """The job's JobReturn; a job that did not finish ok gets its metrics.json completed here."""
    ret0 = _task0_return(t)
    metrics = read_json(spec.job_dir / METRICS_FILE)
    # it recorded itself; in a group the allocation's state is not this job's: a rank that failed
    # as its peer was stopped at the per-job limit records a failure that the notes call a timeout
    if metrics and (
        metrics.get("status") == "ok" or (t.info.state == "COMPLETED" and group_outcome(spec.job_dir) is None)
    ):
        ok = metrics.get("status") == "ok"
        return ret0 or JobReturn(
            overrides=spec.overrides,
            cfg=spec.cfg,
            status=JobStatus.COMPLETED if ok else JobStatus.FAILED,
            _return_value=metrics if ok else RuntimeError(metrics.get("error")),
        )
    status, error, how = _failure(spec, t, metrics, ret0, label)
    slurm = {
        "job_id": str(t.job.job_id),
        "state": t.info.state,
        "exit_code": t.info.exit_code,
        "logs": str(t.job.paths.folder),
    }
    if metrics:
        metrics.update(status=status, error=error, verified=False, slurm=slurm)
        write_json_atomic(spec.job_dir / METRICS_FILE, metrics)
    else:  # rank 0 died before it recorded: a wandb run it had begun is replaced by a whole one
        shutil.rmtree(spec.job_dir / "wandb", ignore_errors=True)
        env = read_json(spec.job_dir / ENV_FILE) or {
            **capture_env(),
            "slurm": {"job_id": str(t.job.job_id)},
            "recorded_by": _by_driver(spec, "the job left no env.json"),
        }
        record_job(
            spec.cfg,
            JobOutcome(status, error),
            job_dir=spec.job_dir,
            tag=spec.tag,
            world_size=spec.world_size,
            overrides=spec.user_overrides,
            group=group,
            wall_time_s=t.info.elapsed_s or 0.0,
            env=env,
            extra={"slurm": slurm},
        )
    say(f"{spec.tag}: {status} ({how})")
    return JobReturn(overrides=spec.overrides, cfg=spec.cfg, status=JobStatus.FAILED, _return_value=RuntimeError(error))
