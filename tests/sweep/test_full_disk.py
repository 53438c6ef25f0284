"""A disk that fills mid-sweep (a real tmpfs, filled the moment the first job has recorded): the jobs
that hit it are failed with ``No space left on device`` in their error, the summary is printed, one
line each says why results.csv and the report could not be written, the exit code is 1, no
process is left, no traceback; with space again the rerun resumes the job that finished and
completes the rest."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pandas as pd
import pytest

from tests.conftest import TINY, base_env, fill_disk, processes_with_env, run_sweepbench, tmpfs

GRID = [*TINY, "parallelism=tp1,tp2,dp2"]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "disk", "64m") as mount:
        yield mount


# when the disk fills: once the first job recorded (the next job's config cannot be saved), or while
# the second job's ranks run (its record cannot be written)
WHEN = {"between_jobs": "*/metrics.json", "while_ranks_run": "*_tp2_*/logs/rank1.log"}


def _fill_once(sweep_dir: Path, pattern: str, filler: Path, stop: threading.Event) -> None:
    while not stop.is_set() and not list(sweep_dir.glob(pattern)):
        time.sleep(0.02)
    fill_disk(filler)


@pytest.mark.parametrize("when", WHEN)
def test_a_disk_that_fills_mid_sweep_loses_nothing_that_finished(small_disk: Path, tmp_path: Path, when: str) -> None:
    sweep_dir, filler = small_disk / "sweep", small_disk / "filler"
    stop = threading.Event()
    filling = threading.Thread(target=_fill_once, args=(sweep_dir, WHEN[when], filler, stop))
    filling.start()
    try:
        run = run_sweepbench(GRID, sweep_dir=sweep_dir, cwd=tmp_path / "cwd")
    finally:
        stop.set()
        filling.join()
    assert filler.stat().st_size > 0, "the disk was never filled"
    out = run.stdout + run.stderr
    assert run.rc == 1, run.describe()
    assert "Traceback" not in out and "Logging error" not in out, run.describe()
    summary = [line.strip() for line in run.stdout.splitlines() if line.startswith("  collective-")]
    assert len(summary) == 3 and ": ok, 1 ranks" in summary[0], summary
    for line in summary[1:]:
        assert ": failed, 2 ranks: " in line and "No space left on device" in line, summary
    csv = f"results.csv and results.parquet not written: [Errno 28] No space left on device: '{sweep_dir}/results.csv'"
    assert f"sweepbench: {csv}\n" in run.stderr, run.stderr
    assert "sweepbench: no report.html (OSError: [Errno 28] No space left on device: " in run.stderr, run.stderr
    assert f"sweepbench: 2 of 3 jobs did not finish ok ({csv})" in run.stderr, run.stderr
    assert not list(sweep_dir.rglob(".*.tmp")), "a half-written file was left"
    assert processes_with_env("SWEEPBENCH_TEST_RUN", run.env["SWEEPBENCH_TEST_RUN"]) == []

    filler.unlink()  # space again: the rerun resumes what finished and runs the rest
    rerun = run_sweepbench(GRID, sweep_dir=sweep_dir, cwd=tmp_path / "cwd")
    assert rerun.rc == 0, rerun.describe()
    table = pd.read_csv(sweep_dir / "results.csv")
    assert list(table["status"]) == ["ok"] * 3 and list(table["resumed"]) == [True, False, False], table
    assert (sweep_dir / "report.html").is_file()


def _drop_dac() -> list[str]:
    """A command prefix that makes file modes hold for root too (its bounding set loses
    CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH); none needed for another user."""
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []


def _make_read_only(sweep_dir: Path, stop: threading.Event) -> None:
    while not stop.is_set() and not list(sweep_dir.glob("*/metrics.json")):
        time.sleep(0.02)
    sweep_dir.chmod(0o555)


def test_a_sweep_directory_made_read_only_mid_sweep(tmp_path: Path) -> None:
    """The directory turns read-only once the first job recorded: the next job fails naming it,
    results.csv and the report are one line each, the lock is let go (its note cannot be removed),
    no traceback; writable again, the rerun completes."""
    sweep_dir = tmp_path / "sweep"
    stop = threading.Event()
    turning = threading.Thread(target=_make_read_only, args=(sweep_dir, stop))
    turning.start()
    env = base_env()
    try:
        proc = subprocess.run([*_drop_dac(), sys.executable, "-m", "sweepbench", "-m", *GRID[:-1],
                               "parallelism=tp1,tp2", f"hydra.sweep.dir={sweep_dir}"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    finally:
        stop.set()
        turning.join()
        sweep_dir.chmod(0o755)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "Traceback" not in out, out[-3000:]
    summary = [line.strip() for line in proc.stdout.splitlines() if line.startswith("  collective-")]
    assert ": ok, 1 ranks" in summary[0] and ": failed, 2 ranks: PermissionError: " in summary[1], summary
    assert f"results.csv and results.parquet not written: [Errno 13] Permission denied: '{sweep_dir}/results.csv'" \
        in proc.stderr, proc.stderr
    assert f"no report.html (PermissionError: [Errno 13] Permission denied: '{sweep_dir}/report.html')" in proc.stderr
    assert processes_with_env("SWEEPBENCH_TEST_RUN", env["SWEEPBENCH_TEST_RUN"]) == []
    rerun = run_sweepbench([*GRID[:-1], "parallelism=tp1,tp2"], sweep_dir=sweep_dir, cwd=tmp_path)
    assert rerun.rc == 0, rerun.describe()
    assert list(pd.read_csv(sweep_dir / "results.csv")["resumed"]) == [True, False]


@pytest.mark.parametrize("command", ["report", "compare", "save_jobs"])
def test_an_output_on_a_full_disk_is_one_line(small_disk: Path, tmp_path: Path, command: str) -> None:
    """report, compare and --save-jobs into a full disk: one line naming the file, exit 2, nothing
    half-written."""
    from tests.report.conftest import sweepbench_cli

    sweep = tmp_path / "sweep"  # a sweep directory that does not need its jobs run: one job that left no record
    (sweep / "collective-x" / ".hydra").mkdir(parents=True)
    (sweep / "results.csv").write_text("tag,status,error\ncollective-x,failed,boom\n")
    fill_disk(small_disk / "filler")
    target = {"report": ["report", sweep, "-o", small_disk / "r.html"],
              "compare": ["compare", sweep, sweep, "-o", small_disk / "cmp"],
              "save_jobs": ["report", sweep, "-o", tmp_path / "r.html", "--save-jobs", small_disk / "j.json"]}[command]
    written = {"report": small_disk / "r.html", "compare": small_disk / "cmp" / "compare.csv",
               "save_jobs": small_disk / "j.json"}[command]
    proc = sweepbench_cli(*target)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and lines[-1] == f"sweepbench: error: {written} cannot be written: No space left on device", \
        proc.stderr
    assert not written.exists() and not list(small_disk.rglob(".*.tmp"))

