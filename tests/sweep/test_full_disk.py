"""A disk that fills mid-sweep (a real tmpfs, filled the moment the first job has recorded): the jobs
that hit it are failed with ``No space left on device`` in their error, the summary is printed, one
line each says why results.csv and the report could not be written, the exit code is 1, no
process is left, no traceback; with space again the rerun resumes the job that finished and
completes the rest."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator

import pandas as pd
import pytest

from tests.conftest import TINY, processes_with_env, run_sweepbench

GRID = [*TINY, "parallelism=tp1,tp2,dp2"]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


# when the disk fills: once the first job recorded (the next job's config cannot be saved), or while
# the second job's ranks run (its record cannot be written)
WHEN = {"between_jobs": "*/metrics.json", "while_ranks_run": "*_tp2_*/logs/rank1.log"}


def _fill_once(sweep_dir: Path, pattern: str, filler: Path, stop: threading.Event) -> None:
    while not stop.is_set() and not list(sweep_dir.glob(pattern)):
        time.sleep(0.02)
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass


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
    assert "sweepbench: results.csv and results.parquet not written: [Errno 28] No space left on device" in run.stderr
    assert "sweepbench: no report.html (OSError: [Errno 28] No space left on device)" in run.stderr
    assert ("sweepbench: 2 of 3 jobs did not finish ok (results.csv and results.parquet not written: "
            "[Errno 28] No space left on device)") in run.stderr
    assert not list(sweep_dir.rglob(".*.tmp")), "a half-written file was left"
    assert processes_with_env("SWEEPBENCH_TEST_RUN", run.env["SWEEPBENCH_TEST_RUN"]) == []

    filler.unlink()  # space again: the rerun resumes what finished and runs the rest
    rerun = run_sweepbench(GRID, sweep_dir=sweep_dir, cwd=tmp_path / "cwd")
    assert rerun.rc == 0, rerun.describe()
    table = pd.read_csv(sweep_dir / "results.csv")
    assert list(table["status"]) == ["ok"] * 3 and list(table["resumed"]) == [True, False, False], table
    assert (sweep_dir / "report.html").is_file()
