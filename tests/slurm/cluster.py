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

Install the packages with ``.ci/install_slurm.sh`` first. The pieces: ``slurm_base`` (constants,
errors, process helpers), ``slurm_files`` (the config files), ``slurm_daemons`` (each daemon's
start, readiness and stop); this module puts them together as :class:`SlurmCluster`.

Usable from a shell, too::

    python tests/slurm/cluster.py start|stop|status
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

try:
    from .ports import load_ports, refresh_ports, save_ports
except ImportError:  # run as a script: python tests/slurm/cluster.py
    from ports import load_ports, refresh_ports, save_ports  # type: ignore[no-redef]

try:
    from .slurm_base import (
        ACCOUNT, CLUSTER_NAME, CPUS, DB_NAME, DB_PASS, DB_USER, DEFAULT_STATE_DIR, FINAL_STATES,
        HEALTHY_NODE_STATES, INSTALL_HINT, PARTITION, PORT_NAMES, SlurmClusterError, _DAEMONS,
        _PreflightError, _SBIN_PATHS, _port_open, _tail, _which, missing_binaries
    )
except ImportError:  # run as a script: python tests/slurm/cluster.py
    from slurm_base import (  # type: ignore[no-redef]
        ACCOUNT, CLUSTER_NAME, CPUS, DB_NAME, DB_PASS, DB_USER, DEFAULT_STATE_DIR, FINAL_STATES,
        HEALTHY_NODE_STATES, INSTALL_HINT, PARTITION, PORT_NAMES, SlurmClusterError, _DAEMONS,
        _PreflightError, _SBIN_PATHS, _port_open, _tail, _which, missing_binaries
    )
try:
    from .slurm_daemons import SlurmDaemons
    from .slurm_files import SlurmFiles
except ImportError:  # run as a script
    from slurm_daemons import SlurmDaemons  # type: ignore[no-redef]
    from slurm_files import SlurmFiles  # type: ignore[no-redef]


class SlurmCluster(SlurmFiles, SlurmDaemons):
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
