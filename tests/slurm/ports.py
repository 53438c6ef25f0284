"""Free TCP ports for a test cluster's daemons, so it runs next to any other SLURM (or MariaDB).

Ports are picked at random below the kernel's ephemeral range (32768-60999) and below the range
sweepbench draws a job's MASTER_PORT from (20000-60000), so neither an outgoing connection nor a
job's rendezvous takes one between the pick and the daemon's bind. The pick is kept in the
cluster's state dir: a cluster that is reused keeps its ports (its config, and the hash that
says it is current, do not change), and a port someone else took meanwhile is picked afresh."""

from __future__ import annotations

import json
import os
import random
import socket
from pathlib import Path
from typing import Callable, Dict, Iterable, Sequence

PORT_RANGE = (10000, 20000)


def port_free(port: int) -> bool:
    """Nothing listens on ``port`` (any address): a daemon binding it with SO_REUSEADDR, as SLURM's
    and MariaDB's do, would succeed."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def pick_ports(names: Sequence[str], *, taken: Iterable[int] = (),
               free: Callable[[int], bool] = port_free) -> Dict[str, int]:
    """One distinct free port per name, none of ``taken``."""
    rng = random.Random()  # not the global one: tests may seed it
    used = set(taken)
    out: Dict[str, int] = {}
    for name in names:
        for _ in range(1000):
            port = rng.randrange(*PORT_RANGE)
            if port not in used and free(port):
                break
        else:
            raise RuntimeError(f"no free TCP port in {PORT_RANGE} for {name}")
        used.add(port)
        out[name] = port
    return out


def load_ports(path: Path, names: Sequence[str]) -> Dict[str, int]:
    """The ports kept in ``path`` if it holds one for every name, else a fresh pick (not saved)."""
    try:
        kept = json.loads(path.read_text())
        if isinstance(kept, dict) and all(isinstance(kept.get(n), int) for n in names):
            return {n: kept[n] for n in names}
    except (OSError, ValueError):
        pass
    return pick_ports(names)


def refresh_ports(ports: Dict[str, int], *, free: Callable[[int], bool] = port_free) -> Dict[str, int]:
    """``ports`` with every one that is not free (someone else's now) replaced by a free one."""
    busy = [name for name, port in ports.items() if not free(port)]
    fresh = pick_ports(busy, taken=ports.values(), free=free) if busy else {}
    return {**ports, **fresh}


def save_ports(path: Path, ports: Dict[str, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(ports, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
