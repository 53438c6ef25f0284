"""``sweepbench compare BASELINE CANDIDATE``: join the jobs of two sweeps and give a verdict per job
and case (see ``verdicts`` for the rule), written to compare.csv and compare.html.

Jobs are joined by their resolved config without the keys that do not define the measurement
(the output-only keys and ``fault``, so a job slowed down on purpose compares against its clean
twin), or by the config columns the user names (``--on parallelism,benchmark.strategy``). Cases
inside a joined pair are matched by their identity (``cases.case_identity``).

A case both sides ran in rounds (``sweep.repeats``: its ``round_medians_s``) is judged on the
rounds (``verdicts.compare_rounds``, basis ``rounds``); any other on the samples of one process
(``verdicts.compare_samples``, basis ``samples``), and the output says that such a verdict does not
cover the noise between processes.

A comparison asks one question per case, often hundreds: at p < 0.01 each, an identical rerun of a
66-case sweep would still show a `slower` or `faster` in about every second comparison. So the
rounds' p-values of one comparison are adjusted together (Benjamini-Hochberg: ``q_value``, the false
discovery rate at which the case would be called) and a rounds verdict needs q < ``rounds_p_value``.
Measured on ten pairs of identical CPU sweeps (docs/results/runs/compare_cpu_2026-11-25_noise_quiet/summary.md): 8 false
verdicts of 660 on raw p, none on q, while a 1.5x slowdown was still found in every pair."""

from __future__ import annotations

import datetime as dt
import io
import json
import math
import re
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from sweepbench.draw.plotting import config_value, figure_svg, heatmap
from sweepbench.record.atomic import write_atomic
from sweepbench.report.cases import case_identity, case_labels
from sweepbench.report.hooks import compared
from sweepbench.report.load import Sweep
from sweepbench.report.verdicts import (
    DECIDED,
    Thresholds,
    Verdict,
    case_rounds,
    compare_rounds,
    compare_samples,
    floor_p,
    log_variance,
    min_samples,
    rounds_reason,
    verdict_for,
)

# what a job's config holds that does not change what is measured
# every verdict a row can have, in the order counts are shown: verdicts' five, then the job-level two
VERDICTS = ("slower", "faster", "~", "unstable", "undecided", "unchanged", "failed", "not compared")
NOT_MEASUREMENT = frozenset({"hydra", "wandb", "launch", "sweep", "fault", "store"})
CSV_COLUMNS = (
    "benchmark",
    "baseline_tag",
    "candidate_tag",
    "case",
    "verdict",
    "ratio",
    "ci_low",
    "ci_high",
    "p_value",
    "q_value",
    "threshold",
    "baseline_noise",
    "baseline_median_s",
    "candidate_median_s",
    "baseline_cv",
    "candidate_cv",
    "baseline_spread",
    "candidate_spread",
    "unstable",
    "n_baseline",
    "n_candidate",
    "basis",
    "note",
)
MIN_PRIOR_CASES = 5  # cases with rounds a job needs for its typical between-round variance
PROCESS_NOISE = (
    "process-to-process noise is not covered: {n} case(s) were judged on the samples of one "
    "process per side; run both sweeps with sweep.repeats=3 or more to judge on rounds"
)
# Rounds interleave inside a sweep, not across two: a change of the machine between two sweeps run
# one after the other (load, clocks, a neighbour) is a shift that every round of one side shares,
# and a rounds verdict cannot tell it from a real one (docs/results/runs/compare_cpu_*/summary.md)
APART = (
    "the sweeps ran apart ({baseline} and {candidate}), so their rounds did not interleave: a change of "
    "the machine between them is not covered; run both configurations in one sweep (e.g. "
    "benchmark.impl=a,b or launch.python=A,B) for a verdict that covers it"
)


def column_value(job: dict[str, Any], column: str) -> Any:
    """A join column: a metrics key (``world_size``, ``backend``), a dotted config key, a group
    name (``parallelism`` -> ``parallelism.name``) or a benchmark/parallelism field (``strategy``, ``tp``)."""
    if column in ("world_size", "backend", "benchmark") and job.get(column) is not None:
        return job[column]
    for dotted in (column, f"{column}.name", f"benchmark.{column}", f"parallelism.{column}"):
        value = config_value(job, dotted, default=_MISSING)
        if value is not _MISSING and not isinstance(value, dict):
            return value
    raise ValueError(
        f"--on column {column!r} is not in job {job.get('tag')}'s config "
        f"(use a dotted config key such as parallelism.tp or benchmark.strategy)"
    )


_MISSING = object()


def join_key(job: dict[str, Any], on: Sequence[str] | None) -> str:
    if on:
        return json.dumps({c: column_value(job, c) for c in on}, sort_keys=True, default=str)
    config = {k: v for k, v in (job.get("config") or {}).items() if k not in NOT_MEASUREMENT}
    if not config:  # a job that crashed before recording its config can only be joined by tag
        return json.dumps({"tag": job.get("tag")})
    return json.dumps(config, sort_keys=True, default=str)


def _index(sweep: Sweep, on: Sequence[str] | None, side: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for job in sweep.jobs:
        key = join_key(job, on)
        if key in out:
            raise ValueError(
                f"{side} jobs {out[key].get('tag')} and {job.get('tag')} have the same join key "
                f"{key if on else '(config)'}; name columns that tell them apart with --on"
            )
        out[key] = job
    return out


@dataclass
class Comparison:
    rows: list[dict[str, Any]]
    unmatched: list[str] = field(default_factory=list)
    # what the gate could not judge, one line each naming the job: a baseline job without a
    # twin, a candidate job that failed with none, a case of the baseline the candidate lacks
    unjudged: list[str] = field(default_factory=list)
    # when each side's compared jobs ran (first start, last finish), where both sides say so
    spans: tuple[tuple[str, str], tuple[str, str]] | None = None

    def count(self, verdict: str) -> int:
        return sum(1 for r in self.rows if r["verdict"] == verdict)

    def counts(self) -> list[tuple[str, int]]:
        """(verdict, number of rows) for the verdicts that occur, in ``VERDICTS`` order."""
        return [(v, self.count(v)) for v in VERDICTS if self.count(v)]

    def notes(self) -> list[str]:
        """What the reader must know about the verdicts' basis."""
        on_samples = sum(1 for r in self.rows if r.get("basis") == "samples")
        notes = [PROCESS_NOISE.format(n=on_samples)] if on_samples else []
        if self.spans and any(r.get("basis") == "rounds" for r in self.rows):
            (b0, b1), (c0, c1) = self.spans
            if b1 <= c0 or c1 <= b0:
                notes.append(APART.format(baseline=_span(b0, b1), candidate=_span(c0, c1)))
        return notes

    def decided(self) -> bool:
        """Whether any case got a verdict that answers (``verdicts.DECIDED``)."""
        return any(r["verdict"] in DECIDED for r in self.rows)

    def what_would_decide(self) -> str:
        """One line for a comparison none of whose cases was decided: the reasons that occur."""
        # each reason's last clause says what would decide; its p (or q) differs from case to case
        wants = [
            re.sub(r"^[pq][^,=]* = [^,]+, ", "", (r.get("reason") or r.get("note") or r["verdict"]).split("; ")[-1])
            for r in self.rows
        ]
        if not wants:
            return "no case was compared"
        ranked = sorted(set(wants), key=lambda w: (-wants.count(w), w))
        return f"no case of {len(wants)} was decided: " + "; ".join(
            w + (f" ({wants.count(w)} of {len(wants)})" if len(ranked) > 1 else "") for w in ranked[:3]
        )

    @property
    def regressions(self) -> list[dict[str, Any]]:
        """Rows that fail ``--fail-on-regression``: slower cases, and candidate jobs that failed
        where the baseline's twin was ok."""
        return [r for r in self.rows if r["verdict"] in ("slower", "failed")]


def _span(start: str, end: str) -> str:
    """``2026-11-25 11:05-11:09`` (UTC, as recorded), the date repeated only when it changes."""
    a, b = (
        dt.datetime.fromisoformat(start.replace("Z", "+00:00")),
        dt.datetime.fromisoformat(end.replace("Z", "+00:00")),
    )
    return f"{a:%Y-%m-%d %H:%M}-{b:%H:%M} UTC" if a.date() == b.date() else f"{a:%Y-%m-%d %H:%M}-{b:%Y-%m-%d %H:%M} UTC"


def _when(jobs: list[dict[str, Any]]) -> tuple[str, str] | None:
    """(first start, last finish) of ``jobs`` (ISO timestamps in UTC, which sort as strings)."""
    starts = [j["started_at"] for j in jobs if isinstance(j.get("started_at"), str)]
    ends = [j["finished_at"] for j in jobs if isinstance(j.get("finished_at"), str)]
    return (min(starts), max(ends)) if starts and ends else None


def _job_rows(base: dict[str, Any], cand: dict[str, Any], th: Thresholds) -> list[dict[str, Any]]:
    common = {
        "benchmark": cand.get("benchmark") or base.get("benchmark"),
        "baseline_tag": base.get("tag"),
        "candidate_tag": cand.get("tag"),
    }
    if cand.get("status") != "ok" or base.get("status") != "ok":
        failed = "candidate" if cand.get("status") != "ok" else "baseline"
        job = cand if failed == "candidate" else base
        verdict = "failed" if failed == "candidate" and base.get("status") == "ok" else "not compared"
        return [
            {
                **common,
                "case": "",
                "verdict": verdict,
                "note": f"{failed} job {job.get('status')}: {job.get('error') or ''}".strip(),
            }
        ]
    # a case that moves no data (Benchmark.compared: a one-rank collective) is not compared
    base_list = [c for c in base["results"].get("cases", []) if compared(base, c)]
    base_cases = {case_identity(c): c for c in base_list}
    cand_cases = [c for c in cand["results"].get("cases", []) if compared(cand, c)]
    labels = case_labels(cand_cases)
    twins = [base_cases.get(case_identity(c)) for c in cand_cases]
    prior = _job_prior(list(zip(twins, cand_cases)))
    rows = []
    for label, case, twin in zip(labels, cand_cases, twins):
        if twin is None or not twin.get("times_s") or not case.get("times_s"):
            rows.append(
                {
                    **common,
                    "case": label,
                    "verdict": "not compared",
                    "note": "no matching case in the baseline" if twin is None else "no per-iteration times",
                }
            )
            continue
        if (twin_rounds := case_rounds(twin)) and (own_rounds := case_rounds(case)):
            v = compare_rounds(
                twin_rounds,
                own_rounds,
                th,
                prior_variance=prior,
                medians=(twin["round_medians_s"], case["round_medians_s"]),
            )
            note = v.reason
        else:
            v = compare_samples(twin["times_s"], case["times_s"], th)
            never = floor_p(v.n_baseline, v.n_candidate) >= th.p_value  # then even `unchanged` could never be `slower`
            floor = (
                (
                    f"{v.n_baseline} and {v.n_candidate} samples can never reach p < {th.p_value:g} "
                    f"(benchmark.iters >= {min_samples(th.p_value)})"
                )
                if never
                else ""
            )
            note = "; ".join(
                x for x in (v.reason or floor, "process-to-process noise not covered (no rounds on both sides)") if x
            )
        rows.append({**common, "case": label, **v.as_dict(), "note": note})
    found = {case_identity(c) for c in cand_cases}
    rows += [
        {**common, "case": label, "verdict": "not compared", "note": "no matching case in the candidate"}
        for label, c in zip(case_labels(base_list), base_list)
        if case_identity(c) not in found
    ]
    return rows


def _job_prior(pairs: list[tuple[dict[str, Any] | None, dict[str, Any]]]) -> float | None:
    """The job's typical between-round variance (logs): the median over its cases with rounds
    (the rounds of one launch share its placement and load, so its cases vary alike)."""
    variances = [
        log_variance(b_rounds, c_rounds)[0]
        for b, c in pairs
        if b is not None and (b_rounds := case_rounds(b)) and (c_rounds := case_rounds(c))
    ]
    variances = [v for v in variances if v == v]  # drop NaN (a side with one round)
    # a typical case needs cases to be typical of: a job of a few cases is judged case by case
    return statistics.median(variances) if len(variances) >= MIN_PRIOR_CASES else None


def compare_sweeps(
    baseline: Sweep, candidate: Sweep, *, on: Sequence[str] | None = None, thresholds: Thresholds = Thresholds()
) -> Comparison:
    base_index, cand_index = _index(baseline, on, "baseline"), _index(candidate, on, "candidate")
    rows: list[dict[str, Any]] = []
    unmatched = [f"baseline only: {j.get('tag')}" for k, j in base_index.items() if k not in cand_index]
    pairs = []
    for key, cand in cand_index.items():
        if key not in base_index:
            unmatched.append(f"candidate only: {cand.get('tag')}")
            continue
        pairs.append((base_index[key], cand))
        rows.extend(_job_rows(base_index[key], cand, thresholds))
    _control_false_discoveries(rows, thresholds)
    base_span, cand_span = _when([b for b, _ in pairs]), _when([c for _, c in pairs])
    return Comparison(
        rows,
        unmatched,
        unjudged=_unjudged(base_index, cand_index, rows, shared=bool(pairs)),
        spans=(base_span, cand_span) if base_span and cand_span else None,
    )


def _said(job: dict[str, Any]) -> str:
    error = " ".join(str(job.get("error") or "").split())
    return f"{job.get('status')}" + (f": {error[:200]}" if error else "")


def _unjudged(
    base_index: dict[str, dict[str, Any]],
    cand_index: dict[str, dict[str, Any]],
    rows: list[dict[str, Any]],
    *,
    shared: bool,
) -> list[str]:
    """What the gate could not judge, one line each naming the job: every baseline job without a
    twin, every candidate job without one that is not ok (a job that left no metrics.json has no
    config to join on), and every joined job or case that was not compared (the baseline's job
    failed, a case the candidate lacks). A new ok job or case of the candidate is not among them."""
    lines = (
        []
        if shared
        else [
            "the two sweeps share no job (joined by config without "
            f"{', '.join(sorted(NOT_MEASUREMENT))}; name the columns to join on with --on)"
        ]
    )
    lines += [
        f"baseline job {j.get('tag')} ({_said(j)}) has no twin in the candidate"
        for k, j in base_index.items()
        if k not in cand_index
    ]
    lines += [
        f"candidate job {j.get('tag')} {_said(j)}, and has no twin in the baseline"
        for k, j in cand_index.items()
        if k not in base_index and j.get("status") != "ok"
    ]
    lines += [
        f"{r['candidate_tag']}{' ' + r['case'] if r.get('case') else ''} (baseline {r['baseline_tag']}): "
        f"not compared: {r.get('note') or ''}".rstrip(": ")
        for r in rows
        if r["verdict"] == "not compared" and r.get("note") != "no matching case in the baseline"
    ]
    return lines


def _control_false_discoveries(rows: list[dict[str, Any]], th: Thresholds) -> None:
    """Re-judge the rounds verdicts of one comparison on Benjamini-Hochberg q-values (in place):
    the family is every case judged on rounds, so the share of false `slower`/`faster` among them
    stays below ``rounds_p_value``."""
    from scipy.stats import false_discovery_control

    family = [
        r
        for r in rows
        if r.get("basis") == "rounds" and r["verdict"] != "undecided" and math.isfinite(r.get("p_value", math.nan))
    ]
    if not family:
        return
    for row, q in zip(family, false_discovery_control([r["p_value"] for r in family], method="bh")):
        row["q_value"] = float(q)
        row["verdict"] = verdict_for(row["ratio"], row["threshold"], significant=q < th.rounds_p_value)
        judged = Verdict(**{k: row[k] for k in Verdict.__dataclass_fields__})
        row["note"] = row["reason"] = rounds_reason(
            replace(judged, verdict=row["verdict"]), th, p=float(q), name="q (p adjusted over the comparison's cases)"
        )


def to_csv(comparison: Comparison) -> str:
    import pandas as pd

    frame = pd.DataFrame(comparison.rows, columns=list(CSV_COLUMNS))
    buf = io.StringIO()
    frame.to_csv(buf, index=False)
    return buf.getvalue()


def _figures(comparison: Comparison) -> list[Any]:
    from sweepbench.report.page import Fig

    figs = []
    benches = sorted({str(r["benchmark"]) for r in comparison.rows if r.get("ratio") is not None})
    for n, bench in enumerate(benches):
        rows = [r for r in comparison.rows if r["benchmark"] == bench and r.get("ratio") is not None]
        jobs = list(dict.fromkeys(str(r["candidate_tag"]) for r in rows))
        cases = list(dict.fromkeys(str(r["case"]) for r in rows))
        grid: list[list[float | None]] = [[None] * len(cases) for _ in jobs]
        for r in rows:
            grid[jobs.index(str(r["candidate_tag"]))][cases.index(str(r["case"]))] = r["ratio"]
        transpose = len(cases) > len(jobs) and len(cases) > 8  # many cases read better as rows
        fig = heatmap(
            [list(c) for c in zip(*grid)] if transpose else grid,
            rows=cases if transpose else jobs,
            cols=jobs if transpose else cases,
            center=1.0,
            cbar_label="median ratio (candidate / baseline)",
            fmt="{:.2f}",
            title=f"{bench}: candidate / baseline (red = slower)",
        )
        figs.append(
            Fig(
                f"{bench} ratio heatmap",
                figure_svg(fig, prefix=f"cmp{n}"),
                "ratio of median per-iteration times; 1 = unchanged, diverging scale centred at 1",
            )
        )
    return figs


def _fmt_cell(key: str, value: Any) -> Any:
    from sweepbench.report.page import Cell, fmt
    from sweepbench.report.template import verdict_class

    if key == "verdict":
        return Cell(str(value), verdict_class(str(value)))
    if key in ("ci_low", "ci_high", "ratio", "threshold") and isinstance(value, float):
        return Cell(f"{value:.3f}", "num")
    if key in ("p_value", "q_value") and isinstance(value, float):
        return Cell(f"{value:.2g}", "num")
    return Cell(fmt(value), "num" if isinstance(value, (int, float)) and not isinstance(value, bool) else "")


def render_comparison(comparison: Comparison, baseline: Sweep, candidate: Sweep, thresholds: Thresholds) -> str:
    from sweepbench.report.template import render

    shown = (
        "benchmark",
        "candidate_tag",
        "case",
        "verdict",
        "basis",
        "ratio",
        "ci_low",
        "ci_high",
        "p_value",
        "q_value",
        "threshold",
        "baseline_noise",
        "baseline_median_s",
        "candidate_median_s",
        "baseline_cv",
        "candidate_cv",
        "unstable",
        "note",
    )
    rows = [[_fmt_cell(k, r.get(k)) for k in shown] for r in comparison.rows]
    counts = comparison.counts()
    t = thresholds
    rule = (
        f"With rounds on both sides (basis rounds): slower/faster: ratio of the geometric means of the rounds' "
        f"fastest samples beyond 1 + max({t.min_change:g}, {t.noise_factor:g} x the spread between rounds, the "
        f"pooled SD of their logs moderated towards the job's typical case with {t.prior_df:g} degrees of "
        f"freedom) and a t-test on their logs whose p, adjusted over every rounds case of this comparison "
        f"(Benjamini-Hochberg q), is < {t.rounds_p_value:g}; undecided: fewer than "
        f"{t.min_rounds} rounds a side. Interval: the t-test's 95% of the ratio. "
        f"Otherwise (basis samples): ratio of medians beyond 1 + max({t.min_change:g}, {t.noise_factor:g} x the "
        f"baseline's noise, IQR/(1.349 median)) and Mann-Whitney U p < {t.p_value:g}; unstable: a side's "
        f"CV > {t.max_cv:g} or max/median > {t.max_spread:g}; interval: bootstrap 95% of the ratio. "
        f"~: the ratio crosses but the test does not." + "".join(f" Note: {n}." for n in comparison.notes())
    )
    meta = [("baseline", f"{baseline.path} ({baseline.date})"), ("candidate", f"{candidate.path} ({candidate.date})")]
    return render(
        "compare.html",
        title=f"sweepbench compare: {baseline.name} -> {candidate.name}",
        generated=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        meta=meta,
        counts=counts,
        rule=rule,
        figures=_figures(comparison),
        columns=[c.replace("_", " ") for c in shown],
        rows=rows,
        unmatched=comparison.unmatched,
        unjudged=comparison.unjudged,
    )


def write_comparison(
    comparison: Comparison, baseline: Sweep, candidate: Sweep, thresholds: Thresholds, out_dir: Path
) -> tuple[Path, Path]:
    csv_path, html_path = out_dir / "compare.csv", out_dir / "compare.html"
    write_atomic(csv_path, to_csv(comparison))
    write_atomic(html_path, render_comparison(comparison, baseline, candidate, thresholds))
    return csv_path, html_path
