"""The verdict of a comparison of two measurements of one case (lower is better).

With rounds on both sides (``sweep.repeats``; see ``compare_rounds``) the verdict rests on the
rounds' medians, one per independent launch of the job, so that the variation between
processes (placement, allocator, clocks, a neighbour's load) is part of the noise it is judged
against. Without them it rests on one process's samples (``compare_samples``), which cannot see
that variation.

``compare_samples``: asv's rule with a noise floor. A change is reported only when both hold:

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
interval (medians of resamples of each side, independently).

A verdict that does not decide (``~``, ``unstable``, ``undecided``) carries its ``reason``: the
threshold and the noise behind it, what kept it from deciding, and what would decide it (the
fewest samples the test needs, ``min_samples``, or rounds)."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, replace
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
    # with rounds (compare_rounds): the fewest rounds a side that can decide, the level of the
    # t-test on the logs of the rounds' values, and the weight (degrees of freedom) of the job's
    # typical between-round variance in each case's
    min_rounds: int = 3
    rounds_p_value: float = 0.01
    prior_df: float = 8.0

    def __post_init__(self) -> None:
        for name in ("min_change", "noise_factor", "p_value", "max_cv", "prior_df"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0")
        for name in ("p_value", "rounds_p_value"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be in (0, 1)")
        if self.min_rounds < 2:
            raise ValueError(f"min_rounds={self.min_rounds} must be >= 2 (a spread needs two rounds)")
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
    n_baseline: int  # samples, or rounds (basis "rounds")
    n_candidate: int
    basis: str = "samples"  # "rounds": the rounds' medians; "samples": one process's samples
    reason: str = ""  # a verdict that does not decide: why, and what would decide it

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


DECIDED = ("slower", "faster", "unchanged")  # the verdicts that answer; the others say why they cannot


def floor_p(n: int, m: int) -> float:
    """The smallest p of ``compare_samples``' test for ``n`` against ``m`` samples: that of two
    samples that do not overlap at all (2 / C(n+m, n) where scipy's test is exact)."""
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(range(n), range(n, n + m), alternative="two-sided").pvalue)


def min_samples(p_value: float) -> int:
    """The fewest samples a side (the same on both) with which ``compare_samples``' test can
    reach p < ``p_value`` (7 for 0.002: 6 against 6 cannot go below 0.0022)."""
    n = 2
    while floor_p(n, n) >= p_value:
        n += 1
    return n


def _sides(n: int, m: int, what: str) -> str:
    return f"{n} {what} a side" if n == m else f"{n} and {m} {what}"


def samples_reason(v: "Verdict", th: Thresholds) -> str:
    """Why a samples verdict does not decide, and what would ("" for one that does)."""
    if v.verdict in DECIDED:
        return ""
    parts = [
        f"threshold {v.threshold:.3f} from the baseline's noise {v.baseline_noise:.3f} "
        f"(CV {v.baseline_cv:.2f} and {v.candidate_cv:.2f})"
    ]
    if v.unstable:
        sides = (("baseline", v.baseline_cv, v.baseline_spread), ("candidate", v.candidate_cv, v.candidate_spread))
        too = [
            f"{side} {name} {value:.2f} > {limit:g}"
            for side, c, s in sides
            for name, value, limit in (("CV", c, th.max_cv), ("max/median", s, th.max_spread))
            if value > limit
        ]
        parts.append("unstable: " + ", ".join(too))
    rounds = f"sweep.repeats >= {th.min_rounds} (judged on rounds)"
    if floor_p(v.n_baseline, v.n_candidate) >= th.p_value:
        parts.append(
            f"{_sides(v.n_baseline, v.n_candidate, 'samples')} cannot reach p < {th.p_value:g}: "
            f"benchmark.iters >= {min_samples(th.p_value)} or {rounds}"
        )
    elif v.ratio > v.threshold or v.ratio < 1 / v.threshold:
        parts.append(f"p = {v.p_value:.2g}, not < {th.p_value:g}: more samples (benchmark.iters) or {rounds}")
    else:
        parts.append(
            f"the ratio is within the threshold, but a side too noisy to call it unchanged: {rounds}, "
            f"or a quieter machine"
        )
    return "; ".join(parts)


def rounds_reason(v: "Verdict", th: Thresholds, *, p: float, name: str = "p") -> str:
    """Why a rounds verdict does not decide, and what would ("" for one that does); ``p`` is
    what the verdict rests on: its p-value, or over a comparison its q-value (``name``)."""
    if v.verdict in DECIDED:
        return ""
    if v.verdict == "undecided":
        return (
            f"{_sides(v.n_baseline, v.n_candidate, 'rounds')}, fewer than {th.min_rounds} a side: "
            f"sweep.repeats >= {th.min_rounds}"
        )
    return (
        f"threshold {v.threshold:.3f} from the noise between rounds {v.baseline_noise:.3f}; "
        f"{name} = {p:.2g}, not < {th.rounds_p_value:g}: more rounds (sweep.repeats > "
        f"{min(v.n_baseline, v.n_candidate)})"
    )


def verdict_for(ratio: float, threshold: float, significant: bool) -> str:
    """A change beyond the threshold that the test agrees with is ``slower``/``faster``; one the
    test does not agree with is ``~``; anything within the threshold is ``unchanged``."""
    if ratio > threshold:
        return "slower" if significant else "~"
    if ratio < 1 / threshold:
        return "faster" if significant else "~"
    return "unchanged"


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
    verdict = verdict_for(ratio, threshold, significant)
    if unstable and verdict not in ("slower", "faster"):
        verdict = "unstable"
    v = Verdict(
        verdict,
        ratio,
        lo,
        hi,
        p,
        threshold,
        noise,
        mb,
        mc,
        cv(base),
        cv(cand),
        spread(base),
        spread(cand),
        unstable,
        len(base),
        len(cand),
    )
    return replace(v, reason=samples_reason(v, th))


def case_rounds(case: dict[str, Any]) -> list[float] | None:
    """A case's value per round that compare judges on: each round's fastest sample."""
    return case.get("round_mins_s") if case.get("round_medians_s") else None


def log_variance(base: Sequence[float], cand: Sequence[float]) -> tuple[float, int]:
    """(pooled variance of the logs of both sides' round values, its degrees of freedom); NaN
    when a side has a single round."""
    b, c = np.log(np.asarray(base, dtype=float)), np.log(np.asarray(cand, dtype=float))
    if min(len(b), len(c)) < 2:
        return math.nan, 0
    df = len(b) + len(c) - 2
    return float((b.var(ddof=1) * (len(b) - 1) + c.var(ddof=1) * (len(c) - 1)) / df), df


def compare_rounds(
    base: Sequence[float],
    cand: Sequence[float],
    th: Thresholds = Thresholds(),
    *,
    prior_variance: float | None = None,
    medians: tuple[Sequence[float], Sequence[float]] | None = None,
) -> Verdict:
    """The verdict on ``cand`` against ``base``, each a list of one value per round (seconds; one
    round = one independent launch of the job). compare passes each round's fastest sample: on a
    shared machine interference only adds time, so a round's fastest sample is its least
    disturbed, while a slower code path slows every sample. In logs, the change is the difference
    of the means (``ratio``: the ratio of the geometric means) and the noise is the spread between
    rounds: the pooled standard deviation of the logs of both sides, moderated towards
    ``prior_variance`` (the job's typical case, with ``prior_df`` degrees of freedom; limma's
    moderated t) since three rounds alone say little about it. A change is reported only when
    both hold:

    * ``ratio`` is beyond ``1 + max(min_change, noise_factor x noise)`` (or below its reciprocal);
    * the t-test of the difference with that noise gives p < ``rounds_p_value`` (alone; a
      comparison of many cases re-judges each on its Benjamini-Hochberg q-value over them all,
      ``compare._control_false_discoveries``).

    ``~`` when only the first holds; ``undecided`` when a side has fewer than ``min_rounds``
    rounds. The interval is the t-test's 95% interval of the ratio. ``medians``: the rounds'
    medians, for the median columns."""
    from scipy import stats as sst

    b = np.log(np.asarray(base, dtype=float))
    c = np.log(np.asarray(cand, dtype=float))
    mb_r, mc_r = medians if medians is not None else (base, cand)
    mb, mc = float(np.median(mb_r)), float(np.median(mc_r))
    ratio = float(np.exp(c.mean() - b.mean()))
    common: dict[str, Any] = dict(
        baseline_median_s=mb,
        candidate_median_s=mc,
        baseline_cv=cv(list(np.exp(b))),
        candidate_cv=cv(list(np.exp(c))),
        baseline_spread=spread(list(np.exp(b))),
        candidate_spread=spread(list(np.exp(c))),
        unstable=False,
        n_baseline=len(b),
        n_candidate=len(c),
        basis="rounds",
    )
    if min(len(b), len(c)) < th.min_rounds:
        v = Verdict("undecided", ratio, math.nan, math.nan, math.nan, math.nan, math.nan, **common)
        return replace(v, reason=rounds_reason(v, th, p=math.nan))
    variance, dof = log_variance(base, cand)
    df = float(dof)
    if prior_variance is not None and math.isfinite(prior_variance) and th.prior_df > 0:
        variance = (th.prior_df * prior_variance + df * variance) / (th.prior_df + df)
        df = df + th.prior_df
    noise = math.sqrt(variance)
    threshold = 1 + max(th.min_change, th.noise_factor * noise)
    diff = float(c.mean() - b.mean())
    se = noise * math.sqrt(1 / len(b) + 1 / len(c))
    if se > 0:
        p = float(2 * sst.t.sf(abs(diff) / se, df))
        half = float(sst.t.ppf(0.975, df)) * se
    else:  # identical rounds on each side: the difference is exact
        p, half = (1.0 if diff == 0 else 0.0), 0.0
    significant = p < th.rounds_p_value
    verdict = verdict_for(ratio, threshold, significant)
    v = Verdict(verdict, ratio, math.exp(diff - half), math.exp(diff + half), p, threshold, noise, **common)
    return replace(v, reason=rounds_reason(v, th, p=p))
