"""Fault injection (``fault.kind``, ``fault.rank``), off by default, to check failure handling."""

from __future__ import annotations

import os
import signal
import time
from typing import Callable

from omegaconf import DictConfig


def _raise(rank: int) -> None:
    raise RuntimeError(f"injected fault: fault.kind=raise on rank {rank}")


def _exit(rank: int) -> None:
    os._exit(3)


def _kill(rank: int) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _hang(rank: int) -> None:
    while True:
        time.sleep(60)


FAULTS: dict[str, Callable[[int], None]] = {"raise": _raise, "exit": _exit, "kill": _kill, "hang": _hang}


def maybe_inject_fault(cfg: DictConfig, rank: int) -> None:
    if cfg.fault.kind != "none" and cfg.fault.rank == rank:
        FAULTS[cfg.fault.kind](rank)
