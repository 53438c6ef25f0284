"""A sweep through ``hydra/launcher=slurm`` on the two-node test cluster (multinode.py): each
node is its own network and UTS namespace, so a job's ranks meet only through the node
addresses SLURM knows (rank 0's node is the rendezvous), as on two machines.

One sweep of two 2-node x 2-task jobs (world size 4, gloo): one runs clean, in the other rank 2
(on the second node) exits. The jobs run at once; the file takes about a minute."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Callable

import pytest
from omegaconf import DictConfig

from ..conftest import TINY, SweepRun, base_env, run_sweepbench
from .multinode import MultiNodeCluster
from .sweeps import grid_tags

GRID = ["model=tiny", "backend=gloo", "parallelism=tp4", "launch.ranks_per_node=2", "fault.rank=2",
        "fault.kind=none,exit", *TINY]
SLURM = ["hydra/launcher=slurm", "hydra.launcher.poll_s=1"]
RANK_HOSTS = {0: "sbnode1", 1: "sbnode1", 2: "sbnode2", 3: "sbnode2"}  # block distribution, 2 a node


@pytest.fixture(scope="module")
def started() -> str:
    """When the sweep began, as sacct reads a time: its records of this cluster before are not ours."""
    return time.strftime("%Y-%m-%dT%H:%M:%S")


@pytest.fixture(scope="module")
def sweep(multinode_cluster: MultiNodeCluster, started: str, tmp_path_factory: pytest.TempPathFactory) -> SweepRun:
    run = run_sweepbench([*SLURM, *GRID], sweep_dir=tmp_path_factory.mktemp("multinode") / "sweep",
                         env=base_env(**multinode_cluster.env), timeout=180)
    assert run.rc == 1, run.describe()  # the faulty job failed, the sweep went on
    return run


@pytest.fixture(scope="module")
def tags(compose: Callable[..., DictConfig]) -> dict[str, str]:
    return grid_tags(compose, [a for a in GRID if not a.startswith("fault.kind=")], "fault.kind", ["none", "exit"])


def rank_log_hosts(job_dir: Path) -> dict[int, str]:
    """Each rank's host, from the header line its SLURM task wrote at its start."""
    hosts = {}
    for rank in range(4):
        text = (job_dir / "logs" / f"rank{rank}.log").read_text()
        found = re.search(rf"rank {rank}: job \S+, start 1 \(SLURM_RESTART_COUNT=0\) on (\S+), python ", text)
        assert found, text[:2000]
        hosts[rank] = found.group(1)
    return hosts


@pytest.mark.timeout(240)
def test_ranks_span_both_nodes_and_the_collective_verifies(sweep: SweepRun, tags: dict[str, str], started: str,
                                                           multinode_cluster: MultiNodeCluster) -> None:
    tag = tags["none"]
    m = sweep.metrics(tag)
    assert m["status"] == "ok" and m["verified"] and m["error"] is None, m["error"]
    assert m["world_size"] == 4 and m["backend"] == "gloo" and len(m["memory"]["per_rank"]) == 4
    assert m["config"]["launch"]["ranks_per_node"] == 2
    assert "2 nodes x 2 tasks, no GPU" in sweep.stdout
    assert rank_log_hosts(sweep.sweep_dir / tag) == RANK_HOSTS
    env = sweep.env_json(tag)
    assert env["host"] == "sbnode1"  # rank 0 records, from its own node
    nodes = multinode_cluster.run(["scontrol", "show", "hostnames", env["slurm"]["nodelist"]]).stdout.split()
    assert nodes == ["sbnode1", "sbnode2"]
    assert env["environment"]["SLURM_JOB_NUM_NODES"] == "2"
    assert env["environment"]["SLURM_TASKS_PER_NODE"] == "2(x2)"  # SLURM's placement: 2 ranks a node
    # the rendezvous is rank 0's node address, which exists only inside the test's namespaces
    addr = multinode_cluster.node_addr("sbnode1")
    assert env["environment"]["MASTER_ADDR"] == addr
    here = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    assert f" {addr}/" not in here
    job_id = env["slurm"]["job_id"]
    acct = multinode_cluster.run(["sacct", "-n", "-P", "-X", "-S", started, "-j", job_id,
                                  "-o", "State,NodeList,NNodes"])
    assert acct.stdout.split() == ["COMPLETED|sbnode[1-2]|2"]


@pytest.mark.timeout(240)
def test_a_rank_failing_on_the_second_node_is_recorded_with_that_node(sweep: SweepRun,
                                                                      tags: dict[str, str]) -> None:
    tag = tags["exit"]
    m = sweep.metrics(tag)
    assert m["status"] == "failed" and not m["verified"], m
    assert m["slurm"]["state"] == "FAILED", m["slurm"]
    assert f"SLURM job {m['slurm']['job_id']} FAILED" in m["error"], m["error"]
    assert "node sbnode2, task 2: Exited with exit code 3" in m["error"], m["error"]
    assert rank_log_hosts(sweep.sweep_dir / tag)[2] == "sbnode2"
    table = sweep.results().set_index("tag")
    assert table.loc[tag, "status"] == "failed" and table.loc[tags["none"], "status"] == "ok"
    assert "1 of 2 jobs did not finish ok" in sweep.stderr
