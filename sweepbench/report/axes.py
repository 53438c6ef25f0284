"""What a sweep varied: the config axes whose value differs between its jobs, read from the
jobs' resolved configs (never from a benchmark's name), and how a report lays them out.

Keys that always change together (``parallelism.name``, ``parallelism.tp`` and the world size of
``parallelism=tp2,tp4``) are one axis. An axis is a *scale* (numeric: sequence length, world
size, message size, GPUs) when it moves with the world size or all its values are integers; it is
*categorical* otherwise (impl, strategy, backend, layout, a float knob such as ``fault.factor``).
Plots put a scale on the x axis and draw one series per value of the categorical axes; the
"fastest" ranking compares the values of the categorical axes within each value of the scales.
An axis that does not vary is never an axis, a series or a facet."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from sweepbench.record.wandb_run import flatten

NOT_AXES = ("hydra.", "wandb.", "launch.", "sweep.")  # keys that steer output, not the measurement
WORLD = "world_size"


def job_values(job: dict[str, Any]) -> dict[str, Any]:
    """A job's flattened config, plus its world size, without the keys that are never axes."""
    values = {k: v for k, v in flatten(job.get("config") or {}).items() if not k.startswith(NOT_AXES)}
    if job.get(WORLD) is not None:
        values[WORLD] = job[WORLD]
    return values


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def short_name(key: str) -> str:
    """``benchmark.seq_len`` -> ``seq_len``, ``parallelism.name`` -> ``parallelism``,
    ``world_size`` -> ``world size``; other keys keep their group (``fault.factor``)."""
    if key == WORLD:
        return "world size"
    if key.endswith(".name"):
        return key.removesuffix(".name")
    return key.removeprefix("benchmark.")


@dataclass(frozen=True)
class Axis:
    keys: tuple[str, ...]  # the config keys that vary together
    key: str  # the one shown (a scale: its integer key; categorical: a .name key if there is one)
    numeric: bool

    @property
    def name(self) -> str:
        return short_name(self.key)

    def value(self, job: dict[str, Any]) -> Any:
        return job_values(job).get(self.key)

    def show(self, job: dict[str, Any]) -> str:
        value = self.value(job)
        return f"{value:g}" if isinstance(value, float) else str(value)


def _swept_keys(jobs: Sequence[dict[str, Any]]) -> list[str] | None:
    """The config keys the jobs' own overrides set (``parallelism=tp2`` -> ``parallelism.name``),
    or None when an override does not map to one config key (an experiment preset) or a job did
    not record its overrides: then every config key that varies counts."""
    keys: list[str] = []
    for job in jobs:
        if not job.get("config"):
            continue
        if "overrides" not in job:
            return None
        for override in job["overrides"]:
            key, eq, _ = str(override).partition("=")
            key = key.lstrip("+~")
            if not eq or key.startswith(NOT_AXES):
                continue
            node: Any = job["config"]
            for part in key.split("."):
                node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
            if node is _MISSING or (isinstance(node, dict) and "name" not in node):
                return None
            keys.append(f"{key}.name" if isinstance(node, dict) else key)
    return list(dict.fromkeys(keys))


_MISSING = object()


def varying_axes(jobs: Sequence[dict[str, Any]]) -> list[Axis]:
    """The axes of ``jobs`` (those with a recorded config), in the order the overrides name them:
    the keys the sweep set that differ between jobs; the world size joins the axis it moves with
    (``parallelism=tp2,tp4``), never an axis of its own."""
    recorded = [j for j in jobs if j.get("config")]
    rows = [job_values(j) for j in recorded]
    if len(rows) < 2:
        return []
    swept = _swept_keys(recorded)
    keys = [*swept, WORLD] if swept is not None else list(dict.fromkeys(k for r in rows for k in r))
    merged: dict[tuple[int, ...], list[str]] = {}
    for key in keys:
        values = [repr(r.get(key)) for r in rows]
        if len(set(values)) < 2:
            continue
        first: dict[str, int] = {}
        signature = tuple(first.setdefault(v, len(first)) for v in values)  # the partition of the jobs
        merged.setdefault(signature, []).append(key)
    axes = []
    for members in merged.values():
        if swept is not None and members == [WORLD]:
            continue  # the world size moved with no swept key alone (tp2,dp2,tp4): not an axis
        ints = [k for k in members if all(_is_int(r.get(k)) for r in rows)]
        numeric = WORLD in members or len(ints) == len(members)
        if numeric:
            shown = WORLD if WORLD in members else ints[0]
        else:
            shown = next((k for k in members if k.endswith(".name")), next(k for k in members if k not in ints))
        axes.append(Axis(tuple(members), shown, numeric))
    return axes


@dataclass(frozen=True)
class Layout:
    """How one benchmark's figures and ranking use the axes."""

    x: Axis | None  # the scale with the most values
    facets: list[Axis]  # the other scales (one panel per value combination)
    series: list[Axis]  # the categorical axes (one line or bar per value combination)

    @property
    def scales(self) -> list[Axis]:
        return [a for a in (self.x, *self.facets) if a is not None]

    def series_label(self, job: dict[str, Any]) -> str:
        return label(job, self.series)

    def facet_label(self, job: dict[str, Any]) -> str:
        return ", ".join(f"{a.name}={a.show(job)}" for a in self.facets)

    def worlds_as_layouts(self) -> Layout:
        """This layout with the scale that moves with the world size as a category named by its
        layout (``parallelism=tp2,tp4``: tp2 and tp4 ranked against each other), for a benchmark
        whose work is counted per GPU, so that different world sizes compare."""
        moved = [a for a in self.scales if WORLD in a.keys]
        if not moved:
            return self
        kept = [a for a in self.scales if WORLD not in a.keys]
        named = [Axis(a.keys, next((k for k in a.keys if k.endswith(".name")), a.key), False) for a in moved]
        return Layout(x=kept[0] if kept else None, facets=kept[1:], series=[*self.series, *named])


def label(job: dict[str, Any], axes: Sequence[Axis]) -> str:
    """The job as the values of ``axes``: a single axis of names shows its value alone
    (``ulysses``), numbers and several axes show ``name=value`` (``fault.factor=2``)."""
    if len(axes) == 1 and isinstance(axes[0].value(job), str):
        return axes[0].show(job)
    return " ".join(f"{a.name}={a.show(job)}" for a in axes) or "all"


def sortable(value: Any) -> tuple[int, Any]:
    """A key that orders an axis' values: numbers by value, before names."""
    return (0, value) if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, str(value))


def layout(jobs: Sequence[dict[str, Any]]) -> Layout:
    axes = varying_axes(jobs)
    scales = sorted((a for a in axes if a.numeric), key=lambda a: -len({repr(a.value(j)) for j in jobs}))
    return Layout(x=scales[0] if scales else None, facets=scales[1:], series=[a for a in axes if not a.numeric])
