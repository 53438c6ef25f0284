"""``sweepbench report SWEEP --wandb``: a saved wandb workspace view of a sweep (wandb-workspaces,
the optional extra ``pip install "sweepbench[workspaces]"``).

The view's run set is filtered to the sweep's group, grouped by the config keys the sweep varied.
It opens, per benchmark, with the chart of the axes the sweep varied (``axes``: the benchmark's
first headline metric against the scale that varied, a scatter of the runs coloured by group,
or a bar per configuration when only categorical axes varied) and the sweep's answer (the
"fastest" ranking of the report page, as Markdown). Then each benchmark gets a section: line panels of its per-case history (busbw over message size, ...,
the same column rules as the runs' own custom charts), a bar panel of its headline numbers and a
parallel-coordinates panel from the swept keys to the headlines; a baseline run can be pinned.
The spec is built without a network (``build_workspace``); only ``publish_workspace`` talks to
wandb, and only when logged in and online."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from sweepbench.record.wandb_run import CHARTS, flatten, group_name
from sweepbench.report.load import Sweep
from sweepbench.report.page import headlines

# config keys that never define a job (they steer output), left out of "what the sweep varied"
_NOT_SWEPT = ("hydra.", "wandb.", "launch.", "sweep.")
_RUN_ID = re.compile(r"(?:offline-)?run-\d{8}_\d{6}-(\w+)$")


def _import_workspaces() -> tuple[Any, Any]:
    try:
        import wandb_workspaces.reports.v2 as wr
        import wandb_workspaces.workspaces as ws
    except ImportError:
        raise ValueError('--wandb needs wandb-workspaces: pip install "sweepbench[workspaces]"') from None
    return ws, wr


def sweep_group(sweep: Sweep) -> str:
    """The wandb group the sweep's runs were logged to, as their metrics.json recorded it (else, for
    sweeps recorded before it was, made again from the path and host as ``wandb_run.group_name`` did)."""
    recorded = [g for j in sweep.jobs if (g := (j.get("wandb") or {}).get("group"))]
    if recorded:
        return recorded[0]
    env = sweep.env()
    machine = (env.get("environment") or {}).get("SLURM_CLUSTER_NAME") or env.get("host")
    return group_name(sweep.path, machine=machine)


def swept_keys(sweep: Sweep) -> list[str]:
    """Flattened config keys whose value differs between the sweep's jobs."""
    configs = [flatten(j["config"]) for j in sweep.jobs if j.get("config")]
    keys = sorted({k for c in configs for k in c if not k.startswith(_NOT_SWEPT)})
    return [k for k in keys if len({repr(c.get(k)) for c in configs}) > 1]


def run_id(job: dict[str, Any]) -> str | None:
    """The wandb run id of a job, from its run directory's name (``offline-run-<date>_<time>-<id>``)."""
    run_dir = ((job.get("wandb") or {}).get("dir")) or ""
    match = _RUN_ID.search(Path(run_dir).name)
    return match.group(1) if match else None


def varied_section(ws: Any, wr: Any, bench: str, jobs: list[dict[str, Any]], answer: Any = None) -> Any:
    """The section the view opens with: the chart of the axes the sweep varied, and its answer
    (``answer``: the benchmark's ranking where the caller made it already)."""
    from sweepbench.report.answer import answer_benchmark
    from sweepbench.report.axes import WORLD, layout
    from sweepbench.report.page import headline_hooks
    from sweepbench.report.varied import better

    lay = layout(jobs)
    heads = [h for j in jobs for h in headline_hooks(j) if better(h.key, h.better)]
    panels: list[Any] = []
    if heads and (lay.x is not None or lay.series):
        metric, name = heads[0].key, heads[0].label.split(" @")[0]
        if lay.x is not None:
            x = wr.SummaryMetric(WORLD) if lay.x.key == WORLD else wr.Config(lay.x.key)
            panels.append(
                wr.ScatterPlot(
                    title=f"{name} vs {lay.x.name}", x=x, y=wr.SummaryMetric(metric), log_x=lay.x.key.endswith("_bytes")
                )
            )
        else:
            panels.append(
                wr.BarPlot(
                    title=f"{name} per {', '.join(a.name for a in lay.series)}",
                    metrics=[wr.SummaryMetric(metric)],
                    groupby=wr.Config(lay.series[0].key),
                )
            )
    answer = answer if answer is not None else answer_benchmark(bench, jobs)
    lines = [f"- {r.sentence()}" for r in answer.rankings if len(r.entries) > 1]
    lines += [f"- failed: {j['config'] or j['tag']} ({j['status']})" for j in answer.failed]
    if lines:
        panels.append(wr.MarkdownPanel(markdown=f"**Fastest {bench}**\n\n" + "\n".join(lines)))
    return ws.Section(name=f"{bench}: what the sweep varied", panels=panels, is_open=True)


def build_workspace(
    sweep: Sweep, *, entity: str, project: str, baseline: str | None = None, answers: list[Any] | None = None
) -> Any:
    """The workspace view of ``sweep`` (a ``wandb_workspaces.workspaces.Workspace``); ``answers``:
    the sweep's ranking (one answer per benchmark) where the caller made it already."""
    ws, wr = _import_workspaces()
    group = sweep_group(sweep)
    swept = swept_keys(sweep)
    sections = []
    by_bench: dict[str, list[dict[str, Any]]] = {}
    for job in sweep.jobs:
        if job.get("benchmark"):
            by_bench.setdefault(job["benchmark"], []).append(job)
    made = {a.benchmark: a for a in answers or []}
    for bench, jobs in sorted(by_bench.items()):
        sections.append(varied_section(ws, wr, bench, jobs, made.get(bench)))
    for bench, jobs in sorted(by_bench.items()):
        columns = {k for j in jobs for c in (j.get("results") or {}).get("cases", []) for k in c}
        heads = list(dict.fromkeys(key for j in jobs for key, _ in headlines(j)))
        panels: list[Any] = [
            wr.LinePlot(title=f"{c.y} vs {c.x}", x=c.x, y=[c.y], log_x=c.x.endswith("_bytes"))
            for c in CHARTS
            if c.kind == "line" and {c.x, c.y} <= columns
        ]
        if heads:
            panels.append(wr.BarPlot(title=f"{bench} headline", metrics=heads[:8]))
            panels.append(
                wr.ParallelCoordinatesPlot(
                    title=f"{bench}: swept keys -> headline",
                    columns=[
                        *(wr.ParallelCoordinatesPlotColumn(metric=wr.Config(k)) for k in swept),
                        *(wr.ParallelCoordinatesPlotColumn(metric=wr.SummaryMetric(h)) for h in heads[:4]),
                    ],
                )
            )
        sections.append(ws.Section(name=bench, panels=panels, is_open=True))
    pinned = None
    if baseline:
        match = [j for j in sweep.jobs if j.get("tag") == baseline]
        if not match or run_id(match[0]) is None:
            raise ValueError(f"--baseline {baseline!r} is not the tag of a job of {sweep.path} with a wandb run")
        pinned = run_id(match[0])
    return ws.Workspace(
        entity=entity,
        project=project,
        name=f"sweepbench {group}"[:120],
        sections=sections,
        runset_settings=ws.RunsetSettings(
            filters=[ws.Metric("Group") == group],
            groupby=[ws.Config(k) for k in swept],
            baseline_run=pinned,
            pinned_runs=[pinned] if pinned else [],
        ),
    )


def _project(sweep: Sweep) -> tuple[str | None, str]:
    cfg: dict[str, Any] = next((j["config"] for j in sweep.jobs if j.get("config")), {})
    w = cfg.get("wandb") or {}
    return w.get("entity"), w.get("project") or "sweepbench"


def publish_workspace(sweep: Sweep, *, baseline: str | None = None, answers: list[Any] | None = None) -> int:
    """Save the view in wandb; offline (or not logged in) say so and do nothing else."""
    entity, project = _project(sweep)
    mode = os.environ.get("WANDB_MODE") or "online"
    if mode in ("offline", "disabled", "dryrun"):
        print(
            f"sweepbench: WANDB_MODE={mode}: publishing a workspace needs wandb online and a login "
            f"(`wandb login`, then `wandb sync {sweep.path}/*/wandb/offline-run-* "
            f"{sweep.path}/.fastest/wandb/offline-run-*`); nothing was published",
            file=sys.stderr,
        )
        return 0
    import wandb

    try:  # without a login (no WANDB_API_KEY, no `wandb login`) wandb's Api raises UsageError
        api = wandb.Api(timeout=20)
        api_key = os.environ.get("WANDB_API_KEY") or api.api_key
    except wandb.errors.UsageError:
        api_key = None
    if not api_key:
        print(
            "sweepbench: publishing a workspace needs a wandb login (`wandb login`); nothing was published",
            file=sys.stderr,
        )
        return 0
    entity = entity or api.default_entity
    assert entity is not None, "wandb knows no default entity of this login"  # a logged-in user has one
    view = build_workspace(sweep, entity=entity, project=project, baseline=baseline, answers=answers).save()
    print(f"sweepbench: workspace view saved: {view.url}")
    return 0
