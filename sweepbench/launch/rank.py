"""What every rank runs: join the process group, run the benchmark, report from rank 0.

``python -m sweepbench.launch.rank`` is the entry of a rank the local launcher starts (its
interpreter is ``launch.python``), ``main(forked=True)`` of one it forks from its warm interpreter
(``preload``); SLURM tasks call ``run_rank`` directly. torch is imported
inside the functions: the driver imports this module's helpers without paying for it."""

from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from sweepbench.core import rank_timeout
from sweepbench.launch.rank_errors import note_rank_error

if TYPE_CHECKING:  # sweepbench.measure imports torch
    import torch
    import torch.distributed as dist

    from sweepbench.measure.progress import Sink

PR_SET_PDEATHSIG = 1
WATCHDOG_S = 1.0
_watched: set[int] = set()  # the driver pids this process's watchdog already watches
# when a kept rank (preload, launch.keep_ranks) took its current job (time.monotonic()); None in a
# rank whose process started for its job
JOB_TAKEN: float | None = None


STACK_SIGNAL = signal.SIGUSR1  # a rank writes every thread's stack to its log (faulthandler)


def redirect_output(log_path: Path) -> None:
    """Send this process's stdout and stderr (file descriptors too) to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def die_with_parent(parent_pid: int, *, forked: bool = False) -> None:
    """SIGKILL this rank when the process that started it dies, however it dies (SIGKILL
    included): the kernel's PR_SET_PDEATHSIG, and a watchdog thread on the parent's pid for
    where that does not hold (the parent gone before prctl ran, a reparenting subreaper). A rank
    ``forked`` by the driver's fork server (``preload``) has the server as its parent, which exits
    with the driver: the kernel kills the rank then, and the watchdog watches the driver's pid."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the watchdog alone
        pass
    parent = os.getppid() if forked else parent_pid

    def alive() -> bool:
        if os.getppid() != parent:
            return False
        try:
            os.kill(parent_pid, 0)  # the driver itself (the same as the parent unless forked)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    if not alive():
        os._exit(1)
    if parent_pid in _watched:  # a kept rank's next job: the same driver, already watched
        return
    _watched.add(parent_pid)

    def watch() -> None:
        while True:
            time.sleep(WATCHDOG_S)
            if not alive():
                os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="sweepbench-parent-watchdog", daemon=True).start()


def process_age_s() -> float | None:
    """Seconds since this process started (Linux's /proc; None elsewhere): the interpreter's
    start and the imports before a rank's work, which no timer inside the process sees begin. In a
    kept rank, the seconds since it took its current job."""
    if JOB_TAKEN is not None:
        return time.monotonic() - JOB_TAKEN
    try:
        stat = Path("/proc/self/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime, after pid and (comm)
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def rank_device(backend: str, local_rank: int) -> "torch.device":
    import torch

    from sweepbench.config.validate import GPU_BACKENDS

    if backend in GPU_BACKENDS:
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def run_rank(
    cfg: DictConfig,
    *,
    rank: int,
    world_size: int,
    local_rank: int,
    ranks_per_node: int,
    store: "dist.Store | None" = None,
    progress_sink: "Sink | None" = None,
    job_dir: Path | None = None,
) -> dict[str, Any] | None:
    """Run the benchmark on this rank; rank 0 returns the job's payload, other ranks None.

    With ``store`` None the process group rendezvous through MASTER_ADDR/MASTER_PORT (SLURM)."""
    import torch
    import torch.distributed as dist

    from sweepbench.benchmarks.registry import get_benchmark
    from sweepbench.core import RankContext
    from sweepbench.config.validate import resolve_backend
    from sweepbench.launch.faults import maybe_inject_fault
    from sweepbench.measure import gpu_state, progress
    from sweepbench.measure.memory import memory_peaks, reset_peaks

    started_s = process_age_s()
    tic = time.monotonic()
    backend = resolve_backend(cfg.backend.name)
    device = rank_device(backend, local_rank)
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // ranks_per_node))
    pg_backend = "nccl" if backend == "nvshmem" else backend  # nvshmem rides on an NCCL group
    dist.init_process_group(
        pg_backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=rank_timeout(cfg),
        device_id=device if device.type == "cuda" else None,
    )
    group_up = time.monotonic()
    print(f"rank {rank}/{world_size}: process group up ({pg_backend} on {device}) in {group_up - tic:.1f}s", flush=True)
    # No try/finally around the group: a rank that fails leaves its group to its own exit. Destroying
    # it first would close the peers' connections before this rank has reported its error, and a
    # peer's "connection closed" could then be reported as the job's failure instead of the cause.
    ctx = RankContext(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        device=device,
        backend=backend,
        cfg=cfg,
        job_dir=job_dir,
    )
    progress.install(rank=rank, sink=progress_sink)
    maybe_inject_fault(cfg, rank)
    reset_peaks(device)
    gpu_state.begin(device)  # read while the benchmark's timing loops time
    result = get_benchmark(cfg.benchmark.name)(ctx).run()
    ran = time.monotonic()
    per_rank: list[Any] = [None] * world_size
    dist.all_gather_object(per_rank, (memory_peaks(device), gpu_state.finish()))
    memory, states = [m for m, _ in per_rank], [g for _, g in per_rank]
    dist.barrier()
    dist.destroy_process_group()
    print(
        f"rank {rank}: {cfg.benchmark.name} done in {time.monotonic() - tic:.1f}s "
        f"({progress.cases_done() if rank == 0 else '-'} cases reported), verified={result.verified}",
        flush=True,
    )
    if rank != 0:
        return None
    # where rank 0's part of the job's wall time went (recorder.WALL_PHASES)
    phases = {
        "start": started_s,
        "process_group": group_up - tic,
        "benchmark": ran - group_up,
        "teardown": time.monotonic() - ran,
    }
    return {
        "result": asdict(result),
        "memory_per_rank": memory,
        # how each rank's GPU ran while the benchmark timed, and results.csv's columns of it
        "gpu_state": {**gpu_state.columns(states), "per_rank": states},
        "backend": backend,
        "device": str(device.type),
        "phases_s": {k: v for k, v in phases.items() if v is not None},
    }


def _store_sink(store: "dist.Store", key: str) -> "Sink":
    def sink(done: int, total: int | None, label: str) -> None:
        store.set(key, f"{done}|{total or 0}|{label}")

    return sink


def main(*, forked: bool = False, kept: bool = False) -> None:
    """Entry of a rank started (or ``forked``, ``preload``; or run in a rank ``kept`` from an
    earlier job, ``launch.keep_ranks``) by the local launcher: its spec (config, rendezvous, files)
    is in the environment; its output already goes to its log."""
    spec = json.loads(os.environ.pop("SWEEPBENCH_RANK_SPEC"))
    die_with_parent(spec["parent_pid"], forked=forked)
    rank, world_size, job_dir = spec["rank"], spec["world_size"], Path(spec["job_dir"])
    print(
        f"===== {time.strftime('%Y-%m-%dT%H:%M:%S')} rank {rank} of {world_size} on {socket.gethostname()}, "
        f"pid {os.getpid()}, python {sys.version.split()[0]} ({sys.executable}) =====",
        flush=True,
    )
    # where every thread of this rank is, written to its log on STACK_SIGNAL (the launcher sends it to
    # a job's ranks when the job outlives launch.timeout_s, before killing them)
    faulthandler.register(STACK_SIGNAL, all_threads=True)
    try:
        import torch.distributed as dist

        from sweepbench.record.atomic import write_json_atomic
        from sweepbench.record.env import capture_env

        cfg = OmegaConf.create(spec["cfg"])
        store = dist.TCPStore(spec["master_addr"], spec["port"], is_master=False, timeout=rank_timeout(cfg))
        sink = _store_sink(store, spec["progress_key"]) if rank == 0 else None
        payload = run_rank(
            cfg,
            rank=rank,
            world_size=world_size,
            local_rank=rank,
            ranks_per_node=world_size,
            store=store,
            progress_sink=sink,
            job_dir=job_dir,
        )
        if payload is not None:
            payload["env"] = capture_env()  # the versions the ranks ran with, not the driver's
            payload["rank_start"] = "kept" if kept else "forked" if forked else "fresh"
            write_json_atomic(spec["payload"], payload)
    except Exception as err:
        note_rank_error(job_dir, rank, err)
        sys.exit(1)


if __name__ == "__main__":
    main()
