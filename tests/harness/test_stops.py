"""Ctrl-C and SIGTERM at every point of a real sweep: before its first job starts, in the middle of
a job, between two jobs. Whatever the signal and its timing, a stopped job is ``interrupted``, a
job that never started is ``not run`` (never ``failed``), the summary ranks no phantom job, and
resuming runs both."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from ..conftest import TINY, base_env, run_sweepbench

GRID = [*TINY, "parallelism=tp1", "benchmark.iters=2,3,4"]
LONG_FIRST = [*TINY, "parallelism=tp1", "benchmark.iters=2000,3,4"]
POINTS = {
    # right after the sweep saved its config: the handlers may or may not be in place yet
    "before the first job": (GRID, lambda lines, sweep: (sweep / "multirun.yaml").exists()),
    # the first job (seconds of timed iterations) has its ranks up
    "mid-job": (LONG_FIRST, lambda lines, sweep: any("process group up" in p.read_text(errors="replace")
                                                     for p in sweep.glob("*/logs/rank0.log"))),
    # the first job finished ok, the second is starting or about to
    "between jobs": (GRID, lambda lines, sweep: any(line.startswith("[1/3] ") and ": ok in " in line
                                                    for line in lines)),
}


def _stopped_sweep(args: list[str], sweep_dir: Path, ready, sig: signal.Signals) -> tuple[int, str, str]:
    sweep_dir.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-m", "sweepbench", "-m", *args, f"hydra.sweep.dir={sweep_dir}"],
                            cwd=sweep_dir.parent, env=base_env(COLUMNS="80"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while not ready(list(lines), sweep_dir):
        assert proc.poll() is None, f"the sweep ended before the point: {''.join(lines)[-2000:]}"
        assert time.monotonic() < deadline, "timed out waiting for the point"
        time.sleep(0.01)
    proc.send_signal(sig)
    err = proc.stderr.read()
    proc.wait(timeout=120)
    reader.join(timeout=10)
    return proc.returncode, "".join(lines), err


@pytest.mark.parametrize("point", sorted(POINTS))
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_records_interrupted_and_not_run_and_resume_runs_both(tmp_path: Path, sig: signal.Signals,
                                                                    point: str) -> None:
    args, ready = POINTS[point]
    sweep_dir = tmp_path / "sweep"
    rc, out, err = _stopped_sweep(args, sweep_dir, ready, sig)
    assert rc == 128 + sig, err[-3000:]
    assert "Traceback" not in err and "Traceback" not in out, err[-3000:]
    if not (sweep_dir / "results.csv").exists():  # stopped before the sweep's handlers were in place
        assert point == "before the first job" and err.strip() == f"sweepbench: interrupted by {sig.name} before any job started", err
        assert not any(p.is_dir() and not p.name.startswith(".") for p in sweep_dir.iterdir())
    else:
        table = pd.read_csv(sweep_dir / "results.csv")
        statuses = list(table["status"])
        assert len(statuses) == 3 and set(statuses) <= {"ok", "interrupted", "not run"}, table[["status", "error"]]
        assert statuses.count("interrupted") <= 1
        if point == "mid-job":
            assert statuses == ["interrupted", "not run", "not run"], statuses
        if point == "between jobs":
            assert statuses[0] == "ok" and statuses[2] == "not run", statuses
        for _, row in table[table["status"] == "not run"].iterrows():
            assert row["error"] == f"not started: the sweep was stopped by {sig.name} first"
            assert not (sweep_dir / row["tag"]).exists()  # a job that never started leaves nothing
        assert "unknown" not in out and "left no metrics.json" not in out, out[-3000:]
        last = err.strip().splitlines()[-1]
        assert last.startswith(f"sweepbench: interrupted by {sig.name}: ") and "resume with:" in last
    again = run_sweepbench(args, sweep_dir=sweep_dir)  # resume: the interrupted and the not-run jobs
    assert again.rc == 0, again.describe()
    assert list(again.results()["status"]) == ["ok"] * 3
    if (sweep_dir / "results.csv").exists() and point == "mid-job":
        assert "resume: 0 job(s) already ok, skipped; 3 to run (2 not run yet, 1 it ended interrupted)" \
            in again.stdout, again.stdout[-2000:]
