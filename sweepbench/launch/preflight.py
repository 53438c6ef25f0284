"""The checks a job passes before any rank starts: the knobs (``config.validate``), the fault
and wandb settings, the benchmark's own checks and world size, and (for a local job) whether this
machine can hold its ranks. Each raises ``ValueError`` with one line naming the bad value and what
would be valid."""

from __future__ import annotations

import copy
import os
import sys
from typing import Callable

from omegaconf import DictConfig, read_write

from sweepbench.config.validate import CHECKS as KNOB_CHECKS
from sweepbench.config.validate import GPU_BACKENDS, check_backend, visible_gpu_memory, visible_gpus
from sweepbench.core import NotOnThisMachine
from sweepbench.launch.faults import FAULTS, check_fault_factor
from sweepbench.record.wandb_run import check_wandb_names

FAULT_KINDS = ("none", *FAULTS)


def _check_fault_kind(cfg: DictConfig) -> None:
    if cfg.fault.kind not in FAULT_KINDS:
        raise ValueError(f"fault.kind={cfg.fault.kind!r} is not valid; choose one of {', '.join(FAULT_KINDS)}")


def _check_keep_ranks(cfg: DictConfig) -> None:
    if not cfg.launch.keep_ranks:
        return
    if cfg.sweep.repeats > 1:
        raise ValueError(
            f"launch.keep_ranks=true with sweep.repeats={cfg.sweep.repeats}: rounds must run in "
            f"independent processes, and kept ranks run every job in the same ones; drop one of them"
        )
    if not cfg.launch.preload:
        raise ValueError(
            "launch.keep_ranks=true with launch.preload=false: only forked ranks are kept; "
            "set launch.preload=true or launch.keep_ranks=false"
        )
    python = str(cfg.launch.python or "")
    if python and os.path.abspath(python) != os.path.abspath(sys.executable):
        raise ValueError(
            f"launch.keep_ranks=true with launch.python={python}: only ranks forked from the "
            f"driver's own interpreter ({sys.executable}) are kept; drop one of them"
        )


CHECKS: tuple[Callable[[DictConfig], None], ...] = (
    *KNOB_CHECKS,
    _check_fault_kind,
    check_fault_factor,
    check_wandb_names,
    _check_keep_ranks,
)


def _check_ranks(cfg: DictConfig, world_size: int) -> None:
    per_node = cfg.launch.ranks_per_node or world_size
    if world_size % per_node:
        raise ValueError(f"launch.ranks_per_node={per_node} does not divide world_size={world_size}")
    if not 0 <= cfg.fault.rank < world_size:
        raise ValueError(f"fault.rank={cfg.fault.rank} is outside 0..{world_size - 1}")


def _check_gpus(cfg: DictConfig, world_size: int) -> None:
    gpus = visible_gpus()
    per_node = cfg.launch.ranks_per_node or world_size
    if cfg.backend.name in GPU_BACKENDS and per_node > gpus:
        raise ValueError(
            f"{per_node} ranks per node need {per_node} GPUs, but {gpus} are visible "
            f"(world_size={world_size}); use a layout of at most {gpus} ranks per node"
        )


def job_backend(cfg: DictConfig, world_size: int) -> str:
    """The backend a job whose ranks start on this machine runs with: ``backend=auto`` is NCCL
    where this machine has a GPU for each of the job's ranks per node, else gloo on the CPU; a
    backend named in the config is kept (and refused where the machine lacks its GPUs)."""
    if cfg.backend.name != "auto":
        return str(cfg.backend.name)
    gpus = visible_gpus()
    return "nccl" if gpus and (cfg.launch.ranks_per_node or world_size) <= gpus else "gloo"


def on_backend(cfg: DictConfig, backend: str) -> DictConfig:
    """A copy of ``cfg`` naming ``backend`` (what the job's ranks are given)."""
    if cfg.backend.name == backend:
        return cfg
    pinned = copy.deepcopy(cfg)
    with read_write(pinned):
        pinned.backend.name = backend
    return pinned


def cpu_fallback_note(cfg: DictConfig, world_size: int) -> str:
    """One line where ``backend=auto`` runs on the CPU although this machine has GPUs ("" else)."""
    gpus = visible_gpus()
    if cfg.backend.name != "auto" or not gpus or job_backend(cfg, world_size) != "gloo":
        return ""
    per_node = cfg.launch.ranks_per_node or world_size
    return (
        f"backend=auto: {per_node} ranks per node, {gpus} GPU{'s' if gpus > 1 else ''} visible: running on "
        f"the CPU with gloo (backend=nccl requires a GPU per rank and refuses such a job)"
    )


def validate_config(cfg: DictConfig, *, plan: bool = False) -> int:
    """The checks that hold on any machine; returns the job's world size. ``plan``: a sweep being
    planned lets a ``NotOnThisMachine`` of a ``backend=auto`` job through (its device type is this
    machine's guess: ``fit_note`` reports it, and a real run refuses with it)."""
    from sweepbench.benchmarks.registry import get_benchmark

    bench = get_benchmark(cfg.benchmark.name)
    for check in CHECKS:
        check(cfg)
    try:
        bench.validate(cfg)
    except NotOnThisMachine:
        if not plan or cfg.backend.name != "auto":
            raise
    world_size = bench.world_size(cfg)
    _check_ranks(cfg, world_size)
    return world_size


def check_machine(cfg: DictConfig, world_size: int) -> None:
    """Does this machine have the GPUs the job's backend and ranks per node need? (``cfg`` names
    the backend the job runs with: ``job_backend``.)"""
    check_backend(cfg)
    _check_gpus(cfg, world_size)


def validate(cfg: DictConfig, *, here: bool = True) -> int:
    """Validate a resolved job config; returns its world size. ``here``: the job's ranks run on
    this machine (a local job, or this process is a SLURM task of it), so its GPUs are checked
    too; a job submitted to a cluster is checked against its request instead (``cluster_note``)."""
    from sweepbench.benchmarks.registry import get_benchmark

    world_size = validate_config(cfg, plan=True)
    if here:
        ranks = on_backend(cfg, job_backend(cfg, world_size))
        get_benchmark(cfg.benchmark.name).validate(ranks)  # its checks of the device the job gets
        check_machine(ranks, world_size)
    return world_size


def cluster_note(cfg: DictConfig, gpus_per_node: int) -> str:
    """Why a job for a cluster whose request gives ``gpus_per_node`` GPUs per node could not run
    there ("" when it could): a GPU backend with no GPU requested. (Its placement is checked where
    its request is computed: ``slurm.request.job_request``.)"""
    if cfg.backend.name in GPU_BACKENDS and not gpus_per_node:
        return (
            f"backend={cfg.backend.name} needs GPUs, but the launcher asks for none; set "
            f"hydra.launcher.gpus_per_node (the cluster preset's) or launch.gpus_per_node"
        )
    return ""


def fit_note(cfg: DictConfig, world_size: int, *, local: bool, gpus_per_node: int = 0) -> str:
    """Why the job (already through ``validate_config``) would not run ("" when it would). A job
    whose ranks start on this machine (``local``): the benchmark's device checks
    (``NotOnThisMachine``), GPUs missing for its backend, too many ranks or too little memory. A
    job submitted to a cluster is judged by its request (``gpus_per_node``), never by this
    machine's GPUs. A dry run records it per job; a real run skips (or refuses) such jobs."""
    from sweepbench.benchmarks.registry import get_benchmark

    if not local:
        return cluster_note(cfg, gpus_per_node)
    ranks = on_backend(cfg, job_backend(cfg, world_size))
    try:
        if ranks is not cfg:  # backend=auto, resolved: validate_config let its device checks through
            get_benchmark(cfg.benchmark.name).validate(ranks)  # its checks of the device this machine gives
        check_machine(ranks, world_size)
        check_local_fit(ranks, world_size)
    except ValueError as err:
        return str(err)
    return ""


# ---------------------------------------------------------------- jobs whose ranks start on this machine

RANKS_PER_CORE = 4
MIN_LOCAL_RANKS = 16
GiB = 1 << 30


def max_local_ranks(cfg: DictConfig) -> int:
    return cfg.launch.max_local_ranks or max(MIN_LOCAL_RANKS, RANKS_PER_CORE * (os.cpu_count() or 1))


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_local_fit(cfg: DictConfig, world_size: int) -> None:
    """A local job (all ranks on this machine): refuse far more ranks than the machine has cores
    (``launch.max_local_ranks`` to allow them), and more memory than it has: the benchmark's
    per-rank estimate against each GPU's memory (NVML), or on the CPU against the host's RAM
    shared by the job's ranks (``launch.skip_memory_check=true`` to run it anyway)."""
    from sweepbench.benchmarks.registry import get_benchmark

    limit = max_local_ranks(cfg)
    if world_size > limit:
        raise ValueError(
            f"world_size={world_size} is far beyond this machine's {os.cpu_count()} CPU cores "
            f"(at most {limit} local ranks); set launch.max_local_ranks={world_size} to run it anyway"
        )
    if cfg.launch.skip_memory_check:
        return
    need = int(get_benchmark(cfg.benchmark.name).memory_bytes(cfg, world_size) or 0)
    if need <= 0:
        return
    force = "set launch.skip_memory_check=true to run it anyway"
    if cfg.backend.name in GPU_BACKENDS:
        have = min(visible_gpu_memory(), default=0)
        if need > have:
            raise ValueError(
                f"{cfg.benchmark.name} needs about {need / GiB:.1f} GiB per rank, more than a GPU's "
                f"{have / GiB:.1f} GiB; use a smaller model or more ranks, or {force}"
            )
        return
    have = host_memory_bytes()
    if need * world_size > have:
        raise ValueError(
            f"{cfg.benchmark.name} needs about {need / GiB:.1f} GiB per rank x {world_size} ranks "
            f"= {need * world_size / GiB:.1f} GiB, more than this machine's {have / GiB:.1f} GiB "
            f"of RAM; use a smaller model (model=tiny) or {force}"
        )
