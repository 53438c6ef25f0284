"""Fixtures for tests that need a real SLURM cluster (see cluster.py).

``slurm_cluster`` starts a one-node SLURM cluster on localhost once per test
session and stops it at the end (set ``SWEEPBENCH_SLURM_KEEP=1`` to leave it
running). ``time_limit_job`` is a job over its 1-minute time limit, submitted when the first
cluster test module begins, so that SLURM's minute (and its ~30 s limit check) passes while the
other modules run; the test reading its TIMEOUT comes last. ``multinode_cluster`` adds the two-node cluster in network namespaces
(multinode.py) on top of it, and removes it, its namespaces and bridge at the end, whatever
happened (``SWEEPBENCH_SLURM_KEEP=1`` leaves it up too).  While the session runs, ``SLURM_CONF`` is set in ``os.environ`` so
that any ``sbatch``/``squeue``/``sacct`` started from the tests -- by submitit,
hydra-submitit-launcher or sweepbench itself -- talks to this cluster.

These tests never skip: when SLURM is not installed the fixture fails, telling
to run ``.ci/install_slurm.sh``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

import pytest

from .cluster import INSTALL_HINT, SlurmCluster, SlurmClusterError, missing_binaries
from .multinode import MultiNodeCluster


def _keep() -> bool:
    return os.environ.get("SWEEPBENCH_SLURM_KEEP", "") not in ("", "0")


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    missing = missing_binaries()
    if missing:
        pytest.fail(f"SLURM is not installed (missing: {', '.join(missing)}). {INSTALL_HINT}", pytrace=False)
    if os.geteuid() != 0:
        pytest.fail("the SLURM test cluster must run as root (it starts munged, mariadbd and the slurm daemons)",
                    pytrace=False)
    cluster = SlurmCluster()
    try:
        cluster.start()
    except SlurmClusterError as exc:
        # leave nothing half-started behind
        try:
            cluster.stop(quiet=True)
        except Exception:  # noqa: BLE001
            pass
        pytest.fail(f"could not start the SLURM test cluster:\n{exc}", pytrace=False)

    saved: Dict[str, Optional[str]] = {k: os.environ.get(k) for k in cluster.env}
    os.environ.update(cluster.env)
    try:
        yield cluster
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if not _keep():
            cluster.stop(quiet=True)


@pytest.fixture(scope="session")
def multinode_cluster(slurm_cluster: SlurmCluster) -> Iterator[MultiNodeCluster]:
    """Two slurmd nodes, each in its own network and UTS namespace; clients reach it through
    ``cluster.env`` (its own SLURM_CONF), the session's SLURM_CONF stays the one-node cluster's."""
    cluster = MultiNodeCluster(slurm_cluster)
    try:
        cluster.start()
    except SlurmClusterError as exc:
        cluster.stop(quiet=True)  # namespaces, bridge and daemons: nothing half-made stays
        pytest.fail(f"could not start the two-node SLURM test cluster:\n{exc}", pytrace=False)
    try:
        yield cluster
    finally:
        if not _keep():
            cluster.stop(quiet=True)


@pytest.fixture(scope="session")
def time_limit_job(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tuple[str, Path]]:
    """(job id, its output file) of ``sleep 600`` under ``--time=1``."""
    out = tmp_path_factory.mktemp("timelimit") / "out.txt"
    job_id = slurm_cluster.sbatch("--time=1", "--job-name=timelimit", f"--output={out}",
                                  "--wrap", "echo started; sleep 600")
    yield job_id, out
    slurm_cluster.run(["scancel", job_id], check=False)
