"""What a benchmark says about its own jobs' cases, asked through the registry (its plugin's
hooks, ``Benchmark.compared`` and ``Benchmark.work_per_step``), for the ranking, the figures and
compare: which cases measure something to compare, and how much work one timed iteration does."""

from __future__ import annotations

from typing import Any, Sequence


def benchmark_of(job: dict[str, Any]) -> Any:
    """The job's Benchmark class; None for a benchmark this install does not have."""
    from sweepbench.benchmarks.registry import get_benchmark

    name = job.get("benchmark") or ((job.get("config") or {}).get("benchmark") or {}).get("name")
    try:
        return get_benchmark(str(name)) if name else None
    except ValueError:
        return None


def compared(job: dict[str, Any], case: dict[str, Any]) -> bool:
    """Whether the case is ranked, plotted and compared (its benchmark's ``compared`` hook)."""
    bench = benchmark_of(job)
    return True if bench is None else bool(bench.compared(job, case))


def compared_jobs(jobs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``jobs`` without the ok jobs none of whose cases is compared (a one-rank collective):
    failed jobs stay, to be listed as failed."""
    return [
        j
        for j in jobs
        if j.get("status") != "ok"
        or not (j.get("results") or {}).get("cases")
        or any(compared(j, c) for c in j["results"]["cases"])
    ]


def work_per_step(job: dict[str, Any], case: dict[str, Any]) -> tuple[float, str] | None:
    """(units of work one timed iteration does per GPU, the unit) from the benchmark's hook, or
    None: its jobs are ranked by time."""
    bench = benchmark_of(job)
    return None if bench is None else bench.work_per_step(job, case)
