"""The verdict of a comparison of two samples of per-iteration times (lower is better).

asv's rule with a noise floor. A change is reported only when both hold:

* the ratio of medians (candidate / baseline) is beyond ``1 + max(min_change, noise_factor x
  the baseline's relative noise)`` (slower) or below its reciprocal (faster): per-iteration times
  are autocorrelated (a slow phase of the machine lasts several iterations), so a p-value alone
  raises false alarms on differences far smaller than the run-to-run noise. The relative noise
  is robust, IQR / (1.349 x median) (the CV of a normal sample with that IQR): a few preempted
  iterations must not hide a real change that every other iteration shows;
* a two-sided Mann-Whitney U test of the two samples gives p < ``p_value``.

When the ratio crosses the threshold but the test does not agree, the verdict is ``~`` (maybe).
A side is ``unstable`` (nccl-tests' flags) when its coefficient of variation exceeds ``max_cv``
or its max/median exceeds ``max_spread``; the verdict is then ``unstable`` unless the change is
established by both rules above (it is still flagged). The ratio comes with a bootstrap 95%
interval (medians of resamples of each side, independently)."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np


@dataclass(frozen=True)
class Thresholds:
    min_change: float = 0.05  # smallest relative change ever reported (5%)
    noise_factor: float = 2.0  # x the baseline's relative noise (robust_noise)
    p_value: float = 0.002  # Mann-Whitney U, two-sided
    max_cv: float = 0.05  # a side with a larger coefficient of variation is unstable
    max_spread: float = 1.5  # ... or with a larger max/median
    bootstrap: int = 2000  # resamples for the ratio's 95% interval
    seed: int = 0  # the interval is reproducible

    def __post_init__(self) -> None:
        for name in ("min_change", "noise_factor", "p_value", "max_cv"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        if not 0 < self.p_value < 1:
            raise ValueError(f"p_value={self.p_value} must be in (0, 1)")
        if self.max_spread < 1:
            raise ValueError(f"max_spread={self.max_spread} must be >= 1 (max/median)")


def cv(xs: Sequence[float]) -> float:
    """Coefficient of variation: population std / mean."""
    mean = statistics.fmean(xs)
    return statistics.pstdev(xs) / mean if mean > 0 else math.inf


def robust_noise(xs: Sequence[float]) -> float:
    """IQR / (1.349 x median): a CV that a few outliers do not move."""
    q25, med, q75 = np.percentile(np.asarray(xs, dtype=float), [25, 50, 75])
    return float((q75 - q25) / (1.349 * med)) if med > 0 else math.inf


def spread(xs: Sequence[float]) -> float:
    """max / median."""
    med = statistics.median(xs)
    return max(xs) / med if med > 0 else math.inf


def bootstrap_ratio(base: Sequence[float], cand: Sequence[float], *, n: int, seed: int) -> tuple[float, float]:
    """95% interval of median(cand) / median(base), resampling each side with replacement."""
    rng = np.random.default_rng(seed)
    b, c = np.asarray(base, dtype=float), np.asarray(cand, dtype=float)
    mb = np.median(rng.choice(b, size=(n, len(b)), replace=True), axis=1)
    mc = np.median(rng.choice(c, size=(n, len(c)), replace=True), axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = mc / mb
    lo, hi = np.nanpercentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


@dataclass(frozen=True)
class Verdict:
    verdict: str
    ratio: float  # median(candidate) / median(baseline)
    ci_low: float
    ci_high: float
    p_value: float
    threshold: float  # the ratio beyond which a change counts: 1 + max(min_change, k x noise)
    baseline_noise: float  # robust relative noise of the baseline (what the threshold uses)
    baseline_median_s: float
    candidate_median_s: float
    baseline_cv: float
    candidate_cv: float
    baseline_spread: float
    candidate_spread: float
    unstable: bool
    n_baseline: int
    n_candidate: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare_samples(base: Sequence[float], cand: Sequence[float], th: Thresholds = Thresholds()) -> Verdict:
    """The verdict on ``cand`` against ``base`` (per-iteration seconds, lower is better)."""
    from scipy.stats import mannwhitneyu  # here: `report` and `--help` need the thresholds, not scipy
    if len(base) < 2 or len(cand) < 2:
        raise ValueError(f"need at least 2 iterations per side, got {len(base)} and {len(cand)}")
    base, cand = [float(x) for x in base], [float(x) for x in cand]
    mb, mc = statistics.median(base), statistics.median(cand)
    ratio = mc / mb if mb > 0 else math.inf
    lo, hi = bootstrap_ratio(base, cand, n=th.bootstrap, seed=th.seed)
    p = float(mannwhitneyu(base, cand, alternative="two-sided").pvalue)
    noise = robust_noise(base)
    threshold = 1 + max(th.min_change, th.noise_factor * noise)
    unstable = any(cv(xs) > th.max_cv or spread(xs) > th.max_spread for xs in (base, cand))
    significant = p < th.p_value
    if ratio > threshold:
        verdict = "slower" if significant else "~"
    elif ratio < 1 / threshold:
        verdict = "faster" if significant else "~"
    else:
        verdict = "unchanged"
    if unstable and verdict not in ("slower", "faster"):
        verdict = "unstable"
    return Verdict(verdict, ratio, lo, hi, p, threshold, noise, mb, mc, cv(base), cv(cand), spread(base),
                   spread(cand), unstable, len(base), len(cand))
