"""The SLURM request of each job (nodes, tasks = ranks per node, GPUs per node, time limit) and
the sbatch script it gets, checked without submitting anything (``sweep.dry_run=true``), through
the documented example preset (docs/slurm_example) on Hydra's search path; requests that cannot
be placed are bad input (one line, exit 2)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Callable

import pytest
from omegaconf import DictConfig

from sweepbench.launch.preflight import validate
from sweepbench.slurm.request import job_request

from ..conftest import run_sweepbench

REPO = Path(__file__).resolve().parents[2]
SLURM = ["hydra/launcher=slurm", "hydra.launcher.poll_s=1"]


@pytest.mark.parametrize("overrides, preset, expected", [
    (["parallelism=tp4pp2", "launch.gpus_per_node=4"], {}, (2, 4, 4, 17)),  # 2 nodes x 4 GPUs
    (["parallelism=tp4pp2"], {"gpus_per_node": 8}, (1, 8, 8, 17)),  # the preset's GPUs per node
    (["parallelism=tp2"], {"gpus_per_node": 8}, (1, 2, 2, 17)),  # GPUs requested = ranks on the node
    (["parallelism=tp4pp2", "launch.gpus_per_node=4", "launch.ranks_per_node=2"], {"gpus_per_node": 8},
     (4, 2, 2, 17)),
    (["parallelism=tp4"], {}, (1, 4, 0, 17)),  # CPU: the whole world on one node, no GPU
    (["parallelism=tp4", "launch.ranks_per_node=2", "launch.timeout_s=61"], {"startup_min": 3}, (2, 2, 0, 5)),
    (["parallelism=tp2"], {"timeout_min": 30}, (1, 2, 0, 30)),
])
def test_job_request(compose: Callable[..., DictConfig], overrides: list[str], preset: dict[str, int],
                     expected: tuple[int, int, int, int]) -> None:
    """nodes, tasks (ranks) per node, GPUs per node, minutes: from the job's config and the preset."""
    cfg = compose("benchmark=collective", *overrides)
    request = job_request(cfg, validate(cfg), {"startup_min": 2, **preset})
    assert (request.nodes, request.tasks_per_node, request.gpus_per_node, request.timeout_min) == expected


@pytest.mark.timeout(60)
def test_multinode_request_and_its_sbatch_script(tmp_path: Path) -> None:
    """The documented example preset, through Hydra's search path; a dry run submits nothing."""
    preset = ["hydra.searchpath=[file://" + str(REPO / "docs" / "slurm_example") + "]", "hydra/launcher=my_cluster"]
    run = run_sweepbench([*preset, "benchmark=collective", "parallelism=tp4pp2", "launch.gpus_per_node=4",
                          "sweep.dry_run=true"], sweep_dir=tmp_path / "sweep", cwd=tmp_path / "cwd")
    assert run.rc == 0, run.describe()
    assert "2 nodes x 4 tasks, 4 GPUs/node, 17 min" in run.stdout
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --partition=gpu", "#SBATCH --account=my_project", "#SBATCH --constraint=h100",
                 "#SBATCH --cpus-per-task=16", "#SBATCH --time=17", "#SBATCH --requeue", "module load cuda/12.4"):
        assert line in run.stdout.splitlines(), line
    assert re.search(r"^srun .*--kill-on-bad-exit=1 .*-m submitit.core._submit", run.stdout, re.M)
    assert not (tmp_path / "sweep").exists() and list((tmp_path / "cwd").iterdir()) == []
    # without launch.gpus_per_node the preset's 8 GPUs per node hold the 8 ranks on one node
    run = run_sweepbench([*preset, "benchmark=collective", "parallelism=tp4pp2,tp2", "sweep.dry_run=true"],
                         sweep_dir=tmp_path / "sweep")
    assert run.rc == 0, run.describe()
    assert "1 node x 8 tasks, 8 GPUs/node" in run.stdout and "1 node x 2 tasks, 2 GPUs/node" in run.stdout


@pytest.mark.parametrize("bad, says", [
    (["hydra.launcher.nodes=2"], "hydra.launcher.nodes=2 is computed per job"),
    (["parallelism=tp4", "launch.ranks_per_node=3"], "launch.ranks_per_node=3 does not divide world_size=4"),
    (["parallelism=tp4pp2", "launch.gpus_per_node=4", "launch.ranks_per_node=8"], "needs 8 GPUs per node"),
    (["launch.python=/nonexistent/venv/bin/python"], "launch.python=/nonexistent/venv/bin/python is not an "
                                                      "executable file"),
])
@pytest.mark.timeout(60)
def test_a_request_that_cannot_be_placed_is_one_line_exit_2(tmp_path: Path, bad: list[str], says: str) -> None:
    run = run_sweepbench([*SLURM, "benchmark=collective", *bad, "sweep.dry_run=true"], sweep_dir=tmp_path / "s")
    assert run.rc == 2, run.describe()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sweepbench: error: ") and says in lines[0], run.stderr


@pytest.mark.timeout(60)
def test_each_interpreter_gets_its_own_submission(tmp_path: Path) -> None:
    """launch.python swept: jobs of each interpreter are submitted apart, srun starting the tasks
    with it (the driver's own when unset)."""
    other = tmp_path / "venv" / "bin" / "python"  # any executable will do for a dry run
    other.parent.mkdir(parents=True)
    other.symlink_to(sys.executable)
    run = run_sweepbench([*SLURM, "benchmark=collective", f"launch.python={sys.executable},{other}",
                          "sweep.dry_run=true"], sweep_dir=tmp_path / "sweep")
    assert run.rc == 0, run.describe()
    assert f"1 node x 2 tasks, no GPU, 17 min, python {sys.executable}" in run.stdout
    assert f"1 node x 2 tasks, no GPU, 17 min, python {other}" in run.stdout
    sruns = [line for line in run.stdout.splitlines() if line.startswith("srun ")]
    assert len(sruns) == 2, run.stdout
    assert f" {sys.executable} -u -m submitit.core._submit " in sruns[0]
    assert f" {other} -u -m submitit.core._submit " in sruns[1]
