"""The verdict's statistics on synthetic samples, where the truth is known."""

from __future__ import annotations

import numpy as np
import pytest

from sweepbench.report.verdicts import Thresholds, bootstrap_ratio, compare_samples, cv, robust_noise, spread


def _sample(median: float, rel_noise: float, n: int = 30, seed: int = 0) -> list[float]:
    rng = np.random.default_rng(seed)
    return list(median * (1 + rel_noise * rng.standard_normal(n)))


def test_same_distribution_is_unchanged() -> None:
    base, cand = _sample(1e-3, 0.01, seed=1), _sample(1e-3, 0.01, seed=2)
    v = compare_samples(base, cand)
    assert v.verdict == "unchanged"
    assert v.ci_low <= 1.0 <= v.ci_high
    assert not v.unstable


def test_known_slowdown_is_slower_and_speedup_is_faster() -> None:
    base = _sample(1e-3, 0.01, seed=3)
    slow = [x * 1.3 for x in _sample(1e-3, 0.01, seed=4)]
    v = compare_samples(base, slow)
    assert v.verdict == "slower"
    assert v.ratio == pytest.approx(1.3, rel=0.02)
    assert v.ci_low < 1.3 < v.ci_high and v.ci_low > v.threshold
    assert v.p_value < 1e-6
    assert compare_samples(slow, base).verdict == "faster"


def test_small_change_under_the_floor_is_unchanged_even_if_significant() -> None:
    """3% slower with tiny noise: the test is sure, the 5% floor says it does not count."""
    base = _sample(1e-3, 0.002, seed=5)
    cand = [x * 1.03 for x in _sample(1e-3, 0.002, seed=6)]
    v = compare_samples(base, cand)
    assert v.p_value < 0.002 and v.verdict == "unchanged"
    assert compare_samples(base, cand, Thresholds(min_change=0.01)).verdict == "slower"


def test_noise_raises_the_threshold() -> None:
    """10% slower, but the baseline's own noise is ~6%: the threshold is 1 + 2 x noise (~1.12)."""
    base = _sample(1e-3, 0.06, seed=7, n=200)
    cand = [x * 1.10 for x in base]  # exactly 10% slower
    v = compare_samples(base, cand)
    assert v.threshold == pytest.approx(1 + 2 * robust_noise(base))
    assert v.threshold > 1.10 and v.p_value < 0.002  # the test alone would have called it
    assert v.ratio == pytest.approx(1.10)
    # past 1.05 but short of the noise-scaled threshold: not slower; a 6% CV also makes it unstable
    assert v.verdict == "unstable"
    assert compare_samples(base, cand, Thresholds(max_cv=0.1)).verdict == "unchanged"


def test_ratio_past_threshold_without_the_test_is_tilde() -> None:
    """Too few iterations for p < 0.002 (5 a side): a 30% change is only `~`."""
    base, cand = _sample(1e-3, 0.005, n=5, seed=9), [x * 1.3 for x in _sample(1e-3, 0.005, n=5, seed=10)]
    v = compare_samples(base, cand)
    assert v.ratio > v.threshold and v.p_value >= 0.002
    assert v.verdict == "~"


def test_unstable_side() -> None:
    base = _sample(1e-3, 0.01, seed=11)
    noisy = _sample(1e-3, 0.01, seed=12)
    noisy[3] = 5e-3  # one iteration 5x the median: max/median > 1.5
    v = compare_samples(base, noisy)
    assert v.unstable and v.verdict == "unstable"
    assert spread(noisy) > 1.5 and cv(noisy) > 0.05
    # a real, large change is still reported, flagged unstable
    v = compare_samples(base, [x * 2 for x in noisy])
    assert v.verdict == "slower" and v.unstable


def test_robust_noise_ignores_an_outlier() -> None:
    xs = _sample(1e-3, 0.01, n=50, seed=13)
    assert robust_noise(xs) == pytest.approx(0.01, rel=0.35)
    assert robust_noise([*xs[:-1], 1.0]) == pytest.approx(robust_noise(xs), rel=0.2)


def test_bootstrap_interval_is_reproducible_and_covers() -> None:
    base, cand = _sample(2.0, 0.02, seed=14), _sample(3.0, 0.02, seed=15)
    lo, hi = bootstrap_ratio(base, cand, n=1000, seed=0)
    assert (lo, hi) == bootstrap_ratio(base, cand, n=1000, seed=0)
    assert lo < 1.5 < hi and hi - lo < 0.1


def test_bad_thresholds_and_samples() -> None:
    with pytest.raises(ValueError, match="p_value"):
        Thresholds(p_value=1.5)
    with pytest.raises(ValueError, match="max_spread"):
        Thresholds(max_spread=0.5)
    with pytest.raises(ValueError, match="at least 2 iterations"):
        compare_samples([1.0], [1.0, 2.0])


# ---------------------------------------------------------------- rounds (compare_rounds)


def test_rounds_same_values_unchanged_and_doubling_slower() -> None:
    from sweepbench.report.verdicts import compare_rounds

    base = [1.00e-3, 1.05e-3, 0.97e-3]
    assert compare_rounds(base, [1.02e-3, 0.99e-3, 1.04e-3]).verdict == "unchanged"
    v = compare_rounds(base, [2 * x for x in (1.02e-3, 0.99e-3, 1.04e-3)])
    assert v.verdict == "slower" and v.basis == "rounds" and v.p_value < 0.01
    assert v.ci_low < 2 < v.ci_high and v.ratio == pytest.approx(2, rel=0.05)
    assert compare_rounds([2 * x for x in base], base).verdict == "faster"


def test_rounds_spread_between_rounds_hides_a_shift_it_cannot_tell() -> None:
    """A 1.3x shift with rounds that spread by 1.5x each way: not a change the rounds can establish."""
    from sweepbench.report.verdicts import compare_rounds

    base = [1.0, 1.5, 0.67]
    v = compare_rounds(base, [1.3 * x for x in base])
    assert v.verdict in ("unchanged", "~") and v.p_value > 0.01
    # the same shift in a job whose cases typically vary little between rounds: the prior decides
    tight = compare_rounds([1.0, 1.01, 0.99], [1.3, 1.31, 1.29], prior_variance=1e-4)
    assert tight.verdict == "slower"


def test_rounds_too_few_is_undecided_and_bad_settings() -> None:
    from sweepbench.report.verdicts import compare_rounds

    v = compare_rounds([1.0, 1.1], [2.0, 2.1])
    assert v.verdict == "undecided" and v.n_baseline == 2 and v.ratio > 1.8
    with pytest.raises(ValueError, match="min_rounds=1 must be >= 2"):
        Thresholds(min_rounds=1)
    with pytest.raises(ValueError, match=r"rounds_p_value=1.5 must be in \(0, 1\)"):
        Thresholds(rounds_p_value=1.5)


# ---------------------------------------------------------------- one comparison, many cases


def _rounds_job(tag: str, rounds_per_case: list[list[float]]) -> dict:
    cases = [{"case": f"c{i}", "times_s": list(r), "round_mins_s": list(r), "round_medians_s": list(r)}
             for i, r in enumerate(rounds_per_case)]
    return {"tag": tag, "status": "ok", "benchmark": "collective", "config": {"benchmark": {"name": "collective"}},
            "results": {"cases": cases}}


def test_many_cases_are_judged_together_false_discoveries_controlled() -> None:
    """60 cases of identical jobs whose rounds differ by noise alone, one of them by chance far
    enough for a raw p < 0.01: compare adjusts the rounds' p-values over the comparison
    (Benjamini-Hochberg) and calls nothing; a case really 2x slower among them is still found."""
    from pathlib import Path

    from sweepbench.report.compare import compare_sweeps
    from sweepbench.report.load import Sweep

    rng = np.random.default_rng(7)
    noise = lambda: list(np.exp(rng.normal(0, 0.05, 3)))  # noqa: E731
    base = [noise() for _ in range(60)]
    twin = [noise() for _ in range(60)]
    lucky = [1.0, 1.01, 0.99], [1.12, 1.13, 1.11]  # raw p far below 0.01 against a tight prior
    base[0], twin[0] = lucky
    rows = compare_sweeps(Sweep(Path("a"), [_rounds_job("j", base)]), Sweep(Path("b"), [_rounds_job("j", twin)])).rows
    assert len(rows) == 60 and {r["basis"] for r in rows} == {"rounds"}
    # judged alone, the lucky case would be a false `slower`; in its family it is only `~`
    assert rows[0]["p_value"] < 0.01 and rows[0]["ratio"] > rows[0]["threshold"] and rows[0]["q_value"] > 0.01
    assert rows[0]["verdict"] == "~"
    assert not [r for r in rows if r["verdict"] in ("slower", "faster")], [r for r in rows if r["p_value"] < 0.01]
    assert all(r["q_value"] >= r["p_value"] for r in rows)
    # the same family with one case really 2x slower: found, with its q-value below 0.01
    twin[5] = [2 * x for x in base[5]]
    rows = compare_sweeps(Sweep(Path("a"), [_rounds_job("j", base)]), Sweep(Path("b"), [_rounds_job("j", twin)])).rows
    assert rows[5]["verdict"] == "slower" and rows[5]["q_value"] < 0.01
    assert [r["case"] for r in rows if r["verdict"] in ("slower", "faster")] == ["c5"]
