"""The figures every benchmark gets from the report engine, keyed by what its sweep varied
(``axes``): each headline metric against the scale the sweep varied (one line per value of the
categorical axes, one panel per value of the other scales), and every job's per-iteration times
side by side on one common axis.

The benchmark says which metrics matter (its ``headline(cfg)``) and which way is better
(``Headline.better``, else read from the key's unit); the axes come from the jobs' configs."""

from __future__ import annotations

import math
from typing import Any, Sequence

from matplotlib.figure import Figure

from sweepbench.report.axes import Layout, label, layout, sortable
from sweepbench.report.cases import case_labels

MAX_METRICS = 2  # headline metrics drawn against the varied axes
MAX_ROWS = 40  # rows of the per-iteration figure (the slowest cases first)
_LOWER = ("_s", "_ms", "_us", "_bytes", "_gib", "_fraction")
_HIGHER = ("gbps", "per_s", "efficiency", "tflops", "mfu", "fraction_of_link", "speedup")


def better(key: str, declared: str = "") -> str:
    """``lower`` / ``higher`` (is better) for a metric key, or "" when neither is known."""
    if declared in ("lower", "higher"):
        return declared
    if any(m in key for m in _HIGHER):
        return "higher"
    return "lower" if key.endswith(_LOWER) else ""


def _metrics(jobs: Sequence[dict[str, Any]], hooks: Any) -> list[tuple[str, str, str]]:
    """(key, label without its "@size" part, better) of the benchmark's headline metrics: its
    first, then its first of the other direction (a time and a rate, rather than a time and its IQR)."""
    seen: dict[str, tuple[str, str, str]] = {}
    for job in jobs:
        for head in hooks(job):
            way = better(head.key, getattr(head, "better", ""))
            if way and head.key not in seen:
                seen[head.key] = (head.key, head.label.split(" @")[0], way)
    ordered = list(seen.values())
    chosen = ordered[:1] + [m for m in ordered[1:] if ordered and m[2] != ordered[0][2]][:1]
    chosen += [m for m in ordered if m not in chosen]
    return chosen[:MAX_METRICS]


def _in_ms(key: str, name: str) -> tuple[float, str]:
    """Seconds read better as ms in a figure: (scale, label)."""
    if not key.endswith("_s"):
        return 1.0, name
    return 1e3, (name[:-2] + " ms") if name.endswith(" s") else f"{name} (ms)"


def _powers_of_two(values: Sequence[float]) -> bool:
    return len(values) > 2 and all(v > 0 and math.log2(v).is_integer() for v in values)


def axis_figures(jobs: Sequence[dict[str, Any]], hooks: Any) -> list[tuple[str, Figure, str]]:
    """(title, figure, caption) per headline metric against the varied axes; none when nothing
    varied or fewer than two jobs are ok. ``hooks(job)`` gives the job's ``Headline`` list."""
    from sweepbench.draw.plotting import axis_plot, bar_plot

    lay: Layout = layout(jobs)
    ok = [j for j in jobs if j.get("status") == "ok" and j.get("results")]
    if len(ok) < 2 or (lay.x is None and not lay.series):  # one point is no chart of what varied
        return []
    figs = []
    for key, name, way in _metrics(ok, hooks):
        scale, name = _in_ms(key, name)
        raw = [(j, (j["results"].get("summary") or {}).get(key)) for j in ok]
        values = [(j, scale * v) for j, v in raw if isinstance(v, (int, float)) and math.isfinite(v)]
        if not values:
            continue
        note = f"{way} is better"
        if lay.x is None:
            bars = {lay.series_label(j): v for j, v in values}
            figs.append(
                (
                    f"{name} per {', '.join(a.name for a in lay.series)}",
                    bar_plot(bars, ylabel=name),
                    f"{note}; one bar per configuration the sweep varied",
                )
            )
            continue
        panels: dict[str, dict[str, list[tuple[float, float]]]] = {}
        for job, v in values:
            series = lay.series_label(job) if lay.series else name
            panels.setdefault(lay.facet_label(job), {}).setdefault(series, []).append((float(lay.x.value(job)), v))
        xs = sorted({float(lay.x.value(j)) for j, _ in values})
        lines = f"one line per {', '.join(a.name for a in lay.series)}" if lay.series else "one line"
        facets = f"; one panel per {', '.join(a.name for a in lay.facets)}" if lay.facets else ""
        figs.append(
            (
                f"{name} vs {lay.x.name}",
                axis_plot(
                    panels,
                    xlabel=lay.x.name,
                    ylabel=name,
                    log2_x=_powers_of_two(xs),
                    bytes_x=lay.x.key.endswith("_bytes"),
                ),
                f"{note}; x: {lay.x.name} (the scale the sweep varied), {lines}{facets}",
            )
        )
    return figs


def distribution_figure(jobs: Sequence[dict[str, Any]]) -> tuple[Figure, str] | None:
    """Every ok job's per-iteration times on one axis (a row per job, and per case when a job
    measures several), labelled by the axes that vary; at most ``MAX_ROWS`` rows, the slowest."""
    from sweepbench.draw.plotting import strip_plot

    lay = layout(jobs)
    every = [*lay.scales, *lay.series]
    rows: list[tuple[str, list[float], float]] = []
    for job in sorted(jobs, key=lambda j: tuple(sortable(a.value(j)) for a in [*lay.series, *lay.scales])):
        cases = [c for c in ((job.get("results") or {}).get("cases") or []) if c.get("times_s")]
        if job.get("status") != "ok" or not cases:
            continue
        name = label(job, every) if every else str(job.get("tag"))
        labels = case_labels(cases) if len(cases) > 1 else [""]
        for case_label, case in zip(labels, cases):
            times = [float(t) for t in case["times_s"]]
            rows.append((" ".join(p for p in (name, case_label) if p), times, sorted(times)[len(times) // 2]))
    if not rows:
        return None
    caption = f"{len(rows)} rows"
    if len(rows) > MAX_ROWS:  # the slowest cases: where noise costs the most
        keep = set(sorted(range(len(rows)), key=lambda i: -rows[i][2])[:MAX_ROWS])
        caption = f"the {MAX_ROWS} slowest of {len(rows)} rows"
        rows = [r for i, r in enumerate(rows) if i in keep]
    samples: dict[str, list[float]] = {}
    for name, times, _ in rows:
        samples.setdefault(name, []).extend(times)
    return strip_plot(samples), caption
