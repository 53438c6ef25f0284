"""Real CPU sweeps whose answer is known, shared by the tests of the report's answer, its figures
and the terminal ranking (a session fixture through tests/report/conftest.py: one set of sweeps
for every module that uses them):

* ``slow``: one refit config run twice, once with every timed iteration made 4x as long
  (``fault.kind=slow fault.factor=1,4``: factor 1 is the clean twin), so the sweep varies one
  axis, fault.factor, and factor 1 must win by a real gap; run with COLUMNS=80 (its terminal
  ranking must fit). 4x, not 2x: a ~200 us iteration on a loaded 2-core box once had a robust
  noise over 0.5, which puts compare's threshold (1 + 2 x noise) above a 2x gap;
* ``attention``: impl x seq_len at a ring of 2 (tiny), for the chart keyed by what varied, its
  processes counting their reads of metrics.json (``read_counts``);
* ``train``: one job of the tiny model, so that every benchmark's page is checked in Chromium."""

from __future__ import annotations

import pytest

from ..conftest import TERMINAL, SweepRun, base_env, concurrently, run_sweepbench
from .read_counts import counting_env

# one rank, many short iterations (as compare's sweeps): the least noisy timing on a busy 2-core box
SLOW = ["benchmark=refit", "model=tiny", "parallelism=tp1", "benchmark.inference=tp1", "benchmark.iters=60",
        "benchmark.warmup=5", "benchmark.probe_bytes=65536", "fault.kind=slow", "fault.factor=1,4"]
ATTENTION = ["benchmark=attention", "model=tiny", "backend=gloo", "parallelism=cp2", "benchmark.impl=ring,ulysses",
             "benchmark.seq_len=64,128", "benchmark.iters=3", "benchmark.warmup=1", "benchmark.t1_iters=1"]
TRAIN = ["benchmark=train", "model=tiny", "backend=gloo", "parallelism=tp1", "benchmark.warmup=1",
         "benchmark.iters=3", "wandb.mode=disabled"]
TERMINAL_COLUMNS = 80


@pytest.fixture(scope="session")
def answer_sweeps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SweepRun]:
    """The three sweeps: the slow one alone on the cores (its timing decides the answer), then the
    other two side by side (no test compares their numbers)."""
    root = tmp_path_factory.mktemp("answer_sweeps")
    runs = {"slow": run_sweepbench(SLOW, sweep_dir=root / "slow", cwd=root,
                                   env=base_env(COLUMNS=str(TERMINAL_COLUMNS), **TERMINAL))}
    runs["attention"], runs["train"] = concurrently(
        lambda: run_sweepbench(ATTENTION, sweep_dir=root / "attention", cwd=root, timeout=300,
                               env=base_env(**counting_env(root / "attention_reads"))),
        lambda: run_sweepbench(TRAIN, sweep_dir=root / "train", cwd=root, timeout=300),
    )
    for run in runs.values():
        assert run.rc == 0, run.describe()
    return runs
