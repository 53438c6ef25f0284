"""One rank's part of a training layout: its model pieces, optimizer and step.

The mesh is (pp, dp, cp, tp), tp innermost. Each pipeline stage is built on the meta device and
laid out in torchtitan's order (TP, AC, compile, init, FSDP/DDP over dp x cp). Without a mesh
the same class is the single-device reference the layouts are verified against."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from sweepbench.train.fp8 import apply_fp8, precompute_scales, scales_precomputed, set_inductor_casts
from sweepbench.train.impls import IMPLS
from sweepbench.train.init import init_weights
from sweepbench.train.model import Attention, Transformer
from sweepbench.train.parallelize import apply_ac, apply_compile, apply_ddp, apply_fsdp, apply_tp
from sweepbench.train.pipeline import pipeline_bubble, schedule_spec, stage_layers
from sweepbench.train.pipeline import stage_ids as pipeline_stage_ids
from sweepbench.train.plan import TrainPlan
from sweepbench.train.recipe import apply_recipe, block_quantizer
from sweepbench.parallel.specs import ModelShape

DTYPES = {"fp32": torch.float32, "mixed": torch.float32, "bf16": torch.bfloat16, "fp8": torch.bfloat16}


@dataclass(frozen=True)
class TrainOptions:
    """The recipe's knobs as the trainer takes them (``run.options_of``: from ``config.TrainKnobs``,
    where each is described; ``lr`` here is the effective one, scaled for LoRA adapters)."""

    ac: str = "none"
    compile: bool = False
    fused_adamw: bool = True
    lr: float = 1e-3
    lora_rank: int = 0
    lora_alpha: float = 16.0
    dp_shard: str = "fsdp"
    pp_schedule: str = "1f1b"
    cp_impl: str = "ring"
    impl: str = "ours"  # the recipe knobs of recipe.py: who trains, quantized base, fused kernels, packing
    quant: str = "none"
    fused: str = "none"
    padding_free: bool = False
    documents: bool = False  # padding_free's documents; without padding_free one per row, padded (its baseline)
    tp_sp: bool = True
    async_tp: bool = False
    fp8_recipe: str = "tensorwise"
    seed: int = 0


def build_mesh(plan: TrainPlan, device: torch.device) -> DeviceMesh:
    return init_device_mesh(device.type, (plan.pp, plan.dp, plan.cp, plan.tp), mesh_dim_names=("pp", "dp", "cp", "tp"))


def data_mesh(mesh: DeviceMesh, plan: TrainPlan) -> DeviceMesh:
    """The ranks that hold the same weights and must average gradients: dp x cp."""
    if plan.cp == 1:
        return mesh["dp"]
    if plan.dp == 1:
        return mesh["cp"]
    return mesh["dp", "cp"]._flatten("dp_cp")


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


@IMPLS.register("ours")
class Trainer:
    """Build with ``mesh=None`` for the single-device reference. ``step(inputs, targets)`` takes
    this rank's rows (and sequence shard) of a global batch and returns its loss (a 0-dim
    tensor; meaningful where :attr:`holds_loss`)."""

    def __init__(
        self,
        shape: ModelShape,
        plan: TrainPlan,
        opts: TrainOptions,
        *,
        device: torch.device,
        mesh: DeviceMesh | None = None,
        positions: torch.Tensor | None = None,
        attn_fn: Callable | None = None,
    ) -> None:
        self.shape, self.plan, self.opts, self.device, self.mesh = shape, plan, opts, device, mesh
        self.dtype = DTYPES[plan.precision]
        self.sharded = mesh is not None and plan.dp * plan.cp > 1 and opts.dp_shard == "fsdp"
        pp_rank = mesh["pp"].get_local_rank() if mesh is not None and plan.pp > 1 else 0
        stage_ids = pipeline_stage_ids(opts.pp_schedule, pp_rank=pp_rank, pp=plan.pp) if plan.pp > 1 else [0]
        fp8_recipe = opts.fp8_recipe if plan.precision == "fp8" else None
        set_inductor_casts(fp8_recipe=fp8_recipe)
        self.precompute_fp8 = fp8_recipe is not None and scales_precomputed(recipe=fp8_recipe, fsdp=self.sharded)
        self.parts: list[nn.Module] = []
        self.first = self.last = False
        for sid in stage_ids:
            first, last = sid == 0, sid == plan.num_stages - 1
            self.first, self.last = self.first or first, self.last or last
            self.parts.append(
                self._build_part(
                    stage_layers(sid, num_layers=shape.num_layers, num_stages=plan.num_stages),
                    first=first,
                    last=last,
                    positions=positions,
                    attn_fn=attn_fn,
                )
            )
        params = [p for part in self.parts for p in part.parameters() if p.requires_grad]
        self.num_trainable = sum(p.numel() for p in params)
        self.optimizer = torch.optim.AdamW(
            params, lr=opts.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=opts.fused_adamw
        )
        self.schedule = self._build_schedule(stage_ids) if plan.pp > 1 else None

    @property
    def holds_loss(self) -> bool:
        return self.last

    def _build_part(
        self, layer_ids: range, *, first: bool, last: bool, positions: torch.Tensor | None, attn_fn: Callable | None
    ) -> nn.Module:
        with torch.device("meta"):
            model = Transformer(self.shape, lora_rank=self.opts.lora_rank, lora_alpha=self.opts.lora_alpha)
        model.keep_stage(layer_ids, first=first, last=last)
        if self.opts.lora_rank:  # LoRA fine-tune: the adapters train, the whole base model is frozen
            for name, param in model.named_parameters():
                param.requires_grad_(name.endswith(("lora_a", "lora_b")))
        if attn_fn is not None:
            for block in model.layers.values():
                cast(Attention, block.attention).attn_fn = attn_fn
        if self.plan.precision == "fp8":
            apply_fp8(model, recipe=self.opts.fp8_recipe, fsdp=self.sharded)
        if self.mesh is not None and self.plan.tp > 1:
            apply_tp(model, self.mesh["tp"], sequence_parallel=self.opts.tp_sp, async_tp=self.opts.async_tp)
        apply_ac(model, self.opts.ac)
        if self.opts.compile:
            apply_compile(model)
        init_weights(
            model, seed=self.opts.seed, device=self.device, dtype=self.dtype, each_block=block_quantizer(self.opts)
        )
        apply_recipe(model, self.opts, device=self.device)
        model.positions = positions if positions is not None else torch.arange(self.plan.seq_len, device=self.device)
        if self.mesh is None or self.plan.dp * self.plan.cp == 1:
            return model
        dmesh = data_mesh(self.mesh, self.plan)
        if self.sharded:
            apply_fsdp(model, dmesh, precision=self.plan.precision, reshard_after_forward=self.plan.pp == 1)
            return model
        return apply_ddp(model, dmesh, self.device)

    def _build_schedule(self, stage_ids: list[int]):
        from torch.distributed.pipelining import PipelineStage, schedules

        assert self.mesh is not None  # a pipeline runs on a mesh with a pp dimension
        stages = [
            PipelineStage(part, sid, self.plan.num_stages, self.device, group=self.mesh["pp"].get_group())
            for part, sid in zip(self.parts, stage_ids)
        ]
        spec = schedule_spec(self.opts.pp_schedule)
        kind = getattr(schedules, spec.cls_name)
        arg = stages if spec.runtime else stages[0]
        return kind(arg, n_microbatches=self.plan.num_micro, loss_fn=cross_entropy, scale_grads=True)

    def bubble(self) -> dict[str, float | None]:
        """The pipeline's idle share: by formula, and by the schedule's own plan where it has one."""
        return pipeline_bubble(self.schedule, self.opts.pp_schedule, pp=self.plan.pp, num_micro=self.plan.num_micro)

    def _micro_batches(self, inputs: torch.Tensor, targets: torch.Tensor) -> Iterator[tuple]:
        mb, n = self.plan.micro_batch, self.plan.num_micro
        model = self.parts[0]
        for i in range(n):
            last = i == n - 1
            # DDP's no_sync: the gradients are reduced once, after the last micro-batch
            no_sync = cast("Callable[[], contextlib.AbstractContextManager] | None", getattr(model, "no_sync", None))
            sync = no_sync() if no_sync is not None and not last else contextlib.nullcontext()
            yield inputs[i * mb : (i + 1) * mb], targets[i * mb : (i + 1) * mb], sync

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        if self.schedule is not None:
            loss = self._pipeline_step(inputs, targets)
        else:
            total: torch.Tensor | None = None  # no zeros to add to: a one-micro-batch step's loss is its own
            for x, y, sync in self._micro_batches(inputs, targets):
                with sync:
                    with self.plan.autocast(self.device.type, sharded=self.sharded):
                        out = self.parts[0](x, y) if self.opts.fused != "none" else self.parts[0](x)
                    part = out if self.opts.fused != "none" else cross_entropy(out, y)
                    if self.plan.num_micro > 1:  # (a division by 1 would be a kernel each way)
                        part = part / self.plan.num_micro
                    part.backward()
                total = part.detach() if total is None else total + part.detach()
            assert total is not None  # a step has one micro-batch or more
            loss = total
        self.optimizer.step()
        if self.precompute_fp8:
            precompute_scales(self.parts)
        return loss

    def _pipeline_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        losses: list[torch.Tensor] = []
        assert self.schedule is not None  # a step of a pipeline
        with self.plan.autocast(self.device.type, sharded=self.sharded):
            # no merged outputs: the loss comes from `losses`, and the last stage would otherwise keep
            # every micro-batch's logits to the step's end
            if self.first:
                self.schedule.step(inputs, target=targets if self.last else None, losses=losses, return_outputs=False)
            elif self.last:
                self.schedule.step(target=targets, losses=losses, return_outputs=False)
            else:
                self.schedule.step()
        if not self.last:
            return torch.zeros((), device=self.device)
        return torch.stack([loss.detach().float() for loss in losses]).mean()
