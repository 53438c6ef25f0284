"""Reading a sweep back for a report or a comparison: its jobs' metrics.json and env.json, and
what the sweep was (the command, its date), from the files the sweep driver wrote.

A "jobs file" (``sweepbench report SWEEP --save-jobs ref.json``) holds the same job records in
one JSON file, so that a reference sweep can be committed and compared against later without its
directory tree."""

from __future__ import annotations

import datetime as dt
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sweepbench.record import ENV_FILE, METRICS_FILE
from sweepbench.record.atomic import read_json, write_json_atomic

JOBS_FILE_FORMAT = "sweepbench-jobs/1"
UNREADABLE = "unreadable"  # the status of a job whose metrics.json exists but cannot be read


@dataclass
class Sweep:
    """One sweep as a report sees it."""

    path: Path
    jobs: list[dict[str, Any]]  # metrics.json dicts, ordered by tag
    envs: dict[str, dict[str, Any]] = field(default_factory=dict)  # tag -> env.json
    command: str = ""
    date: str = ""

    @property
    def name(self) -> str:
        return self.path.name if self.path.name not in ("", ".") else str(self.path)

    def env(self) -> dict[str, Any]:
        """The environment of the sweep's first job that recorded one (they share a machine)."""
        return next(iter(self.envs.values()), {})


def _sweep_command(multirun_yaml: Path) -> str:
    try:
        cfg = yaml.safe_load(multirun_yaml.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return ""
    from sweepbench.record.wandb_run import redact_overrides

    task = ((cfg.get("hydra") or {}).get("overrides") or {}).get("task") or []
    return " ".join(["sweepbench", "-m", *(shlex.quote(o) for o in redact_overrides([str(t) for t in task]))])


def _mtime_utc(path: Path) -> str:
    stamp = dt.datetime.fromtimestamp(path.stat().st_mtime, tz=dt.timezone.utc)
    return stamp.strftime("%Y-%m-%d %H:%M:%S UTC")


def _read_metrics(job_dir: Path) -> dict[str, Any] | None:
    """The job's metrics.json; None when there is none; a job of status ``unreadable`` (naming
    the file and what is wrong with it) when it exists but is not a job record."""
    path = job_dir / METRICS_FILE
    if not path.exists():
        return None
    try:
        metrics = json.loads(path.read_text())
        problem = "" if isinstance(metrics, dict) else f"a JSON {type(metrics).__name__}, not a job record"
    except (OSError, ValueError) as err:
        problem = str(err)
    if not problem:
        return metrics
    return {"tag": job_dir.name, "status": UNREADABLE, "error": f"{path} cannot be read: {problem}",
            "config": {}, "results": {}}


def load_sweep(path: str | Path) -> Sweep:
    """A sweep directory (one sub-directory per job) or a jobs file. Jobs without metrics.json
    (a crash before recording) appear as failed jobs with results.csv's error, never dropped;
    jobs whose metrics.json cannot be read appear as ``unreadable``, by name. A sweep none of whose
    jobs can be read is bad input (ValueError)."""
    path = Path(path)
    if path.is_file():
        return _load_jobs_file(path)
    if not path.is_dir():
        raise ValueError(f"{path} is neither a sweep directory nor a jobs file (.json)")
    jobs, envs = [], {}
    for job_dir in sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")):
        metrics = _read_metrics(job_dir)
        if metrics is None:
            if not (job_dir / ".hydra").is_dir():
                continue  # not a job directory
            metrics = {"tag": job_dir.name, "status": "failed", "error": "the job left no metrics.json",
                       "config": {}, "results": {}}
        jobs.append(metrics)
        env = read_json(job_dir / ENV_FILE)
        if env:
            envs[str(metrics.get("tag") or job_dir.name)] = env
    _add_rows_without_dirs(path, jobs)
    if not jobs:
        raise ValueError(f"{path} holds no job (no <tag>/metrics.json); is it a sweep directory?")
    if all(j.get("status") == UNREADABLE for j in jobs):
        raise ValueError(f"no job of {path} can be read: {jobs[0]['error']}")
    multirun = path / "multirun.yaml"
    return Sweep(path=path, jobs=jobs, envs=envs,
                 command=_sweep_command(multirun) if multirun.exists() else "",
                 date=_mtime_utc(multirun if multirun.exists() else path))


def _add_rows_without_dirs(path: Path, jobs: list[dict[str, Any]]) -> None:
    """Jobs that results.csv lists but that left no directory (e.g. never started)."""
    csv = path / "results.csv"
    if not csv.exists():
        return
    import pandas as pd

    seen = {j.get("tag") for j in jobs}
    for row in pd.read_csv(csv).to_dict("records"):
        if row.get("tag") not in seen:
            error = row.get("error")
            jobs.append({"tag": row.get("tag"), "status": row.get("status") or "failed",
                         "error": error if isinstance(error, str) else None,
                         "benchmark": row.get("benchmark"), "config": {}, "results": {}})


def _load_jobs_file(path: Path) -> Sweep:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a readable jobs file: {err}") from None
    if not isinstance(data, dict) or data.get("format") != JOBS_FILE_FORMAT:
        raise ValueError(f"{path} is not a jobs file (expected format {JOBS_FILE_FORMAT!r}, "
                         f"written by `sweepbench report SWEEP --save-jobs FILE`)")
    return Sweep(path=Path(data.get("sweep") or path.stem), jobs=data["jobs"], envs=data.get("envs", {}),
                 command=data.get("command", ""), date=data.get("date", ""))


def save_jobs_file(sweep: Sweep, out: Path) -> Path:
    """Write the sweep's job records to one JSON file (a reference to compare against later)."""
    write_json_atomic(out, {"format": JOBS_FILE_FORMAT, "sweep": str(sweep.path), "command": sweep.command,
                            "date": sweep.date, "jobs": sweep.jobs, "envs": sweep.envs})
    return out
