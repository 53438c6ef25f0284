"""A training job's plan, resolved from its config in plain Python (no torch), and the checks that
refuse what the engine cannot run: one line naming the bad value and what would be valid.

The driver calls :func:`check_plan` before any rank starts; every rank builds the same
:class:`TrainPlan`, so batch sizes, micro-batch counts and precision are decided in one place.
Each reads the job's typed config (``train.config.TrainJob``)."""

from __future__ import annotations

import contextlib
import importlib.util
from dataclasses import dataclass, replace
from typing import Any

from sweepbench.train.config import TrainJob, TrainKnobs
from sweepbench.train.pipeline import schedule_names, schedule_spec
from sweepbench.parallel.specs import ModelShape
from sweepbench.train.shape import bytes_per_param, shape_of

AC_MODES = ("none", "selective", "full")
# auto: fp32 for a float32 model, bf16 otherwise; fp8: bf16 weights, linear layers in float8 (torchao)
PRECISIONS = ("auto", "fp32", "bf16", "mixed", "fp8")
FP8_RECIPES = ("tensorwise", "rowwise")  # torchao's float8 scaling: one scale per tensor, or per row
DP_SHARDS = ("fsdp", "ddp")
COMPOSES = (
    "the train engine composes tp (with or without sequence parallel), pp ("
    + ", ".join(schedule_names())
    + "), cp and dp (fsdp with any of them; ddp with dp and cp only)"
)


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
    precision: str  # fp32 | bf16 | mixed | fp8 (auto resolved)
    stages_per_rank: int

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def autocast(self, device_type: str, *, sharded: bool) -> contextlib.AbstractContextManager:
        """The step's autocast: with ``mixed`` (fp32 master weights, bf16 compute) FSDP's
        mixed-precision policy casts where the model is sharded (``sharded``), autocast to bf16
        elsewhere; nothing for the other precisions."""
        if self.precision == "mixed" and not sharded:
            import torch

            return torch.autocast(device_type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def single_device(self) -> TrainPlan:
        """The same batch on one device, no layout: the reference a job is verified against."""
        return replace(self, tp=1, pp=1, dp=1, cp=1, stages_per_rank=1)

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


def build_plan(job: TrainJob) -> TrainPlan:
    k, pp = job.knobs, job.pp
    default_batch = k.micro_batch * job.dp * (pp if pp > 1 else 1)
    return TrainPlan(
        tp=job.tp,
        pp=pp,
        dp=job.dp,
        cp=job.cp,
        seq_len=k.seq_len,
        micro_batch=k.micro_batch,
        global_batch=k.global_batch or default_batch,
        precision=resolve_precision(k.precision, job.model.dtype),
        stages_per_rank=schedule_spec(k.pp_schedule).stages_per_rank if pp > 1 else 1,
    )


# bytes of saved activations per token, hidden unit and layer of one micro-batch: about 34 without
# checkpointing (Korthikanti et al.); full checkpointing keeps each layer's input (2 bytes, bf16)
# and one layer's worth while it recomputes
ACT_BYTES = {"none": 34, "selective": 18, "full": 2}
FIT_FRACTION = 0.7  # the single-device reference runs at full depth where it fits this share of a GPU
# what a rank holds whatever its model: its process group, threads and allocator (a tiny model's
# CPU rank adds about 48 MiB of anonymous memory at its peak, measured by train.memory.HostSampler)
RANK_RUNTIME_BYTES = 64 << 20


# bytes a weight of a quantized base (benchmark.quant); bitsandbytes NF4 (train/quant.py): 4 bits, an
# 8-bit absmax per 64-weight block and an fp32 scale per 256 blocks (double quantization)
QUANT_BYTES_PER_PARAM = {"nf4": 0.5 + 1 / 64 + 4 / (64 * 256)}


def frozen_bytes(shape: ModelShape, frozen: int, precision: str, *, quant: str) -> int:
    """The frozen parameters' weights: with a quantized base (``QUANT_BYTES_PER_PARAM``) every
    block's linears at its size, the rest (embedding, norms, output projection) in the training
    precision."""
    per = QUANT_BYTES_PER_PARAM.get(quant)
    quantized = shape.num_layers * (shape.attention_params() + 3 * shape.hidden_size * shape.ffn_hidden_size)
    if per is None:
        return frozen * bytes_per_param(precision, trainable=False)
    return (frozen - quantized) * bytes_per_param(precision, trainable=False) + int(quantized * per)


def step_transient_bytes(trainable: int, precision: str) -> int:
    """The step's transient buffers: about one more copy of the trainable parameters in their
    state dtype (gradients produced before they are accumulated, the optimizer's temporaries).
    Measured: a 41M-parameter model's single-device step on the CPU peaked 1.1 to 1.5 such copies
    above its weights, gradients and AdamW states."""
    return trainable * (2 if precision in ("bf16", "fp8") else 4)


def reference_bytes(shape: ModelShape, plan: TrainPlan, *, lora_rank: int) -> int:
    """Weights, gradients and AdamW states of the whole model on one device and the step's
    transient buffers, plus activations of one micro-batch (about 34 bytes per token and hidden
    unit per layer without checkpointing, Korthikanti et al.) and its fp32 logits and their
    gradient."""
    trainable = shape.num_layers * shape.lora_params(lora_rank) if lora_rank else shape.num_params()
    frozen = shape.num_params(lora_rank=lora_rank) - trainable
    states = (
        trainable * bytes_per_param(plan.precision, trainable=True)
        + frozen * bytes_per_param(plan.precision, trainable=False)
        + step_transient_bytes(trainable, plan.precision)
    )
    tokens = plan.micro_batch * plan.seq_len
    return states + tokens * (34 * shape.num_layers * shape.hidden_size + 8 * shape.vocab_size)


def layout_bytes(
    shape: ModelShape, plan: TrainPlan, *, lora_rank: int, dp_shard: str, ac: str, quant: str = "none"
) -> int:
    """One rank of the layout: its share of the weights, gradients and AdamW states (tp and pp
    split the model; FSDP also splits it over dp and cp, DDP holds the whole of its tp/pp part on
    every dp rank), plus its activations: its micro-batch's tokens (split by cp), its layers (split
    by pp; a pipeline stage holds up to pp micro-batches at once), split by tp; and its logits.
    DDP's gradient buckets are a second copy of the gradients; the step's transient buffers are
    split as the states are. ``quant``: a 4-bit base (``frozen_bytes``)."""
    trainable = shape.num_layers * shape.lora_params(lora_rank) if lora_rank else shape.num_params()
    frozen = shape.num_params(lora_rank=lora_rank) - trainable
    states = (
        trainable * bytes_per_param(plan.precision, trainable=True)
        + frozen_bytes(shape, frozen, plan.precision, quant=quant)
        + step_transient_bytes(trainable, plan.precision)
    )
    split = plan.tp * plan.pp * (plan.dp * plan.cp if dp_shard == "fsdp" else 1)
    if dp_shard == "ddp":  # DDP's buckets: a second copy of the gradients
        states += trainable * (2 if plan.precision in ("bf16", "fp8") else 4)
    tokens = plan.micro_batch * plan.seq_len // plan.cp
    in_flight = min(plan.pp, plan.num_micro) if plan.pp > 1 else 1
    layers = shape.num_layers // plan.pp
    acts = tokens * in_flight * ACT_BYTES.get(ac, 34) * layers * shape.hidden_size // plan.tp
    if ac == "full":
        acts += tokens * 34 * shape.hidden_size // plan.tp  # the layer being recomputed
    return states // split + acts + tokens * 8 * shape.vocab_size // plan.tp


def rank_bytes(job: TrainJob, *, device_bytes: int | None = None) -> int:
    """Peak memory of one rank of a train job: its runtime plus the larger of the single-device
    reference it runs first (then frees) and its share of the layout. The reference runs at full depth on a CPU, and
    on a GPU (``device_bytes``) where it fits ``FIT_FRACTION`` of it, else at 2 layers (a
    multiple of the pipeline's stages)."""
    plan, shape = build_plan(job), shape_of(job.model)
    k = job.knobs
    lora = k.lora_rank
    single = plan.single_device()
    depth = k.verify_layers or shape.num_layers
    if (
        not k.verify_layers
        and device_bytes
        and reference_bytes(shape, single, lora_rank=lora) > FIT_FRACTION * device_bytes
    ):
        depth = plan.num_stages * -(-2 // plan.num_stages)
    reference = reference_bytes(shape_of(job.model, num_layers=depth), single, lora_rank=lora)
    layout = layout_bytes(shape, plan, lora_rank=lora, dp_shard=k.dp_shard, ac=k.ac, quant=k.quant)
    return RANK_RUNTIME_BYTES + max(reference, layout)


def _choice(key: str, value: Any, valid: Any) -> None:
    if value not in valid:
        raise ValueError(f"benchmark.{key}={value!r} is not valid; choose one of {', '.join(valid)}")


def _check_options(k: TrainKnobs) -> None:
    _choice("ac", k.ac, AC_MODES)
    _choice("precision", k.precision, PRECISIONS)
    _choice("dp_shard", k.dp_shard, DP_SHARDS)
    _choice("pp_schedule", k.pp_schedule, schedule_names())
    _choice("fp8_recipe", k.fp8_recipe, FP8_RECIPES)
    for key in ("seq_len", "micro_batch", "verify_steps", "profile_active", "steps_per_sample"):
        if getattr(k, key) < 1:
            raise ValueError(f"benchmark.{key}={getattr(k, key)} must be a positive integer")
    for key in ("global_batch", "lora_rank", "profile_skip", "profile_warmup", "verify_layers"):
        if getattr(k, key) < 0:
            raise ValueError(f"benchmark.{key}={getattr(k, key)} must be >= 0")
    for key in ("lr", "lora_lr_scale", "lora_alpha"):
        if not getattr(k, key) > 0:
            raise ValueError(f"benchmark.{key}={getattr(k, key)} must be > 0")


def _check_layout(job: TrainJob, plan: TrainPlan) -> None:
    model, k = job.model, job.knobs
    if job.ep > 1 or model.num_experts:
        raise ValueError(
            f"benchmark=train does not train expert-parallel or MoE models (parallelism.ep={job.ep}, "
            f"model={model.name}); use a dense model with ep=1: {COMPOSES}"
        )
    if k.dp_shard == "ddp" and (plan.tp > 1 or plan.pp > 1):
        raise ValueError(
            f"benchmark.dp_shard=ddp with parallelism={job.layout} (tp={plan.tp}, pp={plan.pp}) "
            f"cannot be composed: {COMPOSES}; use benchmark.dp_shard=fsdp"
        )
    if k.lora_rank and plan.tp > 1:
        raise ValueError(
            f"benchmark.lora_rank={k.lora_rank} with parallelism.tp={plan.tp} cannot be composed: "
            f"LoRA adapters train with dp, pp and cp layouts; use tp=1 or lora_rank=0"
        )
    stages = plan.num_stages
    if model.num_layers % stages:
        raise ValueError(
            f"model.num_layers={model.num_layers} is not divisible into {stages} pipeline stages "
            f"(pp={plan.pp} x {plan.stages_per_rank} per rank for {k.pp_schedule}); "
            f"valid pp: divisors of {model.num_layers // plan.stages_per_rank}"
        )


def _check_sizes(job: TrainJob, plan: TrainPlan) -> None:
    model, k = job.model, job.knobs
    unit = plan.tp * 2 * plan.cp
    if plan.seq_len % unit:
        raise ValueError(
            f"benchmark.seq_len={plan.seq_len} is not divisible by tp*2*cp={unit} (valid: multiples of {unit})"
        )
    per_step = plan.dp * plan.micro_batch
    if plan.global_batch % per_step:
        raise ValueError(
            f"benchmark.global_batch={plan.global_batch} is not divisible by dp*micro_batch="
            f"{plan.dp}*{plan.micro_batch}={per_step} (valid: multiples of {per_step})"
        )
    if plan.pp > 1 and (plan.num_micro < plan.pp or plan.num_micro % plan.pp):
        raise ValueError(
            f"parallelism.pp={plan.pp} needs a multiple of {plan.pp} micro-batches per step, got "
            f"global_batch/(dp*micro_batch)={plan.num_micro}; use benchmark.global_batch="
            f"{plan.pp * per_step} (or a multiple)"
        )
    shape = shape_of(model)
    smallest = min(shape.hidden_size, shape.kv_dim)
    if k.lora_rank > smallest:
        raise ValueError(
            f"benchmark.lora_rank={k.lora_rank} is larger than the smallest attention projection "
            f"of model={model.name} ({smallest}); valid: 0 (full fine-tune) to {smallest}"
        )


def _check_recipe(k: TrainKnobs, plan: TrainPlan) -> None:
    """Sequence parallel, async TP, fp8 and the zero-bubble schedules: what each needs of the rest."""
    if k.async_tp and not (plan.tp > 1 and k.tp_sp and k.compile):
        raise ValueError(
            f"benchmark.async_tp=true needs parallelism.tp > 1 (got {plan.tp}), benchmark.tp_sp=true "
            f"(got {k.tp_sp}) and benchmark.compile=true (got {k.compile}): inductor overlaps the "
            f"sequence-parallel all-gathers and reduce-scatters with the matmuls it compiles"
        )
    if plan.precision == "fp8" and plan.tp > 1:
        raise ValueError(
            f"benchmark.precision=fp8 with parallelism.tp={plan.tp} cannot be composed: fp8 trains with "
            f"dp, pp and cp layouts; use tp=1, or precision=bf16 with tp"
        )
    if plan.precision == "fp8" and k.lora_rank:
        raise ValueError(
            f"benchmark.precision=fp8 with benchmark.lora_rank={k.lora_rank} cannot be composed: fp8 "
            f"trains full fine-tunes; use lora_rank=0, or precision=bf16 with LoRA"
        )
    if plan.pp > 1 and k.ac == "selective" and schedule_spec(k.pp_schedule).zero_bubble:
        raise ValueError(
            f"benchmark.pp_schedule={k.pp_schedule} with benchmark.ac=selective cannot run: the "
            f"zero-bubble schedules run two backward passes (input, then weight gradients) through "
            f"each block, which selective checkpointing allows once; use ac=full or ac=none"
        )
    if plan.pp > 1 and k.compile and not schedule_spec(k.pp_schedule).compiles:
        raise ValueError(
            f"benchmark.pp_schedule={k.pp_schedule} with benchmark.compile=true cannot run: the "
            f"zero-bubble schedules split each backward in two, which torch does not do through a "
            f"compiled block; use compile=false, or pp_schedule="
            + ", ".join(n for n in schedule_names() if schedule_spec(n).compiles)
        )


def check_device(job: TrainJob, plan: TrainPlan, device_type: str) -> str | None:
    """Why this job cannot run on ``device_type`` (torch-free, before any rank), or None."""
    if job.knobs.async_tp and device_type != "cuda":
        return (
            f"benchmark.async_tp=true needs CUDA GPUs (symmetric memory and inductor's micro-pipelined TP); "
            f"this job would run on {device_type}: use async_tp=false here"
        )
    if plan.precision == "fp8" and device_type != "cuda":
        return (
            f"benchmark.precision=fp8 needs CUDA GPUs of compute capability 8.9 or newer (float8 matmuls); "
            f"this job would run on {device_type}: use precision=bf16 here"
        )
    if plan.precision == "fp8" and importlib.util.find_spec("torchao") is None:
        return "benchmark.precision=fp8 needs torchao, which is not installed: pip install -e '.[fp8]'"
    return None


def check_plan(job: TrainJob) -> TrainPlan:
    """Every check of a train job's config; returns the plan."""
    _check_options(job.knobs)
    plan = build_plan(job)
    _check_layout(job, plan)
    _check_sizes(job, plan)
    _check_recipe(job.knobs, plan)
    return plan
