"""A training job's plan, resolved from its config in plain Python (no torch), and the checks that
refuse what the engine cannot run: one line naming the bad value and what would be valid.

The driver calls :func:`check_plan` before any rank starts; every rank builds the same
:class:`TrainPlan`, so batch sizes, micro-batch counts and precision are decided in one place."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sweepbench.train.shape import Shape

AC_MODES = ("none", "selective", "full")
PRECISIONS = ("auto", "fp32", "bf16", "mixed")  # auto: fp32 for a float32 model, bf16 otherwise
DP_SHARDS = ("fsdp", "ddp")
# pipeline schedule -> stages each pp rank holds (interleaved: two, looped over the ranks)
PP_SCHEDULES = {"gpipe": 1, "1f1b": 1, "interleaved_1f1b": 2}
COMPOSES = ("the train engine composes tp (with sequence parallel), pp (gpipe, 1f1b, interleaved_1f1b), "
            "cp and dp (fsdp with any of them; ddp with dp and cp only)")


@dataclass(frozen=True)
class TrainPlan:
    """Sizes every rank agrees on. A step trains on ``global_batch`` sequences of ``seq_len``
    tokens; each dp rank takes ``local_batch`` of them in ``num_micro`` micro-batches of
    ``micro_batch`` (gradient accumulation, or the pipeline's micro-batches)."""

    tp: int
    pp: int
    dp: int
    cp: int
    seq_len: int
    micro_batch: int
    global_batch: int
    precision: str  # fp32 | bf16 | mixed (auto resolved)
    stages_per_rank: int

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def local_batch(self) -> int:
        return self.global_batch // self.dp

    @property
    def num_micro(self) -> int:
        return self.local_batch // self.micro_batch

    @property
    def num_stages(self) -> int:
        return self.pp * self.stages_per_rank

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len


def resolve_precision(precision: str, model_dtype: str) -> str:
    if precision != "auto":
        return precision
    return "fp32" if model_dtype == "float32" else "bf16"


def build_plan(cfg: Any) -> TrainPlan:
    b, p = cfg.benchmark, cfg.parallelism
    pp = int(p.pp)
    default_batch = int(b.micro_batch) * int(p.dp) * (pp if pp > 1 else 1)
    return TrainPlan(tp=int(p.tp), pp=pp, dp=int(p.dp), cp=int(p.cp), seq_len=int(b.seq_len),
                     micro_batch=int(b.micro_batch), global_batch=int(b.global_batch) or default_batch,
                     precision=resolve_precision(str(b.precision), str(cfg.model.dtype)),
                     stages_per_rank=PP_SCHEDULES.get(str(b.pp_schedule), 1) if pp > 1 else 1)


def _choice(key: str, value: Any, valid: Any) -> None:
    if value not in valid:
        raise ValueError(f"benchmark.{key}={value!r} is not valid; choose one of {', '.join(valid)}")


def _check_options(b: Any) -> None:
    _choice("ac", b.ac, AC_MODES)
    _choice("precision", b.precision, PRECISIONS)
    _choice("dp_shard", b.dp_shard, DP_SHARDS)
    _choice("pp_schedule", b.pp_schedule, tuple(PP_SCHEDULES))
    for key in ("seq_len", "micro_batch", "verify_steps", "profile_active"):
        if int(b[key]) < 1:
            raise ValueError(f"benchmark.{key}={b[key]} must be a positive integer")
    for key in ("global_batch", "lora_rank", "profile_skip", "profile_warmup", "verify_layers"):
        if int(b[key]) < 0:
            raise ValueError(f"benchmark.{key}={b[key]} must be >= 0")
    for key in ("lr", "lora_lr_scale", "lora_alpha"):
        if not b[key] > 0:
            raise ValueError(f"benchmark.{key}={b[key]} must be > 0")


def _check_layout(cfg: Any, plan: TrainPlan) -> None:
    model, b, p = cfg.model, cfg.benchmark, cfg.parallelism
    if p.ep > 1 or model.num_experts:
        raise ValueError(f"benchmark=train does not train expert-parallel or MoE models (parallelism.ep={p.ep}, "
                         f"model={model.name}); use a dense model with ep=1: {COMPOSES}")
    if b.dp_shard == "ddp" and (plan.tp > 1 or plan.pp > 1):
        raise ValueError(f"benchmark.dp_shard=ddp with parallelism={p.name} (tp={plan.tp}, pp={plan.pp}) "
                         f"cannot be composed: {COMPOSES}; use benchmark.dp_shard=fsdp")
    if b.lora_rank and plan.tp > 1:
        raise ValueError(f"benchmark.lora_rank={b.lora_rank} with parallelism.tp={plan.tp} cannot be composed: "
                         f"LoRA adapters train with dp, pp and cp layouts; use tp=1 or lora_rank=0")
    stages = plan.num_stages
    if model.num_layers % stages:
        raise ValueError(f"model.num_layers={model.num_layers} is not divisible into {stages} pipeline stages "
                         f"(pp={plan.pp} x {plan.stages_per_rank} per rank for {b.pp_schedule}); "
                         f"valid pp: divisors of {model.num_layers // plan.stages_per_rank}")


def _check_sizes(cfg: Any, plan: TrainPlan) -> None:
    model, b = cfg.model, cfg.benchmark
    unit = plan.tp * 2 * plan.cp
    if plan.seq_len % unit:
        raise ValueError(f"benchmark.seq_len={plan.seq_len} is not divisible by tp*2*cp={unit} "
                         f"(valid: multiples of {unit})")
    per_step = plan.dp * plan.micro_batch
    if plan.global_batch % per_step:
        raise ValueError(f"benchmark.global_batch={plan.global_batch} is not divisible by dp*micro_batch="
                         f"{plan.dp}*{plan.micro_batch}={per_step} (valid: multiples of {per_step})")
    if plan.pp > 1 and (plan.num_micro < plan.pp or plan.num_micro % plan.pp):
        raise ValueError(f"parallelism.pp={plan.pp} needs a multiple of {plan.pp} micro-batches per step, got "
                         f"global_batch/(dp*micro_batch)={plan.num_micro}; use benchmark.global_batch="
                         f"{plan.pp * per_step} (or a multiple)")
    shape = Shape.of(model)
    smallest = min(shape.hidden_size, shape.kv_dim)
    if b.lora_rank > smallest:
        raise ValueError(f"benchmark.lora_rank={b.lora_rank} is larger than the smallest attention projection "
                         f"of model={model.name} ({smallest}); valid: 0 (full fine-tune) to {smallest}")


def check_plan(cfg: Any) -> TrainPlan:
    """Every check of a train job's config; returns the plan."""
    _check_options(cfg.benchmark)
    plan = build_plan(cfg)
    _check_layout(cfg, plan)
    _check_sizes(cfg, plan)
    return plan
