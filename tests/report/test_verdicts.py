"""Verdicts that can say yes, say why not, and fail closed: the default iteration counts can reach
the ranking's level, a verdict that cannot decide says what would, compare's gate has an exit code
of its own for what it could not judge and for a comparison that decided nothing, and rankings hold
only comparable, ok jobs (one group per world size, train by tokens/s per GPU)."""

from __future__ import annotations

import io
import re
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from omegaconf import DictConfig
from rich.console import Console

from ..conftest import SweepRun, run_sweepbench
from .conftest import sweepbench_cli

# tp1 alone at world size 1; tp2 and dp2 at world size 2, where dp2 steps through twice the
# sequences of tp2 (global batch = micro batch x dp): ranked by tokens/s per GPU, not step time
# two rounds a job: one fewer than a rounds verdict needs
TWO_ROUNDS = ["benchmark=refit", "model=tiny", "parallelism=tp2", "benchmark.strategy=send_recv", "benchmark.iters=3",
              "benchmark.warmup=1", "benchmark.probe_bytes=65536", "sweep.repeats=2", "wandb.mode=disabled"]
TRAIN_LAYOUTS = ["benchmark=train", "model=tiny", "backend=gloo", "parallelism=tp1,tp2,dp2", "benchmark.warmup=1",
                 "benchmark.iters=3", "wandb.mode=disabled"]


@pytest.mark.parametrize("name", ["refit", "attention", "train", "reshard"])
def test_default_iterations_can_reach_the_rankings_level(compose: Callable[..., DictConfig], name: str) -> None:
    from sweepbench.report.verdicts import Thresholds, floor_p, min_samples

    level = Thresholds().p_value
    assert min_samples(level) == 7 and floor_p(6, 6) >= level > floor_p(7, 7)  # 5 against 5: 0.0079
    assert compose(f"benchmark={name}").benchmark.iters >= min_samples(level)


def test_a_clear_gap_is_called_with_enough_samples_and_explained_without() -> None:
    from sweepbench.report.verdicts import compare_samples

    rng = np.random.default_rng(3)
    base = list(1e-3 * (1 + 0.02 * rng.standard_normal(10)))
    slow = [1.5 * t for t in base]
    assert compare_samples(base, slow).verdict == "slower"  # 10 a side: the default
    few = compare_samples(base[:5], slow[:5])
    assert few.verdict == "~" and few.ratio > few.threshold
    assert ("5 samples a side cannot reach p < 0.002: benchmark.iters >= 7 or sweep.repeats >= 3" in few.reason
            and f"threshold {few.threshold:.3f}" in few.reason), few.reason


def _without_metrics(sweep: Path, dest: Path) -> str:
    """A copy of ``sweep`` whose one job left no metrics.json (as a driver killed by the OOM killer
    leaves it): the job directory and its .hydra stay."""
    shutil.copytree(sweep, dest)
    (job,) = [p for p in dest.iterdir() if (p / "metrics.json").exists()]
    (job / "metrics.json").unlink()
    return job.name


def test_gate_fails_closed_on_a_candidate_job_without_metrics(report_sweeps: dict[str, SweepRun],
                                                             tmp_path: Path) -> None:
    good = report_sweeps["refit"].sweep_dir
    tag = _without_metrics(good, tmp_path / "killed")
    proc = sweepbench_cli("compare", good, tmp_path / "killed", "-o", tmp_path / "out", "--fail-on-regression")
    assert proc.returncode == 3, proc.stderr
    assert f"not judged: baseline job {tag} (ok) has no twin in the candidate" in proc.stderr
    assert f"not judged: candidate job {tag} failed: the job left no metrics.json" in proc.stderr
    assert "not judged, so the gate cannot pass" in proc.stderr.splitlines()[-1]
    assert "Not judged" in (tmp_path / "out" / "compare.html").read_text()
    # without the gate the same comparison is reported, exit 0
    assert sweepbench_cli("compare", good, tmp_path / "killed", "-o", tmp_path / "out").returncode == 0


def test_gate_fails_closed_on_sweeps_that_share_no_job(report_sweeps: dict[str, SweepRun], tmp_path: Path) -> None:
    refit, reshard = report_sweeps["refit"], report_sweeps["reshard"]
    proc = sweepbench_cli("compare", refit.sweep_dir, reshard.sweep_dir, "-o", tmp_path, "--fail-on-regression")
    assert proc.returncode == 3, proc.stderr
    assert "not judged: the two sweeps share no job" in proc.stderr and "--on" in proc.stderr
    for tag in refit.all_metrics():
        assert f"not judged: baseline job {tag} (ok) has no twin in the candidate" in proc.stderr


def test_gate_on_a_comparison_that_decided_nothing(report_sweeps: dict[str, SweepRun], tmp_path: Path) -> None:
    """The refit sweep against itself with every side unstable (--max-cv 0): not a pass."""
    sweep = report_sweeps["refit"].sweep_dir
    proc = sweepbench_cli("compare", sweep, sweep, "-o", tmp_path, "--fail-on-regression", "--max-cv", "0")
    assert proc.returncode == 4, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert re.match(r"sweepbench: error: undecided: no case of \d+ was decided: ", line) and "sweep.repeats >= 3" in line
    rows = [r for r in proc.stdout.splitlines() if r.strip().startswith("unstable")]
    assert rows and all("threshold" in r and "CV" in r for r in rows), rows  # each shows its threshold and noise


def test_failed_jobs_are_listed_apart_from_the_ranking(report_sweeps: dict[str, SweepRun],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from sweepbench.sweep.report import print_answer

    out = io.StringIO()  # a terminal (a table), then a pipe (plain lines)
    answers = print_answer(report_sweeps["collective"].sweep_dir,
                           console=Console(file=out, width=100, force_terminal=True, color_system=None))
    print_answer(report_sweeps["collective"].sweep_dir, console=Console(file=io.StringIO(), width=100))
    (answer,) = [a for a in answers if a.benchmark == "collective"]
    assert [j["status"] for j in answer.failed] == ["failed"], [(a.benchmark, a.failed) for a in answers]
    assert {e.job["status"] for r in answer.rankings for e in r.entries} == {"ok"}
    for text in (out.getvalue(), capsys.readouterr().out):
        assert "not ranked: fault.kind=raise failed" in " ".join(text.split()), text


def test_one_rank_collectives_are_left_out(secrets_sweep: SweepRun, tmp_path: Path) -> None:
    """A world-size-1 collective moves no data: no ranking, no figure, nothing compared."""
    from sweepbench.benchmarks.collective import CollectiveBenchmark
    from sweepbench.report.answer import answer_jobs
    from sweepbench.report.hooks import compared_jobs
    from sweepbench.report.load import load_sweep

    jobs = load_sweep(secrets_sweep.sweep_dir).jobs
    assert {j["world_size"] for j in jobs} == {1} and all(j["status"] == "ok" for j in jobs)
    assert compared_jobs(jobs) == [] and CollectiveBenchmark.plots(jobs) == []
    assert [a.rankings for a in answer_jobs(jobs)] == [[]]
    proc = sweepbench_cli("compare", secrets_sweep.sweep_dir, secrets_sweep.sweep_dir, "-o", tmp_path,
                          "--fail-on-regression")
    assert "0 cases" in proc.stdout and proc.returncode == 4
    assert "no case was compared" in proc.stderr


@pytest.fixture(scope="module")
def train_layouts(tmp_path_factory: pytest.TempPathFactory) -> SweepRun:
    root = tmp_path_factory.mktemp("train_layouts")
    run = run_sweepbench(TRAIN_LAYOUTS, sweep_dir=root / "sweep", cwd=root, timeout=400)
    assert run.rc == 0, run.describe()
    return run


def test_train_layouts_of_every_world_size_are_ranked_by_tokens_per_gpu(
    train_layouts: SweepRun, capsys: pytest.CaptureFixture[str]
) -> None:
    from sweepbench.report.answer import answer_jobs
    from sweepbench.report.load import load_sweep
    from sweepbench.sweep.report import print_answer

    (answer,) = answer_jobs(load_sweep(train_layouts.sweep_dir).jobs)
    (ranking,) = answer.rankings  # one ranking: tp1 (one GPU) beside dp2 and tp2, per GPU
    assert sorted(e.label for e in ranking.entries) == ["dp2", "tp1", "tp2"]
    rates = {}
    for e in ranking.entries:
        case = e.job["results"]["cases"][0]
        assert e.unit == "tokens" and e.shown().endswith("tokens/s per GPU")
        rates[e.label] = case["tokens_per_step"] / e.job["world_size"] / case["median_s"]
        assert 1 / e.median_s == pytest.approx(rates[e.label])
    assert ranking.entries[0].label == max(rates, key=rates.get)  # the winner has the most tokens/s per GPU
    tokens = {e.label: e.job["results"]["cases"][0]["tokens_per_step"] for e in ranking.entries}
    assert tokens["dp2"] == 2 * tokens["tp2"]  # why step time alone would mislead
    capsys.readouterr()  # the sweep's closing lines, as a pipe gets them, name the fastest layout
    print_answer(train_layouts.sweep_dir, console=Console(file=io.StringIO(), width=100))
    out = capsys.readouterr().out
    assert f"fastest train (ranked: parallelism):\n  all: {ranking.entries[0].label} " in out, out


def test_too_few_rounds_is_undecided_and_not_a_pass(tmp_path_factory: pytest.TempPathFactory) -> None:
    root = tmp_path_factory.mktemp("two_rounds")
    run = run_sweepbench(TWO_ROUNDS, sweep_dir=root / "sweep", cwd=root)
    assert run.rc == 0, run.describe()
    proc = sweepbench_cli("compare", run.sweep_dir, run.sweep_dir, "-o", root / "out")
    assert proc.returncode == 0, proc.stderr  # without the gate: reported
    import pandas as pd

    table = pd.read_csv(root / "out" / "compare.csv")
    assert len(table) >= 1 and set(table["verdict"]) == {"undecided"} and set(table["basis"]) == {"rounds"}
    assert (table["note"] == "2 rounds a side, fewer than 3 a side: sweep.repeats >= 3").all()
    proc = sweepbench_cli("compare", run.sweep_dir, run.sweep_dir, "-o", root / "out", "--fail-on-regression")
    assert proc.returncode == 4 and proc.stderr.strip().splitlines() == [
        f"sweepbench: error: undecided: no case of {len(table)} was decided: 2 rounds a side, fewer than 3 a side: "
        "sweep.repeats >= 3 (--fail-on-regression)"], proc.stderr


def test_numbers_keep_their_integer_digits() -> None:
    """The summary's and the pages' numbers: 4 significant digits, but never an exponent that
    drops digits of a rate people compare (57991.9 tokens/s is 57992, not 5.799e+04)."""
    from sweepbench.draw.units import format_number

    assert format_number(57991.9026) == "57992" and format_number(4.95e4) == "49500"
    assert format_number(999.94) == "999.9" and format_number(0.012344) == "0.01234"
    assert format_number(0.0) == "0" and format_number(-1234.6) == "-1235"
    assert format_number(4.9e15) == "4.9e+15" and format_number(float("nan")) == "nan"
