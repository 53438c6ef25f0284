"""Aggregation: one row per job of a sweep, from each job's metrics.json, to results.csv/.parquet."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from sweepbench.record.atomic import read_json, write_atomic
from sweepbench.record.recorder import METRICS_FILE

CONFIG_COLUMNS = {
    "benchmark": ("benchmark", "name"), "model": ("model", "name"),
    "parallelism": ("parallelism", "name"), "mode": ("mode", "name"),
    "tp": ("parallelism", "tp"), "pp": ("parallelism", "pp"), "ep": ("parallelism", "ep"),
    "dp": ("parallelism", "dp"), "cp": ("parallelism", "cp"),
}


def _dig(d: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(d, dict):
            return None
        d = d.get(key)  # type: ignore[assignment]
    return d


def job_row(metrics: dict[str, Any]) -> dict[str, Any]:
    config = metrics.get("config", {})
    row: dict[str, Any] = {"tag": metrics.get("tag"), "status": metrics.get("status"),
                           "error": metrics.get("error")}
    row.update({col: _dig(config, path) for col, path in CONFIG_COLUMNS.items()})
    row.update({"backend": metrics.get("backend") or _dig(config, ("backend", "name")),
                "world_size": metrics.get("world_size"), "verified": metrics.get("verified"),
                "wall_time_s": metrics.get("wall_time_s"),
                "peak_allocated_bytes": _dig(metrics, ("memory", "max", "peak_allocated_bytes"))})
    row.update(_dig(metrics, ("results", "summary")) or {})
    return row


def _missing_row(job: Any, error: str) -> dict[str, Any]:
    return {"tag": job.tag, "status": "failed", "error": error, "world_size": job.world_size,
            "benchmark": job.cfg.benchmark.name}


def aggregate_sweep(sweep_dir: Path, jobs: Iterable[Any], *, resumed: set[str],
                    crashed: dict[str, str]) -> pd.DataFrame:
    """Write ``results.csv`` and ``results.parquet`` (atomically) and return the table."""
    rows = []
    for job in jobs:
        metrics = read_json(sweep_dir / job.tag / METRICS_FILE)
        if metrics is None:
            row = _missing_row(job, crashed.get(job.tag, "the job left no metrics.json"))
        else:
            row = job_row(metrics)
        row["resumed"] = job.tag in resumed
        rows.append(row)
    table = pd.DataFrame(rows)
    write_atomic(sweep_dir / "results.csv", table.to_csv(index=False))
    buf = io.BytesIO()
    table.astype({"error": "string"}).to_parquet(buf, index=False)
    write_atomic(sweep_dir / "results.parquet", buf.getvalue())
    return table
