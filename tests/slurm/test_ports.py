"""The test clusters' ports are picked free (ports.py), so the suite runs next to another SLURM:
a port someone listens on is never picked, and a kept port someone took meanwhile is replaced."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Iterator

import pytest

from .ports import PORT_RANGE, load_ports, pick_ports, port_free, refresh_ports, save_ports


@pytest.fixture
def listener() -> Iterator[int]:
    """A real TCP listener on a port of the range, as another SLURM's daemon would hold it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        for port in range(*PORT_RANGE):
            try:
                s.bind(("0.0.0.0", port))
                break
            except OSError:
                continue
        s.listen()
        yield port


def test_a_listened_port_is_not_free_and_is_replaced(listener: int, tmp_path: Path) -> None:
    assert not port_free(listener)
    kept = {"slurmctld": listener, "slurmd": pick_ports(["x"], taken=[listener])["x"]}
    save_ports(tmp_path / "ports.json", kept)
    assert load_ports(tmp_path / "ports.json", ["slurmctld", "slurmd"]) == kept
    fresh = refresh_ports(kept)
    assert fresh["slurmd"] == kept["slurmd"]  # still free: kept, so a reused cluster keeps its config
    assert fresh["slurmctld"] != listener and port_free(fresh["slurmctld"])
    assert len(set(fresh.values())) == 2


def test_picked_ports_are_distinct_free_and_below_the_ephemeral_and_rendezvous_ranges() -> None:
    ports = pick_ports(["a", "b", "c", "d"])
    assert len(set(ports.values())) == 4
    assert all(PORT_RANGE[0] <= p < PORT_RANGE[1] < 20001 and port_free(p) for p in ports.values())

