"""docs/slurm.md's commands as written, from a submit host without GPUs (this machine), on the real
test cluster, whose node declares 8 GPUs as a generic resource: each job is checked against its
request, never against this host's GPUs. The dry run lists every job with its request and sbatch
script and exits 0; the documented preset's ``backend=nccl`` sweep is submitted, SLURM accepts its
GPU requests (sacct's requested TRES), and its jobs then run on a node that has no real GPU."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from sweepbench.config.validate import visible_gpus

from ..conftest import run_sweepbench
from ..house.test_docs_commands import COMMANDS, args_of
from .cluster import SlurmCluster

DOCS = [cmd for page, cmd in COMMANDS if page == "docs/slurm.md"]
PRESET = next(cmd for cmd in DOCS if "hydra/launcher=my_cluster" in cmd)


def _args(cmd: str) -> list[str]:
    args = args_of(cmd, user_conf=Path("/nonexistent"), sweeps=[])
    return [a for a in args if a != "-m"]


def test_this_host_has_no_gpu() -> None:
    assert visible_gpus() == 0  # what makes it a login node for the tests below


@pytest.mark.timeout(180)
@pytest.mark.parametrize("cmd", DOCS, ids=[c[:70] for c in DOCS])
def test_docs_command_dry_run_from_a_login_node(cmd: str, tmp_path: Path) -> None:
    run = run_sweepbench([*_args(cmd), "sweep.dry_run=true"], sweep_dir=tmp_path / "sweep", cwd=tmp_path / "cwd")
    assert run.rc == 0, run.describe()
    jobs = re.findall(r"^  (\S+): \d+ ranks, backend \S+, fits here: (.*?); alone: ", run.stdout, re.M)
    assert jobs and all(fits == "yes" for _, fits in jobs), run.stdout[-3000:]
    requests = dict(re.findall(r"^sweepbench: slurm request (\S+): (.*)$", run.stdout, re.M))
    assert set(requests) == {tag for tag, _ in jobs}  # every job, with its request
    if "backend=nccl" in cmd:
        assert all(re.search(r"\d+ GPUs/node", r) for r in requests.values()), requests
        assert re.search(r"^#SBATCH --gpus-per-node=\d+$", run.stdout, re.M)
    assert not run.sweep_dir.exists()


@pytest.mark.timeout(420)
def test_documented_nccl_sweep_is_submitted_with_its_gpu_requests(slurm_cluster: SlurmCluster,
                                                                  tmp_path: Path) -> None:
    """The preset's command as written (its partition, account, constraint, setup lines), with
    only the test node's size added: 16 CPUs, where the preset asks 16 per task."""
    run = run_sweepbench([*_args(PRESET), "hydra.launcher.cpus_per_task=1", "hydra.launcher.poll_s=1"],
                         sweep_dir=tmp_path / "sweep", cwd=tmp_path / "cwd", timeout=400)
    submitted = re.findall(r"^sweepbench: submitted (\S+) as slurm job (\S+): (.*)$", run.stdout, re.M)
    assert len(submitted) == 2, run.describe()
    gpus = {}
    for tag, job_id, request in submitted:
        ranks = int(re.search(r"_ws(\d+)_", tag).group(1))
        assert request.startswith(f"1 node x {ranks} tasks, {ranks} GPUs/node"), request
        # what SLURM accepted and allocated (gres/gpu is an accounted TRES on the test cluster)
        proc = slurm_cluster.run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "ReqTRES,AllocTRES,Partition,Constraints"])
        req_tres, alloc_tres, partition, constraints = proc.stdout.strip().splitlines()[0].split("|")
        assert f"gres/gpu={ranks}" in req_tres and f"gres/gpu={ranks}" in alloc_tres, proc.stdout
        assert partition == "gpu" and constraints == "h100", proc.stdout
        gpus[tag] = ranks
        script = next((tmp_path / "sweep" / ".submitit").glob(f"{job_id.split('_')[0]}*/*_submission.sh"))
        lines = script.read_text().splitlines()
        for line in (f"#SBATCH --gpus-per-node={ranks}", "#SBATCH --partition=gpu", "#SBATCH --account=my_project",
                     "#SBATCH --constraint=h100", "module load cuda/12.4"):
            assert line in lines, line
    assert sorted(gpus.values()) == [2, 4]
    # the node's GPUs are declared, not real: NCCL finds none there, and each job says so as failed
    table = run.results()
    assert list(table["status"]) == ["failed", "failed"] and run.rc == 1, run.describe()
