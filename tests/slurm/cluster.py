"""A real one-node SLURM cluster on localhost, for tests.

Nothing is mocked: this starts munged, MariaDB (mariadbd), slurmdbd, slurmctld
and slurmd as root, each directly in the foreground (``-D``/``-F``) as a
detached process, with every config, state, pid and log file under one state
directory (default ``/tmp/sweepbench-slurm``, override with the environment
variable ``SWEEPBENCH_SLURM_DIR``).  There is no systemd involved.

Clients find the cluster through ``SLURM_CONF`` (see :attr:`SlurmCluster.env`),
which points at ``<state dir>/etc/slurm.conf``; ``slurmdbd.conf`` lies beside
it.  For convenience in a shell, :meth:`SlurmCluster.start` also makes
``/etc/slurm/slurm.conf`` a symlink to that file when nothing else is there
(and :meth:`SlurmCluster.stop` removes the symlink again), so a bare
``squeue``/``sbatch`` works too.

Layout of the cluster:

* cluster ``sweepbench``; one node named after this machine's short host name
  (so ``SLURM_JOB_NODELIST`` resolves, e.g. for a torch.distributed
  MASTER_ADDR), address 127.0.0.1, declared with ``CPUS`` (16) CPUs and
  ``REAL_MEMORY_MB`` memory whatever the hardware has
  (``SlurmdParameters=config_overrides``), so 16 one-CPU tasks run at once;
* one partition ``debug`` (the default), ``MaxTime=INFINITE``;
* ``select/cons_tres`` with ``CR_Core`` (memory is not a consumable resource),
  ``proctrack/linuxproc``, ``task/none``, no cgroups, no GRES;
* accounting through slurmdbd into MariaDB (``sacct`` works), cluster,
  account ``sweepbench`` and user ``root`` created with ``sacctmgr -i``;
* ``JobRequeue=1``, ``KillWait=2``, ``OverTimeLimit=0``, ``MinJobAge=30``;
* TCP ports (slurmctld, slurmd, slurmdbd, MariaDB) picked free at start and kept in
  ``<state dir>/ports.json`` (see ports.py), so the cluster runs next to any other SLURM.

multinode.py adds a second cluster of two nodes in network namespaces, sharing this
cluster's munged and slurmdbd.

Install the packages with ``.ci/install_slurm.sh`` first.

Usable from a shell, too::

    python tests/slurm/cluster.py start|stop|status
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

try:
    from .ports import load_ports, refresh_ports, save_ports
except ImportError:  # run as a script: python tests/slurm/cluster.py
    from ports import load_ports, refresh_ports, save_ports  # type: ignore[no-redef]

DEFAULT_STATE_DIR = "/tmp/sweepbench-slurm"
CLUSTER_NAME = "sweepbench"
PARTITION = "debug"
ACCOUNT = "sweepbench"
CPUS = 16
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


class SlurmCluster:
    """One-node SLURM cluster on localhost; see the module docstring."""

    daemons: Sequence[str] = _DAEMONS  # ours, in start order

    def __init__(self, state_dir: Optional[str] = None, cpus: int = CPUS) -> None:
        self.state_dir = Path(state_dir or os.environ.get("SWEEPBENCH_SLURM_DIR") or DEFAULT_STATE_DIR)
        self.cpus = cpus
        self.node_name = socket.gethostname().split(".")[0]
        self.partition = PARTITION
        self.cluster_name = CLUSTER_NAME
        self.account = ACCOUNT
        self.etc = self.state_dir / "etc"
        self.run_dir = self.state_dir / "run"
        self.log_dir = self.state_dir / "log"
        self.slurm_conf = self.etc / "slurm.conf"
        self.slurmdbd_conf = self.etc / "slurmdbd.conf"
        self.my_cnf = self.etc / "my.cnf"
        self.munge_key = self.etc / "munge.key"
        self.munge_socket = self.run_dir / "munge.socket"
        self.mysql_socket = self.run_dir / "mysqld.sock"
        self.mysql_datadir = self.state_dir / "mysql"
        self._etc_link = Path("/etc/slurm/slurm.conf")
        self._procs: Dict[str, subprocess.Popen] = {}
        self._had_state = False
        self.ports_file = self.state_dir / "ports.json"
        self.ports: Dict[str, int] = load_ports(self.ports_file, PORT_NAMES)
        self.controller_addr = "127.0.0.1"  # where clients and slurmds reach slurmctld

    # ------------------------------------------------------------------ env
    @property
    def env(self) -> Dict[str, str]:
        """Environment variables a client (sbatch, submitit, ...) needs."""
        return {"SLURM_CONF": str(self.slurm_conf)}

    def _full_env(self) -> Dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_"))}
        env["PATH"] = env.get("PATH", "") + os.pathsep + os.pathsep.join(_SBIN_PATHS)
        env.update(self.env)
        return env

    # ------------------------------------------------------------ commands
    def run(self, args: Sequence[str], timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
        """Run a SLURM client command against this cluster; returns the CompletedProcess."""
        args = list(args)
        exe = _which(args[0]) or args[0]
        try:
            proc = subprocess.run(
                [exe, *args[1:]],
                env=self._full_env(),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:
            raise SlurmClusterError(f"{' '.join(args)} timed out after {timeout}s") from exc
        if check and proc.returncode != 0:
            raise SlurmClusterError(
                f"{' '.join(args)} failed with exit code {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def sbatch(self, *args: str, timeout: float = 30) -> str:
        """Submit with sbatch (``--parsable`` is added); returns the job id."""
        out = self.run(["sbatch", "--parsable", *args], timeout=timeout).stdout.strip()
        return out.split(";")[0].strip()

    # ---------------------------------------------------------- job state
    def sacct_state(self, job_id: str) -> str:
        """State of the job's allocation per sacct (e.g. COMPLETED), "" if not recorded yet."""
        proc = self.run(
            ["sacct", "-n", "-P", "-X", "-j", str(job_id), "-o", "JobID,State"], check=False, timeout=30
        )
        if proc.returncode != 0:
            return ""
        state = ""
        for line in proc.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) >= 2 and parts[0] == str(job_id):
                state = parts[1].split()[0] if parts[1].strip() else ""
        return state

    def squeue_state(self, job_id: str) -> str:
        """State of the job per squeue (PENDING, RUNNING, COMPLETING, ...), "" if not listed."""
        proc = self.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], check=False, timeout=30)
        if proc.returncode != 0:
            return ""
        return proc.stdout.strip().splitlines()[0].strip() if proc.stdout.strip() else ""

    def wait_job(self, job_id: str, timeout: float = 120, poll: float = 0.5) -> str:
        """Wait until the job is finished (in sacct and gone from squeue); returns its final state."""
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            state = self.sacct_state(job_id)
            queued = self.squeue_state(job_id)
            last = f"sacct={state or '-'} squeue={queued or '-'}"
            # squeue lists a job until it is fully cleaned up (COMPLETING), sacct keeps it for good
            if state in FINAL_STATES and (queued == "" or queued in FINAL_STATES):
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} not finished after {timeout}s ({last})")
            time.sleep(poll)

    def wait_state(self, job_id: str, states: Sequence[str], timeout: float = 60, poll: float = 0.3) -> str:
        """Wait until squeue (or sacct) shows the job in one of ``states``; returns it."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.squeue_state(job_id) or self.sacct_state(job_id)
            if state in states:
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} not in {list(states)} after {timeout}s (is {state or '-'})")
            time.sleep(poll)

    # ---------------------------------------------------------- node state
    def node_state(self) -> str:
        """The node's state per sinfo, lower case (idle, mixed, down*, ...), "" if unknown."""
        proc = self.run(["sinfo", "-h", "-N", "-n", self.node_name, "-o", "%T"], check=False, timeout=15)
        if proc.returncode != 0:
            return ""
        return proc.stdout.strip().splitlines()[0].strip().lower() if proc.stdout.strip() else ""

    def wait_idle(self, timeout: float = 60) -> None:
        """Wait until the node is idle (no job on it) and the queue is empty."""
        deadline = time.monotonic() + timeout
        state = queue = ""
        while time.monotonic() < deadline:
            state = self.node_state()
            queue = self.run(["squeue", "-h", "-o", "%i %T"], check=False, timeout=15).stdout.strip()
            if state == "idle" and not queue:
                return
            time.sleep(0.5)
        raise SlurmClusterError(
            f"node {self.node_name} not idle after {timeout}s (state {state!r}, queue {queue!r})\n"
            + self._logs_summary(("slurmctld", "slurmd"))
        )

    # ------------------------------------------------------------- configs
    def _node_lines(self) -> str:
        """slurm.conf's node and partition lines."""
        host = self.node_name
        return (f"NodeName={host} NodeAddr=127.0.0.1 CPUs={self.cpus} Sockets=1 CoresPerSocket={self.cpus} "
                f"ThreadsPerCore=1 RealMemory={REAL_MEMORY_MB} State=UNKNOWN\n"
                f"PartitionName={self.partition} Nodes={host} Default=YES MaxTime=INFINITE State=UP\n")

    def _slurmd_files(self) -> Dict[str, str]:
        """slurmd's spool dir, pid and log file (one slurmd here)."""
        return {"SlurmdSpoolDir": f"{self.state_dir}/slurmd", "SlurmdPidFile": f"{self.run_dir}/slurmd.pid",
                "SlurmdLogFile": f"{self.log_dir}/slurmd.log"}

    def _slurm_conf(self, *, munge_socket: Path, slurmdbd_port: int) -> str:
        files = "".join(f"{k}={v}\n" for k, v in self._slurmd_files().items())
        return f"""# generated by tests/slurm/cluster.py -- do not edit
ClusterName={self.cluster_name}
SlurmctldHost={self.node_name}({self.controller_addr})
SlurmctldPort={self.ports["slurmctld"]}
SlurmdPort={self.ports["slurmd"]}
SlurmUser=root
SlurmdUser=root
# cred_expire also is how long a requeued job waits before it may start again
# (default 120 s); 10 s keeps `scontrol requeue` tests fast.
AuthType=auth/munge
AuthInfo=socket={munge_socket},cred_expire={CRED_EXPIRE_S}
CredType=cred/munge
StateSaveLocation={self.state_dir}/slurmctld
SlurmctldPidFile={self.run_dir}/slurmctld.pid
SlurmctldLogFile={self.log_dir}/slurmctld.log
{files}SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1,batch_sched_delay=0
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
KillWait=2
OverTimeLimit=0
MinJobAge=30
InactiveLimit=0
WaitTime=0
SlurmctldTimeout=30
SlurmdTimeout=60
MessageTimeout=10
UnkillableStepTimeout=30
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={slurmdbd_port}
# for slurmdbd connections this names the munge socket (AuthInfo is not used there)
AccountingStoragePass={munge_socket}
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
JobCompType=jobcomp/none
MailProg=/bin/true
{self._node_lines()}"""

    def _configs(self) -> Dict[Path, str]:
        auth = f"AuthType=auth/munge\nAuthInfo=socket={self.munge_socket}\n"
        slurm_conf = self._slurm_conf(munge_socket=self.munge_socket, slurmdbd_port=self.ports["slurmdbd"])
        slurmdbd_conf = f"""# generated by tests/slurm/cluster.py -- do not edit
{auth}DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={self.ports["slurmdbd"]}
SlurmUser=root
DebugLevel=info
LogFile={self.log_dir}/slurmdbd.log
PidFile={self.run_dir}/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={self.ports["mysql"]}
StorageUser={DB_USER}
StoragePass={DB_PASS}
StorageLoc={DB_NAME}
"""
        my_cnf = f"""# generated by tests/slurm/cluster.py -- do not edit
[client]
socket={self.mysql_socket}
user=root

[mysqld]
user=root
datadir={self.mysql_datadir}
socket={self.mysql_socket}
pid-file={self.run_dir}/mysqld.pid
log-error={self.log_dir}/mysqld.log
port={self.ports["mysql"]}
bind-address=127.0.0.1
skip-name-resolve
skip-log-bin
innodb_use_native_aio=0
innodb_buffer_pool_size=64M
innodb_log_file_size=32M
innodb_lock_wait_timeout=900
max_connections=100
performance_schema=OFF
"""
        return {self.slurm_conf: slurm_conf, self.slurmdbd_conf: slurmdbd_conf, self.my_cnf: my_cnf}

    def _config_hash(self) -> str:
        h = hashlib.sha256()
        for path, text in sorted(self._configs().items()):
            h.update(str(path).encode() + b"\0" + text.encode() + b"\0")
        return h.hexdigest()

    def _write_configs(self) -> None:
        for d in (self.state_dir, self.etc, self.run_dir, self.log_dir,
                  self.state_dir / "slurmctld", self.state_dir / "slurmd"):
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, 0o755)
        for path, text in self._configs().items():
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            os.chmod(tmp, 0o600 if path == self.slurmdbd_conf else 0o644)
            os.replace(tmp, path)
        (self.run_dir / "config.sha256").write_text(self._config_hash())
        if not self.munge_key.exists() or self.munge_key.stat().st_size < 32:
            tmp = self.munge_key.with_suffix(".tmp")
            tmp.write_bytes(os.urandom(1024))
            os.chmod(tmp, 0o400)
            os.replace(tmp, self.munge_key)
        os.chmod(self.munge_key, 0o400)

    def _link_etc(self) -> None:
        link = self._etc_link
        try:
            if link.is_symlink() or not link.exists():
                link.parent.mkdir(parents=True, exist_ok=True)
                if link.is_symlink():
                    link.unlink()
                link.symlink_to(self.slurm_conf)
        except OSError:
            pass  # only a convenience; clients use SLURM_CONF

    def _unlink_etc(self) -> None:
        link = self._etc_link
        try:
            if link.is_symlink() and os.readlink(link) == str(self.slurm_conf):
                link.unlink()
        except OSError:
            pass

    # ------------------------------------------------------ daemon control
    def _pid_file(self, name: str) -> Path:
        return self.run_dir / f"{name}.pid"

    def _log_file(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def _out_file(self, name: str) -> Path:
        return self.log_dir / f"{name}.out"

    def _cmdline_marks(self, name: str) -> Sequence[str]:
        """What the command line of our daemon ``name`` holds (to tell it from a reused pid)."""
        return (name,)

    def _daemon_pid(self, name: str) -> Optional[int]:
        """Pid of our running daemon ``name`` (from its pid file), or None."""
        try:
            pid = int(self._pid_file(name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        if pid <= 1 or not _pid_alive(pid):
            return None
        cmd = _pid_cmdline(pid)
        if not all(mark in cmd for mark in self._cmdline_marks(name)):
            return None  # stale pid file, pid reused by something else
        return pid

    def _spawn(self, name: str, args: List[str]) -> int:
        exe = _which(args[0])
        if exe is None:
            raise SlurmClusterError(f"{args[0]} not found. {INSTALL_HINT}")
        out = open(self._out_file(name), "ab")
        out.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {' '.join(args)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            [exe, *args[1:]],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=self._full_env(),
            cwd=str(self.state_dir),
            start_new_session=True,
            close_fds=True,
        )
        out.close()
        # Our own pid file (daemons may write theirs to the same path; same pid with -D/-F).
        self._pid_file(name).write_text(f"{proc.pid}\n")
        self._procs[name] = proc
        return proc.pid

    def _daemon_failed(self, name: str, why: str) -> SlurmClusterError:
        logs = [self._out_file(name)]
        if name != "munged":
            logs.append(self._log_file(name))
        else:
            logs.append(self.log_dir / "munged.log")
        text = f"SLURM test cluster: {name} failed to come up: {why}\n"
        for log in logs:
            if log.exists():
                text += f"---- tail of {log}\n{_tail(log)}\n"
        return SlurmClusterError(text)

    def _wait(self, name: str, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        proc = self._procs.get(name)
        while True:
            if proc is not None and proc.poll() is not None:
                raise self._daemon_failed(name, f"process exited with code {proc.returncode}")
            try:
                if ready():
                    return
            except Exception:  # noqa: BLE001 - readiness probes may fail while starting
                pass
            if time.monotonic() > deadline:
                raise self._daemon_failed(name, f"not {what} after {timeout}s")
            time.sleep(0.2)

    def _stop_daemon(self, name: str, timeout: float = 20) -> None:
        pid = self._daemon_pid(name)
        proc = self._procs.pop(name, None)
        if pid is None and proc is not None and proc.poll() is None:
            pid = proc.pid
        if pid is not None:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + timeout
            while _pid_alive(pid) and time.monotonic() < deadline:
                if proc is not None:
                    proc.poll()  # reap our child
                time.sleep(0.1)
            if _pid_alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                deadline = time.monotonic() + 5
                while _pid_alive(pid) and time.monotonic() < deadline:
                    if proc is not None:
                        proc.poll()
                    time.sleep(0.1)
        if proc is not None:
            try:
                proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        self._pid_file(name).unlink(missing_ok=True)

    # ----------------------------------------------------------- probes
    def _munge_ok(self) -> bool:
        if not self.munge_socket.exists():
            return False
        enc = subprocess.run(
            [_which("munge") or "munge", "-n", "-S", str(self.munge_socket)],
            capture_output=True, timeout=5, stdin=subprocess.DEVNULL,
        )
        if enc.returncode != 0:
            return False
        dec = subprocess.run(
            [_which("unmunge") or "unmunge", "-S", str(self.munge_socket)],
            input=enc.stdout, capture_output=True, timeout=5,
        )
        return dec.returncode == 0

    def _mysql(self, sql: str, timeout: float = 20) -> subprocess.CompletedProcess:
        return subprocess.run(
            [_which("mariadb") or "mariadb", f"--defaults-file={self.my_cnf}", "-uroot", "-e", sql],
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )

    def _mysql_ok(self) -> bool:
        return self._mysql("SELECT 1", timeout=5).returncode == 0

    def _slurmdbd_ok(self) -> bool:
        if not _port_open(self.ports["slurmdbd"]):
            return False
        return self.run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"],
                        check=False, timeout=10).returncode == 0

    def _slurmctld_ok(self) -> bool:
        proc = self.run(["scontrol", "ping"], check=False, timeout=10)
        return proc.returncode == 0 and "UP" in proc.stdout

    # ------------------------------------------------------------ health
    def is_healthy(self) -> bool:
        """All five daemons are ours, alive, on the current config, and the node takes jobs."""
        try:
            if (self.run_dir / "config.sha256").read_text() != self._config_hash():
                return False
        except OSError:
            return False
        if any(self._daemon_pid(name) is None for name in self.daemons):
            return False
        try:
            return self._slurmctld_ok() and self.node_state() in HEALTHY_NODE_STATES
        except SlurmClusterError:
            return False

    # ------------------------------------------------------------- start
    def start(self, timeout: float = 90) -> "SlurmCluster":
        """Start the cluster, or reuse it if it is already up and healthy.

        If starting on the kept state (database, slurmctld state) fails, the
        state dir is moved to ``<state dir>.failed`` (logs kept for a look) and
        the cluster is started once more from scratch.  Set
        ``SWEEPBENCH_SLURM_RESET=1`` to always start from scratch.
        """
        with self._lock(timeout + 60):
            return self._start_locked(timeout)

    @contextlib.contextmanager
    def _lock(self, timeout: float):
        """Serialise start/stop between processes sharing this state dir (e.g. two pytest runs)."""
        lock_path = self.state_dir.with_name(self.state_dir.name + ".lock")
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(lock_path, "a") as f:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise _PreflightError(f"timed out waiting for the lock {lock_path}") from None
                    time.sleep(0.2)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def _start_locked(self, timeout: float) -> "SlurmCluster":
        if os.environ.get("SWEEPBENCH_SLURM_RESET", "") not in ("", "0"):
            self.stop(quiet=True, _locked=True)
            self._wipe_state()
        try:
            return self._start(timeout)
        except _PreflightError:
            raise
        except SlurmClusterError as first:
            if not self._had_state:
                raise
            self.stop(quiet=True, _locked=True)
            failed = self._wipe_state(keep_as_failed=True)
            try:
                return self._start(timeout)
            except SlurmClusterError as second:
                raise SlurmClusterError(
                    f"{second}\n(an earlier try on the old state, kept in {failed}, failed too: "
                    f"{str(first).splitlines()[0]})"
                ) from second

    def _wipe_state(self, keep_as_failed: bool = False) -> Optional[Path]:
        if not self.state_dir.exists():
            return None
        if keep_as_failed:
            failed = self.state_dir.with_name(self.state_dir.name + ".failed")
            shutil.rmtree(failed, ignore_errors=True)
            os.replace(self.state_dir, failed)
            return failed
        shutil.rmtree(self.state_dir)
        return None

    def _start(self, timeout: float) -> "SlurmCluster":
        if os.geteuid() != 0:
            raise _PreflightError("the SLURM test cluster must be started as root")
        missing = missing_binaries()
        if missing:
            raise _PreflightError(f"missing programs: {', '.join(missing)}. {INSTALL_HINT}")
        self._had_state = (self.mysql_datadir / ".sweepbench-initialised").exists()
        if self.state_dir.exists() and self.is_healthy():
            self._link_etc()
            return self
        # Something is missing or stale: stop whatever of ours is left, then start afresh.
        self.stop(quiet=True, _locked=True)
        self._choose_ports()
        self._write_configs()
        t0 = time.monotonic()

        def left() -> float:
            return max(5.0, timeout - (time.monotonic() - t0))

        # munge
        (self.log_dir / "munged.log").touch()
        (self.state_dir / "munged.seed").unlink(missing_ok=True)
        self._spawn("munged", [
            "munged", "--foreground", "--force",
            f"--key-file={self.munge_key}",
            f"--socket={self.munge_socket}",
            f"--pid-file={self._pid_file('munged')}",
            f"--log-file={self.log_dir / 'munged.log'}",
            f"--seed-file={self.state_dir / 'munged.seed'}",
        ])
        self._wait("munged", self._munge_ok, min(20, left()), "answering")

        # MariaDB
        self._init_mysql(left())
        self._spawn("mariadbd", ["mariadbd", f"--defaults-file={self.my_cnf}"])
        self._wait("mariadbd", self._mysql_ok, min(60, left()), "accepting connections")
        sql = (
            f"CREATE DATABASE IF NOT EXISTS {DB_NAME};"
            + "".join(
                f"CREATE USER IF NOT EXISTS '{DB_USER}'@'{h}' IDENTIFIED BY '{DB_PASS}';"
                f"ALTER USER '{DB_USER}'@'{h}' IDENTIFIED BY '{DB_PASS}';"
                f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'{h}';"
                for h in ("127.0.0.1", "localhost")
            )
            + "FLUSH PRIVILEGES;"
        )
        res = self._mysql(sql)
        if res.returncode != 0:
            raise self._daemon_failed("mariadbd", f"creating the slurm database user failed: {res.stderr}")

        # slurmdbd
        self._spawn("slurmdbd", ["slurmdbd", "-D"])
        self._wait("slurmdbd", self._slurmdbd_ok, min(60, left()), "answering sacctmgr")
        self._ensure_associations()

        # slurmctld (-i: ignore errors in old state files)
        self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
        self._wait("slurmctld", self._slurmctld_ok, min(60, left()), "answering `scontrol ping`")

        # slurmd
        self._spawn("slurmd", ["slurmd", "-D"])

        def node_ready() -> bool:
            state = self.node_state()
            if state.startswith(("down", "drain")) or state.endswith("drain"):
                self.run(["scontrol", "update", f"nodename={self.node_name}", "state=resume"], check=False)
                return False
            return state in HEALTHY_NODE_STATES

        self._wait("slurmd", node_ready, min(60, left()), "registered as a usable node in sinfo")
        self._link_etc()
        return self

    def _choose_ports(self) -> None:
        """Keep the ports of the last start where they are still free; our daemons are stopped,
        so a busy one is someone else's (another SLURM, MariaDB): pick another."""
        self.ports = refresh_ports(self.ports)
        save_ports(self.ports_file, self.ports)

    def _init_mysql(self, timeout: float) -> None:
        marker = self.mysql_datadir / ".sweepbench-initialised"
        if marker.exists():
            return
        if self.mysql_datadir.exists():
            shutil.rmtree(self.mysql_datadir)  # half-initialised by an interrupted run
        self.mysql_datadir.mkdir(parents=True)
        install = _which("mariadb-install-db") or _which("mysql_install_db")
        try:
            res = subprocess.run(
                [install, f"--defaults-file={self.my_cnf}", "--user=root",
                 "--auth-root-authentication-method=socket", "--skip-test-db"],
                capture_output=True, text=True, timeout=min(timeout, 90),
                stdin=subprocess.DEVNULL, env=self._full_env(), cwd=str(self.state_dir),
            )
        except subprocess.TimeoutExpired as exc:
            raise SlurmClusterError("mariadb-install-db timed out") from exc
        if res.returncode != 0:
            raise SlurmClusterError(
                f"mariadb-install-db failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}\n"
                f"---- tail of {self._log_file('mysqld')}\n{_tail(self._log_file('mysqld'))}"
            )
        marker.write_text("ok\n")

    def _ensure_associations(self) -> None:
        def show(entity: str, fmt: str) -> str:
            return self.run(["sacctmgr", "-n", "-P", "show", entity, f"format={fmt}"],
                            check=False, timeout=20).stdout

        if self.cluster_name not in show("cluster", "cluster").split():
            self.run(["sacctmgr", "-i", "add", "cluster", self.cluster_name], check=False, timeout=30)
        if self.account not in show("account", "account").split():
            self.run(["sacctmgr", "-i", "add", "account", self.account,
                      f"cluster={self.cluster_name}", "description=sweepbench tests",
                      "organization=sweepbench"], check=False, timeout=30)
        # root exists in a fresh DB (account root); give it our account too (no-op when done)
        if f"root|{self.account}" not in show("association", "user,account").split():
            self.run(["sacctmgr", "-i", "add", "user", "root", f"account={self.account}",
                      f"cluster={self.cluster_name}"], check=False, timeout=30)
        if self.cluster_name not in show("cluster", "cluster").split():
            raise self._daemon_failed("slurmdbd", f"sacctmgr could not add cluster {self.cluster_name}")

    # -------------------------------------------------------------- stop
    def stop(self, quiet: bool = False, _locked: bool = False) -> None:
        """Cancel all jobs and stop the daemons (ours only, found by pid file)."""
        if not _locked:
            with self._lock(120):
                return self.stop(quiet=quiet, _locked=True)
        if self._daemon_pid("slurmctld") is not None:
            try:
                q = self.run(["squeue", "-h", "-o", "%i"], check=False, timeout=10)
                ids = q.stdout.split() if q.returncode == 0 else []
                if ids:
                    self.run(["scancel", *ids], check=False, timeout=15)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:
                    q = self.run(["squeue", "-h", "-o", "%i"], check=False, timeout=10)
                    if q.returncode != 0 or not q.stdout.strip():
                        break
                    time.sleep(0.5)
            except SlurmClusterError:
                if not quiet:
                    raise
        for name in reversed(self.daemons):
            self._stop_daemon(name)
        self._unlink_etc()

    # ------------------------------------------------------------- misc
    def _logs_summary(self, names: Sequence[str] = _DAEMONS, lines: int = 20) -> str:
        text = ""
        for name in names:
            log = self.log_dir / ("munged.log" if name == "munged" else f"{name}.log")
            if log.exists():
                text += f"---- tail of {log}\n{_tail(log, lines)}\n"
        return text

    def status(self) -> str:
        rows = [f"state dir: {self.state_dir}", f"SLURM_CONF={self.slurm_conf}"]
        for name in self.daemons:
            pid = self._daemon_pid(name)
            rows.append(f"{name:10s} {'pid ' + str(pid) if pid else 'not running'}")
        if self._daemon_pid("slurmctld") is not None:
            rows.append(f"node {self.node_name}: {self.node_state() or 'unknown'}")
        rows.append(f"healthy: {self.is_healthy()}")
        return "\n".join(rows)


def main(argv: Sequence[str], cluster: Any) -> int:
    """``start|stop|status`` of a test cluster (this one, or the two-node one of multinode.py),
    for a person looking at it by hand."""
    cmd = argv[1] if len(argv) > 1 else "status"
    if cmd == "start":
        t0 = time.monotonic()
        cluster.start()
        print(f"started in {time.monotonic() - t0:.1f}s; export SLURM_CONF={cluster.slurm_conf}")
    elif cmd == "stop":
        cluster.stop()
        print("stopped")
    elif cmd == "status":
        print(cluster.status())
    else:
        print(f"usage: {argv[0]} start|stop|status", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv, SlurmCluster()))
