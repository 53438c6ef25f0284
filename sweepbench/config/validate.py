"""Cross-field validation of the knobs (the job's own checks, which ask its benchmark, are
``sweepbench.launch.preflight``), and where the job's ranks compute (backend, GPUs visible).

Each check raises ``ValueError`` with one line naming the bad value and what would be valid."""

from __future__ import annotations

import functools
import math
import os
from typing import Callable, Protocol

from omegaconf import DictConfig

BACKENDS = ("auto", "gloo", "nccl", "nvshmem")
GPU_BACKENDS = ("nccl", "nvshmem")
MODES = ("collocated", "non_collocated")
DTYPES = ("float32", "bfloat16", "float16")


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
        return tuple(
            int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).total) for i in range(count)
        )
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
        "model": ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size", "seq_len"),
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
    if cfg.launch.timeout_s > MAX_TIMEOUT_S:  # process groups take it in milliseconds, as a C int
        raise ValueError(
            f"launch.timeout_s={cfg.launch.timeout_s:g} is more than {MAX_TIMEOUT_S} s (a week), "
            f"the longest a job may take; use 1..{MAX_TIMEOUT_S}"
        )


MAX_TIMEOUT_S = 7 * 24 * 3600
MAX_REPEATS = 1000  # rounds of each job; each is a fresh launch of every job of the grid


def check_repeats(repeats: int) -> None:
    """``sweep.repeats``: how many times each job runs, 1..MAX_REPEATS."""
    if repeats < 1:
        raise ValueError(f"sweep.repeats={repeats} must be >= 1 (how many times each job runs)")
    if repeats > MAX_REPEATS:
        raise ValueError(
            f"sweep.repeats={repeats} is more than {MAX_REPEATS} rounds (how many times each job "
            f"runs, each a fresh launch of every job); use 1..{MAX_REPEATS}"
        )


def _check_sweep(cfg: DictConfig) -> None:
    check_repeats(cfg.sweep.repeats)
    per = cfg.sweep.jobs_per_allocation
    if isinstance(per, bool) or not isinstance(per, int) or per < 1:
        raise ValueError(
            f"sweep.jobs_per_allocation={per} must be an integer >= 1 (how many of a SLURM "
            f"sweep's jobs one allocation runs, one after the other; 1 = an allocation per job)"
        )
    max_mb = cfg.store.max_mb
    if not math.isfinite(max_mb) or max_mb <= 0:
        raise ValueError(f"store.max_mb={max_mb} must be a positive number of MiB (the store's size cap)")


def _check_choices(cfg: DictConfig) -> None:
    choices = {
        "backend.name": (cfg.backend.name, BACKENDS),
        "mode.name": (cfg.mode.name, MODES),
        "model.dtype": (cfg.model.dtype, DTYPES),
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


class Degrees(Protocol):
    """A layout's degrees as check_layout reads them (a parallelism node, or a layout string's NamedLayout)."""

    @property
    def tp(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def ep(self) -> int: ...
    @property
    def cp(self) -> int: ...


def check_layout(model: DictConfig, par: DictConfig | Degrees, *, where: str = "parallelism") -> None:
    """Can this model be laid out with these degrees? (Used for every layout a job holds.)"""
    divisible = {
        "num_heads": model.num_heads,
        "num_kv_heads": model.num_kv_heads,
        "hidden_size": model.hidden_size,
        "ffn_hidden_size": model.ffn_hidden_size,
        "vocab_size": model.vocab_size,
    }
    for key, value in divisible.items():
        if value % par.tp:
            raise ValueError(f"{where}.tp={par.tp} does not divide model.{key}={value} (valid tp: divisors of {value})")
    if model.num_layers % par.pp:
        raise ValueError(f"{where}.pp={par.pp} does not divide model.num_layers={model.num_layers}")
    if par.ep > 1 and model.num_experts == 0:
        raise ValueError(
            f"{where}.ep={par.ep} needs an MoE model, but model={model.name} is dense "
            f"(num_experts=0); use ep=1 or an MoE model (tiny_moe, mixtral_8x7b)"
        )
    if model.num_experts and model.num_experts % par.ep:
        raise ValueError(f"{where}.ep={par.ep} does not divide model.num_experts={model.num_experts}")
    if model.seq_len % par.cp:
        raise ValueError(f"{where}.cp={par.cp} does not divide model.seq_len={model.seq_len}")


def check_backend(cfg: DictConfig) -> None:
    """A GPU backend needs a GPU on this machine (a check of the machine, not of the knobs)."""
    gpus = visible_gpus()
    if cfg.backend.name in GPU_BACKENDS and gpus == 0:
        raise ValueError(f"backend={cfg.backend.name} needs a GPU, but none is visible; use backend=gloo or auto")


def _check_parallelism(cfg: DictConfig) -> None:
    check_layout(cfg.model, cfg.parallelism)


CHECKS: tuple[Callable[[DictConfig], None], ...] = (
    _check_positive,
    _check_sweep,
    _check_choices,
    _check_model,
    _check_parallelism,
)
