"""Aggregation: one row per job of the sweep directory (this invocation's grid and any job an
earlier invocation left there), from each job's metrics.json, to results.csv/.parquet. Columns
``resumed`` (skipped: already ok) and ``this_run`` (launched by this invocation) say which is which.

``timed_s`` / ``measuring_fraction``: the seconds of the job's timed samples and their share of
its wall time; ``wall_<phase>_s``: where that wall time went (``recorder.WALL_PHASES``). A job of
rounds (``sweep.repeats``) has one row: its headline numbers are the median across rounds (see
``sweep.rounds``), ``repeats`` says how many rounds it ran and ``<key>_rounds`` lists every
round's value of each ``*_median_s`` headline number."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any, Iterable

import pandas as pd
from omegaconf import OmegaConf

from sweepbench.record.atomic import write_atomic
from sweepbench.record.readback import SweepRecords, read_sweep
from sweepbench.record.recorder import WALL_PHASES, gpu_state_columns, sample_ops, timed_seconds

CONFIG_COLUMNS = {
    "benchmark": ("benchmark", "name"),
    "model": ("model", "name"),
    "parallelism": ("parallelism", "name"),
    "mode": ("mode", "name"),
    "tp": ("parallelism", "tp"),
    "pp": ("parallelism", "pp"),
    "ep": ("parallelism", "ep"),
    "dp": ("parallelism", "dp"),
    "cp": ("parallelism", "cp"),
}


def _dig(d: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(d, dict):
            return None
        d = d.get(key)  # type: ignore[assignment]
    return d


def _tag_keys(benchmark: Any) -> tuple[str, ...]:
    """The benchmark's tag keys (its fields shown in the tag): results.csv columns too."""
    from sweepbench.benchmarks.registry import get_benchmark

    try:
        return tuple(get_benchmark(str(benchmark)).tag_keys)
    except ValueError:  # a job of a benchmark this install does not have
        return ()


def job_row(metrics: dict[str, Any]) -> dict[str, Any]:
    config = metrics.get("config", {})
    row: dict[str, Any] = {"tag": metrics.get("tag"), "status": metrics.get("status"), "error": metrics.get("error")}
    row.update({col: _dig(config, path) for col, path in CONFIG_COLUMNS.items()})
    row.update({key: _dig(config, ("benchmark", key)) for key in _tag_keys(_dig(config, ("benchmark", "name")))})
    row.update(
        {
            "backend": metrics.get("backend") or _dig(config, ("backend", "name")),
            "world_size": metrics.get("world_size"),
            "verified": metrics.get("verified"),
            "wall_time_s": metrics.get("wall_time_s"),
            "peak_allocated_bytes": _dig(metrics, ("memory", "max", "peak_allocated_bytes")),
        }
    )
    row.update(_measuring(metrics))
    row.update(gpu_state_columns(metrics))  # how the GPUs ran the timed samples (measure/gpu_state.py)
    row.update(_dig(metrics, ("results", "summary")) or {})
    return row


def _measuring(metrics: dict[str, Any]) -> dict[str, Any]:
    """timed_s and measuring_fraction (computed from the cases for records older than them)."""
    timed = metrics.get("timed_s")
    if timed is None and metrics.get("status") == "ok":
        results = metrics.get("results") or {}
        timed = timed_seconds(results.get("cases") or [], ops_per_sample=sample_ops(results))
    wall = metrics.get("wall_time_s")
    fraction = timed / wall if timed is not None and wall else None
    phases = metrics.get("wall_phases_s") or {}
    return {"timed_s": timed, "measuring_fraction": fraction, **{f"wall_{k}_s": phases.get(k) for k in WALL_PHASES}}


def _round_columns(records: SweepRecords, metrics: dict[str, Any]) -> dict[str, Any]:
    """repeats, and each ``*_median_s`` headline number's value in every round (``a;b;c``)."""
    repeats = metrics.get("repeats")
    if not repeats:
        return {}
    tag = str(metrics.get("tag"))
    rounds = [records.metrics(tag, r) or {} for r in range(1, repeats + 1)]
    out: dict[str, Any] = {"repeats": repeats}
    for key in _dig(metrics, ("results", "summary")) or {}:
        if key.endswith("_median_s"):
            values = [_dig(m, ("results", "summary", key)) for m in rounds]
            out[f"{key}_rounds"] = ";".join("" if v is None else f"{v:.6g}" for v in values)
    return out


def _missing_row(job: Any, error: str, status: str = "failed") -> dict[str, Any]:
    """A job with no record: it crashed before recording (failed), did not fit (skipped) or a stop
    came before it started (not run). Its config columns come from the plan."""
    config = OmegaConf.to_container(job.cfg, resolve=True)
    row = {"tag": job.tag, "status": status, "error": error}
    row.update({col: _dig(config, path) for col, path in CONFIG_COLUMNS.items()})  # type: ignore[arg-type]
    row.update({"backend": getattr(job, "backend", "") or job.cfg.backend.name, "world_size": job.world_size})
    return row


def _earlier_jobs(records: SweepRecords, known: set[str]) -> list[dict[str, Any]]:
    """Rows of the jobs in the directory that are not in this invocation's grid."""
    rows = []
    for name in records.jobs:
        metrics = records.metrics(name)
        if name not in known and isinstance(metrics, dict) and metrics.get("tag") == name:
            rows.append({**job_row(metrics), **_round_columns(records, metrics), "resumed": False, "this_run": False})
    return rows


def aggregate_sweep(
    sweep_dir: Path,
    jobs: Iterable[Any],
    *,
    resumed: set[str],
    crashed: dict[str, str],
    skipped: dict[str, str] | None = None,
    not_run: dict[str, str] | None = None,
    records: SweepRecords | None = None,
) -> pd.DataFrame:
    """Write ``results.csv`` and ``results.parquet`` (atomically) and return the table. ``this_run``
    marks the jobs this invocation ran: those of ``jobs`` not ``resumed``. ``skipped`` (did not
    fit) and ``not_run`` (a stop came first) map such jobs' tags to why: with no record of their
    own (or, skipped, one that is not ok) their status says so, never ``failed``. ``records``: the
    sweep directory's records as this command read them (``record.readback``), else read here."""
    jobs = list(jobs)
    skipped, not_run = skipped or {}, not_run or {}
    records = records if records is not None else read_sweep(sweep_dir)
    rows = []
    for job in jobs:
        metrics = records.metrics(job.tag)
        if job.tag in skipped and not (isinstance(metrics, dict) and metrics.get("status") == "ok"):
            row = _missing_row(job, skipped[job.tag], "skipped")
        elif not isinstance(metrics, dict) and job.tag in not_run:
            row = _missing_row(job, not_run[job.tag], "not run")
        elif not isinstance(metrics, dict):
            row = _missing_row(job, crashed.get(job.tag, "the job left no metrics.json"))
        else:
            row = {**job_row(metrics), **_round_columns(records, metrics)}
        row["resumed"] = job.tag in resumed
        row["this_run"] = job.tag not in resumed
        rows.append(row)
    rows += _earlier_jobs(records, {j.tag for j in jobs})
    table = pd.DataFrame(rows)
    try:
        write_atomic(sweep_dir / "results.csv", table.to_csv(index=False))
        buf = io.BytesIO()
        table.astype({"error": "string"}).to_parquet(buf, index=False)
        write_atomic(sweep_dir / "results.parquet", buf.getvalue())
    except OSError as err:  # a full disk: the summary is printed all the same, and says why it is not written
        table.attrs["not_written"] = f"results.csv and results.parquet not written: {err}"
        print(f"sweepbench: {table.attrs['not_written']}", file=sys.stderr)
    return table
