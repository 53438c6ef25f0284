"""Fault injection (``fault.kind``, ``fault.rank``), off by default, to check failure handling.

``raise`` raises, ``exit`` calls os._exit(3), ``kill`` SIGKILLs the rank, ``segfault`` crashes
it in C, ``hang`` never returns (the job's time bound must end it), and ``hang_until_requeued``
hangs on a job's first start only: once SLURM restarts the job (``scontrol requeue``, a
preemption, a requeue on time-out) it runs normally, so a requeue can be checked end to end."""

from __future__ import annotations

import ctypes
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


def _segfault(rank: int) -> None:
    ctypes.string_at(0)  # reads address 0: SIGSEGV


def _hang(rank: int) -> None:
    while True:
        time.sleep(60)


def restart_count() -> int:
    """How many times SLURM has restarted this job (0 outside SLURM)."""
    return int(os.environ.get("SLURM_RESTART_COUNT") or 0)


def _hang_until_requeued(rank: int) -> None:
    if restart_count() == 0:
        print(f"injected fault: rank {rank} hangs until the job is requeued", flush=True)
        _hang(rank)


FAULTS: dict[str, Callable[[int], None]] = {
    "raise": _raise, "exit": _exit, "kill": _kill, "segfault": _segfault, "hang": _hang,
    "hang_until_requeued": _hang_until_requeued,
}


def maybe_inject_fault(cfg: DictConfig, rank: int) -> None:
    if cfg.fault.kind != "none" and cfg.fault.rank == rank:
        FAULTS[cfg.fault.kind](rank)
