"""What a person sees in the terminal: the dry-run plan and the end-of-sweep summary (rich).

The summary has one table per benchmark, its metric columns the benchmark's own ``headline(cfg)``
(labels with units and the size they refer to), as many as fit the terminal's width (rich's
Console: the terminal, else ``COLUMNS``, else 80); the rest are in results.csv. A job skipped
because it was already done reads ``ok (resumed)``.

Then the sweep's answer (``sweepbench.report.answer``): per benchmark, the fastest configuration
of each group, named by the axes the sweep varied (not by its long tag), its runner-up and
whether the gap is real, in the terminal's width; the same ranking goes to wandb as a table of a
``fastest`` run in the sweep's group."""

from __future__ import annotations

import logging
import math
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sweepbench.record.atomic import read_json

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)
MAX_RANKINGS = 12  # rows of the terminal's ranking per benchmark (the page has them all)
STATUS_STYLE = {"ok": "green", "failed": "red", "timeout": "red", "interrupted": "yellow", "skipped": "yellow"}
FIXED_WIDTH = 14 + 5 + 16  # status, ranks, error: their least useful widths (the tag's is added)
TAG_WIDTH = 44  # a default tag fits on one line up to this
CELL_PAD = 3  # rich's padding and border per column


def _console() -> Console:
    return Console()


def job_command(job: Any, *, sweep_dir: Path, hydra_overrides: Iterable[str] = ()) -> str:
    """The command that runs this job alone, into the same sweep directory (a dry run's own
    switch left out)."""
    overrides = [o for o in job.overrides if not o.startswith("sweep.dry_run=")]
    hydra = [o for o in hydra_overrides if not o.startswith(("hydra.sweep.dir=", "hydra.mode="))]
    return shlex.join(["python", "-m", "sweepbench", *overrides, *hydra, f"hydra.sweep.dir={sweep_dir}"])


def print_plan(jobs: Iterable[Any], *, sweep_dir: Path, hydra_overrides: Iterable[str] = ()) -> None:
    jobs = list(jobs)
    table = Table(title=f"dry run: {sweep_dir} (no rank started)")
    table.add_column("tag", overflow="fold")
    for col in ("ranks", "benchmark", "model", "parallelism", "backend", "mode", "fits here"):
        table.add_column(col)
    for job in jobs:
        c = job.cfg
        table.add_row(job.tag, str(job.world_size), c.benchmark.name, c.model.name,
                      c.parallelism.name, c.backend.name, c.mode.name, "no (see below)" if job.fit else "yes")
    _console().print(table)
    print(f"{len(jobs)} jobs; each alone:")
    for job in jobs:
        print(f"  {job.tag}\n    {job_command(job, sweep_dir=sweep_dir, hydra_overrides=hydra_overrides)}")
        print(f"    fits here: {'no: ' + job.fit if job.fit else 'yes'}")
    misfits = sum(1 for job in jobs if job.fit)
    if misfits:
        print(f"{misfits} of {len(jobs)} jobs would not run from this machine (fit notes above); "
              f"a real run here refuses them")


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _headlines(sweep_dir: Path, row: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, label) of the job's headline columns, from its benchmark's hook and its config."""
    from omegaconf import OmegaConf

    from sweepbench.benchmarks.registry import get_benchmark

    metrics = read_json(sweep_dir / str(row.get("tag")) / "metrics.json")
    if not isinstance(metrics, dict) or not isinstance(metrics.get("config"), dict):
        return []
    try:
        bench = get_benchmark(str(row.get("benchmark")))
        return [(h.key, h.label) for h in bench.headline(OmegaConf.create(metrics["config"]))]
    except Exception:  # a job of a benchmark this version no longer has, or an odd config
        return []


def _status(row: dict[str, Any]) -> str:
    status = escape(_fmt(row.get("status")))
    style = STATUS_STYLE.get(status, "")
    text = f"[{style}]{status}[/{style}]" if style else status
    return text + (" (resumed)" if row.get("resumed") is True else "")


def _label_width(label: str) -> int:
    return max(9, *(len(w) for w in label.split()))


def _fitting(columns: list[tuple[str, str]], width: int) -> list[tuple[str, str]]:
    room = width - FIXED_WIDTH - 4 * CELL_PAD
    chosen = []
    for key, label in columns:
        need = _label_width(label) + CELL_PAD
        if chosen and need > room:
            break
        chosen.append((key, label))
        room -= need
    return chosen


def print_summary(results: "pd.DataFrame", *, sweep_dir: Path) -> None:
    console = _console()
    rows = results.to_dict("records")
    by_benchmark: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_benchmark.setdefault(str(row.get("benchmark")), []).append(row)
    for benchmark, group in by_benchmark.items():
        heads = [_headlines(sweep_dir, row) for row in group]
        columns = list(dict.fromkeys(h for hs in heads for h in hs))
        tag_width = min(TAG_WIDTH, max(len(str(r.get("tag"))) for r in group))
        shown = _fitting(columns, console.width - tag_width)
        title = f"sweep {sweep_dir}: {benchmark}"
        if len(shown) < len(columns):
            title += f" ({len(columns) - len(shown)} more columns in results.csv)"
        table = Table(title=title)
        table.add_column("tag", overflow="fold", min_width=tag_width)
        table.add_column("status")
        table.add_column("ranks", justify="right")
        for _, label in shown:
            table.add_column(label, justify="right", overflow="fold", max_width=_label_width(label))
        table.add_column("error", overflow="fold")
        for row, hs in zip(group, heads):
            own = dict(hs)
            cells = [escape(_fmt(row.get(key))) if key in own else "" for key, _ in shown]
            table.add_row(escape(_fmt(row.get("tag"))), _status(row), _fmt(row.get("world_size")), *cells,
                          escape(_fmt(row.get("error"))))  # an error may hold "[...]"
        console.print(table)
    try:  # the answer is read back from the jobs' records: a failure here never fails the sweep
        answers = print_answer(sweep_dir, console=console)
        log_answer(sweep_dir, answers)
    except Exception as err:
        print(f"sweepbench: no ranking ({type(err).__name__}: {err})")


def print_answer(sweep_dir: Path, *, console: Console | None = None) -> list[Any]:
    """Print the ranking of every benchmark of the sweep; return the answers (``report.answer``)."""
    from sweepbench.report.answer import answer_jobs
    from sweepbench.report.load import load_sweep
    from sweepbench.report.units import format_time

    console = console or _console()
    answers = answer_jobs(load_sweep(sweep_dir).jobs)
    for a in answers:
        ranked = [r for r in a.rankings if len(r.entries) > 1]
        if not ranked and not a.failed:
            continue
        varied = ", ".join(x.name for x in a.layout.series) or "nothing"
        table = Table(title=f"fastest {a.benchmark} (ranked: {varied})", title_justify="left")
        table.add_column("where", overflow="fold")
        table.add_column("fastest", overflow="fold")
        table.add_column("runner-up", overflow="fold")
        table.add_column("gap", overflow="fold")
        for r in ranked[:MAX_RANKINGS]:
            first, second = r.entries[:2]
            table.add_row(escape(r.where), escape(f"{first.label} {format_time(first.median_s)}"),
                          escape(f"{second.label} {format_time(second.median_s)}"), escape(r.gap()))
        for job in a.failed:
            table.add_row("", escape(job["config"] or job["tag"]), f"[red]{escape(job['status'])}[/red]",
                          escape(job["error"][:60]))
        if len(ranked) > MAX_RANKINGS:
            table.caption = f"{len(ranked) - MAX_RANKINGS} more groups in report.html"
        console.print(table)
    return answers


def log_answer(sweep_dir: Path, answers: list[Any]) -> None:
    """The ranking as a wandb table of a ``fastest`` run in the sweep's group (when wandb is on and
    something was ranked)."""
    from sweepbench.record.wandb_run import log_ranking
    from sweepbench.report.answer import COLUMNS

    rows = [row for a in answers for r in a.rankings if len(r.entries) > 1 for row in r.rows()]
    jobs = [j for a in answers for r in a.rankings for e in r.entries for j in [e.job]]
    group = next((g for j in jobs if (g := (j.get("wandb") or {}).get("group"))), None)
    if rows and group:
        log_ranking(sweep_dir, group=group, wandb_cfg=jobs[0]["config"].get("wandb") or {},
                    columns=list(COLUMNS), rows=[[row[c] for c in COLUMNS] for row in rows])
