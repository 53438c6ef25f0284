"""Ranks forked from a warm interpreter: multiprocessing's fork server, started once per driver
with torch and the rank's modules already imported (``PRELOAD``), forks each rank of every local
job, instead of a fresh ``python -m sweepbench.launch.rank`` importing them again (2-5 s a job,
more on a loaded machine). ``launch.preload=false`` turns it off.

The fork server never touches CUDA (importing torch does not initialise it), so each rank creates
its own CUDA context after the fork, as a fresh interpreter would. A forked rank is what a started
one is: its own session, its log as stdout and stderr, exactly the environment it would have been
started with (``os.environ`` replaced before its first line of work), the same entry
(``rank.main``) and exit codes (a signal's death is minus its number). It dies with the driver: the
fork server is SIGKILLed when the driver dies (``forkserver_guard``; and it exits when the driver's
pipe closes), which SIGKILLs the rank (PR_SET_PDEATHSIG), and the rank's watchdog also watches the
driver's pid.

Used only where a fork gives the same process as a start: the ranks' interpreter is this one (no
``launch.python`` of another environment) and the environment is the one the fork server started
with (variables that torch reads at import would otherwise differ); elsewhere ranks start fresh."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

# what a rank imports before its first line of work (rank.run_rank, the benchmark registry and
# every benchmark plugin, the environment capture): imported once, in the fork server, after the
# guard that makes the server die with the driver
PRELOAD = ["sweepbench.launch.forkserver_guard", "torch", "torch.distributed", "omegaconf", "sweepbench.launch.rank",
           "sweepbench.benchmarks.registry", "sweepbench.record.env", "sweepbench.record.atomic",
           "sweepbench.launch.preload"]

_server_env: dict[str, str] | None = None  # the environment the fork server started with
# variables that nothing preloaded reads, which the driver sets between jobs (its wandb runs set
# WANDB_SERVICE); a rank still gets their values of the moment (os.environ replaced at its start)
IGNORED_PREFIXES = ("WANDB_",)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(IGNORED_PREFIXES)}


def usable(cfg: DictConfig) -> bool:
    """Whether this job's ranks can be forked from the warm interpreter (see the module's text)."""
    if not cfg.launch.get("preload", True) or sys.platform != "linux":
        return False
    python = str(cfg.launch.python or "")
    if python and os.path.abspath(python) != os.path.abspath(sys.executable):
        return False  # not realpath: a venv's bin/python links to its base interpreter, with other packages
    return _server_env is None or _server_env == _env()


class ForkedRank:
    """A forked rank, behind the part of subprocess.Popen's interface the launcher uses."""

    def __init__(self, proc: multiprocessing.process.BaseProcess) -> None:
        self.proc = proc
        self.pid = proc.pid

    def poll(self) -> int | None:
        return self.proc.exitcode

    def kill(self) -> None:
        if self.proc.exitcode is None:
            self.proc.kill()

    def wait(self, timeout: float | None = None) -> int | None:
        self.proc.join(timeout)
        if self.proc.exitcode is None:
            raise subprocess.TimeoutExpired("rank", timeout or 0)
        return self.proc.exitcode


def start_rank(env: dict[str, str], log: Path) -> ForkedRank:
    """Fork one rank from the fork server (started with ``PRELOAD`` on the first call). Its log is
    opened here first, so that a log that cannot be written fails the start (OSError), as it does
    for a started rank, instead of the rank."""
    global _server_env
    os.close(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
    ctx = multiprocessing.get_context("forkserver")
    if _server_env is None:
        ctx.set_forkserver_preload(PRELOAD)
        _server_env = _env()
    proc = ctx.Process(target=_rank_main, args=(env, str(log)), name="sweepbench-rank", daemon=False)
    proc.start()
    return ForkedRank(proc)


def _rank_main(env: dict[str, Any], log: str) -> None:
    """In the forked rank: what Popen(start_new_session=True, stdout=stderr=log, env=env) sets up,
    then rank.main. Its exit code is the rank's (sys.exit's; 1 for an uncaught error)."""
    from sweepbench.launch import rank

    os.setsid()
    rank.redirect_output(Path(log))
    os.environ.clear()
    os.environ.update(env)
    rank.main(forked=True)
