"""A driver that never leaves ranks behind or tells a stale story, with real processes and real
signals: SIGKILL of the driver (ranks die with it; a forced rerun's old result never stands in),
Ctrl-C/SIGTERM (the running job recorded ``interrupted``, results for what finished, exit
130/143), a second sweep into a locked directory, resume that checks what it trusts."""

from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..conftest import TERMINAL, TINY, base_env, fill_disk, processes_with_env, run_sweepbench, tmpfs

ONE = [*TINY, "parallelism=tp2"]


def _start(args: list[str], sweep_dir: Path, env: dict[str, str]) -> subprocess.Popen:
    sweep_dir.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "sweepbench", "-m", *args, f"hydra.sweep.dir={sweep_dir}"],
                            cwd=sweep_dir.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(predicate, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _count_in_logs(sweep_dir: Path, text: str) -> int:
    return sum(p.read_text(errors="replace").count(text) for p in sweep_dir.glob("*/logs/rank*.log"))


def _no_ranks_left(marker: str, timeout: float = 10) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := processes_with_env("SWEEPBENCH_TEST_RUN", marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _leftover_files(sweep_dir: Path) -> list[str]:
    return [str(p) for p in sweep_dir.rglob(".rank*") if p.is_file()]


def test_sigkill_of_the_driver_kills_its_ranks_and_no_old_result_stands_in(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    first = run_sweepbench(ONE, sweep_dir=sweep_dir)
    assert first.rc == 0, first.describe()
    (job,) = [p for p in sweep_dir.iterdir() if p.is_dir()]
    env = base_env()
    proc = _start([*ONE, "sweep.force=true"], sweep_dir, env)
    _wait_for(lambda: _count_in_logs(sweep_dir, "===== ") >= 4, "the forced rerun's ranks to start")
    assert processes_with_env("SWEEPBENCH_TEST_RUN", env["SWEEPBENCH_TEST_RUN"])
    proc.kill()
    proc.wait(timeout=30)
    assert _no_ranks_left(env["SWEEPBENCH_TEST_RUN"]) == [], "ranks outlived a SIGKILLed driver"
    assert _leftover_files(sweep_dir) == []
    # the forced rerun died before writing metrics.json: the old ok result is not there to be trusted
    assert not (job / "metrics.json").exists()
    assert json.loads((job / "metrics.previous.json").read_text())["status"] == "ok"
    again = run_sweepbench(ONE, sweep_dir=sweep_dir)
    assert again.rc == 0, again.describe()
    assert "resume: 0 job(s) already ok, skipped; 1 to run (1 its last run left no metrics.json)" in again.stdout
    assert json.loads((job / "metrics.json").read_text())["status"] == "ok"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_ctrl_c_and_sigterm_stop_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    sweep_dir = tmp_path / "sweep"
    env = base_env()
    proc = _start([*ONE, "fault.rank=1", "fault.kind=none,hang", "launch.timeout_s=300"], sweep_dir, env)
    # the second job hangs after its process group is up: 2 + 2 ranks have said so
    _wait_for(lambda: _count_in_logs(sweep_dir, "process group up") >= 4, "the hanging job's ranks")
    if sig == signal.SIGTERM:  # meanwhile, a second sweep into the same directory is refused
        second = run_sweepbench(ONE, sweep_dir=sweep_dir)
        assert second.rc == 2, second.describe()
        assert second.stderr.strip().splitlines() == [second.stderr.strip()]
        assert f"is in use by another sweep (pid {proc.pid} on " in second.stderr
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, err[-3000:]
    assert "Traceback" not in err and "Traceback" not in out, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"sweepbench: interrupted by {sig.name}: 1 of 2 jobs") and "resume with: python -m sweepbench" in last
    assert f"hydra.sweep.dir={sweep_dir}" in last
    assert _no_ranks_left(env["SWEEPBENCH_TEST_RUN"]) == []
    assert _leftover_files(sweep_dir) == []
    import pandas as pd

    table = pd.read_csv(sweep_dir / "results.csv")
    assert sorted(table["status"]) == ["interrupted", "ok"]
    hung = table[table["status"] == "interrupted"].iloc[0]
    metrics = json.loads((sweep_dir / hung["tag"] / "metrics.json").read_text())
    assert metrics["status"] == "interrupted" and sig.name in metrics["error"] and metrics["results"] == {}
    assert not (sweep_dir / ".sweepbench.lock.json").exists()


def test_resume_checks_what_it_trusts_and_results_cover_the_directory(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    grid = [*TINY, "parallelism=tp1", "benchmark.iters=2,3"]
    first = run_sweepbench(grid, sweep_dir=sweep_dir, env=base_env(WANDB_BASE_URL="http://alice:pw123@wandb.example:8080"))
    assert first.rc == 0, first.describe()
    a, b = sorted(p for p in sweep_dir.iterdir() if p.is_dir())
    # credentials in a URL in the environment are not written down
    env_text = (a / "env.json").read_text()
    assert "pw123" not in env_text and "http://<redacted>@wandb.example:8080" in env_text
    (a / "metrics.json").write_text("[1, 2]\n")  # valid JSON, not an object
    tampered = json.loads((b / "metrics.json").read_text())
    tampered["config"]["benchmark"]["iters"] = 7  # no longer the config its tag promises
    (b / "metrics.json").write_text(json.dumps(tampered))
    again = run_sweepbench(grid, sweep_dir=sweep_dir)
    assert again.rc == 0, again.describe()
    resume_line = next(line for line in again.stdout.splitlines() if line.startswith("resume:"))
    assert "0 job(s) already ok, skipped; 2 to run" in resume_line
    assert "its metrics.json is unreadable" in resume_line and "its recorded config does not match its tag" in resume_line
    other = run_sweepbench([*TINY, "parallelism=tp1", "benchmark.iters=4"], sweep_dir=sweep_dir,
                           env=base_env(COLUMNS="100", **TERMINAL))
    assert other.rc == 0, other.describe()
    # progress: job i of N with the elapsed time and an estimate; informative rank logs on success
    assert re.search(r"^\[1/1\] collective-torch_\S+: 1 ranks starting \(sweep \d+:\d\d elapsed, no estimate yet\)$",
                     other.stdout, re.M), other.stdout
    assert re.search(r"^\[1/1\] collective-torch_\S+: ok in [\d.]+s$", other.stdout, re.M), other.stdout
    # the summary fits a 100-column terminal and shows the benchmark's headline columns
    table_lines = [ln for ln in other.stdout.splitlines() if ln[:1] in "┏┃│┡└"]
    assert table_lines and max(len(ln) for ln in table_lines) <= 100, "\n".join(table_lines)
    assert "busbw" in other.stdout and "@1 KiB" in other.stdout
    import pandas as pd

    table = pd.read_csv(sweep_dir / "results.csv").set_index("tag")
    assert len(table) == 3 and (table["status"] == "ok").all()
    new = next(p for p in sweep_dir.iterdir() if p.is_dir() and p not in (a, b))
    log = (new / "logs" / "rank0.log").read_text()
    assert "rank 0 of 1" in log and "process group up" in log and "collective done in" in log
    assert table["this_run"].sum() == 1 and not table.loc[a.name, "this_run"] and not table.loc[b.name, "this_run"]
    # readable by teammates, like the logs
    for path in (sweep_dir / "results.csv", sweep_dir / "multirun.yaml", a / "metrics.json", a / "env.json"):
        assert path.stat().st_mode & 0o777 == 0o644, path


BAD_DIRS = {
    "proc": lambda tmp: Path("/proc/x/sweep"),
    "file": lambda tmp: tmp / "a_file" / "sweep",
    "long-name": lambda tmp: tmp / ("n" * 300),
}


@pytest.mark.parametrize("case", sorted(BAD_DIRS))
def test_bad_output_location_is_one_line_exit_2(tmp_path: Path, case: str) -> None:
    (tmp_path / "a_file").write_text("not a directory\n")
    run = run_sweepbench(ONE, sweep_dir=BAD_DIRS[case](tmp_path), cwd=tmp_path / "cwd")
    assert run.rc == 2, run.describe()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sweepbench: error: hydra.sweep.dir="), run.stderr
    assert "cannot be written" in lines[0]
    assert "ranks starting" not in run.stdout


@pytest.fixture
def full_disk(tmp_path: Path):
    with tmpfs(tmp_path / "full", "256k") as mount:
        fill_disk(mount / "filler", chunk=4096)
        yield mount


def test_full_disk_is_one_line_exit_2(tmp_path: Path, full_disk: Path) -> None:
    run = run_sweepbench(ONE, sweep_dir=full_disk / "sweep", cwd=tmp_path / "cwd")
    assert run.rc == 2, run.describe()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "No space left on device" in lines[0], run.stderr
    assert not (full_disk / "sweep").exists()


def test_a_spawn_that_fails_partway_kills_what_it_started(tmp_path: Path, compose) -> None:
    """Rank 1 cannot start (its log path is a directory: a real OSError at the second spawn), so
    rank 0, already running, must be killed and the job recorded as failed."""
    from ..conftest import planned_tag

    sweep_dir = tmp_path / "sweep"
    tag = planned_tag(compose, *ONE)
    (sweep_dir / tag / "logs" / "rank1.log").mkdir(parents=True)
    run = run_sweepbench(ONE, sweep_dir=sweep_dir)
    assert run.rc == 1, run.describe()
    metrics = json.loads((sweep_dir / tag / "metrics.json").read_text())
    assert metrics["status"] == "failed"
    assert metrics["error"].startswith("launch: could not start rank 1 of 2 with "), metrics["error"]
    assert "Is a directory" in metrics["error"]
    assert _no_ranks_left(run.env["SWEEPBENCH_TEST_RUN"], timeout=5) == []


def test_a_job_past_its_time_limit_says_where_each_rank_was(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    env = base_env()
    res = run_sweepbench([*ONE, "fault.rank=1", "fault.kind=hang", "launch.timeout_s=20"], sweep_dir=sweep_dir, env=env)
    assert res.rc == 1, res.describe()
    (job,) = [p for p in sweep_dir.iterdir() if p.is_dir()]
    metrics = json.loads((job / "metrics.json").read_text())
    assert metrics["status"] == "timeout", metrics["error"]
    assert "where each rank was is at the end of its log (logs/rank<N>.log)" in metrics["error"]
    # faulthandler's dump, written by the ranks themselves when asked, before they were killed
    hung = (job / "logs" / "rank1.log").read_text()
    assert re.search(r"Thread 0x[0-9a-f]+ \(most recent call first\):", hung), hung[-2000:]
    assert re.search(r'File ".*faults\.py", line \d+ in _hang', hung), hung[-2000:]
    waiting = (job / "logs" / "rank0.log").read_text()  # its peer, in the collective rank 1 never joined
    assert "(most recent call first)" in waiting and "in _hang" not in waiting, waiting[-2000:]
    assert _no_ranks_left(env["SWEEPBENCH_TEST_RUN"]) == []
