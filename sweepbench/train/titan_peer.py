"""The ``torchtitan`` train implementation: torchtitan's own llama3 ``Transformer`` laid out by its
own parallelize pieces (``apply_tp`` with sequence parallel, ``apply_ac``, ``apply_compile``,
``apply_fsdp``) and pipeline split and schedule builder, with its own loss (summed cross-entropy
over the global token count) and its own optimizer builder, run on the same recipe as ours so one sweep (``benchmark.impl=ours,torchtitan``)
times both.

Same shape (model args from our ``ModelShape``, nothing downloaded), same weights: torchtitan's
llama3 names its parameters as ours (``tok_embeddings``, ``layers.N.attention.wq`` .., ``norm``,
``output``) and rotates the same interleaved RoPE pairs (2i, 2i+1) with the same frequencies once
its llama-3.1 frequency scaling is set to 1, so our name-seeded initialisation fills it as it is,
and at step 0 it computes our function: its losses are checked against our single-device reference.

Pinned to our step where torchtitan's defaults differ (docs/benchmarks/train.md, "torchtitan"):
no loss parallel, uncompiled loss, no gradient clipping, constant learning rate, op-level selective
AC without saving RNG state, attention through plain SDPA (torch picks its backend, as for ours), and our
pipeline stages with the loss scaled as without a pipeline."""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from sweepbench.parallel.specs import ModelShape
from sweepbench.train.impls import IMPLS, missing
from sweepbench.train.init import fill_weights
from sweepbench.train.model import ROPE_THETA
from sweepbench.train.pipeline import pipeline_bubble, schedule_spec, stage_layers
from sweepbench.train.plan import TrainPlan

try:
    from torchtitan.components.loss import IGNORE_INDEX, build_cross_entropy_loss
    from torchtitan.components.optimizer import build_optimizers
    from torchtitan.config import JobConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed.activation_checkpoint import apply_ac
    from torchtitan.distributed.pipeline_parallel import build_pipeline_schedule, pipeline_module_split
    from torchtitan.distributed.tensor_parallel import maybe_enable_async_tp
    from torchtitan.distributed.utils import dist_sum
    from torchtitan.models.attention import ScaledDotProductAttentionWrapper
    from torchtitan.models.llama3 import Transformer, TransformerModelArgs
    from torchtitan.models.llama3.infra.parallelize import _op_sac_save_list, apply_compile, apply_fsdp, apply_tp
    from torchtitan.models.llama3.model.args import RoPEScalingArgs
    from torchtitan.models.llama3.model.model import precompute_freqs_cis
    from torchtitan.tools.utils import set_default_dtype
except ImportError as e:  # the extra is not installed: one line naming the install command
    raise ImportError(missing("torchtitan") or f"benchmark.impl=torchtitan cannot import torchtitan: {e}") from None

DTYPES = {"fp32": torch.float32, "mixed": torch.float32, "bf16": torch.bfloat16}


def model_args(shape: ModelShape, seq_len: int) -> TransformerModelArgs:
    """torchtitan's llama3 args for our shape: SwiGLU width exactly ours (torchtitan derives it from
    4·dim, ``ffn_dim_multiplier`` and ``multiple_of``), our RoPE theta, and its llama-3.1 frequency
    scaling set to factor 1 (no change: ours does not scale)."""
    derived = int(2 * 4 * shape.hidden_size / 3)
    return TransformerModelArgs(
        dim=shape.hidden_size,
        n_layers=shape.num_layers,
        n_heads=shape.num_heads,
        n_kv_heads=shape.num_kv_heads,
        vocab_size=shape.vocab_size,
        multiple_of=shape.ffn_hidden_size,
        ffn_dim_multiplier=shape.ffn_hidden_size / derived,
        norm_eps=1e-5,
        rope_theta=ROPE_THETA,
        rope_scaling_args=RoPEScalingArgs(scaling_factor=1.0),
        max_seq_len=seq_len,
        attn_type="sdpa",
        attn_mask_type="causal",
    )


def job_config(plan: TrainPlan, opts: Any) -> JobConfig:
    """torchtitan's JobConfig of this job, built in code (no TOML): what its builders read."""
    job = JobConfig()
    job.training.seq_len, job.training.global_batch_size = plan.seq_len, plan.global_batch
    job.training.dtype = "bfloat16" if plan.precision == "bf16" else "float32"
    job.training.mixed_precision_param = "float32" if plan.precision == "fp32" else "bfloat16"
    job.training.mixed_precision_reduce = "float32"
    job.optimizer.name, job.optimizer.lr = "AdamW", opts.lr
    job.optimizer.beta1, job.optimizer.beta2, job.optimizer.eps, job.optimizer.weight_decay = 0.9, 0.95, 1e-8, 0.1
    job.optimizer.implementation = "fused" if opts.fused_adamw else "foreach"
    job.activation_checkpoint.mode = opts.ac
    job.activation_checkpoint.selective_ac_option = "op"  # ours' policy; torchtitan's default is every 2nd block
    job.activation_checkpoint.preserve_rng_state = False  # no dropout in the block: nothing random to replay
    job.compile.enable, job.compile.components = opts.compile, ["model"]  # ours compiles the blocks only
    job.parallelism.tensor_parallel_degree = plan.tp
    job.parallelism.data_parallel_shard_degree = plan.dp
    job.parallelism.pipeline_parallel_degree = plan.pp
    job.parallelism.pipeline_parallel_microbatch_size = plan.micro_batch
    job.training.local_batch_size = plan.local_batch if plan.pp > 1 else plan.micro_batch  # the pipeline splits it
    job.parallelism.disable_loss_parallel = True  # ours gathers the logits: the same plain loss on each TP rank
    job.parallelism.enable_async_tensor_parallel = opts.async_tp
    return job


@IMPLS.register("torchtitan")
class TitanTrainer:
    """The same interface as ``trainer.Trainer`` on single-device, dp, tp and pp layouts and their products."""

    def __init__(
        self,
        shape: ModelShape,
        plan: TrainPlan,
        opts: Any,
        *,
        device: torch.device,
        mesh: DeviceMesh | None = None,
        **_: Any,
    ) -> None:
        assert plan.cp == 1 and not opts.lora_rank, "refused before launch (train/impls.py)"
        self.shape, self.plan, self.opts, self.device, self.mesh = shape, plan, opts, device, mesh
        job = self.job = job_config(plan, opts)
        self.dims = ParallelDims(
            dp_replicate=1, dp_shard=plan.dp, cp=1, tp=plan.tp, pp=plan.pp, ep=1, etp=1, world_size=plan.world_size
        )
        self.args = model_args(shape, plan.seq_len)
        with torch.device("meta"), set_default_dtype(DTYPES[plan.precision]):
            model = Transformer(self.args)
        ffn = model.layers["0"].feed_forward.w1.weight.shape[0]
        assert ffn == shape.ffn_hidden_size, f"torchtitan's SwiGLU width {ffn} != {shape.ffn_hidden_size}"
        _pin_sdpa(model)
        self.sharded = mesh is not None and plan.dp > 1
        self.loss_fn = build_cross_entropy_loss(job)
        self.schedule = None
        if mesh is not None and plan.pp > 1:
            self.parts, self.schedule, self.first, self.last = self._pipeline(model, mesh)
        else:
            self.parts, self.first, self.last = [self._layout(model)], True, True
        self.num_trainable = sum(p.numel() for part in self.parts for p in part.parameters() if p.requires_grad)
        self.optimizers = build_optimizers(self.parts, job.optimizer, self.dims)

    @property
    def holds_loss(self) -> bool:
        return self.last

    def _layout(self, model: nn.Module) -> nn.Module:
        """TP, AC, compile, our weights, FSDP: torchtitan's parallelize_llama in pieces, the weights
        filled before FSDP shards them, as ours (torchtitan inits after, with its own init)."""
        plan, opts, mesh, job = self.plan, self.opts, self.mesh, self.job
        if mesh is not None and plan.tp > 1:
            apply_tp(model, mesh["tp"], loss_parallel=False, enable_float8_tensorwise_tp=False)
            maybe_enable_async_tp(job, mesh["tp"])
        if opts.ac != "none":
            apply_ac(
                model, job.activation_checkpoint, model_compile_enabled=opts.compile, op_sac_save_list=_op_sac_save_list
            )
        if opts.compile:
            apply_compile(model, job.compile)
        model.to_empty(device=self.device)
        fill_weights(model, shape=self.shape, seed=opts.seed, device=self.device)
        args = self.args
        with torch.device(self.device):
            model.freqs_cis = precompute_freqs_cis(
                self.shape.head_dim, args.max_seq_len, args.rope_theta, args.rope_scaling_args
            )
        if self.sharded and mesh is not None:
            apply_fsdp(
                model,
                mesh["dp"],
                param_dtype=torch.bfloat16 if plan.precision != "fp32" else torch.float32,
                reduce_dtype=torch.float32,
                pp_enabled=plan.pp > 1,
            )
            _sum_on_gloo(model, mesh["dp"])
        return model.train()

    def _pipeline(self, model: nn.Module, mesh: DeviceMesh) -> tuple[list[nn.Module], Any, bool, bool]:
        """torchtitan's pipeline split and schedule builder over our stages (equal layers per stage,
        the embedding on the first, norm and output on the last, as ours; torchtitan's own split
        counts the embedding and the output as a layer each). Its schedule backpropagates each
        micro-batch's summed loss unscaled; here it is divided by the global token count first, as
        its step without a pipeline does, so the gradients are ours."""
        stages_total = self.plan.num_stages
        names = [
            [
                *(["tok_embeddings"] if sid == 0 else []),
                *(f"layers.{i}" for i in stage_layers(sid, num_layers=self.shape.num_layers, num_stages=stages_total)),
                *(["norm", "output"] if sid == stages_total - 1 else []),
            ]
            for sid in range(stages_total)
        ]
        name = schedule_spec(self.opts.pp_schedule).cls_name.removeprefix("Schedule")
        self.job.parallelism.pipeline_parallel_schedule = name
        stages, parts = pipeline_module_split(model, mesh["pp"], name, self.device, names)
        for stage, part in zip(stages, parts):
            stage.submod = self._layout(part)
        schedule = build_pipeline_schedule(self.job, stages, self._pipeline_loss)
        return parts, schedule, any(s.is_first for s in stages), any(s.is_last for s in stages)

    def _pipeline_loss(self, pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(pred, labels) / self._global_tokens

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """torchtitan's train step without its clipping, scheduler and logging: each micro-batch's
        summed loss over the global batch's token count (FSDP then sums gradients, undivided).
        Returns this rank's mean loss per token."""
        self.optimizers.zero_grad()
        local_tokens = (targets != IGNORE_INDEX).sum()
        if self.sharded and self.mesh is not None:
            self._global_tokens: torch.Tensor | float = dist_sum(local_tokens, self.mesh["dp"])
        else:
            self._global_tokens = local_tokens.float()
        if self.schedule is not None:
            total = self._pipeline_step(inputs, targets)
        else:
            mb, n = self.plan.micro_batch, self.plan.num_micro
            total = torch.zeros((), device=self.device)
            for i in range(n):
                x, y = inputs[i * mb : (i + 1) * mb], targets[i * mb : (i + 1) * mb]
                with self.plan.autocast(self.device.type, sharded=self.sharded):
                    pred = self.parts[0](x)
                    loss = self.loss_fn(pred, y) / self._global_tokens
                del pred
                loss.backward()
                total += loss.detach()
        self.optimizers.step()
        return total * self._global_tokens / local_tokens

    def _pipeline_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        assert self.schedule is not None
        losses: list[torch.Tensor] | None = [] if self.last else None
        target = targets if self.last else None
        with self.plan.autocast(self.device.type, sharded=self.sharded):
            if self.first:
                self.schedule.step(inputs, target=target, losses=losses, return_outputs=False)
            else:
                self.schedule.step(target=target, losses=losses, return_outputs=False)
        if not losses:
            return torch.zeros((), device=self.device)
        return torch.stack([loss.detach().float() for loss in losses]).sum()

    def bubble(self) -> dict[str, float | None]:
        """The pipeline's idle share, as ours reports it."""
        return pipeline_bubble(self.schedule, self.opts.pp_schedule, pp=self.plan.pp, num_micro=self.plan.num_micro)


def _sum_on_gloo(model: nn.Module, mesh: DeviceMesh) -> None:
    """torchtitan leaves FSDP's gradients undivided (divide factor 1), which FSDP reduces with
    PREMUL_SUM(1); gloo has no PREMUL_SUM, and a plain SUM is the same sum."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    if dist.get_backend(mesh.get_group()) != "gloo":
        return
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)


def plain_sdpa(
    self: nn.Module,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
    is_causal: bool = True,
) -> torch.Tensor:
    """torchtitan's SDPA wrapper's forward without its backend priority (cuDNN, flash, math, set
    with ``sdpa_kernel(..., set_priority=True)``): plain SDPA, whose backend torch picks as it does
    for ours (on torch 2.9+ and a Hopper GPU, cuDNN's; flash on older stacks)."""
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, scale=scale, is_causal=is_causal, enable_gqa=enable_gqa
    )


def _pin_sdpa(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, ScaledDotProductAttentionWrapper):
            module.forward = types.MethodType(plain_sdpa, module)
