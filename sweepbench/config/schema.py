"""Dataclass schemas of every config group, stored in Hydra's ConfigStore.

Each YAML under ``conf/<group>/`` extends one of these (``defaults: [base_<group>]``), so a typo
or a wrong type fails when the config is composed, before any rank starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING


@dataclass
class ModelConfig:
    """A transformer shape; weights are random-initialised from it (no hub downloads)."""

    name: str = MISSING
    num_layers: int = MISSING
    hidden_size: int = MISSING
    num_heads: int = MISSING  # query heads
    num_kv_heads: int = MISSING  # key/value heads (GQA when < num_heads)
    ffn_hidden_size: int = MISSING  # per expert for MoE shapes
    vocab_size: int = MISSING
    dtype: str = "bfloat16"  # float32 | bfloat16 | float16
    num_experts: int = 0  # 0 = dense MLP
    moe_top_k: int = 0  # experts routed per token (MoE only)
    seq_len: int = 2048  # tokens per sequence, for benchmarks that run the model


@dataclass
class ParallelismConfig:
    """Parallel degrees. world_size = tp * pp * cp * dp * ep (ep: experts split over ep ranks,
    dense weights replicated across them)."""

    name: str = MISSING
    tp: int = 1  # tensor parallel
    pp: int = 1  # pipeline parallel (contiguous layer stages)
    ep: int = 1  # expert parallel
    dp: int = 1  # data parallel
    cp: int = 1  # context parallel (sequence split)


@dataclass
class BackendConfig:
    """Communication backend; ``auto`` picks nccl where a GPU is visible and gloo otherwise."""

    name: str = MISSING  # auto | gloo | nccl | nvshmem


@dataclass
class ModeConfig:
    """Placement of the benchmark's ranks; the refit benchmark gives it its meaning."""

    name: str = MISSING  # collocated | non_collocated


@dataclass
class BenchmarkConfig:
    """Fields every benchmark has; each benchmark's schema extends this one."""

    name: str = MISSING  # registry key, e.g. "collective"
    warmup: int = 2  # untimed iterations before timing
    iters: int = 10  # timed iterations: the ranking's test needs at least 7 a side to reach p < 0.002


@dataclass
class WandbConfig:
    mode: str = "offline"  # offline | online | disabled (WANDB_MODE in the environment wins)
    project: str = "sweepbench"
    entity: str | None = None
    tags: list[str] = field(default_factory=list)
    init_timeout_s: float = 30.0


@dataclass
class LaunchConfig:
    """How a job's ranks are started. Output-only: not part of the sweep tag."""

    timeout_s: float = 900.0  # wall-clock bound for a whole job (all its ranks)
    ranks_per_node: int = 0  # 0 = all ranks on one node (or gpus_per_node of them on SLURM)
    gpus_per_node: int = 0  # GPUs a SLURM job asks for per node, one per rank; 0 = none (CPU/gloo)
    master_addr: str = "127.0.0.1"
    # local jobs: refuse more ranks than this on one machine (0 = 4 per CPU core, at least 16)
    max_local_ranks: int = 0
    # local jobs: skip the check of the benchmark's memory estimate against the host's/GPU's memory
    skip_memory_check: bool = False
    # the interpreter that runs the ranks (a venv's bin/python, to sweep software environments);
    # "" = the driver's own. Part of the tag when set, since it changes what is measured.
    python: str = ""
    # local jobs: fork the ranks from a warm interpreter that imported torch once for the sweep
    # (launch/preload.py) instead of starting a fresh one per rank; false = always start fresh
    preload: bool = True
    # keep each rank's process after its job ends ok and run the next job's rank of the same index
    # in it (launch/preload.py), so that CUDA, cuDNN, Triton and NCCL's first-use costs are paid once
    # per sweep instead of once per job. null (default): kept for ranks on GPUs of a benchmark whose
    # numbers were measured the same kept or fresh (attention, train), where the sweep allows it
    # (the driver's interpreter, sweep.repeats 1); true: always (refused where not allowed); false: never
    keep_ranks: Optional[bool] = None


@dataclass
class SweepConfig:
    """Sweep-level switches. Output-only: not part of the sweep tag."""

    dry_run: bool = False  # list each job's tag, world size and options; start no rank
    force: bool = False  # rerun jobs whose metrics.json already says ok
    # run each job this many times, each a fresh launch of its ranks, interleaved with the other
    # jobs (round 1 of every job, then round 2, ...): <tag>/rounds/<r>/, combined in <tag>/metrics.json
    repeats: int = 1
    # jobs that do not fit where they would run (this machine's GPUs, cores and memory; a cluster's
    # request): skip = run the others, record these as skipped and exit 3; refuse = run nothing (exit 2)
    on_unfit: str = "skip"
    # SLURM sweeps: one allocation runs up to this many of the sweep's jobs of the same request, one
    # after the other, each in its own processes (its time limit: the per-job limit x the group's size);
    # 1 = an allocation per job
    jobs_per_allocation: int = 1
    # Tag format: str.format fields are the group option names (benchmark, model, parallelism,
    # backend, mode), detail (the benchmark's own tag fields, e.g. "-tp1-send_recv"), world_size
    # and hash (short hash of the resolved job config).
    tag_format: str = "{benchmark}{detail}_{model}_{parallelism}_{backend}_{mode}_ws{world_size}_{hash}"
    tag_max_len: int = 120


@dataclass
class StoreConfig:
    """The store of baselines (attention's T1 and reference), kept beyond the sweep per key, device,
    driver and software (sweepbench/measure/store.py). Output-only: not part of the sweep tag."""

    dir: str | None = None  # null: $SWEEPBENCH_STORE_DIR, else $XDG_CACHE_HOME/sweepbench/store; "": none
    enabled: bool = True  # false: measure every baseline in every job, keep nothing
    refresh: bool = False  # measure afresh and replace (once per sweep run; its later jobs reuse that)
    max_mb: float = 16384.0  # size cap in MiB: the oldest entries beyond it are removed


@dataclass
class FaultConfig:
    """Fault injection, off by default: check failure handling end to end."""

    kind: str = "none"  # none | raise | exit | kill | segfault | hang | hang_until_requeued | slow
    rank: int = 0  # which rank misbehaves
    factor: float = 1.0  # kind=slow: each timed iteration of that rank takes factor x as long


@dataclass
class SweepbenchConfig:
    benchmark: Any = MISSING
    model: ModelConfig = MISSING
    parallelism: ParallelismConfig = MISSING
    backend: BackendConfig = MISSING
    mode: ModeConfig = MISSING
    wandb: WandbConfig = field(default_factory=WandbConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    store: StoreConfig = field(default_factory=StoreConfig)


# Top-level keys that only steer output and launching; they never change what is measured,
# so they are left out of the sweep tag's hash.
OUTPUT_ONLY_KEYS: frozenset[str] = frozenset({"hydra", "wandb", "launch", "sweep", "store"})
