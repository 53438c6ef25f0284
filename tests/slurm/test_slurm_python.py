"""Software environments as a sweep axis under SLURM: ``launch.python`` swept over two real
interpreters, this project's and a second venv (``--system-site-packages``, so it sees torch and
sweepbench) with another version of ``rich``, one of sweepbench's dependencies, really installed
in it. srun starts each job's tasks with its interpreter, and env.json (written by rank 0, a
SLURM task) records the interpreter and package versions the ranks ran with, not the driver's."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
from omegaconf import DictConfig

from ..conftest import TINY, planned_tag, run_sweepbench
from .cluster import SlurmCluster

OTHER_RICH = "13.9.4"  # the project's environment has another (asserted below)
SLURM = ["hydra/launcher=slurm", "hydra.launcher.poll_s=1"]
GRID = ["parallelism=tp2", *TINY]


@pytest.fixture(scope="module")
def second_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real venv over this interpreter's packages, with rich==OTHER_RICH installed into it."""
    venv = tmp_path_factory.mktemp("venv") / "rich13"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                   check=True, timeout=120)
    python = venv / "bin" / "python"
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                          f"rich=={OTHER_RICH}"], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr
    return python


@pytest.mark.timeout(300)
def test_each_job_runs_with_its_interpreter_and_env_json_says_so(
        slurm_cluster: SlurmCluster, second_venv: Path, tmp_path: Path, compose: Callable[..., DictConfig]) -> None:
    ours = importlib.metadata.version("rich")
    assert ours != OTHER_RICH
    pythons = {sys.executable: ours, str(second_venv): OTHER_RICH}
    run = run_sweepbench([*SLURM, *GRID, f"launch.python={','.join(pythons)}"], sweep_dir=tmp_path / "sweep")
    assert run.rc == 0, run.describe()
    submitted = dict(re.findall(r"submitted (\S+) as slurm job (\S+):", run.stdout))
    assert len(submitted) == 2, run.stdout
    for python, rich in pythons.items():
        tag = planned_tag(compose, *GRID, f"launch.python={python}")
        assert tag in submitted, (tag, submitted)
        m = run.metrics(tag)
        assert m["status"] == "ok" and m["verified"], m["error"]
        assert m["config"]["launch"]["python"] == python
        env = run.env_json(tag)
        assert env["executable"] == python and env["packages"]["rich"] == rich, env
        assert env["slurm"]["job_id"]  # recorded inside the SLURM job, by rank 0
        for rank in (0, 1):  # every rank ran with it, per the header its task wrote
            log = (run.sweep_dir / tag / "logs" / f"rank{rank}.log").read_text()
            assert f", python {python} =====" in log, log[:1000]
        # srun started the tasks with that interpreter (submitit's submission script)
        scripts = [p.read_text() for p in (run.sweep_dir / ".submitit").rglob("*_submission.sh")]
        assert sum(f" {python} -u -m submitit.core._submit " in text for text in scripts) == 1, scripts
    assert len(set(submitted.values())) == 2 and len({j.split("_")[0] for j in submitted.values()}) == 2
