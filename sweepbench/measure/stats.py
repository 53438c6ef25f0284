"""Summary statistics of per-iteration times."""

from __future__ import annotations

import statistics


def _quantile(sorted_xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    pos = (len(sorted_xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def summarize(times_s: list[float]) -> dict[str, float]:
    """median, IQR (p75 - p25), mean, min, max and std of ``times_s`` (seconds)."""
    assert times_s, "no timed iterations"
    xs = sorted(times_s)
    return {
        "median_s": statistics.median(xs),
        "p25_s": _quantile(xs, 0.25),
        "p75_s": _quantile(xs, 0.75),
        "iqr_s": _quantile(xs, 0.75) - _quantile(xs, 0.25),
        "mean_s": statistics.fmean(xs),
        "min_s": xs[0],
        "max_s": xs[-1],
        "std_s": statistics.pstdev(xs),
    }
