"""Saved sweep lists (``hydra.sweeper.params``, as Hydra's basic sweeper has them): an experiment
file on Hydra's search path sets a grid; the CLI wins per key; the saved grid is expanded,
validated and tagged like a CLI grid, and a dry run prints the command that reproduces each job."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from ..conftest import TINY, base_env, planned_tag, run_sweepbench

EXPERIMENT = """\
# @package _global_
defaults:
  - override /benchmark: collective
hydra:
  sweeper:
    params:
      benchmark.max_bytes: 1024,2048
      {par}
"""


def _conf(tmp_path: Path, par: str = "parallelism: tp1,tp2") -> str:
    folder = tmp_path / "my_conf" / "experiment"
    folder.mkdir(parents=True)
    (folder / "grid.yaml").write_text(EXPERIMENT.format(par=par))
    return f"hydra.searchpath=[file://{tmp_path / 'my_conf'}]"


def test_saved_grid_expanded_tagged_and_cli_wins(tmp_path: Path, compose) -> None:
    searchpath = _conf(tmp_path)
    sweep_dir = tmp_path / "sweep"
    # the CLI's parallelism list replaces the saved one; the saved max_bytes list stays
    run = run_sweepbench([searchpath, "experiment=grid", "parallelism=tp1,dp2", "sweep.dry_run=true"],
                         sweep_dir=sweep_dir, cwd=tmp_path / "cwd")
    assert run.rc == 0, run.describe()
    expected = {planned_tag(compose, searchpath, "experiment=grid", f"benchmark.max_bytes={b}", f"parallelism={p}")
                for b in (1024, 2048) for p in ("tp1", "dp2")}
    assert len(expected) == 4
    for tag in expected:
        assert tag in run.stdout, (tag, run.stdout)
    assert "4 jobs" in run.stdout and "_tp2_" not in run.stdout
    # a dry run through a pipe: one line per job, "TAG: ...; alone: COMMAND"
    commands = [line.split("alone: ", 1)[1] for line in run.stdout.splitlines() if "alone: python -m sweepbench" in line]
    assert len(commands) == 4
    assert all("sweep.dry_run" not in c and f"hydra.sweep.dir={sweep_dir}" in c for c in commands)
    assert not sweep_dir.exists()

    # a printed command runs exactly its job, into the same sweep dir (the saved lists overridden)
    argv = shlex.split(commands[0])[3:] + [a for a in TINY[1:] if not a.startswith("benchmark.max_bytes=")]
    proc = subprocess.run([sys.executable, "-m", "sweepbench", *argv], cwd=tmp_path / "cwd", env=base_env(),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = [p.name for p in sweep_dir.iterdir() if p.is_dir()]
    assert len(jobs) == 1 and jobs[0].startswith("collective-torch_tiny_tp1_"), jobs


def test_saved_grid_validated_before_any_job(tmp_path: Path) -> None:
    searchpath = _conf(tmp_path, par="parallelism.tp: 1,3")  # 3 does not divide tiny's heads
    run = run_sweepbench([searchpath, "experiment=grid"], sweep_dir=tmp_path / "sweep", cwd=tmp_path / "cwd")
    assert run.rc == 2, run.describe()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sweepbench: error: parallelism.tp=3"), run.stderr
    assert not (tmp_path / "sweep").exists()
