"""A real two-node SLURM cluster on this one machine, for multi-node tests.

Two slurmd nodes (``sbnode1``, ``sbnode2``), each in its own network and UTS namespace with
its own address on a private bridge (netns.py), under a slurmctld of their own: a second SLURM
cluster (``ClusterName=sweepbench2``) in the root namespace, listening on the bridge's address.
It shares the one-node cluster's munged (one key; munge's socket is a file, reachable from
every namespace) and slurmdbd (one slurmdbd serves many clusters, as at a site), so
``sacct`` works the same; the one-node cluster must be up first. Ports are picked free
(ports.py), state and logs live in ``<one-node state dir>-multinode``.

What a job sees is what it would on two machines: ``hostname`` differs per node, the ranks of
a job reach each other only through the node addresses (the network namespaces have nothing
else but loopback), the filesystem is shared (as a cluster's home or scratch would be).

Usable from a shell, after ``python tests/slurm/cluster.py start``::

    python tests/slurm/multinode.py start|stop|status
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Dict, Optional, Sequence

try:
    from .cluster import (HEALTHY_NODE_STATES, INSTALL_HINT, SlurmCluster, SlurmClusterError, _PreflightError,
                          _which, main, missing_binaries)
    from .netns import PrivateNet
    from .ports import load_ports
except ImportError:  # run as a script
    from cluster import (HEALTHY_NODE_STATES, INSTALL_HINT, SlurmCluster, SlurmClusterError,  # type: ignore
                         _PreflightError, _which, main, missing_binaries)
    from netns import PrivateNet  # type: ignore[no-redef]
    from ports import load_ports  # type: ignore[no-redef]

NODE_NAMES = ("sbnode1", "sbnode2")
NODE_CPUS = 8  # declared per node: two 2-task jobs fit at once on each
PORT_NAMES = ("slurmctld", "slurmd")


class MultiNodeCluster(SlurmCluster):
    """Two namespaced slurmd nodes under their own slurmctld; see the module docstring."""

    def __init__(self, base: SlurmCluster, state_dir: Optional[str] = None) -> None:
        super().__init__(state_dir or str(base.state_dir.with_name(base.state_dir.name + "-multinode")),
                         cpus=NODE_CPUS)
        self.base = base
        self.cluster_name = "sweepbench2"
        self.node_names = list(NODE_NAMES)
        self.net = PrivateNet(self.node_names, controller_name=self.node_name)
        self.controller_addr = self.net.gateway  # the slurmds, in their namespaces, reach it there
        self.munge_socket, self.munge_key = base.munge_socket, base.munge_key
        self.ports = load_ports(self.ports_file, PORT_NAMES)
        self.daemons = ("slurmctld", *(f"slurmd-{name}" for name in self.node_names))

    # ----------------------------------------------------------- configs
    def node_addr(self, name: str) -> str:
        return next(node.addr for node in self.net.nodes if node.name == name)

    def _node_lines(self) -> str:
        lines = [f"NodeName={n.name} NodeAddr={n.addr} CPUs={self.cpus} Sockets=1 CoresPerSocket={self.cpus} "
                 f"ThreadsPerCore=1 RealMemory=8000 State=UNKNOWN" for n in self.net.nodes]
        lines.append(f"PartitionName={self.partition} Nodes={','.join(self.node_names)} Default=YES "
                     f"MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _slurmd_files(self) -> Dict[str, str]:
        # one slurmd per node on one filesystem: %n (the node name) keeps their files apart
        return {"SlurmdSpoolDir": f"{self.state_dir}/slurmd-%n", "SlurmdPidFile": f"{self.run_dir}/slurmd-%n.pid",
                "SlurmdLogFile": f"{self.log_dir}/slurmd-%n.log"}

    def _configs(self) -> Dict[Path, str]:
        return {self.slurm_conf: self._slurm_conf(munge_socket=self.munge_socket,
                                                  slurmdbd_port=self.base.ports["slurmdbd"])}

    def _cmdline_marks(self, name: str) -> Sequence[str]:
        return name.split("-", 1)  # "slurmd-sbnode1": slurmd ... -N sbnode1

    def _link_etc(self) -> None:
        pass  # /etc/slurm/slurm.conf stays the one-node cluster's

    def _unlink_etc(self) -> None:
        pass

    # ------------------------------------------------------------ state
    def node_states(self) -> Dict[str, str]:
        """Each node's state per sinfo, lower case."""
        proc = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False, timeout=15)
        states = dict.fromkeys(self.node_names, "")
        for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
            name, _, state = line.strip().partition(" ")
            if name in states:
                states[name] = state.strip().lower()
        return states

    def node_state(self) -> str:
        """The worst node's state ("idle" only when every node is)."""
        states = self.node_states()
        return next((s for s in states.values() if s != "idle"), "idle")

    def is_healthy(self) -> bool:
        return self.net.is_up() and self.base.is_healthy() and super().is_healthy()

    # ------------------------------------------------------------ start
    def _start(self, timeout: float) -> "MultiNodeCluster":
        if missing_binaries() or _which("ip") is None or _which("unshare") is None:
            raise _PreflightError(f"missing programs (ip, unshare, or SLURM's). {INSTALL_HINT}")
        if not self.base.is_healthy():
            raise _PreflightError("the one-node cluster (its munged and slurmdbd) must be up first")
        # slurmctld's state is kept (with -i, a stale one is ignored): job ids go on increasing,
        # and never repeat one that slurmdbd already holds a record of for this cluster
        self._had_state = False
        if self.state_dir.exists() and self.is_healthy():
            return self
        self.stop(quiet=True, _locked=True)
        self._choose_ports()
        self._write_configs()
        for name in self.node_names:
            (self.state_dir / f"slurmd-{name}").mkdir(parents=True, exist_ok=True)
        self.net.up()
        t0 = time.monotonic()

        def left() -> float:
            return max(5.0, timeout - (time.monotonic() - t0))

        self._ensure_associations()
        self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
        self._wait("slurmctld", self._slurmctld_ok, min(60, left()), "answering `scontrol ping`")
        slurmd = _which("slurmd") or "slurmd"
        for node in self.net.nodes:
            self._spawn(f"slurmd-{node.name}", self.net.node_command(node, [slurmd, "-D", "-N", node.name]))

        def nodes_ready() -> bool:
            states = self.node_states()
            for name, state in states.items():
                if state.startswith(("down", "drain")) or state.endswith("drain"):
                    self.run(["scontrol", "update", f"nodename={name}", "state=resume"], check=False)
            return all(state in HEALTHY_NODE_STATES for state in states.values())

        self._wait("slurmd-" + self.node_names[-1], nodes_ready, min(60, left()),
                   "registered, with every node usable in sinfo")
        return self

    def _ensure_associations(self) -> None:
        """This cluster in slurmdbd, with root in the tests' account there (idempotent)."""
        clusters = self.run(["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"], check=False).stdout
        if self.cluster_name not in clusters.split():
            self.run(["sacctmgr", "-i", "add", "cluster", self.cluster_name], timeout=30)
        where = self.run(["sacctmgr", "-n", "-P", "show", "association", f"cluster={self.cluster_name}",
                          "format=user,account"], check=False).stdout.split()
        if f"|{self.account}" not in where:
            self.run(["sacctmgr", "-i", "add", "account", self.account, f"cluster={self.cluster_name}",
                      "description=sweepbench tests", "organization=sweepbench"], check=False, timeout=30)
        if f"root|{self.account}" not in where:
            self.run(["sacctmgr", "-i", "add", "user", "root", f"account={self.account}",
                      f"cluster={self.cluster_name}"], check=False, timeout=30)

    def _wait(self, name: str, ready, timeout: float, what: str) -> None:
        try:
            super()._wait(name, ready, timeout, what)
        except SlurmClusterError as err:
            raise SlurmClusterError(f"{err}\n{self._logs_summary(self.daemons)}") from None

    # ------------------------------------------------------------- stop
    def stop(self, quiet: bool = False, _locked: bool = False) -> None:
        """Cancel the jobs, stop our slurmctld and slurmds, remove the namespaces and the bridge."""
        if not _locked:
            with self._lock(120):
                return self.stop(quiet=quiet, _locked=True)
        try:
            super().stop(quiet=quiet, _locked=True)
        finally:
            self.net.down()

    def status(self) -> str:
        rows = [f"state dir: {self.state_dir}", f"SLURM_CONF={self.slurm_conf}",
                f"bridge {self.net.bridge} {self.net.gateway}/{self.net.subnet.prefixlen}: "
                f"{'up' if self.net.is_up() else 'down'}"]
        for name in self.daemons:
            pid = self._daemon_pid(name)
            rows.append(f"{name:16s} {'pid ' + str(pid) if pid else 'not running'}")
        if self._daemon_pid("slurmctld") is not None:
            rows += [f"node {n} ({self.node_addr(n)}): {s or 'unknown'}" for n, s in self.node_states().items()]
        rows.append(f"healthy: {self.is_healthy()}")
        return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main(sys.argv, MultiNodeCluster(SlurmCluster())))
