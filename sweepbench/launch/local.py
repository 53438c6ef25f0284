"""Local launch: the job starts its ranks as processes of ``launch.python`` (default: this
interpreter) running ``python -m sweepbench.launch.rank``, or forks them from a warm interpreter
that has imported torch once for the whole sweep (``preload``, where that gives the same process),
and supervises them.

A rank that raises or dies takes its job down (the others are killed); a job that outlives
``launch.timeout_s`` is killed; a stop asked for by Ctrl-C/SIGTERM kills the ranks and reports
the job ``interrupted``. Either way the outcome is reported, never raised. Ranks die with this
process whatever kills it (each sets PR_SET_PDEATHSIG and watches its parent), and run in their
own session, so a terminal's Ctrl-C reaches the driver only, which then stops them itself."""

from __future__ import annotations

import json
import multiprocessing.connection
import os
import signal
import subprocess
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from sweepbench.core import JobOutcome
from sweepbench.launch import preload
from sweepbench.launch.rank_errors import clear_rank_errors, exit_how, first_raised, has_record
from sweepbench.record.atomic import read_json, temp_pattern

POLL_S = 0.2
SPEC_ENV = "SWEEPBENCH_RANK_SPEC"
PROGRESS_KEY = "sweepbench/progress"


def rank_python(cfg: DictConfig) -> str:
    import sys

    return str(cfg.launch.python or sys.executable)


def clear_leftovers(job_dir: Path) -> None:
    """Files a killed launch can leave: payloads, rank error notes and their temporaries."""
    clear_rank_errors(job_dir)
    for pattern in (".rank0_payload*.json", temp_pattern(".rank*.json")):
        for stale in job_dir.glob(pattern):
            stale.unlink(missing_ok=True)


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            try:  # what the rank started in its session's group (it leads one: start_new_session, setsid)
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def _start_ranks(cfg: DictConfig, spec: dict[str, Any], *, world_size: int, job_dir: Path) -> list[subprocess.Popen]:
    """Start (or fork, ``preload``) every rank; if one cannot start (EAGAIN, a missing
    interpreter), kill those that did."""
    logs = job_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    argv = [rank_python(cfg), "-m", "sweepbench.launch.rank"]
    forked = preload.usable(cfg)
    keep = forked and preload.keeps(cfg)
    procs: list[Any] = []
    try:
        for rank in range(world_size):
            env = {**os.environ, SPEC_ENV: json.dumps({**spec, "rank": rank})}
            if forked:
                procs.append(preload.start_rank(env, logs / f"rank{rank}.log", index=rank, keep=keep))
                continue
            fd = os.open(logs / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                procs.append(
                    subprocess.Popen(
                        argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, env=env, start_new_session=True
                    )
                )
            finally:
                os.close(fd)
    except OSError as err:
        _stop(procs)
        raise OSError(f"could not start rank {len(procs)} of {world_size} with {argv[0]}: {err}") from err
    return procs


def _failure(procs: list[subprocess.Popen], codes: list[int | None], job_dir: Path) -> str:
    """The job's error: a rank that died (no error note) before a rank's raised error, since its
    peers' later 'connection closed' errors are echoes of the death."""
    failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
    died = [(rank, code) for rank, code in failed if not has_record(job_dir, rank)]
    if died:
        rank, code = died[0]
        return f"rank {rank} died ({exit_how(code)})"
    return first_raised(job_dir) or f"rank {failed[0][0]} died ({exit_how(failed[0][1])})"


class _Ends:
    """What the supervisor waits on between its polls: each running rank's end (a started process's
    pidfd, a forked or kept rank's ``waitables()``), so that a job whose ranks finish is seen as they
    do rather than at the next poll; where a pidfd cannot be had it sleeps the poll out."""

    def __init__(self) -> None:
        self.fds: dict[int, int] = {}

    def wait(self, procs: list[Any], timeout: float) -> None:
        objs: list[Any] = []
        for proc in procs:
            if proc.poll() is not None:
                continue
            waitables = getattr(proc, "waitables", None)
            if waitables is not None:
                objs += waitables()
                continue
            if proc.pid not in self.fds:
                try:
                    self.fds[proc.pid] = os.pidfd_open(proc.pid)
                except (AttributeError, OSError):  # no pidfd (an old kernel): the poll's sleep
                    time.sleep(timeout)
                    return
            objs.append(self.fds[proc.pid])
        if objs:
            multiprocessing.connection.wait(objs, timeout)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _show_progress(store: Any, status: Any) -> None:
    if status is None or not store.check([PROGRESS_KEY]):
        return
    done, total, label = store.get(PROGRESS_KEY).decode().split("|", 2)
    status.case_done(int(done), int(total) or None, label)


def launch_local(cfg: DictConfig, *, world_size: int, job_dir: Path) -> JobOutcome:
    import torch.distributed as dist  # only where a job runs

    from sweepbench.launch import interrupt, status as sweep_status

    interrupt.check()  # a stop asked for during the previous job: start nothing
    launch_id = uuid.uuid4().hex[:12]
    payload_path = job_dir / f".rank0_payload.{launch_id}.json"
    clear_leftovers(job_dir)
    store = dist.TCPStore(
        cfg.launch.master_addr,
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=min(cfg.launch.timeout_s, 3600)),
    )
    spec = {
        "cfg": OmegaConf.to_container(cfg, resolve=True),
        "job_dir": str(job_dir),
        "master_addr": cfg.launch.master_addr,
        "port": store.port,
        "world_size": world_size,
        "payload": str(payload_path),
        "parent_pid": os.getpid(),
        "progress_key": PROGRESS_KEY,
    }
    status = sweep_status.current()
    if status is not None:
        status.job_started(sweep_status.job_label(job_dir), world_size)
    outcome = JobOutcome("failed", "the job did not finish")
    tic = time.monotonic()
    procs: list[subprocess.Popen] = []
    try:
        procs = _start_ranks(cfg, spec, world_size=world_size, job_dir=job_dir)
        outcome = _supervise(cfg, procs, store, status, job_dir=job_dir, payload_path=payload_path, tic=tic)
    except OSError as err:
        outcome = JobOutcome("failed", f"launch: {err}")
    finally:
        _stop(procs)
        clear_leftovers(job_dir)
        if status is not None:
            status.job_finished(outcome.status, outcome.error)
    return outcome


def _interrupted(signum: int, tic: float, world_size: int) -> JobOutcome:
    return JobOutcome(
        "interrupted",
        f"interrupted by {signal.Signals(signum).name} after "
        f"{time.monotonic() - tic:.1f}s; its {world_size} ranks were stopped",
    )


def _dump_stacks(procs: list[Any], wait_s: float = 2.0) -> list[int]:
    """Have each rank still running write every thread's stack to its log (``rank.STACK_SIGNAL``,
    faulthandler: it answers from inside a hung C call too); the indices of those asked."""
    from sweepbench.launch.rank import STACK_SIGNAL

    asked = []
    for i, proc in enumerate(procs):
        if proc.poll() is None:
            try:
                os.kill(proc.pid, STACK_SIGNAL)
                asked.append(i)
            except ProcessLookupError:
                pass
    if asked:
        time.sleep(wait_s)
    return asked


def _supervise(
    cfg: DictConfig,
    procs: list[subprocess.Popen],
    store: Any,
    status: Any,
    *,
    job_dir: Path,
    payload_path: Path,
    tic: float,
) -> JobOutcome:
    ends = _Ends()
    try:
        return _watch(cfg, procs, store, status, ends, job_dir=job_dir, payload_path=payload_path, tic=tic)
    finally:
        ends.close()


def _watch(
    cfg: DictConfig,
    procs: list[subprocess.Popen],
    store: Any,
    status: Any,
    ends: _Ends,
    *,
    job_dir: Path,
    payload_path: Path,
    tic: float,
) -> JobOutcome:
    from sweepbench.launch import interrupt

    world_size = len(procs)
    deadline = tic + cfg.launch.timeout_s
    while True:
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes):
            time.sleep(POLL_S)  # let a raising rank's peers settle, so the cause is told apart from echoes
            signum = interrupt.requested()
            if signum is not None:  # the stop's signal reached the ranks too (sent to every process)
                return _interrupted(signum, tic, world_size)
            return JobOutcome("failed", _failure(procs, [p.poll() for p in procs], job_dir))
        if all(c == 0 for c in codes):
            break
        signum = interrupt.requested()
        if signum is not None:
            return _interrupted(signum, tic, world_size)
        if time.monotonic() > deadline:
            stuck = _dump_stacks(procs)
            return JobOutcome(
                "timeout",
                f"job exceeded launch.timeout_s={cfg.launch.timeout_s:g}s; all {world_size} ranks were killed"
                + ("; where each rank was is at the end of its log (logs/rank<N>.log)" if stuck else ""),
            )
        _show_progress(store, status)
        if status is not None:
            status.tick()
        ends.wait(procs, POLL_S)  # the poll's interval, or less: until a rank ends
    payload = read_json(payload_path)
    if not isinstance(payload, dict):
        return JobOutcome("failed", "rank 0 finished without reporting a result")
    return JobOutcome("ok", payload=payload)
