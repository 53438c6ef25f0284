"""What a person sees: the dry-run plan and the end-of-sweep summary table (rich)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Iterable

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

STATUS_STYLE = {"ok": "green", "failed": "red", "timeout": "red", "skipped": "yellow"}
SUMMARY_COLUMNS = ("tag", "status", "backend", "world_size", "verified", "wall_time_s")


def _console() -> Console:
    return Console(width=200)


def job_command(job: Any, *, sweep_dir: Path, hydra_overrides: Iterable[str] = ()) -> str:
    """The command that runs this job alone, into the same sweep directory (a dry run's own
    switch left out)."""
    overrides = [o for o in job.overrides if not o.startswith("sweep.dry_run=")]
    hydra = [o for o in hydra_overrides if not o.startswith(("hydra.sweep.dir=", "hydra.mode="))]
    return shlex.join(["python", "-m", "sweepbench", *overrides, *hydra, f"hydra.sweep.dir={sweep_dir}"])


def print_plan(jobs: Iterable[Any], *, sweep_dir: Path, hydra_overrides: Iterable[str] = ()) -> None:
    jobs = list(jobs)
    table = Table(title=f"dry run: {sweep_dir} (no rank started)")
    for col in ("tag", "world_size", "benchmark", "model", "parallelism", "backend", "mode"):
        table.add_column(col)
    n = 0
    for job in jobs:
        c = job.cfg
        table.add_row(job.tag, str(job.world_size), c.benchmark.name, c.model.name,
                      c.parallelism.name, c.backend.name, c.mode.name)
        n += 1
    _console().print(table)
    print(f"{n} jobs; each alone:")
    for job in jobs:
        print(f"  {job_command(job, sweep_dir=sweep_dir, hydra_overrides=hydra_overrides)}")


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def print_summary(results: pd.DataFrame, *, sweep_dir: Path) -> None:
    metric_cols = [c for c in results.columns
                   if c.endswith(("_s", "_gbps", "_per_s")) and c not in SUMMARY_COLUMNS][:3]
    table = Table(title=f"sweep {sweep_dir}")
    columns = [*SUMMARY_COLUMNS, *metric_cols, "error"]
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in results.to_dict("records"):
        cells = [escape(_fmt(row.get(col))) for col in columns]  # an error may hold "[...]"
        style = STATUS_STYLE.get(str(row.get("status")), "")
        cells[1] = f"[{style}]{cells[1]}[/{style}]" if style else cells[1]
        table.add_row(*cells)
    _console().print(table)
