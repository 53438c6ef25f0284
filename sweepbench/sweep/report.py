"""What a person sees in the terminal: the dry-run plan and the end-of-sweep summary (rich).

The summary has one table per benchmark, its metric columns the benchmark's own ``headline(cfg)``
(labels with units and the size they refer to), as many as fit the terminal's width (rich's
Console: the terminal, else ``COLUMNS``, else 80); the rest are in results.csv. A number is never
cut: a column is as wide as its widest value. A column's label holds for every row: where the
jobs' labels differ in the size they refer to (``@512 tokens``, ``@1024 tokens``), each cell
names its own. A job skipped because it was already done reads ``ok (resumed)``.

Output that is not a terminal (a pipe, a file, a CI log) gets plain lines instead of tables: one
per job of the plan, one per job of the summary (every headline number with its own label), one
per ranking.

Then the sweep's answer (``sweepbench.report.answer``): per benchmark, the fastest configuration
of each group, named by the axes the sweep varied (not by its long tag), its runner-up and
whether the gap is real, in the terminal's width; the same ranking goes to wandb as a table of a
``fastest`` run in the sweep's group."""

from __future__ import annotations

import logging
import math
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, cast

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sweepbench.draw.units import format_number
from sweepbench.record.readback import SweepRecords, read_sweep

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)
MAX_RANKINGS = 12  # rows of the terminal's ranking per benchmark (the page has them all)
STATUS_STYLE = {"ok": "green", "failed": "red", "timeout": "red", "interrupted": "yellow", "skipped": "yellow"}
RANKS_WIDTH, ERROR_WIDTH = 5, 10  # the ranks column; the least an error column folds into
TAG_WIDTH = 44  # a default tag fits on one line up to this
MIN_TAG_WIDTH = 16  # narrower, a tag folds into too many lines; the headline columns give way first
CELL_PAD = 3  # rich's padding and border per column


def _console() -> Console:
    return Console()


def job_command(job: Any, *, sweep_dir: Path, hydra_overrides: Iterable[str] = ()) -> str:
    """The command that runs this job alone, into the same sweep directory (a dry run's own
    switch left out)."""
    overrides = [o for o in job.overrides if not o.startswith("sweep.dry_run=")]
    hydra = [o for o in hydra_overrides if not o.startswith(("hydra.sweep.dir=", "hydra.mode="))]
    return shlex.join(["python", "-m", "sweepbench", *overrides, *hydra, f"hydra.sweep.dir={sweep_dir}"])


def plain(console: Console) -> bool:
    """Plain lines instead of tables: output that is not a terminal (a pipe, a file, a CI log)."""
    return not console.is_terminal


def print_plan(jobs: Iterable[Any], *, sweep_dir: Path, hydra_overrides: Iterable[str] = ()) -> None:
    """The dry run: on a terminal a table, then each job's command and fit; elsewhere one line per
    job (tag, ranks, backend, fits here, command)."""
    jobs = list(jobs)
    console = _console()
    if plain(console):
        print(f"dry run: {sweep_dir} (no rank started); {len(jobs)} jobs, one per line:")
        for job in jobs:
            fits = "no: " + job.fit if job.fit else "yes"
            print(
                f"  {job.tag}: {job.world_size} ranks, backend {_backend(job)}, fits here: {fits}; alone: "
                f"{job_command(job, sweep_dir=sweep_dir, hydra_overrides=hydra_overrides)}"
            )
    else:
        table = Table(title=f"dry run: {sweep_dir} (no rank started)")
        table.add_column("tag", overflow="fold")
        for col in ("ranks", "benchmark", "model", "parallelism", "backend", "mode", "fits here"):
            table.add_column(col)
        for job in jobs:
            c = job.cfg
            table.add_row(
                job.tag,
                str(job.world_size),
                c.benchmark.name,
                c.model.name,
                c.parallelism.name,
                _backend(job),
                c.mode.name,
                "no (see below)" if job.fit else "yes",
            )
        console.print(table)
        print(f"{len(jobs)} jobs; each alone:")
        for job in jobs:
            print(f"  {job.tag}\n    {job_command(job, sweep_dir=sweep_dir, hydra_overrides=hydra_overrides)}")
            print(f"    fits here: {'no: ' + job.fit if job.fit else 'yes'}")
    misfits = sum(1 for job in jobs if job.fit)
    if misfits:
        print(
            f"{misfits} of {len(jobs)} jobs would not run from this machine (fit notes above); "
            f"a real run here skips them (sweep.on_unfit=refuse: refuses the sweep)"
        )


def _backend(job: Any) -> str:
    """The backend column: ``auto -> gloo`` where this machine resolved it."""
    asked, used = str(job.cfg.backend.name), getattr(job, "backend", "")
    return f"{asked} -> {used}" if used and used != asked else asked


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))  # a count read back from results.csv as a float (a column with blanks)
    return format_number(value) if isinstance(value, float) else str(value)


def _headlines(records: SweepRecords, row: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, label) of the job's headline columns, from its benchmark's hook and its config."""
    from omegaconf import DictConfig, OmegaConf

    from sweepbench.benchmarks.registry import get_benchmark

    metrics = records.metrics(str(row.get("tag")))
    if not isinstance(metrics, dict) or not isinstance(metrics.get("config"), dict):
        return []
    try:
        bench = get_benchmark(str(row.get("benchmark")))
        cfg = cast(DictConfig, OmegaConf.create(metrics["config"]))  # made from a dict
        return [(h.key, h.label) for h in bench.headline(cfg)]
    except Exception:  # a job of a benchmark this version no longer has, or an odd config
        return []


def _status(row: dict[str, Any]) -> str:
    status = escape(_fmt(row.get("status")))
    style = STATUS_STYLE.get(status, "")
    text = f"[{style}]{status}[/{style}]" if style else status
    return text + (" (resumed)" if row.get("resumed") is True else "")


def _status_text(row: dict[str, Any]) -> str:
    return _fmt(row.get("status")) + (" (resumed)" if row.get("resumed") is True else "")


def _label_width(label: str) -> int:
    return max(9, *(len(w) for w in label.split()))


def _split_at(label: str) -> tuple[str, str]:
    """ "busbw GB/s @1 KiB" -> ("busbw GB/s", "@1 KiB"): a label and the size it refers to."""
    base, at, size = label.partition(" @")
    return base, (at.strip() + size) if at else ""


def _column_labels(heads: list[list[tuple[str, str]]]) -> tuple[list[tuple[str, str]], set[str]]:
    """One column per headline key, labelled so that the label holds for every row it labels:
    where the rows' labels differ only in the size they refer to, the column keeps the common
    part and each cell says its own size. Returns the columns and the keys whose cells do."""
    labels: dict[str, set[str]] = {}
    for hs in heads:
        for key, label in hs:
            labels.setdefault(key, set()).add(label)
    columns, per_row = [], set()
    for key, seen in labels.items():
        if len(seen) == 1:
            columns.append((key, next(iter(seen))))
            continue
        bases = {_split_at(label)[0] for label in seen}
        columns.append((key, bases.pop() if len(bases) == 1 else key))
        per_row.add(key)
    return columns, per_row


def _cell(row: dict[str, Any], key: str, own: dict[str, str], per_row: set[str]) -> str:
    if key not in own:
        return ""
    value = _fmt(row.get(key))
    size = _split_at(own[key])[1] if key in per_row else ""
    return f"{value} {size}" if value and size else value


def _value_width(group: list[dict[str, Any]], heads: list[list[tuple[str, str]]], key: str, per_row: set[str]) -> int:
    return max((len(_cell(row, key, dict(hs), per_row)) for row, hs in zip(group, heads)), default=0)


def _fitting(columns: list[tuple[str, str]], room: int, widths: dict[str, int]) -> list[tuple[str, str]]:
    """The headline columns, in order, that fit ``room`` characters whole."""
    chosen = []
    for key, label in columns:
        need = max(_label_width(label), widths.get(key, 0)) + CELL_PAD
        if need > room:
            break
        chosen.append((key, label))
        room -= need
    return chosen


def print_summary(
    results: "pd.DataFrame",
    *,
    sweep_dir: Path,
    records: SweepRecords | None = None,
    answers: "list[Any] | Exception | None" = None,
) -> None:
    """Per benchmark: on a terminal a table of the headline columns that fit its width (a number
    is never cut: its column is as wide as its widest value); elsewhere one line per job with
    every headline number and its label. Then the ranking. ``records`` (the jobs' records) and
    ``answers`` (their ranking, or why there is none) as this command already has them, else they
    are read and ranked here."""
    console = _console()
    records = records if records is not None else read_sweep(sweep_dir)
    rows = results.to_dict("records")
    by_benchmark: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_benchmark.setdefault(str(row.get("benchmark")), []).append(row)
    for benchmark, group in by_benchmark.items():
        heads = [_headlines(records, row) for row in group]
        if plain(console):
            _print_plain(group, heads, title=f"sweep {sweep_dir}: {benchmark}")
            continue
        columns, per_row = _column_labels(heads)
        widths = {key: _value_width(group, heads, key, per_row) for key, _ in columns}
        status_width = max(len(_status_text(r)) for r in group)
        fixed = status_width + RANKS_WIDTH + ERROR_WIDTH + 4 * CELL_PAD + 1  # and the tag's padding
        tags = max(len(str(r.get("tag"))) for r in group)
        shown = _fitting(columns, console.width - fixed - min(tags, MIN_TAG_WIDTH), widths)
        used = sum(max(_label_width(label), widths[key]) + CELL_PAD for key, label in shown)
        tag_width = max(MIN_TAG_WIDTH, min(TAG_WIDTH, tags, console.width - fixed - used))
        title = f"sweep {sweep_dir}: {benchmark}"
        if len(shown) < len(columns):
            title += f" ({len(columns) - len(shown)} more columns in results.csv)"
        table = Table(title=title)
        error_width = max(ERROR_WIDTH, console.width - fixed + ERROR_WIDTH - used - tag_width)
        table.add_column("tag", overflow="fold", width=tag_width)
        table.add_column("status", no_wrap=True, min_width=status_width)
        table.add_column("ranks", justify="right", no_wrap=True, min_width=RANKS_WIDTH)
        for key, label in shown:  # as wide as its widest value: a number is never folded or cut
            table.add_column(label, justify="right", overflow="fold", width=max(_label_width(label), widths[key]))
        table.add_column("error", overflow="fold", width=error_width)
        for row, hs in zip(group, heads):
            own = dict(hs)
            cells = [escape(_cell(row, key, own, per_row)) for key, _ in shown]
            table.add_row(
                escape(_fmt(row.get("tag"))),
                _status(row),
                _fmt(row.get("world_size")),
                *cells,
                escape(_fmt(row.get("error"))),
            )  # an error may hold "[...]"
        console.print(table)
    try:  # the answer is read back from the jobs' records: a failure here never fails the sweep
        if isinstance(answers, Exception):
            raise answers
        log_answer(sweep_dir, print_answer(sweep_dir, console=console, answers=answers))
    except Exception as err:
        print(f"sweepbench: no ranking ({type(err).__name__}: {err})")


def _print_plain(group: list[dict[str, Any]], heads: list[list[tuple[str, str]]], *, title: str) -> None:
    """One line per job: tag, status (and ranks), each headline number with its own label (its
    unit and size), or the error."""
    print(title)
    for row, hs in zip(group, heads):
        status = _fmt(row.get("status")) + (" (resumed)" if row.get("resumed") is True else "")
        numbers = "; ".join(f"{label} {_fmt(row.get(key))}" for key, label in hs if _fmt(row.get(key)))
        error = _fmt(row.get("error"))
        tail = "; ".join(filter(None, [numbers, error]))
        print(
            f"  {_fmt(row.get('tag'))}: {status}, {_fmt(row.get('world_size'))} ranks" + (f": {tail}" if tail else "")
        )


def print_answer(sweep_dir: Path, *, console: Console | None = None, answers: list[Any] | None = None) -> list[Any]:
    """Print the ranking of every benchmark of the sweep (``answers``, else ranked here); return
    the answers (``report.answer``)."""
    from sweepbench.report.answer import answer_jobs
    from sweepbench.report.load import load_sweep

    console = console or _console()
    answers = answers if answers is not None else answer_jobs(load_sweep(sweep_dir).jobs)
    for a in answers:
        ranked = [r for r in a.rankings if len(r.entries) > 1]
        if not ranked and not a.failed:
            continue
        varied = ", ".join(x.name for x in a.layout.series) or "nothing"
        if plain(console):
            print(f"fastest {a.benchmark} (ranked: {varied}):")
            for r in ranked:
                first, second = r.entries[:2]
                print(
                    f"  {r.where}: {first.label} {first.shown()}; runner-up {second.label} {second.shown()}; {r.gap()}"
                )
            for job in a.failed:  # apart from the ranking: a job that did not finish ok is never ranked
                print(f"  not ranked: {job['config'] or job['tag']} {job['status']}: {job['error']}")
            continue
        table = Table(title=f"fastest {a.benchmark} (ranked: {varied})", title_justify="left")
        table.add_column("where", overflow="fold")
        table.add_column("fastest", overflow="fold")
        table.add_column("runner-up", overflow="fold")
        table.add_column("gap", overflow="fold")
        for r in ranked[:MAX_RANKINGS]:
            first, second = r.entries[:2]
            table.add_row(
                escape(r.where),
                escape(f"{first.label} {first.shown()}"),
                escape(f"{second.label} {second.shown()}"),
                escape(r.gap()),
            )
        if len(ranked) > MAX_RANKINGS:
            table.caption = f"{len(ranked) - MAX_RANKINGS} more groups in report.html"
        if ranked:
            console.print(table)
        for job in a.failed:  # apart from the ranking: a job that did not finish ok is never ranked
            console.print(
                f"  not ranked: {escape(job['config'] or job['tag'])} [red]{escape(job['status'])}[/red]: "
                f"{escape(job['error'][:120])}",
                soft_wrap=False,
                highlight=False,
            )
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
        log_ranking(
            sweep_dir,
            group=group,
            wandb_cfg=jobs[0]["config"].get("wandb") or {},
            columns=list(COLUMNS),
            rows=[[row[c] for c in COLUMNS] for row in rows],
        )
