"""Tests of the real one-node SLURM test cluster (tests/slurm/cluster.py).

They submit real jobs with sbatch and submitit and read the results back with
sacct. This file submits the session's job over its time limit (conftest.py's
``time_limit_job``); the test of its TIMEOUT is the last of test_sweep_slurm.py, by
when its minute has long passed.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from .cluster import SlurmCluster, _port_open


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else f"<no {path}>"


@pytest.fixture(scope="module", autouse=True)
def _time_limit_job_submitted(time_limit_job: tuple[str, Path]) -> None:
    """The job over its time limit, submitted with the first cluster test (its wait overlaps the rest)."""


@pytest.mark.timeout(90, func_only=True)
def test_two_task_job_completes_and_is_in_sacct(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "hostname.out"
    job_id = slurm_cluster.sbatch("--ntasks=2", "--job-name=two-tasks", f"--output={out}",
                                  "--wrap", "srun hostname; echo CONF=$SLURM_CONF")
    try:
        state = slurm_cluster.wait_job(job_id, timeout=60)
    finally:
        slurm_cluster.run(["scancel", job_id], check=False)
    assert state == "COMPLETED", _read(out)
    text = out.read_text()
    hosts = [line for line in text.splitlines() if not line.startswith("CONF=")]
    assert hosts == [socket.gethostname()] * 2, text
    assert f"CONF={slurm_cluster.env['SLURM_CONF']}" in text

    acct = slurm_cluster.run(["sacct", "-n", "-P", "-j", job_id, "-o", "JobID,State,NTasks,ExitCode"]).stdout
    rows = {line.split("|")[0]: line.split("|")[1:] for line in acct.splitlines() if line}
    assert rows[job_id][0] == "COMPLETED", acct
    assert rows[f"{job_id}.batch"][0] == "COMPLETED", acct
    # the srun step ran two tasks
    assert rows[f"{job_id}.0"][:2] == ["COMPLETED", "2"], acct


@pytest.mark.timeout(60, func_only=True)
def test_eight_tasks_run_at_once(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """The 2-core machine is declared with 16 CPUs: 8 one-CPU tasks must all be running together."""
    node = slurm_cluster.run(["scontrol", "show", "node", slurm_cluster.node_name]).stdout
    assert f"CPUTot={slurm_cluster.cpus}" in node, node
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    # each task checks in, then waits (bounded) until all 8 have checked in
    script = (
        f"srun --ntasks=8 bash -c 'touch {barrier}/$SLURM_PROCID; "
        f"for i in $(seq 200); do [ $(ls {barrier} | wc -l) -ge 8 ] && exit 0; sleep 0.1; done; exit 1'"
    )
    job_id = slurm_cluster.sbatch("--ntasks=8", "--cpus-per-task=1", "--job-name=eight",
                                  f"--output={tmp_path / 'out'}", "--wrap", script)
    try:
        state = slurm_cluster.wait_job(job_id, timeout=45)
    finally:
        slurm_cluster.run(["scancel", job_id], check=False)
    assert state == "COMPLETED", _read(tmp_path / "out")
    assert sorted(int(p.name) for p in barrier.iterdir()) == list(range(8))


@pytest.mark.timeout(60, func_only=True)
def test_failing_job_is_failed_in_sacct(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    job_id = slurm_cluster.sbatch("--ntasks=1", "--job-name=fails", f"--output={tmp_path / 'out'}",
                                  "--wrap", "echo failing; exit 3")
    state = slurm_cluster.wait_job(job_id, timeout=45)
    assert state == "FAILED"
    acct = slurm_cluster.run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State,ExitCode"]).stdout.strip()
    assert acct == "FAILED|3:0"
    assert slurm_cluster.sacct_state(job_id) == "FAILED"


@pytest.mark.timeout(120, func_only=True)
def test_submitit_two_tasks_return_their_procid(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    import submitit

    def procid() -> int:
        # defined here so that cloudpickle ships it by value (the job cannot import this test module)
        import os

        return int(os.environ["SLURM_PROCID"])

    executor = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    assert executor.cluster == "slurm"
    executor.update_parameters(
        slurm_partition=slurm_cluster.partition,
        nodes=1,
        tasks_per_node=2,
        cpus_per_task=1,
        timeout_min=2,
        name="submitit-procid",
    )
    job = executor.submit(procid)
    try:
        deadline = time.monotonic() + 90
        while not job.done() and time.monotonic() < deadline:
            time.sleep(0.5)
        results = job.results()
    except Exception:
        logs = "\n".join(f"--- {p}\n{_read(p)}" for p in sorted((tmp_path / "submitit").glob("*.out")))
        logs += "\n".join(f"--- {p}\n{_read(p)}" for p in sorted((tmp_path / "submitit").glob("*.err")))
        slurm_cluster.run(["scancel", str(job.job_id)], check=False)
        raise AssertionError(f"submitit job {job.job_id} failed:\n{logs}")
    assert sorted(results) == [0, 1]
    assert slurm_cluster.wait_job(str(job.job_id), timeout=30) == "COMPLETED"


@pytest.mark.timeout(120, func_only=True)
def test_scontrol_requeue_restarts_running_job(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    counter = tmp_path / "starts.txt"
    # every start appends a line; the first run waits to be requeued, the second finishes at once
    script = (
        f"echo start restart_count=${{SLURM_RESTART_COUNT:-0}} >> {counter}; "
        f"if [ \"$(wc -l < {counter})\" -lt 2 ]; then sleep 300; fi; echo done"
    )
    job_id = slurm_cluster.sbatch("--requeue", "--job-name=requeue", f"--output={tmp_path / 'out'}",
                                  "--open-mode=append", "--wrap", script)
    try:
        slurm_cluster.wait_state(job_id, ["RUNNING"], timeout=30)
        deadline = time.monotonic() + 30
        while not counter.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert counter.exists(), "the job never started"
        slurm_cluster.run(["scontrol", "requeue", job_id])
        # a requeued job may start again after AuthInfo cred_expire (10 s) has passed
        state = slurm_cluster.wait_job(job_id, timeout=75)
    finally:
        slurm_cluster.run(["scancel", job_id], check=False)
    assert state == "COMPLETED", _read(tmp_path / "out")
    assert counter.read_text().splitlines() == ["start restart_count=0", "start restart_count=1"]
    records = slurm_cluster.run(["sacct", "-n", "-P", "-X", "-D", "-j", job_id, "-o", "State"]).stdout.split()
    assert records == ["REQUEUED", "COMPLETED"]


@pytest.mark.timeout(30, func_only=True)
def test_daemons_listen_on_the_picked_ports(slurm_cluster: SlurmCluster) -> None:
    """No fixed port (SLURM's 6817-6819): the configs name the ports picked free at start."""
    ports = slurm_cluster.ports
    assert len(set(ports.values())) == 4
    slurm_conf = slurm_cluster.slurm_conf.read_text()
    assert f"SlurmctldPort={ports['slurmctld']}\n" in slurm_conf and f"SlurmdPort={ports['slurmd']}\n" in slurm_conf
    assert f"DbdPort={ports['slurmdbd']}\n" in slurm_cluster.slurmdbd_conf.read_text()
    assert f"port={ports['mysql']}\n" in slurm_cluster.my_cnf.read_text()
    assert all(_port_open(port) for port in ports.values()), ports
