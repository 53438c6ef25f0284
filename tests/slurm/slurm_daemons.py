"""The test SLURM cluster's daemons: spawn, wait for, stop and health-check each one."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import List, Optional, Sequence

try:
    from .slurm_base import (
        HEALTHY_NODE_STATES, INSTALL_HINT, SlurmClusterError, _pid_alive, _pid_cmdline, _port_open,
        _tail, _which
    )
except ImportError:  # run as a script: python tests/slurm/cluster.py
    from slurm_base import (  # type: ignore[no-redef]
        HEALTHY_NODE_STATES, INSTALL_HINT, SlurmClusterError, _pid_alive, _pid_cmdline, _port_open,
        _tail, _which
    )


class SlurmDaemons:
    """Mixed into SlurmCluster (cluster.py), whose __init__ sets the paths and ports used here."""

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
