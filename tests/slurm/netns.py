"""A private network for the multi-node test cluster, on this one machine.

Each node is a network namespace (``ip netns``) with its own address on a bridge that this
module creates in the root namespace; the root namespace holds the bridge's own address (the
gateway), where the node's slurmd finds slurmctld. The addresses are in a private /24 that no
route of this machine covers, and exist only on the bridge and inside the namespaces: traffic
stays among the test's namespaces (and loopback). A node's processes get their own host name
through a UTS namespace (:meth:`PrivateNet.node_command`), and their own ``/etc/hosts`` (bind-
mounted in a mount namespace of their own, from ``/etc/netns/<netns>/hosts``, where ``ip netns
exec`` would look for it) naming every node, as a cluster's DNS would, so a rank's host name
resolves to its node's address (gloo binds to it). Not ``ip netns exec`` itself: it remounts
``/sys``, which hides the cgroup mounts slurmd needs.

:meth:`PrivateNet.up` first removes whatever of ours a killed run left behind; :meth:`down`
removes the namespaces, veth pairs, bridge and ``/etc/netns`` entries (ours only, by name)."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import List, Sequence

PREFIX = "sbslurm"  # of every interface, namespace and /etc/netns entry made here
CANDIDATE_NETS = ("10.213.47.0/24", "10.214.47.0/24", "172.29.47.0/24", "192.168.213.0/24")
ETC_NETNS = Path("/etc/netns")


class NetError(RuntimeError):
    """An ``ip`` command failed."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise NetError(f"ip {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _link_exists(name: str) -> bool:
    return ip("link", "show", name, check=False).returncode == 0


def _netns_list() -> List[str]:
    return [line.split()[0] for line in ip("netns", "list").stdout.splitlines() if line.strip()]


def free_subnet(bridge: str) -> ipaddress.IPv4Network:
    """The first candidate /24 that no route of the root namespace overlaps (our bridge's aside)."""
    routes = []
    for line in ip("-4", "route", "show").stdout.splitlines():
        words = line.split()
        if not words or f"dev {bridge}" in line:
            continue
        dest = "0.0.0.0/0" if words[0] == "default" else words[0]
        try:
            routes.append(ipaddress.ip_network(dest, strict=False))
        except ValueError:
            continue
    for cand in map(ipaddress.ip_network, CANDIDATE_NETS):
        if not any(cand.overlaps(r) for r in routes if r.prefixlen > 0):
            return cand  # type: ignore[return-value]
    raise NetError(f"every candidate subnet {CANDIDATE_NETS} overlaps a route of this machine")


@dataclass(frozen=True)
class Node:
    name: str  # SLURM node name and host name
    netns: str
    veth: str  # the root namespace's end of the node's veth pair (the node's end is eth0)
    addr: str


class PrivateNet:
    """A bridge and one namespace per node; see the module docstring."""

    def __init__(self, node_names: Sequence[str], *, controller_name: str) -> None:
        self.bridge = f"{PREFIX}0"
        self.subnet = free_subnet(self.bridge)
        hosts = list(self.subnet.hosts())
        self.gateway = str(hosts[0])
        self.controller_name = controller_name
        self.nodes = [Node(name, f"{PREFIX}-{name}", f"{PREFIX}v{i}", str(self.subnet.network_address + 10 + i))
                      for i, name in enumerate(node_names, start=1)]

    def hosts_file(self) -> str:
        lines = ["127.0.0.1\tlocalhost", f"{self.gateway}\t{self.controller_name}"]
        lines += [f"{node.addr}\t{node.name}" for node in self.nodes]
        return "\n".join(lines) + "\n"

    def is_up(self) -> bool:
        names = set(_netns_list())
        return _link_exists(self.bridge) and all(node.netns in names for node in self.nodes)

    def up(self) -> None:
        self.down()
        mask = self.subnet.prefixlen
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.gateway}/{mask}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for node in self.nodes:
            ip("netns", "add", node.netns)
            ip("link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", node.netns)
            ip("link", "set", node.veth, "master", self.bridge, "up")
            inside = ("netns", "exec", node.netns, "ip")
            ip(*inside, "addr", "add", f"{node.addr}/{mask}", "dev", "eth0")
            ip(*inside, "link", "set", "eth0", "up")
            ip(*inside, "link", "set", "lo", "up")
            etc = ETC_NETNS / node.netns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(self.hosts_file())

    def down(self) -> None:
        """Remove every namespace, link and /etc/netns entry of ours, whichever run made them."""
        for netns in _netns_list():
            if netns.startswith(f"{PREFIX}-"):
                ip("netns", "del", netns, check=False)  # its veth pair goes with it
        for line in ip("-o", "link", "show").stdout.splitlines():
            name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
            if name.startswith(PREFIX) and name != self.bridge:
                ip("link", "del", name, check=False)
        if _link_exists(self.bridge):
            ip("link", "del", self.bridge, check=False)
        if ETC_NETNS.is_dir():
            for entry in ETC_NETNS.iterdir():
                if entry.name.startswith(f"{PREFIX}-"):
                    shutil.rmtree(entry, ignore_errors=True)
            if not any(ETC_NETNS.iterdir()):
                ETC_NETNS.rmdir()

    def node_command(self, node: Node, argv: Sequence[str]) -> List[str]:
        """``argv`` run on ``node``: in its network namespace, with its own host name (UTS
        namespace) and /etc/hosts (mount namespace, private: nothing leaks to this one). Every
        step execs, so the pid stays the command's."""
        hosts = ETC_NETNS / node.netns / "hosts"
        script = f'hostname "$0" && mount --bind {hosts} /etc/hosts && exec "$@"'
        return ["nsenter", f"--net=/run/netns/{node.netns}", "--", "unshare", "--uts", "--mount",
                "--propagation", "private", "--", "sh", "-c", script, node.name, *argv]
