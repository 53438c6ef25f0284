"""Reading a sweep back for a report or a comparison: its jobs' metrics.json and env.json, and
what the sweep was (the command, its date), from the files the sweep driver wrote.

A "jobs file" (``sweepbench report SWEEP --save-jobs ref.json``) holds the same job records in
one JSON file, so that a reference sweep can be committed and compared against later without its
directory tree."""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sweepbench.record import METRICS_FILE
from sweepbench.record.atomic import write_json_atomic
from sweepbench.record.readback import MAX_RECORD_BYTES, JobFiles, SweepRecords, read_sweep

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


MAX_SAMPLES = 2000  # per case, for the page and the statistics: more are thinned (``thin_samples``)
# fields a job record holds, with their types (a field may be absent; all but tag and status null)
_FIELDS: dict[str, tuple[type, ...]] = {
    "tag": (str,),
    "status": (str,),
    "error": (str,),
    "benchmark": (str,),
    "config": (dict,),
    "results": (dict,),
    "world_size": (int,),
    "overrides": (list,),
    "memory": (dict,),
    "wall_phases_s": (dict,),
    "rounds": (list,),
}
_NULLABLE = frozenset(_FIELDS) - {"tag", "status"}
# a case's or summary's key with one of these ends holds numbers (or null): a time, a rate, a size
_NUMERIC = re.compile(r"_(s|ms|us|ns|gbps|gb|bytes|tflops|flops|fraction|ratio)$|^(iters|warmup)$")


def _numbers_problem(value: Any, where: str, *, numeric: bool) -> str:
    """Where ``value`` (a record's part) holds a non-finite number, or, where ``numeric``, anything
    but numbers and nulls ("" when nothing)."""
    if isinstance(value, bool):
        return f"{where} is {json.dumps(value)}, not a number" if numeric else ""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} is {value}, not a finite number"
    if isinstance(value, dict):
        return next(
            (
                p
                for k, v in value.items()
                if (p := _numbers_problem(v, f"{where}.{k}", numeric=numeric or bool(_NUMERIC.search(str(k)))))
            ),
            "",
        )
    if isinstance(value, list):
        return next(
            (p for i, v in enumerate(value) if (p := _numbers_problem(v, f"{where}[{i}]", numeric=numeric))), ""
        )
    if numeric and not isinstance(value, (int, float, type(None))):
        return f"{where} is {json.dumps(value)[:40]}, not a number"
    return ""


def record_problem(record: Any) -> str:
    """What makes ``record`` no job record a report can use ("" when it is one): not an object,
    a field of the wrong type, cases that are not a list of objects, a number that is not finite
    (``Infinity``, ``NaN``) or a time that is not a number."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not a job record"
    for key, types in _FIELDS.items():
        value = record.get(key)
        if (
            key in record
            and not (value is None and key in _NULLABLE)
            and (not isinstance(value, types) or isinstance(value, bool))
        ):
            return f"its field {key!r} is {json.dumps(record[key], default=str)[:40]}, not a {types[0].__name__}"
    results = record.get("results") or {}
    cases = results.get("cases", [])
    if not isinstance(cases, list) or not all(isinstance(c, dict) for c in cases):
        return "its results.cases is not a list of cases"
    if not isinstance(results.get("summary", {}), dict):
        return "its results.summary is not an object"
    for part in ("results", "memory", "wall_phases_s", "wall_time_s", "timed_s", "measuring_fraction"):
        if part in record and (
            problem := _numbers_problem(record[part], part, numeric=part != "results" and part != "memory")
        ):
            return f"its {problem}"
    return ""


def thin_samples(record: dict[str, Any], limit: int = MAX_SAMPLES) -> dict[str, Any]:
    """Each case's ``times_s`` cut to at most ``limit`` samples, evenly spaced in the order they were
    taken (the case's summary statistics stay those of all samples; ``samples_recorded`` says how
    many there were), so that the size of a record decides neither a page's size nor the memory
    and time of its statistics. A record with such a case comes back as a copy: ``record`` is the
    one every reader of the command shares (``record.readback``)."""

    def thin(case: dict[str, Any]) -> dict[str, Any]:
        times = case.get("times_s")
        if not (isinstance(times, list) and len(times) > limit):
            return case
        step = len(times) / limit
        return {**case, "times_s": [times[int(i * step)] for i in range(limit)], "samples_recorded": len(times)}

    cases = (record.get("results") or {}).get("cases") or []
    thinned = [thin(case) for case in cases]
    if all(a is b for a, b in zip(thinned, cases)):
        return record
    return {**record, "results": {**record["results"], "cases": thinned}}


def unreadable_job(tag: str, path: Path, problem: str) -> dict[str, Any]:
    return {"tag": tag, "status": UNREADABLE, "error": f"{path} cannot be read: {problem}", "config": {}, "results": {}}


def _job_record(files: JobFiles) -> dict[str, Any]:
    """The job's record as a report uses it: its metrics.json with the samples thinned; a failed
    job where it left none; a job of status ``unreadable`` (naming the file and what is wrong with
    it) where it is not a job record, or it or the job's directory cannot be read."""
    if not files.found:
        return {
            "tag": files.name,
            "status": "failed",
            "error": "the job left no metrics.json",
            "config": {},
            "results": {},
        }
    problem = files.problem
    if not problem:
        try:
            problem = record_problem(files.metrics)
        except RecursionError as err:
            problem = str(err)
    if problem:
        return unreadable_job(files.name, files.problem_path or files.dir / METRICS_FILE, problem)
    return thin_samples(files.metrics)


def load_sweep(path: str | Path, *, records: SweepRecords | None = None) -> Sweep:
    """A sweep directory (one sub-directory per job) or a jobs file. Jobs without metrics.json
    (a crash before recording) appear as failed jobs with results.csv's error, never dropped;
    jobs whose metrics.json cannot be read appear as ``unreadable``, by name. A sweep none of whose
    jobs can be read is bad input (ValueError). ``records``: the sweep directory's records as this
    command already read them (``record.readback.read_sweep``), else they are read here."""
    path = Path(path)
    if records is None and path.is_file():
        return _load_jobs_file(path)
    if records is None and not path.is_dir():
        raise ValueError(f"{path} is neither a sweep directory nor a jobs file (.json)")
    jobs, envs = [], {}
    for files in (records if records is not None else read_sweep(path)).jobs.values():
        metrics = _job_record(files)
        jobs.append(metrics)
        if files.env:
            envs[str(metrics.get("tag") or files.name)] = files.env
    _add_rows_without_dirs(path, jobs)
    if not jobs:
        raise ValueError(f"{path} holds no job (no <tag>/metrics.json); is it a sweep directory?")
    if all(j.get("status") == UNREADABLE for j in jobs):
        raise ValueError(f"no job of {path} can be read: {jobs[0]['error']}")
    multirun = path / "multirun.yaml"
    return Sweep(
        path=path,
        jobs=jobs,
        envs=envs,
        command=_sweep_command(multirun) if multirun.exists() else "",
        date=_mtime_utc(multirun if multirun.exists() else path),
    )


def _add_rows_without_dirs(path: Path, jobs: list[dict[str, Any]]) -> None:
    """Jobs that results.csv lists but that left no directory (e.g. never started). A results.csv
    that cannot be read, or has no ``tag`` and ``status`` columns, adds nothing: the jobs are their
    metrics.json files (one line on stderr says so)."""
    import pandas as pd

    csv = path / "results.csv"
    try:
        if not csv.is_file():
            return
        rows = pd.read_csv(
            csv, usecols=lambda c: c in ("tag", "status", "error", "benchmark"), dtype=str, encoding="utf-8"
        ).to_dict("records")
        if rows and not {"tag", "status"} <= set(rows[0]):
            raise ValueError("it has no tag and status columns")
    except (OSError, ValueError, UnicodeError, pd.errors.ParserError) as err:  # EmptyDataError is a ValueError
        print(
            f"sweepbench: {csv} cannot be read ({str(err).splitlines()[0] if str(err) else type(err).__name__}); "
            f"the jobs are read from their metrics.json files",
            file=sys.stderr,
        )
        return
    seen = {j.get("tag") for j in jobs}
    for row in rows:
        tag = row.get("tag")
        if isinstance(tag, str) and tag and tag not in seen:
            seen.add(tag)
            error = row.get("error")
            status = row.get("status") if isinstance(row.get("status"), str) else "failed"
            if status == "ok":  # a job that finished has its record: this one's is gone
                status, error = "failed", f"results.csv lists it ok, but {path / tag / METRICS_FILE} is missing"
            jobs.append(
                {
                    "tag": tag,
                    "status": status,
                    "error": error if isinstance(error, str) else None,
                    "benchmark": row.get("benchmark") if isinstance(row.get("benchmark"), str) else None,
                    "config": {},
                    "results": {},
                }
            )


def _load_jobs_file(path: Path) -> Sweep:
    """A jobs file; a record in it that is no job record becomes an ``unreadable`` job named by
    its tag (or its place in the file); a body that holds no list of jobs is bad input."""
    try:
        if path.stat().st_size > MAX_RECORD_BYTES:
            raise ValueError(f"{path.stat().st_size >> 20} MiB, more than {MAX_RECORD_BYTES >> 20} MiB")
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as err:
        raise ValueError(f"{path} is not a readable jobs file: {err}") from None
    if not isinstance(data, dict) or data.get("format") != JOBS_FILE_FORMAT:
        raise ValueError(
            f"{path} is not a jobs file (expected format {JOBS_FILE_FORMAT!r}, "
            f"written by `sweepbench report SWEEP --save-jobs FILE`)"
        )
    if not isinstance(data.get("jobs"), list) or not data["jobs"]:
        raise ValueError(f"{path} is a damaged jobs file: its 'jobs' is not a list of job records")
    jobs = []
    for i, record in enumerate(data["jobs"]):
        problem = record_problem(record)
        tag = record["tag"] if isinstance(record, dict) and isinstance(record.get("tag"), str) else f"job {i + 1}"
        jobs.append(unreadable_job(tag, path, f"{tag}: {problem}") if problem else thin_samples(record))
    if all(j.get("status") == UNREADABLE for j in jobs):
        raise ValueError(f"no job of {path} can be read: {jobs[0]['error']}")
    envs = data.get("envs")
    envs = {k: v for k, v in envs.items() if isinstance(v, dict)} if isinstance(envs, dict) else {}
    name = data.get("sweep")
    return Sweep(
        path=Path(name if isinstance(name, str) and name else path.stem),
        jobs=jobs,
        envs=envs,
        command=str(data.get("command") or ""),
        date=str(data.get("date") or ""),
    )


def save_jobs_file(sweep: Sweep, out: Path) -> Path:
    """Write the sweep's job records to one JSON file (a reference to compare against later)."""
    write_json_atomic(
        out,
        {
            "format": JOBS_FILE_FORMAT,
            "sweep": str(sweep.path),
            "command": sweep.command,
            "date": sweep.date,
            "jobs": sweep.jobs,
            "envs": sweep.envs,
        },
    )
    return out
