"""A sweep reads each job's record once: the driver reads every job's metrics.json a single time,
after the job wrote it, for all it does with the records (results.csv, the terminal summary and
ranking, report.html); no other process of the sweep (a rank, the fork server) reads one."""

from __future__ import annotations

import os

from ..conftest import SweepRun
from .read_counts import read_counts


def test_the_driver_reads_each_job_record_once(answer_sweeps: dict[str, SweepRun]) -> None:
    run = answer_sweeps["attention"]
    records = [str(p / "metrics.json") for p in run.job_dirs() if (p / "metrics.json").is_file()]
    assert len(records) == 4 and (run.sweep_dir / "report.html").is_file(), run.describe()
    counts = read_counts(run.sweep_dir.parent / "attention_reads")
    # the driver is the process this test's session started (the fixture's subprocess)
    by_driver = [proc["reads"] for proc in counts.values() if proc["ppid"] == os.getpid()]
    assert by_driver == [{path: 1 for path in records}], counts
    assert [proc for proc in counts.values() if proc["ppid"] != os.getpid()] == [], counts
