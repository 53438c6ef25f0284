"""The sweep's answer: per benchmark, and per value of the scales it varied (sequence length,
world size, ...) and per case, the configurations ranked by median per-iteration time, the
runner-up against the winner, and whether the gap is real by compare's rule (``verdicts``).

Only ok jobs are ranked (the others are listed apart), only the cases their benchmark compares
(``Benchmark.compared``: a one-rank collective moves no data), one group per world size, and a
benchmark whose jobs do different work per iteration (``Benchmark.work_per_step``: train's global
batches) is ranked by time per unit of work per GPU, shown as a rate.

One place computes it; the report page, the terminal summary and the wandb table show it."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Sequence

from sweepbench.draw.units import format_bytes, format_number, format_time
from sweepbench.report.axes import WORLD, Axis, Layout, layout, sortable
from sweepbench.report.cases import case_identity
from sweepbench.report.hooks import compared, work_per_step

COLUMNS = ("benchmark", "group", "case", "rank", "config", "median_s", "ratio", "verdict", "p_value", "tag")


@dataclass
class Entry:
    job: dict[str, Any]
    label: str  # the job by the categorical axes that vary
    median_s: float
    times_s: list[float]
    case: dict[str, Any] | None = None  # the case's record (its rounds, where the sweep ran them)
    unit: str = ""  # times are per this unit of work per GPU (Benchmark.work_per_step); "": per iteration
    work: float = 1.0  # units of work per iteration per GPU

    def shown(self) -> str:
        """``9.91 ms``, or for a rate ``57992 tokens/s per GPU``."""
        return f"{format_number(1 / self.median_s)} {self.unit}/s per GPU" if self.unit else format_time(self.median_s)


@dataclass
class Ranking:
    """The jobs of one group (scale values) and one case, fastest first."""

    benchmark: str
    group: str  # ``seq_len=16384`` ("" when no scale varies)
    case: str  # the case inside a job ("" when a job measures one case)
    entries: list[Entry]
    verdict: Any = None  # verdicts.Verdict of the runner-up against the winner
    note: str = ""  # why there is no verdict
    p_level: float = 0.002

    @property
    def where(self) -> str:
        return " ".join(p for p in (self.group, self.case) if p) or "all"

    def gap(self) -> str:
        """``1.06x, slower, p < 0.002``: the runner-up's time / the winner's, and compare's verdict."""
        if len(self.entries) < 2:
            return "the only configuration"
        ratio = self.entries[1].median_s / self.entries[0].median_s
        if self.verdict is None or self.verdict.verdict == "undecided":
            return f"{ratio:.2f}x, {self.note or 'undecided'}"
        v = self.verdict
        p = f"p < {self.p_level:g}" if v.p_value < self.p_level else f"p = {v.p_value:.2g}"
        return f"{ratio:.2f}x, {v.verdict}, {p}" + (f" ({v.reason})" if v.reason else "")

    def sentence(self) -> str:
        """``seq_len=16384: ulysses 9.91 ms, ring 10.5 ms (1.06x, slower, p < 0.002)``."""
        shown = ", ".join(f"{e.label} {e.shown()}" for e in self.entries[:2])
        return f"{self.where}: {shown} ({self.gap()})"

    def rows(self) -> list[dict[str, Any]]:
        """One row per entry (the table columns ``COLUMNS``); ratio and verdict are against the winner."""
        out = []
        for n, e in enumerate(self.entries, start=1):
            verdict = self.verdict if n == 2 else None
            out.append(
                {
                    "benchmark": self.benchmark,
                    "group": self.group,
                    "case": self.case,
                    "rank": n,
                    "config": e.label,
                    "median_s": e.median_s,
                    "ratio": e.median_s / self.entries[0].median_s,
                    "verdict": "fastest" if n == 1 else (verdict.verdict if verdict else self.note if n == 2 else ""),
                    "p_value": verdict.p_value if verdict else None,
                    "tag": str(e.job.get("tag")),
                }
            )
        return out


@dataclass
class Answer:
    """One benchmark's answer."""

    benchmark: str
    layout: Layout
    rankings: list[Ranking] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)  # tag, config, status, error


def _show(key: str, value: Any) -> str:
    return format_bytes(value) if key.endswith("_bytes") and isinstance(value, int) else str(value)


def _case_keys(jobs: Sequence[dict[str, Any]]) -> dict[int, list[tuple[tuple[str, Any], ...]]]:
    """Each job's cases by the identity fields that vary inside a job (op, message size): a field
    with one value per job (its impl, its sequence length) describes the job, not the case."""
    idents = {id(j): [dict(case_identity(c)) for c in j["results"].get("cases", [])] for j in jobs}
    fields = {k for cases in idents.values() for c in cases for k in c}
    inner = sorted(k for k in fields if any(len({repr(c.get(k)) for c in cases}) > 1 for cases in idents.values()))
    return {jid: [tuple((k, c.get(k)) for k in inner) for c in cases] for jid, cases in idents.items()}


def _compare(ranking: Ranking, thresholds: Any) -> None:
    """compare's rule between the winner and the runner-up: on their rounds where the sweep ran
    rounds (``sweep.repeats``), else on their per-iteration samples."""
    from sweepbench.report.verdicts import case_rounds, compare_rounds, compare_samples

    if len(ranking.entries) < 2:
        return
    winner, runner = ranking.entries[0], ranking.entries[1]
    rounds = [[r / e.work for r in case_rounds(e.case or {}) or []] for e in (winner, runner)]
    try:
        if all(rounds):
            assert winner.case is not None and runner.case is not None  # their rounds came from them
            ranking.verdict = compare_rounds(
                rounds[0],
                rounds[1],
                thresholds,
                medians=(
                    [r / winner.work for r in winner.case["round_medians_s"]],
                    [r / runner.work for r in runner.case["round_medians_s"]],
                ),
            )
            ranking.p_level = thresholds.rounds_p_value
            if ranking.verdict.verdict == "undecided":
                ranking.note = f"undecided: {ranking.verdict.reason}"
        else:
            ranking.verdict = compare_samples(winner.times_s, runner.times_s, thresholds)
    except ValueError as err:  # fewer than 2 iterations a side
        ranking.note = f"not tested ({err})"


NOT_ATTEMPTED = ("skipped", "not run")  # did not fit / a stop came first: listed in the summary, not as failures


def answer_benchmark(name: str, jobs: Sequence[dict[str, Any]], *, thresholds: Any = None) -> Answer:
    from sweepbench.report.verdicts import Thresholds

    thresholds = thresholds or Thresholds()
    ok = [j for j in jobs if j.get("status") == "ok" and j.get("results")]
    # work counted per GPU (tokens per GPU) compares across world sizes: tp2 against tp4 is the
    # user's question; time alone (an attention step at W=2 against W=4) does not
    per_gpu = bool(ok) and all(
        work_per_step(j, c) is not None for j in ok for c in j["results"].get("cases", []) if compared(j, c)
    )
    lay = layout(jobs).worlds_as_layouts() if per_gpu else layout(jobs)
    every: list[Axis] = [*lay.scales, *lay.series]
    result = Answer(name, lay)
    for job in jobs:
        if job.get("status") not in ("ok", *NOT_ATTEMPTED):
            error = (job.get("error") or "(no error recorded)").strip().splitlines() or [""]
            result.failed.append(
                {
                    "tag": str(job.get("tag")),
                    "config": " ".join(f"{a.name}={a.show(job)}" for a in every) if job.get("config") else "",
                    "status": str(job.get("status")),
                    "error": error[-1][:200],
                }
            )
    groups: dict[tuple[str, str], Ranking] = {}
    order: dict[tuple[str, str], tuple[Any, ...]] = {}  # by the scales' values, then the cases' order
    keys = _case_keys(ok)
    backends = {str(j.get("backend")) for j in ok}  # a CPU (gloo) job is never ranked against a GPU job
    # jobs of different world sizes are ranked together only by work per GPU, whether or not the
    # world size is swept
    per_world = (
        not per_gpu and len({j.get("world_size") for j in ok}) > 1 and not any(WORLD in a.keys for a in lay.scales)
    )
    for job in ok:
        group = ", ".join(
            [
                *(f"{a.name}={_show(a.key, a.value(job))}" for a in lay.scales),
                *([f"world size={job.get('world_size')}"] if per_world else []),
            ]
        )
        if len(backends) > 1:
            group = ", ".join(filter(None, [group, f"ran on {job.get('backend')}"]))
        for case, case_key in zip(job["results"].get("cases", []), keys[id(job)]):
            times = [float(t) for t in case.get("times_s") or []]
            if not times or not compared(job, case):
                continue
            work, unit = work_per_step(job, case) or (1.0, "")
            times = [t / work for t in times]
            case_label = " ".join(_show(k, v) for k, v in case_key)
            ranking = groups.setdefault(
                (group, case_label), Ranking(name, group, case_label, [], p_level=thresholds.p_value)
            )
            order.setdefault(
                (group, case_label),
                (
                    *(sortable(a.value(job)) for a in lay.scales),
                    *((sortable(job.get("world_size")),) if per_world else ()),
                    len(order),
                ),
            )
            median = case["median_s"] / work if case.get("median_s") else statistics.median(times)
            entry_label = lay.series_label(job) if lay.series else (group or str(job.get("tag")))
            ranking.entries.append(Entry(job, entry_label, float(median), times, case, unit, work))
    for key in sorted(groups, key=order.__getitem__):
        ranking = groups[key]
        ranking.entries.sort(key=lambda e: e.median_s)
        _compare(ranking, thresholds)
        result.rankings.append(ranking)
    return result


def answer_jobs(jobs: Sequence[dict[str, Any]], *, thresholds: Any = None) -> list[Answer]:
    """Every benchmark's answer, in the order the jobs name them."""
    by_bench: dict[str, list[dict[str, Any]]] = {}
    for job in jobs:
        name = job.get("benchmark") or ((job.get("config") or {}).get("benchmark") or {}).get("name") or "unknown"
        by_bench.setdefault(str(name), []).append(job)
    return [answer_benchmark(name, js, thresholds=thresholds) for name, js in by_bench.items()]
