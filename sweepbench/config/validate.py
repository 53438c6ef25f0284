"""Cross-field validation, in one place, before any rank starts.

Each check raises ``ValueError`` with one line naming the bad value and what would be valid."""

from __future__ import annotations

import functools
import math
import os
from typing import Callable

from omegaconf import DictConfig

from sweepbench.launch.faults import FAULTS, check_fault_factor
from sweepbench.record.wandb_run import check_wandb_names

BACKENDS = ("auto", "gloo", "nccl", "nvshmem")
GPU_BACKENDS = ("nccl", "nvshmem")
MODES = ("collocated", "non_collocated")
DTYPES = ("float32", "bfloat16", "float16")
FAULT_KINDS = ("none", *FAULTS)


@functools.lru_cache(maxsize=1)
def _nvml_gpus() -> tuple[int, ...]:
    """Total memory (bytes) of each GPU NVML sees; () without NVML (a CPU machine). NVML, not
    torch: the driver's path (typos, --help, dry runs) must not pay for importing torch."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return ()
    try:
        count = pynvml.nvmlDeviceGetCount()
        return tuple(int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total)
                     for i in range(count))
    except Exception:
        return ()
    finally:
        pynvml.nvmlShutdown()


def visible_gpu_memory() -> list[int]:
    """Total memory of each GPU this process may use, honouring CUDA_VISIBLE_DEVICES as CUDA
    does (indices or UUIDs; the list stops at the first invalid entry; empty hides all)."""
    gpus = _nvml_gpus()
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask is None:
        return list(gpus)
    visible: list[int] = []
    for entry in (e.strip() for e in mask.split(",")):
        if entry.isdigit() and int(entry) < len(gpus):
            visible.append(gpus[int(entry)])
        elif entry.startswith(("GPU-", "MIG-")) and len(visible) < len(gpus):
            visible.append(min(gpus))
        else:
            break
    return visible


def visible_gpus() -> int:
    return len(visible_gpu_memory())


def resolve_backend(name: str) -> str:
    """``auto`` -> nccl where a GPU is visible, gloo otherwise."""
    if name == "auto":
        return "nccl" if visible_gpus() > 0 else "gloo"
    return name


def device_type(cfg: DictConfig) -> str:
    """Where the job's ranks will compute: ``cuda`` for a GPU backend (after ``auto``), else ``cpu``."""
    return "cuda" if resolve_backend(cfg.backend.name) in GPU_BACKENDS else "cpu"


def _check_positive(cfg: DictConfig) -> None:
    groups = {
        "parallelism": ("tp", "pp", "ep", "dp", "cp"),
        "model": ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size",
                  "vocab_size", "seq_len"),
        "benchmark": ("iters",),
    }
    for group, keys in groups.items():
        for key in keys:
            value = cfg[group][key]
            if value <= 0:
                raise ValueError(f"{group}.{key}={value} must be a positive integer")
    if cfg.benchmark.warmup < 0:
        raise ValueError(f"benchmark.warmup={cfg.benchmark.warmup} must be >= 0")
    if not math.isfinite(cfg.launch.timeout_s) or cfg.launch.timeout_s <= 0:
        raise ValueError(f"launch.timeout_s={cfg.launch.timeout_s} must be a finite number of seconds > 0")


def _check_choices(cfg: DictConfig) -> None:
    choices = {
        "backend.name": (cfg.backend.name, BACKENDS),
        "mode.name": (cfg.mode.name, MODES),
        "model.dtype": (cfg.model.dtype, DTYPES),
        "fault.kind": (cfg.fault.kind, FAULT_KINDS),
        "wandb.mode": (cfg.wandb.mode, ("online", "offline", "disabled")),
    }
    for key, (value, valid) in choices.items():
        if value not in valid:
            raise ValueError(f"{key}={value!r} is not valid; choose one of {', '.join(valid)}")


def _check_model(cfg: DictConfig) -> None:
    m = cfg.model
    if m.hidden_size % m.num_heads:
        raise ValueError(f"model.hidden_size={m.hidden_size} is not divisible by model.num_heads={m.num_heads}")
    if m.num_heads % m.num_kv_heads:
        raise ValueError(f"model.num_heads={m.num_heads} is not divisible by model.num_kv_heads={m.num_kv_heads}")
    if m.num_experts < 0 or (m.num_experts > 0 and not 0 < m.moe_top_k <= m.num_experts):
        raise ValueError(f"model.moe_top_k={m.moe_top_k} must be in 1..num_experts={m.num_experts} for an MoE model")


def check_layout(model: DictConfig, par: DictConfig, *, where: str = "parallelism") -> None:
    """Can this model be laid out with these degrees? (Used for every layout a job holds.)"""
    divisible = {
        "num_heads": model.num_heads, "num_kv_heads": model.num_kv_heads,
        "hidden_size": model.hidden_size, "ffn_hidden_size": model.ffn_hidden_size,
        "vocab_size": model.vocab_size,
    }
    for key, value in divisible.items():
        if value % par.tp:
            raise ValueError(f"{where}.tp={par.tp} does not divide model.{key}={value} "
                             f"(valid tp: divisors of {value})")
    if model.num_layers % par.pp:
        raise ValueError(f"{where}.pp={par.pp} does not divide model.num_layers={model.num_layers}")
    if par.ep > 1 and model.num_experts == 0:
        raise ValueError(f"{where}.ep={par.ep} needs an MoE model, but model={model.name} is dense "
                         f"(num_experts=0); use ep=1 or an MoE model (tiny_moe, mixtral_8x7b)")
    if model.num_experts and model.num_experts % par.ep:
        raise ValueError(f"{where}.ep={par.ep} does not divide model.num_experts={model.num_experts}")
    if model.seq_len % par.cp:
        raise ValueError(f"{where}.cp={par.cp} does not divide model.seq_len={model.seq_len}")


def _check_backend(cfg: DictConfig) -> None:
    gpus = visible_gpus()
    if cfg.backend.name in GPU_BACKENDS and gpus == 0:
        raise ValueError(f"backend={cfg.backend.name} needs a GPU, but none is visible; use backend=gloo or auto")


def _check_ranks(cfg: DictConfig, world_size: int) -> None:
    per_node = cfg.launch.ranks_per_node or world_size
    if world_size % per_node:
        raise ValueError(f"launch.ranks_per_node={per_node} does not divide world_size={world_size}")
    if not 0 <= cfg.fault.rank < world_size:
        raise ValueError(f"fault.rank={cfg.fault.rank} is outside 0..{world_size - 1}")


def _check_gpus(cfg: DictConfig, world_size: int) -> None:
    gpus = visible_gpus()
    per_node = cfg.launch.ranks_per_node or world_size
    if resolve_backend(cfg.backend.name) in GPU_BACKENDS and per_node > gpus:
        raise ValueError(f"{per_node} ranks per node need {per_node} GPUs, but {gpus} are visible "
                         f"(world_size={world_size}); use a layout of at most {gpus} ranks per node")


def _check_parallelism(cfg: DictConfig) -> None:
    check_layout(cfg.model, cfg.parallelism)


CHECKS: tuple[Callable[[DictConfig], None], ...] = (
    _check_positive, _check_choices, _check_model, _check_parallelism, check_fault_factor, check_wandb_names,
)


def validate_config(cfg: DictConfig) -> int:
    """The checks that hold on any machine; returns the job's world size."""
    from sweepbench.benchmarks.registry import get_benchmark

    bench = get_benchmark(cfg.benchmark.name)
    for check in CHECKS:
        check(cfg)
    bench.validate(cfg)
    world_size = bench.world_size(cfg)
    _check_ranks(cfg, world_size)
    return world_size


def check_machine(cfg: DictConfig, world_size: int) -> None:
    """Does this machine have the GPUs the job's backend and ranks per node need?"""
    _check_backend(cfg)
    _check_gpus(cfg, world_size)


def validate(cfg: DictConfig) -> int:
    """Validate a resolved job config for a run from this machine; returns its world size."""
    world_size = validate_config(cfg)
    check_machine(cfg, world_size)
    return world_size


def fit_note(cfg: DictConfig, world_size: int, *, local: bool) -> str:
    """Why the job (already through ``validate_config``) would not run from this machine ("" when
    it would): GPUs missing for its backend, and for a local job (ranks on this machine) too many
    ranks or too little memory. A dry run records it per job; a real run refuses with it."""
    try:
        check_machine(cfg, world_size)
        if local:
            check_local_fit(cfg, world_size)
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
        raise ValueError(f"world_size={world_size} is far beyond this machine's {os.cpu_count()} CPU cores "
                         f"(at most {limit} local ranks); set launch.max_local_ranks={world_size} to run it anyway")
    if cfg.launch.skip_memory_check:
        return
    need = int(get_benchmark(cfg.benchmark.name).memory_bytes(cfg, world_size) or 0)
    if need <= 0:
        return
    force = "set launch.skip_memory_check=true to run it anyway"
    if resolve_backend(cfg.backend.name) in GPU_BACKENDS:
        have = min(visible_gpu_memory(), default=0)
        if need > have:
            raise ValueError(f"{cfg.benchmark.name} needs about {need / GiB:.1f} GiB per rank, more than a GPU's "
                             f"{have / GiB:.1f} GiB; use a smaller model or more ranks, or {force}")
        return
    have = host_memory_bytes()
    if need * world_size > have:
        raise ValueError(f"{cfg.benchmark.name} needs about {need / GiB:.1f} GiB per rank x {world_size} ranks "
                         f"= {need * world_size / GiB:.1f} GiB, more than this machine's {have / GiB:.1f} GiB "
                         f"of RAM; use a smaller model (model=tiny) or {force}")
