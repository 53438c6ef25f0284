"""Helpers of the SLURM sweep tests: sweeps in the background, grids of tags, job dir contents."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig

from ..conftest import SweepRun, base_env, planned_tag


def grid_tags(compose: Callable[..., DictConfig], fixed: list[str], key: str, values: list[str]) -> dict[str, str]:
    return {v: planned_tag(compose, *fixed, f"{key}={v}") for v in values}


def job_files(job_dir: Path) -> set[str]:
    """A job dir's files (relative paths), its wandb directory left out."""
    files = set()
    for path in job_dir.rglob("*"):
        rel = path.relative_to(job_dir).as_posix()
        if path.is_file() and not rel.startswith("wandb/"):
            files.add(rel)
    return files


def what_was_measured(case: dict[str, Any]) -> dict[str, Any]:
    """A measured case without its measurements (times, rates): op, size, dtype, iterations."""
    return {k: v for k, v in case.items() if not k.endswith(("_s", "_gbps"))}


def wandb_run_dir(job_dir: Path) -> Path:
    runs = sorted((job_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs
    return runs[0]


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def assert_requeued_and_done(driver_output: str, tag: str) -> None:
    """The driver said: the job ran, went back to the queue, ran again and finished ok."""
    states = " ".join(re.findall(rf"slurm job \S+ {tag}: (\S+)", driver_output))
    assert re.search(r"RUNNING (\S+ )*?(REQUEUED|PENDING) (\S+ )*?RUNNING (\S+ )*?finished,$", states), states
    assert f"{tag}: finished, done" in driver_output


class BackgroundSweep:
    """A sweep running in a subprocess while other tests go on; its output goes to a file."""

    def __init__(self, args: list[str], sweep_dir: Path) -> None:
        self.sweep_dir = sweep_dir
        self.args = ["-m", *args, f"hydra.sweep.dir={sweep_dir}"]
        self.out = sweep_dir.parent / "driver.out"
        self.err = sweep_dir.parent / "driver.err"
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "sweepbench", *self.args], cwd=sweep_dir.parent,
                                         env=base_env(), stdout=out, stderr=err, text=True)

    def wait(self, timeout: float) -> SweepRun:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            self.stop()
        done = subprocess.CompletedProcess(self.args, self.proc.returncode, self.out.read_text(), self.err.read_text())
        return SweepRun(self.sweep_dir, self.args, done, {})

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            ids = set(re.findall(r"as slurm job (\S+):", self.out.read_text()))
            if ids:
                subprocess.run(["scancel", *ids], check=False, capture_output=True)
