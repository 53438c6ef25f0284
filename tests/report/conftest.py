"""Real CPU sweeps the report tests read: every benchmark at tiny size, one job failing on purpose,
and three refit sweeps (two of one config, one slowed by fault.kind=slow) for compare."""

from __future__ import annotations

import contextlib
import io
import subprocess
from pathlib import Path

import pytest

from ..conftest import TINY, SweepRun, run_sweeps
from .answer_sweeps import answer_sweeps  # noqa: F401 (one session fixture for every module of tests/report)

REPORT_SWEEPS = {
    # tp2 twice: clean, and with rank 1 raising (a failed job the report must list with its error)
    "collective": ["benchmark=collective", "parallelism=tp2", "fault.kind=none,raise", "fault.rank=1",
                   "benchmark.ops=[all_reduce,all_gather,send_recv]", "benchmark.max_bytes=16384",
                   "benchmark.iters=3", "benchmark.warmup=1"],
    "refit": ["benchmark=refit", "model=tiny", "parallelism=tp2", "benchmark.strategy=send_recv",
              "benchmark.warmup=1", "benchmark.iters=3", "benchmark.probe_bytes=65536"],
    "reshard": ["benchmark=reshard", "benchmark.tensor_bytes=36864", "benchmark.iters=3", "benchmark.warmup=1",
                "benchmark.m=[1,2]", "benchmark.probe_bytes=65536"],
}

# a tiny sweep with secret-looking config keys (run again with sweep.force=true by test_wandb)
SECRET = "sekrit" + "77" * 8
SECRETS_SWEEP = [*TINY, "parallelism=tp1", f"+wandb_api_key={SECRET}", f"+launch.my_token={SECRET}"]

# compare: one rank (no peer to wait for: the least noisy timing on a busy 2-core box), many
# short iterations, so that a few preempted ones move neither the median nor the noise estimate
# five rounds a sweep (sweep.repeats): compare judges on the rounds. Five, not three: this job's
# speed is bimodal between processes on a 2-core box (a round's median 0.34-0.40 or 0.53-0.62 ms,
# with fresh and forked ranks alike), and CI once saw base's three rounds all in the slow mode and
# two of slow's three in the fast one: the 3x slowdown came out 1.85x at p 0.011 (`~`). Modelled
# on those modes, 3 + 3 rounds miss the slowdown about 3% of the time, 5 + 5 not in 4000 draws
COMPARE_ROUNDS = 5
COMPARE = ["benchmark=refit", "model=tiny", "parallelism=tp1", "benchmark.inference=tp1", "benchmark.iters=50",
           "benchmark.warmup=5", "benchmark.probe_bytes=65536", f"sweep.repeats={COMPARE_ROUNDS}"]
# 3x: on a busy 2-core CI box the baseline's own noise (IQR/median) was seen at 13%, which raises
# the threshold to 1.25 and would hide a 1.3x slowdown (correctly: it is within 2x noise); a 2x
# slowdown's t-test on 3 + 3 rounds came out at p 1e-5 to 1e-3 on six pairs run one after the
# other on such a box, close to the 0.01 a verdict needs (this file once failed there); 3x is clear
SLOW_FACTOR = 3.0
SLOW = ["fault.kind=slow", f"fault.factor={SLOW_FACTOR}"]


def _run_all(grids: dict[str, list[str]], root: Path, *, workers: int = 0) -> dict[str, SweepRun]:
    """The sweeps at the same time (a 2-core box spends much of a sweep starting processes), or
    ``workers`` at a time."""
    return run_sweeps(grids, root, workers=workers, cwd=root, timeout=280)


@pytest.fixture(scope="session")
def all_sweeps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SweepRun]:
    runs = _run_all({**REPORT_SWEEPS, "secrets": SECRETS_SWEEP}, tmp_path_factory.mktemp("report_sweeps"))
    for name, run in runs.items():
        expected = 1 if name == "collective" else 0  # the failed job makes the sweep exit 1
        assert run.rc == expected, run.describe()
    return runs


@pytest.fixture(scope="session")
def report_sweeps(all_sweeps: dict[str, SweepRun]) -> dict[str, SweepRun]:
    """One sweep of each benchmark (collective with a failed job)."""
    return {k: all_sweeps[k] for k in REPORT_SWEEPS}


@pytest.fixture(scope="session")
def secrets_sweep(all_sweeps: dict[str, SweepRun]) -> SweepRun:
    return all_sweeps["secrets"]


@pytest.fixture(scope="session")
def compare_sweeps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SweepRun]:
    """base and slow, one after the other, each alone; then twin_a and twin_b (the same config as
    base) at the same time. Alone, each sweep's noise is its own (three at once on 2 cores made
    sub-millisecond iterations fight for the cores: a CV of 3 and max/median of 84 were seen).
    The twins run side by side because an identical rerun that ran apart can rightly be `slower`:
    the machine itself changed between two sweeps (CI saw base's three rounds at 0.43 ms and its
    rerun's, a minute later, all beyond 1.16x), which compare cannot tell from the code and says
    so ("the sweeps ran apart"); side by side, whatever the machine does it does to both."""
    root = tmp_path_factory.mktemp("compare_sweeps")
    runs = _run_all({"base": COMPARE, "slow": [*COMPARE, *SLOW]}, root, workers=1)
    runs.update(_run_all({"twin_a": COMPARE, "twin_b": COMPARE}, root))
    for run in runs.values():
        assert run.rc == 0, run.describe()
    return runs


def sweepbench_cli(*args: str | Path) -> subprocess.CompletedProcess:
    """``sweepbench ARGS`` (a sub-command) run in this process, its exit status and output.
    The console entry itself (``python -m sweepbench report``) is run as a process by the page
    fixture; the other calls skip a 2-core box's seconds of interpreter start-up."""
    from sweepbench.report.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main([str(a) for a in args])
        except SystemExit as exit_:  # argparse: --help, usage errors
            rc = int(exit_.code or 0)
    return subprocess.CompletedProcess(list(args), rc, out.getvalue(), err.getvalue())
