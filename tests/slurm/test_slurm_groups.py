"""Many jobs per allocation (``sweep.jobs_per_allocation``) on the real one-node SLURM test
cluster: 4 two-rank jobs in groups of 2 take 2 allocations; a job whose rank crashes in the
middle of its group fails alone and the next job of the group runs ok; a rerun regroups and
reruns only the failed jobs; a bad value is refused before anything is submitted."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Iterator

import pytest
from omegaconf import DictConfig

from ..conftest import TINY, SweepRun, planned_tag, run_sweepbench
from .cluster import SlurmCluster
from .sweeps import BackgroundSweep

SLURM = ["hydra/launcher=slurm", "hydra.launcher.poll_s=1", "sweep.jobs_per_allocation=2"]
# 4 jobs: fault.kind varies fastest, so each allocation runs the crashing job, then an ok one
GRID = ["benchmark=collective", "parallelism=tp2", "fault.rank=1", "benchmark.iters=2,3", "fault.kind=exit,none",
        "launch.timeout_s=300", *[a for a in TINY if not a.startswith("benchmark.iters=")]]
SUBMITTED = r"submitted (\S+) as slurm job (\S+):"
# launch.keep_ranks=true: the ok job's processes are kept and run the next job's ranks, which hang
# until that job's own limit ends them (1 min; the allocation's is 2, SLURM's warning comes 45 s
# in). In the background, beside the other sweeps.
HANG_GRID = ["benchmark=collective", "parallelism=tp2", "fault.rank=1", "fault.kind=none,hang",
             "hydra.launcher.timeout_min=1", "launch.timeout_s=300", "launch.keep_ranks=true", *TINY]


@pytest.fixture(scope="module")
def hang_sweep(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundSweep]:
    sweep = BackgroundSweep([*SLURM, *HANG_GRID], tmp_path_factory.mktemp("grouphang") / "sweep")
    yield sweep
    sweep.stop()


@pytest.fixture(scope="module")
def grouped(slurm_cluster: SlurmCluster, hang_sweep: BackgroundSweep,
            tmp_path_factory: pytest.TempPathFactory) -> SweepRun:
    run = run_sweepbench([*SLURM, *GRID], sweep_dir=tmp_path_factory.mktemp("groups") / "sweep", timeout=300)
    assert run.rc == 1, run.describe()
    return run


def _tags(compose: Callable[..., DictConfig]) -> dict[tuple[str, str], str]:
    fixed = [a for a in GRID if not a.startswith(("benchmark.iters=", "fault.kind="))]
    return {(iters, kind): planned_tag(compose, *fixed, f"benchmark.iters={iters}", f"fault.kind={kind}")
            for iters in ("2", "3") for kind in ("exit", "none")}


def _rendezvous_port(job_dir: Path) -> int:
    return int(re.findall(r"rendezvous \S+:(\d+)", (job_dir / "sweepbench.log").read_text())[-1])


@pytest.mark.timeout(360)
def test_groups_share_allocations_and_a_crash_fails_alone(grouped: SweepRun, slurm_cluster: SlurmCluster,
                                                          compose: Callable[..., DictConfig]) -> None:
    tags = _tags(compose)
    submitted = dict(re.findall(SUBMITTED, grouped.stdout))
    assert set(submitted) == set(tags.values()), grouped.stdout
    for iters in ("2", "3"):  # the crashing job and the ok job after it share an allocation
        assert submitted[tags[(iters, "exit")]] == submitted[tags[(iters, "none")]]
    allocations = set(submitted.values())
    assert len(allocations) == 2, submitted
    array = {a.split("_")[0] for a in allocations}
    acct = slurm_cluster.run(["sacct", "-n", "-P", "-X", "-j", ",".join(array), "-o", "JobID,State,Timelimit"])
    rows = [line.split("|") for line in acct.stdout.split()]
    assert sorted(r[0] for r in rows) == sorted(allocations), acct.stdout  # 2 allocations for 4 jobs
    assert all(r[1] == "COMPLETED" for r in rows), acct.stdout
    assert "job 2 of 2 in this allocation" in grouped.stdout
    table = grouped.results().set_index("tag")
    for iters in ("2", "3"):
        ok, crashed = grouped.metrics(tags[(iters, "none")]), grouped.metrics(tags[(iters, "exit")])
        assert ok["status"] == "ok" and ok["verified"] and table.loc[tags[(iters, "none")], "status"] == "ok"
        assert crashed["status"] == "failed", crashed["error"]
        assert "rank 1's process ended (exit code 3)" in crashed["error"], crashed["error"]
        assert table.loc[tags[(iters, "exit")], "status"] == "failed"
        assert crashed["error"] == table.loc[tags[(iters, "exit")], "error"]
        # each job its own rendezvous port, though both ran in one allocation
        job_ids = {grouped.env_json(tags[(iters, k)])["slurm"]["job_id"] for k in ("exit", "none")}
        assert len(job_ids) == 1
        assert _rendezvous_port(grouped.sweep_dir / tags[(iters, "exit")]) != \
               _rendezvous_port(grouped.sweep_dir / tags[(iters, "none")])
    assert "2 of 4 jobs did not finish ok" in grouped.stderr


@pytest.mark.timeout(300)
def test_a_rerun_regroups_only_the_failed_jobs(grouped: SweepRun, compose: Callable[..., DictConfig]) -> None:
    tags = _tags(compose)
    run = run_sweepbench([*SLURM, *GRID], sweep_dir=grouped.sweep_dir, timeout=240)
    assert run.rc == 1, run.describe()
    again = dict(re.findall(SUBMITTED, run.stdout))
    assert set(again) == {tags[("2", "exit")], tags[("3", "exit")]}, run.stdout
    assert len(set(again.values())) == 1  # the two left over now share one allocation
    table = run.results().set_index("tag")
    assert {t for t, resumed in table["resumed"].items() if resumed} == {tags[("2", "none")], tags[("3", "none")]}
    assert (table.loc[list(again), "status"] == "failed").all()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value, says", [("0", "sweep.jobs_per_allocation=0 must be an integer >= 1"),
                                         ("two", "'two' of type 'str' could not be converted to Integer")])
def test_a_bad_group_size_is_refused_before_submission(slurm_cluster: SlurmCluster, tmp_path: Path,
                                                       value: str, says: str) -> None:
    run = run_sweepbench(["hydra/launcher=slurm", f"sweep.jobs_per_allocation={value}", *TINY],
                         sweep_dir=tmp_path / "sweep", timeout=50)
    assert run.rc == 2, run.describe()
    assert says in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "submitted" not in run.stdout and not (tmp_path / "sweep" / ".submitit").exists()


@pytest.mark.timeout(300)
def test_a_kept_rank_runs_the_next_job_and_a_hung_job_times_out_alone(hang_sweep: BackgroundSweep,
                                                     compose: Callable[..., DictConfig]) -> None:
    run = hang_sweep.wait(timeout=280)
    assert run.rc == 1, run.describe()
    fixed = [a for a in HANG_GRID if not a.startswith(("fault.kind=", "hydra."))]
    hung, ok = (run.metrics(planned_tag(compose, *fixed, f"fault.kind={k}")) for k in ("hang", "none"))
    assert "2 min, job 2 of 2 in this allocation (per-job limit 1 min)" in run.stdout
    for rank in (0, 1):  # the same process ran both jobs' rank
        notes = [json.loads((run.sweep_dir / m["tag"] / "logs" / f"group_rank{rank}.json").read_text())
                 for m in (ok, hung)]
        assert notes[0]["pid"] == notes[1]["pid"] and [n["slot"] for n in notes] == [0, 1], notes
    assert hung["status"] == "timeout" and "per-job time limit of 60 s reached" in hung["error"], hung["error"]
    assert ok["status"] == "ok" and ok["verified"], ok["error"]
    submitted = dict(re.findall(SUBMITTED, run.stdout))
    assert submitted[hung["tag"]] == submitted[ok["tag"]] == hung["slurm"]["job_id"]  # one allocation
