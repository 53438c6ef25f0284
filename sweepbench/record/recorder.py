"""Turns a job's outcome into metrics.json, env.json and a wandb run (in that job's directory)."""

from __future__ import annotations

import datetime as dt
import logging
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sweepbench.config.validate import resolve_backend
from sweepbench.core import JobOutcome
from sweepbench.record import ENV_FILE, METRICS_FILE
from sweepbench.record.atomic import write_json_atomic
from sweepbench.record.env import capture_env, redact_config
from sweepbench.record.wandb_run import group_name, start_run

log = logging.getLogger(__name__)


# where a sample says how many back-to-back operations it timed (its time is per operation):
# the case's own field, else the job's ``results.sampling`` (measure.timing.sampling); absent: one
SAMPLE_OPS_KEY = "ops_per_sample"


def sample_ops(results: dict[str, Any]) -> int:
    """The job-wide operations per sample its results record (``sampling.ops_per_sample``), else 1."""
    ops = (results.get("sampling") or {}).get(SAMPLE_OPS_KEY) if isinstance(results, dict) else None
    return ops if isinstance(ops, int) and ops >= 1 else 1


def timed_seconds(cases: list[dict[str, Any]], *, ops_per_sample: int = 1) -> float:
    """What the job's timed samples add up to: a case's own ``timed_s`` where it records one (the
    attention case times fwd, bwd and T1 loops besides its ``times_s``), else the sum of its
    ``times_s``, each sample counted as many times as the operations it stands for
    (``ops_per_sample``, the case's own value first)."""
    total = 0.0
    for case in cases:
        own = case.get("timed_s")
        if isinstance(own, (int, float)) and not isinstance(own, bool) and own >= 0:
            total += float(own)
            continue
        times = case.get("times_s")
        if isinstance(times, list):
            ops = case.get(SAMPLE_OPS_KEY)
            total += sum(float(t) for t in times) * (ops if isinstance(ops, int) and ops >= 1 else ops_per_sample)
    return total


# where a job's wall time goes (and how the sweep's summary names it), in order: rank 0's
# interpreter start and imports, its process group, the benchmark (set-up, verification, warm-up,
# timing), the teardown (memory peaks, barrier, group destroyed), and the rest: launching the
# ranks, rank 0's environment capture and payload, the driver's wait (under SLURM, from the job's
# start: its queue is not wall time)
WALL_PHASES = {
    "start": "rank start-up (interpreter, imports)",
    "process_group": "process groups",
    "benchmark": "benchmarks (set-up, verification, warm-up, timing)",
    "teardown": "teardown",
    "rest": "launch and record",
}


def wall_phases(phases: Any, wall_time_s: float) -> dict[str, float] | None:
    """``wall_phases_s``: rank 0's phases (its payload's ``phases_s``) and the rest of the job's
    wall time; None when rank 0 reported none (a failed job, a record older than them)."""
    if not isinstance(phases, dict):
        return None
    known = {k: float(phases[k]) for k in WALL_PHASES if k != "rest" and isinstance(phases.get(k), (int, float))}
    return {**known, "rest": max(0.0, wall_time_s - sum(known.values()))}


def _utc(stamp: float) -> str:
    return dt.datetime.fromtimestamp(stamp, tz=dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _max_memory(per_rank: list[dict[str, Any] | None]) -> dict[str, Any]:
    keys = {k for m in per_rank if m for k in m}
    return {k: max((m[k] for m in per_rank if m and m.get(k) is not None), default=None) for k in sorted(keys)}


def build_metrics(
    cfg: DictConfig, outcome: JobOutcome, *, tag: str, world_size: int, overrides: list[str], wall_time_s: float
) -> dict[str, Any]:
    result = outcome.payload.get("result", {})
    status, error = outcome.status, outcome.error
    # ok | failed | timeout | interrupted (Ctrl-C/SIGTERM stopped it) | skipped
    if status == "ok" and not result.get("verified"):
        status, error = "failed", "the benchmark did not verify its output; its times are not reported"
    per_rank = outcome.payload.get("memory_per_rank", [])
    timed = (
        timed_seconds(result.get("cases", []), ops_per_sample=sample_ops(result.get("extra", {})))
        if status == "ok"
        else 0.0
    )
    now = time.time()
    return {
        "status": status,
        "error": error,
        "tag": tag,
        "benchmark": cfg.benchmark.name,
        "world_size": world_size,
        "backend": outcome.payload.get("backend") or resolve_backend(cfg.backend.name),
        "overrides": overrides,
        # secret-looking values (``+api_key=...``) redacted; .hydra/*.yaml keep what the user typed
        "config": redact_config(OmegaConf.to_container(cfg, resolve=True)),
        "verified": bool(result.get("verified")) and status == "ok",
        "results": {"summary": result.get("summary", {}), "cases": result.get("cases", []), **result.get("extra", {})}
        if status == "ok"
        else {},
        "memory": {"max": _max_memory(per_rank), "per_rank": per_rank},
        # how each rank's GPU ran while the benchmark timed (measure/gpu_state.py: results.csv's
        # gpu_* columns, then each rank's summary, None on a CPU); None where no rank reported
        "gpu_state": outcome.payload.get("gpu_state"),
        "wall_time_s": wall_time_s,
        # the part of the job's wall time spent in timed samples (start-up, warm-up and
        # verification are the rest)
        "timed_s": timed,
        "measuring_fraction": timed / wall_time_s if wall_time_s > 0 else None,
        "wall_phases_s": wall_phases(outcome.payload.get("phases_s"), wall_time_s),
        # how the local launcher began the ranks: "forked" from the sweep's warm interpreter
        # (launch.preload) or "fresh" interpreters; None where SLURM started them or no rank reported
        "rank_start": outcome.payload.get("rank_start"),
        "started_at": _utc(now - wall_time_s),
        "finished_at": _utc(now),
    }


def gpu_state_columns(metrics: dict[str, Any]) -> dict[str, Any]:
    """A job's ``gpu_state`` columns (results.csv's and wandb's: every key but the per-rank record);
    none for a job with no record."""
    return {k: v for k, v in (metrics.get("gpu_state") or {}).items() if k != "per_rank"}


def wandb_summary(metrics: dict[str, Any]) -> dict[str, Any]:
    return {
        "status": metrics["status"],
        "error": metrics["error"],
        "verified": metrics["verified"],
        "world_size": metrics["world_size"],
        "backend": metrics["backend"],
        "wall_time_s": metrics["wall_time_s"],
        "memory": metrics["memory"]["max"],
        **gpu_state_columns(metrics),
        **metrics["results"].get("summary", {}),
    }


def record_job(
    cfg: DictConfig,
    outcome: JobOutcome,
    *,
    job_dir: Path,
    tag: str,
    world_size: int,
    overrides: list[str],
    group: str,
    wall_time_s: float,
    env: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write env.json (``env``, else this process's), the wandb run and metrics.json (with
    ``extra`` keys added, e.g. the SLURM state of a job the sweep driver records)."""
    metrics = build_metrics(cfg, outcome, tag=tag, world_size=world_size, overrides=overrides, wall_time_s=wall_time_s)
    metrics.update(extra or {})
    if env is None:  # rank 0's capture (the ranks' interpreter and packages), else this process's
        env = outcome.payload.get("env") or {**capture_env(), "captured_by": "driver (no rank reported)"}
    write_json_atomic(job_dir / ENV_FILE, env)
    run_group = group_name(group)  # recorded: a report finds the runs by it, wherever it is run from
    run = start_run(cfg, job_dir=job_dir, tag=tag, group=run_group, config=metrics["config"])
    run.log_cases(metrics["results"].get("cases", []))
    run.log_summary(wandb_summary(metrics))
    run.finish(failed=metrics["status"] != "ok")
    metrics["wandb"] = {"dir": run.dir, "error": run.error, "group": run_group}
    # metrics.json last: its presence with status ok is what resume trusts
    write_json_atomic(job_dir / METRICS_FILE, metrics)
    log.info("job %s: %s%s", tag, metrics["status"], f" ({metrics['error']})" if metrics["error"] else "")
    return metrics
