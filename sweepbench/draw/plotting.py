"""Matplotlib helpers that benchmark plugins call from their ``plots()`` hook, and that the report
engine uses for its own figures (per-iteration distributions, compare's ratio heatmap).

Every helper returns a ``matplotlib.figure.Figure`` built without pyplot: no global figure state,
no GUI backend, safe in a headless driver process and never kept alive by pyplot's registry.
Figures are rendered to SVG by :func:`figure_svg` and inlined in the HTML report.

Typical use in a plugin (import inside ``plots()``, never at module level)::

    @classmethod
    def plots(cls, jobs):
        from sweepbench.draw.plotting import line_plot, ok_cases
        series = {}
        for job, case in ok_cases(jobs):
            series.setdefault(case["op"], []).append((case["size_bytes"], case["busbw_gbps"]))
        return [Plot("busbw", line_plot(series, xlabel="message size", ylabel="busbw (GB/s)",
                                        log2_x=True, bytes_x=True))]
"""

from __future__ import annotations

import io
import math
import re
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
from matplotlib.colors import Normalize, TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from sweepbench.draw.units import format_bytes

Points = Sequence[tuple[float, float]]  # (x, y) pairs; sorted by x when drawn


def ok_jobs(jobs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The jobs whose results count (status ok); failed ones are listed by the report itself."""
    return [j for j in jobs if j.get("status") == "ok" and j.get("results")]


def ok_cases(jobs: Iterable[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(job, case) for every measured case of every ok job."""
    for job in ok_jobs(jobs):
        for case in job["results"].get("cases", []):
            yield job, case


def config_value(job: dict[str, Any], dotted: str, default: Any = None) -> Any:
    """A value of a job's resolved config by dotted key (``parallelism.name``)."""
    node: Any = job.get("config", {})
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def new_figure(width: float = 6.4, height: float = 3.6) -> Figure:
    return Figure(figsize=(width, height), layout="constrained")


def _log10_axis(axis: Any, lo: float, hi: float) -> None:
    """A base-10 log axis for data from ``lo`` to ``hi`` (> 0), labelled in plain numbers (0.2, 1,
    50): at 1-2-5 steps where it spans up to 3 decades, at powers of ten beyond; minor ticks
    unlabelled. (matplotlib's default names minor ticks in scientific notation where an axis spans
    a decade or two, and 3x10^-1 and 4x10^-1 are then written over each other.)"""
    decades = math.log10(hi / lo) if 0 < lo < hi else 1.0
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= 3 else (1.0,)))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _bytes_axis(axis: Any) -> None:
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: format_bytes(v)))


def line_plot(
    series: Mapping[str, Points],
    *,
    title: str = "",
    xlabel: str,
    ylabel: str,
    log2_x: bool = False,
    bytes_x: bool = False,
    log_y: bool = False,
    ceiling: float | Mapping[str, float] | None = None,
    ceiling_label: str = "link ceiling",
    ideal: Points | None = None,
    ideal_label: str = "ideal",
    width: float = 6.4,
    height: float = 3.6,
) -> Figure:
    """One line (with markers) per series. ``log2_x``: a base-2 log x axis (message sizes, GPU
    counts); ``bytes_x``: x tick labels as sizes (KiB, MiB). ``ceiling``: a horizontal dotted
    line (or one per label, e.g. each world size's measured link), drawn so that a measurement
    can be read against its bound. ``ideal``: a dashed reference curve (linear scaling)."""
    fig = new_figure(width, height)
    ax = fig.add_subplot()
    for label, points in series.items():
        pts = sorted(points)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=label)
    if ideal:
        pts = sorted(ideal)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], linestyle="--", color="0.35", label=ideal_label)
    ceilings = {ceiling_label: ceiling} if isinstance(ceiling, (int, float)) else dict(ceiling or {})
    for i, (label, value) in enumerate(ceilings.items()):
        if value is not None and math.isfinite(value) and value > 0:
            ax.axhline(value, linestyle=":", linewidth=1.2, color=f"C{(i + 5) % 10}", label=label)
    if log2_x:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(LogLocator(base=2 ** (2 if bytes_x else 1)))
    if bytes_x:
        _bytes_axis(ax.xaxis)
    if log_y:
        ax.set_yscale("log")
        ys = [p[1] for pts in series.values() for p in pts if p[1] > 0]
        ys += [v for v in ceilings.values() if v is not None and math.isfinite(v) and v > 0]
        if ys:
            _log10_axis(ax.yaxis, min(ys), max(ys))
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    return fig


def _wrap(label: str, width: int = 28) -> str:
    """A long tick label on several lines (at spaces), so that it never runs into its neighbour."""
    import textwrap

    return "\n".join(textwrap.wrap(label, width, break_on_hyphens=False)) or label


def bar_plot(
    values: Mapping[str, float],
    *,
    title: str = "",
    ylabel: str,
    floor: Mapping[str, float] | None = None,
    floor_label: str = "link floor",
    annotations: Mapping[str, str] | None = None,
    width: float = 6.4,
    height: float = 3.6,
) -> Figure:
    """One horizontal bar per label (labels on the y axis, wrapped: they never overlap however
    many or long they are); ``floor`` marks each bar's bound (a short black line),
    ``annotations`` writes a note at the end of a bar (e.g. ``0.42 of link``). ``ylabel`` names
    the value (drawn along the bars)."""
    labels = list(values)
    lines = sum(_wrap(k).count("\n") + 1 for k in labels)
    fig = new_figure(width, max(height if len(labels) > 3 else 2.4, 1.2 + 0.2 * lines + 0.12 * len(labels)))
    ax = fig.add_subplot()
    ys = range(len(labels))
    ax.barh(ys, [values[k] for k in labels], color="C0", height=0.6, label=ylabel)
    if floor:
        marked = [i for i, k in enumerate(labels) if floor.get(k) is not None]
        ax.vlines(
            [floor[labels[i]] for i in marked],
            [i - 0.4 for i in marked],
            [i + 0.4 for i in marked],
            colors="black",
            linewidth=2,
            label=floor_label,
        )
    for i, k in enumerate(labels):
        if annotations and k in annotations:
            ax.annotate(" " + annotations[k], (values[k], i), ha="left", va="center", fontsize="x-small")
    if annotations:
        ax.margins(x=0.25)  # room for the notes right of the longest bar
    ax.set_yticks(list(ys), [_wrap(k) for k in labels], fontsize="small")
    ax.set_ylim(len(labels) - 0.5, -0.5)  # first label on top, as listed
    ax.set(title=title, xlabel=ylabel)
    ax.grid(True, axis="x", alpha=0.3)
    if floor:
        ax.legend(fontsize="small", loc="lower right", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return fig


def heatmap(
    values: Sequence[Sequence[float | None]],
    *,
    rows: Sequence[str],
    cols: Sequence[str],
    title: str = "",
    xlabel: str = "",
    ylabel: str = "",
    cbar_label: str = "",
    center: float | None = None,
    cmap: str | None = None,
    fmt: str = "{:.3g}",
    width: float | None = None,
    height: float | None = None,
) -> Figure:
    """A rows x cols grid of numbers (None/NaN = no measurement, left blank), each cell written
    out. ``center``: a diverging scale centred on that value (compare's ratios: 1 = unchanged,
    red = slower/above, blue = faster/below)."""
    grid = [[math.nan if v is None else float(v) for v in row] for row in values]
    finite = [v for row in grid for v in row if math.isfinite(v)]
    longest = max((len(r) for r in rows), default=0)  # row labels take width from the cells
    fig = new_figure(
        width or max(4.0, 2.0 + 0.9 * len(cols) + 0.075 * longest), height or max(2.5, 1.6 + 0.3 * len(rows))
    )
    ax = fig.add_subplot()
    if center is not None:
        span = max([abs(v - center) for v in finite], default=0.0) or 0.05 * abs(center) or 1.0
        norm: Normalize = TwoSlopeNorm(vcenter=center, vmin=center - span, vmax=center + span)
        cmap = cmap or "RdBu_r"
    else:
        norm = Normalize(min(finite, default=0.0), max(finite, default=1.0))
        cmap = cmap or "viridis"
    # pcolormesh, not imshow: vector cells (imshow would embed a PNG in the SVG)
    cells = np.ma.masked_invalid(np.asarray(grid, dtype=float).reshape(len(rows), len(cols)))
    image = ax.pcolormesh(np.arange(len(cols) + 1) - 0.5, np.arange(len(rows) + 1) - 0.5, cells, cmap=cmap, norm=norm)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # first row on top, as in a table
    for r, row in enumerate(grid):
        for c, v in enumerate(row):
            if math.isfinite(v):
                dark = abs(norm(v) - 0.5) > 0.3 if center is not None else norm(v) < 0.5
                ax.text(
                    c,
                    r,
                    fmt.format(v),
                    ha="center",
                    va="center",
                    fontsize="x-small",
                    color="white" if dark else "black",
                )
    turn = len(cols) > 3 or max((len(c) for c in cols), default=0) > 10
    ax.set_xticks(range(len(cols)), list(cols), rotation=90 if turn else 0, fontsize="small")
    ax.set_yticks(range(len(rows)), list(rows), fontsize="small")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    bar = fig.colorbar(image, ax=ax, label=cbar_label)
    assert bar.solids is not None  # a colorbar of a mappable draws its solids
    bar.solids.set_rasterized(False)  # vector, like the rest of the page (no embedded PNG)
    return fig


def strip_plot(
    samples: Mapping[str, Sequence[float]],
    *,
    title: str = "",
    xlabel: str = "time per iteration (ms)",
    scale: float = 1e3,
    width: float = 7.5,
) -> Figure:
    """Every sample of every label on one common axis: a row per label (labels on the y axis,
    wrapped), each iteration a dot (deterministic jitter), the median a black tick. A log axis
    when the medians span more than 20x, so jobs of very different speed stay readable."""
    labels = [k for k, v in samples.items() if len(v)]
    lines = sum(_wrap(k, 40).count("\n") + 1 for k in labels)
    fig = new_figure(width, max(2.2, 1.1 + 0.2 * lines + 0.1 * len(labels)))
    ax = fig.add_subplot()
    medians, drawn = [], []
    for i, k in enumerate(labels):
        xs = [x * scale for x in samples[k]]
        drawn += xs
        # deterministic jitter: a report must not change between two renders of the same data
        offsets = [((j * 0.618) % 1.0 - 0.5) * 0.5 for j in range(len(xs))]
        ax.scatter(xs, [i + o for o in offsets], s=7, alpha=0.55, color=f"C{i % 10}", linewidths=0)
        med = float(np.median(xs))
        medians.append(med)
        ax.vlines(med, i - 0.35, i + 0.35, colors="black", linewidth=1.5)
    positive = [m for m in medians if m > 0]
    if positive and max(positive) / min(positive) > 20:
        ax.set_xscale("log")
        shown = [x for x in drawn if x > 0]
        _log10_axis(ax.xaxis, min(shown), max(shown))
    ax.set_yticks(range(len(labels)), [_wrap(k, 40) for k in labels], fontsize="small")
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set(title=title, xlabel=xlabel)
    ax.grid(True, axis="x", alpha=0.3)
    return fig


def axis_plot(
    panels: Mapping[str, Mapping[str, Points]],
    *,
    xlabel: str,
    ylabel: str,
    log2_x: bool = False,
    bytes_x: bool = False,
    width: float = 6.4,
    height: float = 3.4,
) -> Figure:
    """A metric against the axis a sweep varied: one panel per facet (``panels``' keys, "" for a
    single panel), one line per series; the legend sits right of the panels (never over a point or
    a label)."""
    fig = new_figure(width + 2.2, height * (1 if len(panels) <= 2 else 1.6))
    cols = min(len(panels), 2)
    axes = fig.subplots(-(-len(panels) // cols), cols, squeeze=False, sharey=True).ravel()
    for ax, (facet, series) in zip(axes, panels.items()):
        for n, (name, points) in enumerate(series.items()):
            pts = sorted(points)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=4, label=name, color=f"C{n % 10}")
        if log2_x:
            ax.set_xscale("log", base=2)
            xs = sorted({p[0] for pts in series.values() for p in pts})
            ax.set_xticks(
                xs,
                [format_bytes(x) if bytes_x else f"{x:g}" for x in xs],
                fontsize="small",
                rotation=90 if len(xs) > 5 else 0,
            )
            ax.minorticks_off()
        else:
            xs = sorted({p[0] for pts in series.values() for p in pts})
            if len(xs) <= 8:  # the values the sweep ran, not round numbers between them
                ax.set_xticks(xs, [f"{x:g}" for x in xs], fontsize="small")
        ax.set(title=facet, xlabel=xlabel)
        ax.grid(True, alpha=0.3)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    axes[0].set_ylabel(ylabel)
    handles, names = axes[0].get_legend_handles_labels()
    if len(handles) > 1:
        fig.legend(handles, [_wrap(n, 24) for n in names], loc="outside right center", fontsize="small")
    return fig


_ID = re.compile(r'\bid="([^"]+)"')


def figure_svg(fig: Figure, *, prefix: str) -> str:
    """The figure as an inline ``<svg>`` element. Every id is prefixed (and every reference to
    it), so that several figures in one page never resolve each other's clip paths or markers."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]
    for ident in set(_ID.findall(svg)):
        new = f"{prefix}-{ident}"
        svg = (
            svg.replace(f'id="{ident}"', f'id="{new}"')
            .replace(f"#{ident})", f"#{new})")
            .replace(f'#{ident}"', f'#{new}"')
        )
    return svg
