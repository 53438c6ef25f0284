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
with (variables that torch reads at import would otherwise differ); elsewhere ranks start fresh.

``launch.keep_ranks``: a forked rank whose job ended ok is kept, and runs the next job's rank of
the same index (its log, its environment, ``rank.main`` again), so that what a process pays at its
first CUDA work (the context, cuDNN's first call, 2.5 s on an H100; Triton's kernels; NCCL's set-up)
is paid once per sweep, not once per job: no fork can carry a CUDA context. A rank whose job failed,
timed out or was stopped exits, and the next job forks a new one; the kept ranks leave when the
sweep ends (``release_kept``)."""

from __future__ import annotations

import gc
import importlib.abc
import importlib.machinery
import multiprocessing
import os
import subprocess
import sys
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf

# what a rank imports before its first line of work (rank.run_rank, the benchmark registry and
# every benchmark plugin, the environment capture): imported once, in the fork server, after the
# guard that makes the server die with the driver
PRELOAD = [
    "sweepbench.launch.forkserver_guard",
    "torch",
    "torch.distributed",
    "omegaconf",
    "sweepbench.launch.rank",
    "sweepbench.benchmarks.registry",
    "sweepbench.record.env",
    "sweepbench.record.atomic",
    "sweepbench.launch.preload",
]

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


def keeps(cfg: DictConfig, *, on_gpus: bool | None = None) -> bool:
    """Whether this job's ranks are kept for the sweep's next job: ``launch.keep_ranks`` where set
    (true is refused before any rank where it cannot be), else the benchmark's ``keeps_ranks_for`` for
    ranks on GPUs, where its numbers were measured the same (a kept process's host memory is not a
    fresh one's, so CPU jobs run fresh), and where the sweep allows it: one round a job, the
    driver's own interpreter. ``on_gpus``: a SLURM job's request says; None for a local job, whose
    ranks must also fork from the driver's interpreter and whose backend says."""
    want = cfg.launch.get("keep_ranks")
    if want is not None:
        return bool(want)
    if cfg.sweep.get("repeats", 1) > 1 or str(cfg.launch.python or ""):
        return False
    if on_gpus is None:
        from sweepbench.config.validate import device_type

        on_gpus = usable(cfg) and device_type(cfg) == "cuda"
    if not on_gpus:
        return False
    from sweepbench.benchmarks.registry import get_benchmark

    return get_benchmark(cfg.benchmark.name).keeps_ranks_for(cfg)


class ForkedRank:
    """A forked rank, behind the part of subprocess.Popen's interface the launcher uses."""

    def __init__(self, proc: multiprocessing.process.BaseProcess) -> None:
        self.proc = proc
        self.pid = proc.pid

    def poll(self) -> int | None:
        return self.proc.exitcode

    def waitables(self) -> list[Any]:
        """What becomes ready as the rank's job ends (``multiprocessing.connection.wait``)."""
        return [self.proc.sentinel]

    def kill(self) -> None:
        if self.proc.exitcode is None:
            self.proc.kill()

    def wait(self, timeout: float | None = None) -> int | None:
        self.proc.join(timeout)
        if self.proc.exitcode is None:
            raise subprocess.TimeoutExpired("rank", timeout or 0)
        return self.proc.exitcode


def _server(extra: Sequence[str] = ()) -> Any:
    """The fork server's context, its preload (``PRELOAD``, then ``extra``) and environment set on
    the first call."""
    global _server_env
    ctx = multiprocessing.get_context("forkserver")
    if _server_env is None:
        ctx.set_forkserver_preload([*PRELOAD, *(m for m in extra if m not in PRELOAD)])
        _server_env = _env()
    return ctx


def start_server(cfg: DictConfig, *, extra: Sequence[str] = ()) -> None:
    """Start the fork server now, where this sweep's ranks will fork from it: its imports (torch's
    2-5 s, and ``extra``: the modules the sweep's benchmarks name as their ranks' imports) then
    run while the driver launches the first job, instead of after it. Nothing else changes: a job
    whose environment or interpreter differs still starts its ranks fresh. Not where Hydra sets
    variables for each job (``hydra.job.env_set``, in ``cfg``): the server would lack them and
    every rank would start fresh; it then starts with the first job's ranks."""
    if _server_env is not None or not usable(cfg) or OmegaConf.select(cfg, "hydra.job.env_set"):
        return
    from multiprocessing import forkserver

    _server(extra)
    forkserver.ensure_running()


def start_rank(env: dict[str, str], log: Path, *, index: int = 0, keep: bool = False) -> ForkedRank:
    """Fork one rank from the fork server (started with ``PRELOAD`` on the first call). Its log is
    opened here first, so that a log that cannot be written fails the start (OSError), as it does
    for a started rank, instead of the rank. With ``keep`` (``launch.keep_ranks``) the rank of this
    ``index`` kept from an earlier job runs it, if there is one, and the rank is kept after it."""
    os.close(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
    if keep:
        worker = _kept.pop(index, None)
        if worker is not None:
            try:
                if worker.proc.exitcode is None:
                    worker.conn.send((env, str(log)))
                    return KeptRank(worker, index)
            except OSError:  # it died between jobs: a new one
                worker.proc.kill()
            worker.conn.close()
    ctx = _server()
    if not keep:
        proc = ctx.Process(target=_rank_main, args=(env, str(log)), name="sweepbench-rank", daemon=False)
        proc.start()
        return ForkedRank(proc)
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=_kept_main, args=(theirs, env, str(log)), name="sweepbench-rank", daemon=False)
    proc.start()
    theirs.close()
    return KeptRank(_Worker(proc, ours), index)


@dataclass
class _Worker:
    proc: multiprocessing.process.BaseProcess
    conn: Any  # the driver's end of the pipe: jobs go out, each job's exit code comes back


_kept: dict[int, _Worker] = {}  # idle kept ranks by rank index, waiting for their next job


class KeptRank(ForkedRank):
    """A rank that stays after its job (``launch.keep_ranks``): its job's exit code comes back over
    the pipe; after 0 the process waits for the next job of its index. One that failed exits."""

    def __init__(self, worker: _Worker, index: int) -> None:
        super().__init__(worker.proc)
        self.worker, self.index = worker, index
        self.code: int | None = None

    def poll(self) -> int | None:
        if self.code is None:
            try:
                if self.worker.conn.poll():
                    self.code = int(self.worker.conn.recv())
                    if self.code == 0:
                        _kept[self.index] = self.worker
            except (EOFError, OSError):  # died: its exit code is the job's
                self.proc.join(1.0)
                self.code = self.proc.exitcode if self.proc.exitcode is not None else -9
        return self.code

    def waitables(self) -> list[Any]:
        """Its job's exit code arrives on the pipe; a rank that dies ends its process."""
        return [self.worker.conn, self.proc.sentinel]

    def kill(self) -> None:
        if self.poll() is None:
            self.proc.kill()
            self.proc.join(10.0)
            self.code = self.proc.exitcode

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("rank", timeout or 0)
            time.sleep(0.01)
        return self.code


# torch's compiler configs: a job that compiles imports them (torch._dynamo's import alone costs
# seconds), a job that does not never needs them put back
COMPILER_CONFIGS = ("torch._dynamo.config", "torch._inductor.config", "torch._functorch.config")


class _SnapshotOnImport(importlib.abc.MetaPathFinder):
    """Takes each compiler config module's settings (``save_config``) the moment its import
    completes, before any job's code can change them: what a fresh process would have."""

    def __init__(self, saved: dict[str, Any]) -> None:
        self.saved = saved

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in COMPILER_CONFIGS or name in self.saved:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        inner, saved = spec.loader, self.saved

        class Loader(importlib.abc.Loader):
            def create_module(self, spec: Any) -> Any:
                return inner.create_module(spec)

            def exec_module(self, module: Any) -> None:
                inner.exec_module(module)
                saved[name] = sys.modules.get(name, module).save_config()

        spec.loader = Loader()
        return spec


class _GlobalState:
    """torch's process-wide settings that a job may change and a fresh process starts without: the
    compiler's configs (dynamo, inductor, functorch) and the backends' flags. Taken when a kept
    rank starts (a compiler config module not yet imported: when its import completes, by an
    import hook, so that a rank whose jobs never compile never imports them); ``restore`` puts
    them back between its jobs."""

    def __init__(self) -> None:
        import torch

        self.configs: dict[str, Any] = {
            name: sys.modules[name].save_config() for name in COMPILER_CONFIGS if name in sys.modules
        }
        sys.meta_path.insert(0, _SnapshotOnImport(self.configs))
        self.flags = self._flags()
        self.default_dtype = torch.get_default_dtype()
        self.matmul_precision = torch.get_float32_matmul_precision()
        self.deterministic = torch.are_deterministic_algorithms_enabled()

    @staticmethod
    def _flags() -> dict[tuple[Any, str], Any]:
        import torch

        owners = (torch.backends.cudnn, torch.backends.cuda.matmul)
        return {
            (o, k): getattr(o, k)
            for o in owners
            for k in (
                "benchmark",
                "deterministic",
                "allow_tf32",
                "allow_bf16_reduced_precision_reduction",
                "allow_fp16_reduced_precision_reduction",
            )
            if hasattr(o, k)
        }

    def restore(self) -> None:
        import torch

        with warnings.catch_warnings():  # the saved configs name keys torch has deprecated
            warnings.simplefilter("ignore", FutureWarning)
            for name, saved in self.configs.items():
                sys.modules[name].load_config(saved)
        for (owner, key), value in self.flags.items():
            if getattr(owner, key) != value:
                setattr(owner, key, value)
        torch.set_default_dtype(self.default_dtype)
        torch.set_float32_matmul_precision(self.matmul_precision)
        torch.use_deterministic_algorithms(self.deterministic)


def release_kept() -> None:
    """End the kept ranks (the sweep is over): each leaves when its pipe closes."""
    while _kept:
        _, worker = _kept.popitem()
        worker.conn.close()
        worker.proc.join(10.0)
        if worker.proc.exitcode is None:
            worker.proc.kill()


def _rank_main(env: dict[str, Any], log: str) -> None:
    """In the forked rank: what Popen(start_new_session=True, stdout=stderr=log, env=env) sets up,
    then rank.main. Its exit code is the rank's (sys.exit's; 1 for an uncaught error)."""
    from sweepbench.launch import rank

    os.setsid()
    _take_job(env, log)
    rank.main(forked=True)


def _take_job(env: dict[str, Any], log: str) -> None:
    from sweepbench.launch import rank

    rank.redirect_output(Path(log))
    os.environ.clear()
    os.environ.update(env)


def _kept_main(conn: Any, env: dict[str, Any], log: str) -> None:
    """In a kept rank: run jobs until the driver closes the pipe or a job fails; each job is what
    a forked rank runs (its log, its environment, rank.main), its exit code sent back."""
    import torch

    from sweepbench.launch import rank

    os.setsid()
    kept = False
    fresh = _GlobalState()  # torch's process-wide settings as a fresh process has them
    while True:
        rank.JOB_TAKEN = time.monotonic() if kept else None
        _take_job(env, log)
        try:
            rank.main(forked=True, kept=kept)
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 1
        except BaseException:  # noqa: BLE001  (as an uncaught error ends a forked rank: its traceback, exit 1)
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            conn.send(code)
        except OSError:
            os._exit(code)
        if code != 0:
            os._exit(code)
        gc.collect()
        # this job's compiled code goes (where it compiled): the next compiles its own, as a fresh process would
        if "torch._dynamo" in sys.modules:
            torch._dynamo.reset()
        fresh.restore()  # and no setting a job changed (async TP's inductor switch, cuDNN's flags) carries over
        if torch.cuda.is_initialized():
            # what this job's allocator kept goes back: the next job's peaks are its own. cuBLAS's
            # workspaces (allocator blocks it keeps per handle and stream) go first: one left inside a
            # large segment kept the whole segment reserved, which the next job then reused where
            # NVML, sampling above the job's starting level, could not see it
            torch._C._cuda_clearCublasWorkspaces()
            torch.cuda.empty_cache()
        try:
            env, log = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        kept = True
