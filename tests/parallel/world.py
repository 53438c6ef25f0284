"""A persistent group of spawned processes joined in a gloo process group.

Starting processes that import torch is the expensive part on a small machine, so
one :class:`World` is started per test session and runs many jobs: ``run(fn, *args)``
calls ``fn(rank, world_size, *args)`` on every rank (``fn`` must be a module-level
function) and returns the per-rank results, re-raising any rank's exception.
"""

from __future__ import annotations

import datetime
import os
import queue
import socket
import traceback
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

JOB_TIMEOUT_S = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world_size: int, port: int, jobs: Any, results: Any) -> None:
    import torch
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
        timeout=datetime.timedelta(seconds=60),
    )
    results.put((rank, True, "ready"))
    while True:
        job = jobs.get()
        if job is None:
            break
        fn, args = job
        try:
            results.put((rank, True, fn(rank, world_size, *args)))
        except BaseException:  # noqa: BLE001 - reported to the parent
            results.put((rank, False, traceback.format_exc()))
    dist.destroy_process_group()


class WorldError(AssertionError):
    pass


class World:
    def __init__(self, size: int) -> None:
        self.size = size
        ctx = mp.get_context("spawn")
        self._jobs = [ctx.Queue() for _ in range(size)]
        self._results = ctx.Queue()
        port = _free_port()
        self._procs = [
            ctx.Process(target=_worker, args=(r, size, port, self._jobs[r], self._results), daemon=True)
            for r in range(size)
        ]
        for p in self._procs:
            p.start()
        self._collect(timeout=JOB_TIMEOUT_S)
        self.broken = False

    def _collect(self, timeout: float) -> list[Any]:
        out: dict[int, tuple[bool, Any]] = {}
        try:
            while len(out) < self.size:
                rank, ok, value = self._results.get(timeout=timeout)
                out[rank] = (ok, value)
                if not ok:  # the others may be stuck in a collective: give them a moment
                    timeout = min(timeout, 15.0)
        except queue.Empty:
            self.broken = True
            missing = sorted(set(range(self.size)) - set(out))
            errors = "\n".join(v for ok, v in out.values() if not ok)
            raise WorldError(f"ranks {missing} did not answer in time\n{errors}") from None
        failed = {r: v for r, (ok, v) in sorted(out.items()) if not ok}
        if failed:
            first = next(iter(failed))
            raise WorldError(f"ranks {sorted(failed)} failed; rank {first}:\n{failed[first]}")
        return [out[r][1] for r in range(self.size)]

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = JOB_TIMEOUT_S) -> list[Any]:
        if self.broken:
            raise WorldError("world is broken by an earlier failure")
        for q in self._jobs:
            q.put((fn, args))
        try:
            return self._collect(timeout)
        except WorldError:
            self.broken = True
            raise

    def close(self) -> None:
        for q, p in zip(self._jobs, self._procs):
            if p.is_alive():
                q.put(None)
        for p in self._procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)


class Worlds:
    """Session-wide worlds by size: each started on first use, and started again when an earlier
    test broke it (the ``worlds`` fixture of tests/conftest.py holds one for the session)."""

    def __init__(self) -> None:
        self._by_size: dict[int, World] = {}

    def get(self, size: int) -> World:
        w = self._by_size.get(size)
        if w is None or w.broken:
            if w is not None:
                w.close()
            w = self._by_size[size] = World(size)
        return w

    def close(self) -> None:
        for w in self._by_size.values():
            w.close()
