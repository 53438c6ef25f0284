"""The test SLURM cluster's constants, errors and process helpers (cluster.py puts them together)."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path
from typing import List, Optional

DEFAULT_STATE_DIR = "/tmp/sweepbench-slurm"
CLUSTER_NAME = "sweepbench"
PARTITION = "debug"
ACCOUNT = "sweepbench"
CPUS = 16
# the node's GPUs as SLURM sees them (a generic resource; there are no devices), and the feature
# and partition of docs/slurm_example/hydra/launcher/my_cluster.yaml
GRES_GPUS = 8
GPU_FEATURE = "h100"
GPU_PARTITION = "gpu"
REAL_MEMORY_MB = 16000

# TCP ports are picked free at start (ports.py) and kept in <state dir>/ports.json.
PORT_NAMES = ("slurmctld", "slurmd", "slurmdbd", "mysql")
CRED_EXPIRE_S = 10
DB_USER = "slurm"
DB_PASS = "sweepbench"
DB_NAME = "slurm_acct_db"

# Final job states as printed by sacct (first word: "CANCELLED by 0" -> CANCELLED).
FINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "TIMEOUT",
        "CANCELLED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
        "REVOKED",
    }
)
# Node states (sinfo %T, lower case) in which the node answers and takes jobs.
HEALTHY_NODE_STATES = frozenset({"idle", "mixed", "allocated", "completing"})

INSTALL_HINT = (
    "SLURM test cluster prerequisites are missing. Run `bash .ci/install_slurm.sh` "
    "as root (installs munge, mariadb-server, slurmctld, slurmd, slurmdbd, slurm-client)."
)

_SBIN_PATHS = ("/usr/sbin", "/sbin", "/usr/bin", "/bin", "/usr/local/sbin", "/usr/local/bin")

# name -> executable, in start order
_DAEMONS = ("munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd")
_REQUIRED_BINARIES = (
    "munged",
    "munge",
    "unmunge",
    "mariadbd",
    "mariadb-install-db",
    "mariadb",
    "mariadb-admin",
    "slurmdbd",
    "slurmctld",
    "slurmd",
    "slurmstepd",
    "sbatch",
    "srun",
    "squeue",
    "sacct",
    "sacctmgr",
    "scontrol",
    "scancel",
    "sinfo",
)


class SlurmClusterError(RuntimeError):
    """The cluster could not be started, or a command against it failed."""


class _PreflightError(SlurmClusterError):
    """Start refused before any daemon was started (retrying on fresh state would not help)."""


def _which(name: str) -> Optional[str]:
    path = os.environ.get("PATH", "") + os.pathsep + os.pathsep.join(_SBIN_PATHS)
    return shutil.which(name, path=path)


def missing_binaries() -> List[str]:
    """Names of the programs the cluster needs that are not installed."""
    return [b for b in _REQUIRED_BINARIES if _which(b) is None]


def _tail(path: Path, lines: int = 40) -> str:
    try:
        data = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(data[-lines:])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is not alive
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0] != "Z"
    except (OSError, IndexError):
        return True


def _pid_cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
