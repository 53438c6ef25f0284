"""Sweeps through ``hydra/launcher=slurm`` on the real one-node SLURM test cluster (cluster.py):
the same sweep as a local one, hard deaths and a time limit recorded as failed / timeout while
every other job is kept, requeue (``scontrol requeue``, and on a time limit with
max_num_timeout=1), resume, jobs SLURM refuses or would never start, the local variant.
(The per-job request and its sbatch script: test_slurm_request.py.)

Every sweep is a real ``python -m sweepbench`` subprocess; the time-limit sweep (about 75 s) is
started first, in the background, so that its wait overlaps the other tests. Timeouts leave room
for a 2-core machine shared with other work (a load of 12 doubles a sweep's time)."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Callable, Iterator

import pytest
from omegaconf import DictConfig

from sweepbench.slurm.tasks import master_port

from ..conftest import SMALL, TINY, SweepRun, planned_tag, run_sweepbench, run_sweeps, wandb_inspect
from .cluster import FINAL_STATES, SlurmCluster
from .sweeps import (
    BackgroundSweep,
    assert_requeued_and_done,
    grid_tags,
    job_files,
    wait_for,
    wandb_run_dir,
    what_was_measured,
)

SLURM = ["hydra/launcher=slurm", "hydra.launcher.poll_s=1"]
GRID = ["benchmark=collective", "parallelism=tp2,dp2,cp2", *SMALL]  # 3 configurations x 2 ranks
FAULT_KINDS = ["none", "raise", "exit", "kill", "segfault"]
FAULT_GRID = ["benchmark=collective", "parallelism=tp2", "fault.rank=1", f"fault.kind={','.join(FAULT_KINDS)}",
              *TINY]
# rank 0 hangs until requeued: SLURM's time-limit warning makes submitit requeue it, it then runs
# ok; rank 1 hanging leaves rank 0 stuck in a collective, which cannot act on the warning: the
# time limit ends that job (TIMEOUT). A 2-minute limit with the warning 20 s before it (slurmctld
# sends it up to 30 s early): the requeued attempt has over a minute to start and finish, even on
# a loaded 2-core machine (with 1 minute, a slow second start was warned again and failed).
TIME_LIMIT_GRID = ["benchmark=collective", "parallelism=tp2", "fault.kind=hang_until_requeued",
                   "fault.rank=0,1", "hydra.launcher.timeout_min=2", "hydra.launcher.signal_delay_s=20",
                   "hydra.launcher.max_num_timeout=1", *TINY]
SRUN_SAYS = {"raise": "Exited with exit code 1", "exit": "Exited with exit code 3", "kill": "Killed",
             "segfault": "Segmentation fault"}


@pytest.fixture(scope="module")
def time_limit_sweep(slurm_cluster: SlurmCluster,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundSweep]:
    sweep = BackgroundSweep([*SLURM, *TIME_LIMIT_GRID], tmp_path_factory.mktemp("timelimit") / "sweep")
    yield sweep
    sweep.stop()


@pytest.fixture(scope="module")
def grid_sweeps(slurm_cluster: SlurmCluster, time_limit_sweep: BackgroundSweep,
                tmp_path_factory: pytest.TempPathFactory) -> dict[str, SweepRun]:
    """The grid on SLURM and locally, side by side (the SLURM one mostly waits on its polls)."""
    runs = run_sweeps({"slurm": [*SLURM, *GRID], "local": GRID}, tmp_path_factory.mktemp("grid"))
    for run in runs.values():
        assert run.rc == 0, run.describe()
    return runs


@pytest.fixture(scope="module")
def slurm_sweep(grid_sweeps: dict[str, SweepRun]) -> SweepRun:
    return grid_sweeps["slurm"]


@pytest.fixture(scope="module")
def local_sweep(grid_sweeps: dict[str, SweepRun]) -> SweepRun:
    return grid_sweeps["local"]


# ---------------------------------------------------------------- a sweep on SLURM


@pytest.mark.timeout(480)
def test_slurm_sweep_matches_a_local_sweep(slurm_sweep: SweepRun, local_sweep: SweepRun,
                                           compose: Callable[..., DictConfig]) -> None:
    tags = set(grid_tags(compose, ["benchmark=collective", *SMALL], "parallelism", ["tp2", "dp2", "cp2"]).values())
    for run in (slurm_sweep, local_sweep):
        assert {p.name for p in run.job_dirs() if not p.name.startswith(".")} == tags
        assert {p.name for p in run.sweep_dir.iterdir() if p.is_file()} == {"multirun.yaml", "results.csv",
                                                                            "results.parquet", "report.html"}
    assert (slurm_sweep.sweep_dir / ".submitit").is_dir()
    for tag in tags:
        on_slurm, local = slurm_sweep.sweep_dir / tag, local_sweep.sweep_dir / tag
        assert job_files(on_slurm) == job_files(local) == {
            ".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml", "sweepbench.log",
            "logs/rank0.log", "logs/rank1.log", "metrics.json", "env.json"}, tag
        s, m = slurm_sweep.metrics(tag), local_sweep.metrics(tag)
        assert s["status"] == m["status"] == "ok" and s["verified"] and s["error"] is None
        assert set(s) == set(m)
        assert s["overrides"] == m["overrides"] and s["world_size"] == m["world_size"] == 2
        assert s["backend"] == m["backend"] == "gloo"
        assert {k: v for k, v in s["config"].items() if k != "launch"} == \
               {k: v for k, v in m["config"].items() if k != "launch"}
        assert s["config"]["launch"]["ranks_per_node"] == 2  # one SLURM task per rank, on one node
        assert [what_was_measured(c) for c in s["results"]["cases"]] == \
               [what_was_measured(c) for c in m["results"]["cases"]]
        assert set(s["results"]["summary"]) == set(m["results"]["summary"])
        assert len(s["memory"]["per_rank"]) == 2
        summaries = [wandb_inspect(wandb_run_dir(d)) for d in (on_slurm, local)]
        assert set(summaries[0]) == set(summaries[1])
    s_table, m_table = slurm_sweep.results(), local_sweep.results()
    assert list(s_table.columns) == list(m_table.columns)
    assert sorted(s_table["tag"]) == sorted(m_table["tag"])
    assert (s_table["status"] == "ok").all() and not s_table["resumed"].any()


@pytest.mark.timeout(60)
def test_jobs_really_ran_as_slurm_tasks(slurm_sweep: SweepRun, slurm_cluster: SlurmCluster) -> None:
    submitted = dict(re.findall(r"submitted (\S+) as slurm job (\S+):", slurm_sweep.stdout))
    assert len(submitted) == 3, slurm_sweep.stdout
    array_ids = set()
    for tag, job_id in submitted.items():
        slurm = slurm_sweep.env_json(tag)["slurm"]
        assert slurm["job_id"] and slurm["nodelist"] == slurm_cluster.node_name
        assert f"{slurm['array_job_id']}_{slurm['array_task_id']}" == job_id  # one job array for equal requests
        array_ids.add(slurm["array_job_id"])
        assert slurm_cluster.wait_job(job_id, timeout=30) == "COMPLETED"
        for rank in (0, 1):  # each rank was its own SLURM task
            log = (slurm_sweep.sweep_dir / tag / "logs" / f"rank{rank}.log").read_text()
            assert f"rank {rank}: job {slurm['job_id']}, start 1" in log
    assert len(array_ids) == 1
    # the driver said how the sweep went while it waited
    assert "1 node x 2 tasks, no GPU" in slurm_sweep.stdout
    assert re.search(r"slurm: 3 jobs: \d pending, \d running, \d done, 0 failed", slurm_sweep.stdout)
    assert "3 jobs: 0 pending, 0 running, 3 done, 0 failed" in slurm_sweep.stdout
    assert re.search(r"slurm job \S+ \S+: RUNNING", slurm_sweep.stdout)


@pytest.mark.timeout(240)
def test_resubmitting_skips_jobs_already_ok(slurm_sweep: SweepRun) -> None:
    first = dict(re.findall(r"submitted (\S+) as slurm job (\S+):", slurm_sweep.stdout))
    redo = sorted(first)[0]
    (slurm_sweep.sweep_dir / redo / "metrics.json").unlink()
    run = run_sweepbench([*SLURM, *GRID], sweep_dir=slurm_sweep.sweep_dir)
    assert run.rc == 0, run.describe()
    again = dict(re.findall(r"submitted (\S+) as slurm job (\S+):", run.stdout))
    assert list(again) == [redo] and again[redo] != first[redo]
    table = run.results().set_index("tag")
    assert (table["status"] == "ok").all()
    assert {tag for tag, resumed in table["resumed"].items() if not resumed} == {redo}
    assert run.metrics(redo)["status"] == "ok"


# ---------------------------------------------------------------- failures


# 5 jobs x 2 ranks, each rank importing torch on a 2-core machine while the time-limit sweep runs
# beside them: over 240 s once on a loaded CI box, so this one has more room than the rest.
@pytest.mark.timeout(540)
def test_hard_deaths_are_recorded_and_other_jobs_kept(slurm_cluster: SlurmCluster, tmp_path: Path,
                                                      compose: Callable[..., DictConfig]) -> None:
    run = run_sweepbench([*SLURM, *FAULT_GRID], sweep_dir=tmp_path / "sweep", timeout=480)
    assert run.rc == 1, run.describe()
    assert "4 of 5 jobs did not finish ok" in run.stderr
    fixed = [a for a in FAULT_GRID if not a.startswith("fault.kind=")]
    tags = grid_tags(compose, fixed, "fault.kind", FAULT_KINDS)
    table = run.results().set_index("tag")
    assert set(table.index) == set(tags.values())
    ok = run.metrics(tags["none"])
    assert ok["status"] == "ok" and ok["verified"]
    for kind, says in SRUN_SAYS.items():
        m = run.metrics(tags[kind])
        assert m["status"] == "failed" and table.loc[tags[kind], "status"] == "failed", kind
        assert m["slurm"]["state"] == "FAILED", (kind, m["slurm"])
        assert f"SLURM job {m['slurm']['job_id']} FAILED" in m["error"], m["error"]
        assert f"task 1: {says}" in m["error"], m["error"]  # srun's word on how the rank died
        assert "stderr tail: " in m["error"] and m["error"] == table.loc[tags[kind], "error"]
        # a complete job dir: what and where it ran, and a wandb run, even for a job that died
        assert m["tag"] == tags[kind] and m["world_size"] == 2 and m["config"]["fault"]["kind"] == kind
        assert run.env_json(tags[kind])["slurm"]["job_id"]
        summary = wandb_inspect(wandb_run_dir(run.sweep_dir / tags[kind]))
        assert "failed" in json.dumps(summary)
    assert "injected fault: fault.kind=raise on rank 1" in run.metrics(tags["raise"])["error"]


# Rank 0's rendezvous port is taken (CI once saw it: a sweep held for minutes). Rank 0 cannot
# serve the rendezvous and fails; rank 1 connects to whatever holds the port and would wait there
# for launch.timeout_s (15 min here). Rank 0 records the job, then fails its task, and srun ends
# rank 1: the job is over in seconds. The test holds the ports of the next job ids SLURM hands out.
@pytest.mark.timeout(240)
def test_a_rank0_that_cannot_rendezvous_ends_its_job_at_once(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    probe = int(slurm_cluster.sbatch("--hold", "--wrap=true"))
    slurm_cluster.run(["scancel", str(probe)])
    holders = []
    for job in range(probe + 1, probe + 21):  # a job alone, or task 0 of an array
        for job_id in (str(job), f"{job}_0"):
            sock = socket.socket()
            try:
                sock.bind(("", master_port(job_id, 0)))
                sock.listen()
            except OSError:
                sock.close()
                continue
            holders.append(sock)
    try:
        grid = ["benchmark=collective", "parallelism=tp2", "launch.timeout_s=900", *TINY]
        run = run_sweepbench([*SLURM, *grid], sweep_dir=tmp_path / "sweep", timeout=200)
    finally:
        for sock in holders:
            sock.close()
    assert run.rc == 1, run.describe()
    [job] = [p for p in run.job_dirs() if not p.name.startswith(".")]
    m = run.metrics(job.name)
    assert m["status"] == "failed" and m["slurm"]["state"] == "FAILED", (m["error"], m["slurm"])
    assert "address already in use" in m["error"], m["error"]
    elapsed = slurm_cluster.run(["sacct", "-n", "-P", "-X", "-j", m["slurm"]["job_id"], "-o", "ElapsedRaw"])
    assert int(elapsed.stdout.split()[0]) < 120, elapsed.stdout  # not launch.timeout_s
    assert run.results()["status"].tolist() == ["failed"]


@pytest.mark.timeout(360)
def test_time_limit_is_a_timeout_and_a_time_out_requeue_finishes(time_limit_sweep: BackgroundSweep,
                                                                 compose: Callable[..., DictConfig]) -> None:
    run = time_limit_sweep.wait(timeout=330)
    assert run.rc == 1, run.describe()
    fixed = [a for a in TIME_LIMIT_GRID if not a.startswith(("fault.rank=", "hydra."))]
    tags = grid_tags(compose, fixed, "fault.rank", ["0", "1"])
    requeued, stuck = run.metrics(tags["0"]), run.metrics(tags["1"])
    assert requeued["status"] == "ok", requeued["error"]
    assert run.env_json(tags["0"])["slurm"]["restart_count"] == "1"
    assert stuck["status"] == "timeout"
    assert stuck["slurm"]["state"] == "TIMEOUT"
    assert "TIMEOUT: time limit of 2 min reached" in stuck["error"] and "DUE TO TIME LIMIT" in stuck["error"]
    table = run.results().set_index("tag")
    assert table.loc[tags["0"], "status"] == "ok" and table.loc[tags["1"], "status"] == "timeout"
    assert_requeued_and_done(run.stdout, tags["0"])
    assert f"{tags['1']}: finished, failed" in run.stdout


@pytest.mark.timeout(240)
def test_scontrol_requeue_reruns_the_job_to_ok(slurm_cluster: SlurmCluster, tmp_path: Path,
                                               compose: Callable[..., DictConfig]) -> None:
    args = ["benchmark=collective", "parallelism=tp2", "fault.kind=hang_until_requeued", *TINY]
    tag = planned_tag(compose, *args)
    sweep = BackgroundSweep([*SLURM, *args], tmp_path / "sweep")
    job_dir = sweep.sweep_dir / tag
    try:
        rank0 = job_dir / "logs" / "rank0.log"
        wait_for(lambda: rank0.exists() and "hangs until the job is requeued" in rank0.read_text(), 60,
                 "the first start to hang")
        job_id = json.loads((job_dir / "env.json").read_text())["slurm"]["job_id"]
        slurm_cluster.run(["scontrol", "requeue", job_id])
        run = sweep.wait(timeout=120)
    finally:
        sweep.stop()
    assert run.rc == 0, run.describe()
    m = run.metrics(tag)
    assert m["status"] == "ok" and m["verified"]
    assert run.env_json(tag)["slurm"]["restart_count"] == "1"
    log = rank0.read_text()
    assert "start 1 (SLURM_RESTART_COUNT=0)" in log and "start 2 (SLURM_RESTART_COUNT=1)" in log
    wandb_run_dir(job_dir)  # the rerun's wandb run only
    assert_requeued_and_done(run.stdout, tag)


@pytest.mark.timeout(240)
def test_a_job_slurm_would_never_start_fails_alone(slurm_cluster: SlurmCluster, tmp_path: Path,
                                                   compose: Callable[..., DictConfig]) -> None:
    """tp4 at 2 ranks a node asks for 2 nodes of a 1-node partition: SLURM queues it for ever
    (PartitionNodeLimit); the sweep cancels it and records why; the tp2 job runs."""
    grid = ["benchmark=collective", "parallelism=tp2,tp4", "launch.ranks_per_node=2", *TINY]
    run = run_sweepbench([*SLURM, *grid], sweep_dir=tmp_path / "sweep")
    assert run.rc == 1, run.describe()
    tags = grid_tags(compose, [a for a in grid if not a.startswith("parallelism=")], "parallelism", ["tp2", "tp4"])
    assert run.metrics(tags["tp2"])["status"] == "ok"
    never = run.metrics(tags["tp4"])
    assert never["status"] == "failed" and never["slurm"]["state"] == "CANCELLED", never["error"]
    assert "would never start it (PartitionNodeLimit)" in never["error"]
    assert f"{tags['tp4']}: PENDING (PartitionNodeLimit)" in run.stdout


@pytest.mark.timeout(180)
def test_a_refused_submission_is_a_failed_job(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    run = run_sweepbench([*SLURM, "hydra.launcher.partition=nope", "benchmark=collective", *TINY],
                         sweep_dir=tmp_path / "sweep")
    assert run.rc == 1, run.describe()
    (job,) = [p for p in run.job_dirs() if not p.name.startswith(".")]
    m = run.metrics(job.name)
    assert m["status"] == "failed" and m["slurm"]["state"] == "NOT_SUBMITTED"
    assert m["error"].startswith("submission failed: ") and "invalid partition" in m["error"], m["error"]
    assert run.results()["status"].tolist() == ["failed"]
    assert run.env_json(job.name)["recorded_by"].startswith("the sweep driver: the job was not submitted")


@pytest.mark.timeout(240)
def test_local_variant_runs_the_same_path_without_slurm(tmp_path: Path, compose: Callable[..., DictConfig]) -> None:
    grid = ["benchmark=collective", "parallelism=tp2", "fault.rank=1", "fault.kind=none,kill", *TINY]
    run = run_sweepbench(["hydra/launcher=slurm_local", *grid], sweep_dir=tmp_path / "sweep")
    assert run.rc == 1, run.describe()
    fixed = [a for a in grid if not a.startswith("fault.kind=")]
    tags = grid_tags(compose, fixed, "fault.kind", ["none", "kill"])
    assert run.metrics(tags["none"])["status"] == "ok"
    assert run.metrics(tags["none"])["config"]["launch"]["ranks_per_node"] == 2
    # the phases add up: rank 0's start-up (timed from its process's start) lies inside the wall time
    ok = run.metrics(tags["none"])
    phases = ok["wall_phases_s"]
    # (within two clock ticks: /proc gives a process's start time in ticks of 10 ms)
    assert sum(v for k, v in phases.items() if k != "rest") <= ok["wall_time_s"] + 0.02, (phases, ok["wall_time_s"])
    assert sum(phases.values()) == pytest.approx(ok["wall_time_s"], abs=0.02), (phases, ok["wall_time_s"])
    dead = run.metrics(tags["kill"])
    assert dead["status"] == "failed" and "submitit-local job" in dead["error"], dead["error"]
    assert "submitit-local: 2 jobs:" in run.stdout


@pytest.mark.timeout(150, func_only=True)
def test_time_limit_kills_job_with_timeout(slurm_cluster: SlurmCluster, time_limit_job: tuple[str, Path]) -> None:
    """The job over its 1-minute limit (submitted with the first cluster test; slurmctld checks
    limits every ~30 s, KillWait=2, OverTimeLimit=0) ends TIMEOUT, having started. Last in this
    file, the last of the cluster tests, so that its wait has passed while they ran."""
    job_id, out = time_limit_job
    state = slurm_cluster.wait_job(job_id, timeout=140)
    assert state == "TIMEOUT", out.read_text() if out.exists() else f"<no {out}>"
    assert state in FINAL_STATES
    assert "started" in out.read_text()
