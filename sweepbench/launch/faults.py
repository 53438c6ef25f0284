"""Fault injection (``fault.kind``, ``fault.rank``), off by default, to check failure handling.

``raise`` raises, ``exit`` calls os._exit(3), ``kill`` SIGKILLs the rank, ``segfault`` crashes
it in C, ``hang`` never returns (the job's time bound must end it), and ``hang_until_requeued``
hangs on a job's first start only: once SLURM restarts the job (``scontrol requeue``, a
preemption, a requeue on time-out) it runs normally, so a requeue can be checked end to end.
``slow`` makes every timed iteration of the rank take ``fault.factor`` times as long (a wait
inside the timed region, ``measure.timing.slow_down``), to check that ``sweepbench compare``
flags a known slowdown."""

from __future__ import annotations

import ctypes
import os
import signal
import time
from typing import Callable

from omegaconf import DictConfig

from sweepbench.core import Registry

# fault.kind -> what the rank does at start ("none": no fault)
FAULTS: Registry[Callable[[int], None]] = Registry("fault", ordered=True)


@FAULTS.register("raise")
def _raise(rank: int) -> None:
    raise RuntimeError(f"injected fault: fault.kind=raise on rank {rank}")


@FAULTS.register("exit")
def _exit(rank: int) -> None:
    os._exit(3)


@FAULTS.register("kill")
def _kill(rank: int) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@FAULTS.register("segfault")
def _segfault(rank: int) -> None:
    ctypes.string_at(0)  # reads address 0: SIGSEGV


@FAULTS.register("hang")
def _hang(rank: int) -> None:
    while True:
        time.sleep(60)


def restart_count() -> int:
    """How many times SLURM has restarted this job (0 outside SLURM)."""
    return int(os.environ.get("SLURM_RESTART_COUNT") or 0)


@FAULTS.register("hang_until_requeued")
def _hang_until_requeued(rank: int) -> None:
    if restart_count() == 0:
        print(f"injected fault: rank {rank} hangs until the job is requeued", flush=True)
        _hang(rank)


@FAULTS.register("slow")
def _slow(rank: int) -> None:
    """Nothing happens at start: maybe_inject_fault hands fault.factor to the timing loop."""


def check_fault_factor(cfg: DictConfig) -> None:
    """fault.factor slows timed iterations down: >= 1, and only with fault.kind=slow."""
    factor = cfg.fault.factor
    if factor < 1 or (factor != 1 and cfg.fault.kind != "slow"):
        raise ValueError(
            f"fault.factor={factor} needs fault.kind=slow and a value >= 1 "
            f"(1.3: every timed iteration takes 1.3x as long)"
        )


def maybe_inject_fault(cfg: DictConfig, rank: int) -> None:
    if cfg.fault.kind != "none" and cfg.fault.rank == rank:
        if cfg.fault.factor != 1:  # fault.kind=slow (validated): the timing loop sleeps
            from sweepbench.measure.timing import slow_down

            slow_down(cfg.fault.factor)
        FAULTS.get(cfg.fault.kind)(rank)
