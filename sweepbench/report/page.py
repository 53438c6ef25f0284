"""The sweep report: one self-contained HTML file per sweep (or several sweeps in one page).

The page opens with the answer (``answer``): per benchmark and per value of the scales the sweep
varied, the configurations ranked, the runner-up's ratio to the winner and whether the gap is
real, and the failed jobs. What a benchmark shows is asked of the benchmark itself, through the
registry: its headline columns and metrics (``Benchmark.headline``) and its own figures
(``Benchmark.plots``). The report adds what holds for every benchmark: the headline metrics
against the axes the sweep varied (``varied``), the sweep's command and machine, the results
table, the failed jobs with their error, and every job's per-iteration times on one axis."""

from __future__ import annotations

import datetime as dt
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from omegaconf import OmegaConf

from sweepbench.draw.plotting import config_value, figure_svg
from sweepbench.draw.units import format_number
from sweepbench.record.atomic import write_atomic
from sweepbench.report.answer import Answer, answer_jobs
from sweepbench.report.hooks import compared_jobs
from sweepbench.report.load import Sweep, load_sweep
from sweepbench.report.template import render

log = logging.getLogger(__name__)

REPORT_FILE = "report.html"
CONFIG_COLUMNS = ("benchmark.name", "model.name", "parallelism.name", "backend.name", "mode.name")


@dataclass
class Cell:
    text: str
    cls: str = ""


@dataclass
class Fig:
    title: str
    svg: str
    caption: str = ""


class _Ids:
    """Unique prefixes for the SVG ids of every figure of one page."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> str:
        self.n += 1
        return f"fig{self.n}"


def fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    if isinstance(value, float):
        return format_number(value)
    return str(value)


def _benchmark(name: str | None) -> Any:
    from sweepbench.benchmarks.registry import get_benchmark

    try:
        return get_benchmark(name) if name else None
    except ValueError:  # a sweep recorded by a benchmark this install does not have
        return None


def headline_hooks(job: dict[str, Any]) -> list[Any]:
    """The job's ``Headline`` list from its benchmark's ``headline(cfg)`` ([] when it has none)."""
    bench = _benchmark(job.get("benchmark") or config_value(job, "benchmark.name"))
    if bench is not None and job.get("config"):
        try:
            return list(bench.headline(OmegaConf.create(job["config"])))
        except Exception as err:  # a hook's bug must not cost the whole report
            log.warning("headline() of %s: %s", job.get("tag"), err)
    return []


def headlines(job: dict[str, Any]) -> list[tuple[str, str]]:
    """(summary key, label) of a job: its benchmark's ``headline(cfg)``, or its first summary
    numbers when the benchmark declares none."""
    hooks = headline_hooks(job)
    if hooks:
        return [(h.key, h.label) for h in hooks]
    summary = (job.get("results") or {}).get("summary") or {}
    keys = [k for k in summary if k.endswith(("_s", "_gbps", "_per_s", "fraction_of_link"))][:3]
    return [(k, k) for k in keys]


def _tag_key_columns(jobs: Iterable[dict[str, Any]]) -> list[str]:
    cols: list[str] = []
    for job in jobs:
        bench = _benchmark(job.get("benchmark") or config_value(job, "benchmark.name"))
        for key in getattr(bench, "tag_keys", ()):
            if f"benchmark.{key}" not in cols:
                cols.append(f"benchmark.{key}")
    return cols


def results_table(jobs: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[Cell]]]:
    config_cols = [*CONFIG_COLUMNS, *_tag_key_columns(jobs)]
    heads: dict[str, str] = {}
    for job in jobs:
        for key, label in headlines(job):
            heads.setdefault(label, key)
    columns = [
        "tag",
        "status",
        *[c.split(".")[0] if c.endswith(".name") else c for c in config_cols],
        "world size",
        *heads,
        "verified",
        "wall time (s)",
        "error",
    ]
    rows = []
    for job in jobs:
        summary = (job.get("results") or {}).get("summary") or {}
        row = [Cell(str(job.get("tag"))), Cell(str(job.get("status")), str(job.get("status")))]
        row += [Cell(fmt(config_value(job, c))) for c in config_cols]
        row.append(Cell(fmt(job.get("world_size")), "num"))
        own = {label for _, label in headlines(job)}  # a label holds for the rows it labels only (@512 vs @1024)
        row += [Cell(fmt(summary.get(key)) if label in own else "", "num") for label, key in heads.items()]
        row += [
            Cell(fmt(job.get("verified"))),
            Cell(fmt(job.get("wall_time_s")), "num"),
            Cell(job.get("error") or "", "error"),
        ]
        rows.append(row)
    return columns, rows


def sweep_meta(sweep: Sweep) -> list[tuple[str, str]]:
    env = sweep.env()
    git = env.get("git") or {}
    gpus = env.get("gpus") or {}
    commit = git.get("commit") or "unknown"
    if git.get("dirty"):
        commit += " (uncommitted changes)"
    gpu_text = "none"
    if gpus.get("count"):
        names = sorted(set(gpus.get("names") or []))
        gpu_text = f"{gpus['count']} x {', '.join(names)}" + (
            f" (driver {gpus['driver']})" if gpus.get("driver") else ""
        )
    slurm = (env.get("slurm") or {}).get("job_id")
    meta = [
        ("directory", str(sweep.path)),
        ("command", sweep.command or "unknown"),
        ("date", sweep.date or "unknown"),
        ("git commit", commit),
        ("host", str(env.get("host", "unknown"))),
        ("platform", str(env.get("platform", "unknown"))),
        ("CPUs", fmt(env.get("cpu_count"))),
        ("GPUs", gpu_text),
        (
            "software",
            f"python {env.get('python')}, torch {env.get('torch')}, CUDA {env.get('cuda')}, NCCL {env.get('nccl')}",
        ),
    ]
    if slurm:
        meta.append(("SLURM job", str(slurm)))
    return meta


def benchmark_figures(name: str, jobs: list[dict[str, Any]], ids: _Ids) -> tuple[list[Fig], list[str]]:
    """The figures of the axes the sweep varied, then the benchmark's own from its ``plots``
    hook; a failing hook becomes a note."""
    from sweepbench.report.varied import axis_figures

    figs = [Fig(t, figure_svg(f, prefix=ids()), c) for t, f, c in axis_figures(jobs, headline_hooks)]
    bench = _benchmark(name)
    if bench is None:
        return figs, [f"benchmark {name!r} is not installed here: no figures of its own"]
    try:
        plots, notes = bench.plots(jobs), list(bench.report_notes(jobs))
    except Exception as err:
        log.warning("plots() of %s failed: %s", name, err)
        return figs, [f"{name}.plots() failed: {type(err).__name__}: {err}"]
    return figs + [Fig(p.title, figure_svg(p.figure, prefix=ids()), p.caption) for p in plots], notes


def distribution_figure(name: str, jobs: list[dict[str, Any]], ids: _Ids) -> list[Fig]:
    """Every job's per-iteration times of one benchmark, side by side on one axis."""
    from sweepbench.report.varied import distribution_figure as build

    built = build(jobs)
    if built is None:
        return []
    fig, caption = built
    return [Fig(f"{name}: per-iteration times", figure_svg(fig, prefix=ids()), caption)]


_GAP = {
    "slower": "real",
    "~": "maybe (the test does not agree)",
    "unchanged": "within noise",
    "unstable": "unstable (too noisy to tell)",
    "undecided": "too few rounds to decide",
}


def answer_view(answer: Answer) -> dict[str, Any]:
    """The "fastest" block of one benchmark for the template."""
    rows = []
    for r in answer.rankings:
        first, second = r.entries[0], (r.entries[1] if len(r.entries) > 1 else None)
        verdict = r.verdict.verdict if r.verdict is not None else ""
        p = r.verdict.p_value if r.verdict is not None else None
        rows.append(
            [
                Cell(r.group),
                Cell(r.case),
                Cell(first.label, "winner"),
                Cell(first.shown(), "num"),
                Cell(second.label if second else "(the only one)"),
                Cell(second.shown() if second else "", "num"),
                Cell(f"{second.median_s / first.median_s:.2f}x" if second else "", "num"),
                Cell(_GAP.get(verdict, r.note), "gap-" + (verdict.replace("~", "maybe") or "none")),
                Cell("" if p is None else (f"< {r.p_level:g}" if p < r.p_level else f"{p:.2g}"), "num"),
                Cell(r.verdict.reason if r.verdict is not None else ""),
                Cell(" < ".join(f"{e.label} {e.shown()}" for e in r.entries) if len(r.entries) > 2 else ""),
            ]
        )
    note = ""
    if rows and all(len(r.entries) < 2 for r in answer.rankings):
        alone = len({id(e.job) for r in answer.rankings for e in r.entries}) == 1
        rows, note = (
            [],
            (
                "one job ok: nothing to rank it against"
                if alone
                else "every configuration is alone in its group (only scales varied): nothing to rank"
            ),
        )
    columns = [
        "where",
        "case",
        "fastest",
        "median",
        "runner-up",
        "median",
        "ratio",
        "gap",
        "p",
        "why not decided",
        "ranking",
    ]
    keep = [i for i, c in enumerate(columns) if i not in (0, 1, 9, 10) or any(row[i].text for row in rows)]
    return {
        "name": answer.benchmark,
        "columns": [columns[i] for i in keep],
        "rows": [[row[i] for i in keep] for row in rows],
        "failed": answer.failed,
        "note": note,
        "sentences": [r.sentence() for r in answer.rankings],
        "varied": ", ".join(a.name for a in [*answer.layout.scales, *answer.layout.series]) or "nothing",
    }


def sweep_section(sweep: Sweep, ids: _Ids, answers: list[Answer] | None = None) -> dict[str, Any]:
    """The page's part of one sweep; ``answers``: its ranking where the caller made it already."""
    columns, rows = results_table(sweep.jobs)
    by_bench: dict[str, list[dict[str, Any]]] = {}
    for job in sweep.jobs:
        name = job.get("benchmark") or config_value(job, "benchmark.name")
        if name:
            by_bench.setdefault(name, []).append(job)
    benchmarks = []
    for name, jobs in by_bench.items():
        jobs = compared_jobs(jobs)  # a job whose cases move no data (a one-rank collective) is not drawn
        figures, notes = benchmark_figures(name, jobs, ids)
        benchmarks.append(
            {"name": name, "figures": figures, "notes": notes, "distributions": distribution_figure(name, jobs, ids)}
        )
    failed = [
        {"tag": j.get("tag"), "status": j.get("status"), "error": j.get("error") or "(no error recorded)"}
        for j in sweep.jobs
        if j.get("status") != "ok"
    ]
    return {
        "name": sweep.name,
        "meta": sweep_meta(sweep),
        "columns": columns,
        "rows": rows,
        "num_jobs": len(sweep.jobs),
        "num_ok": len(sweep.jobs) - len(failed),
        "failed": failed,
        "benchmarks": benchmarks,
        "answers": [answer_view(a) for a in (answers if answers is not None else answer_jobs(sweep.jobs))],
    }


def render_report(sweeps: Sequence[Sweep], answers: Sequence[list[Answer] | None] = ()) -> str:
    """The page of ``sweeps``; ``answers``: each sweep's ranking where the caller made it already."""
    ids = _Ids()
    title = f"sweepbench report: {', '.join(s.name for s in sweeps)}"
    generated = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    made = [*answers, *[None] * (len(sweeps) - len(answers))]
    sections = [sweep_section(s, ids, a) for s, a in zip(sweeps, made)]
    return render("report.html", title=title, generated=generated, sweeps=sections)


def write_report(
    paths: Sequence[str | Path],
    out: str | Path | None = None,
    *,
    sweeps: Sequence[Sweep] | None = None,
    answers: Sequence[list[Answer] | None] = (),
) -> Path:
    """Render the report of one or more sweeps; by default ``<first sweep>/report.html``.
    ``sweeps``: the sweeps of ``paths`` where the caller loaded them already; ``answers``: each
    sweep's ranking where the caller made it already."""
    sweeps = sweeps if sweeps is not None else [load_sweep(p) for p in paths]
    out = Path(out) if out else Path(paths[0]) / REPORT_FILE
    write_atomic(out, render_report(sweeps, answers))
    return out


def write_sweep_report(
    sweep_dir: str | Path, *, sweep: Sweep | None = None, answers: list[Answer] | None = None
) -> Path:
    """The end-of-sweep report (``<sweep>/report.html``), called by the sweep driver with the
    sweep and its ranking as it made them (else they are read and made here)."""
    out = Path(sweep_dir) / REPORT_FILE
    write_atomic(out, render_report([sweep if sweep is not None else load_sweep(sweep_dir)], [answers]))
    return out
