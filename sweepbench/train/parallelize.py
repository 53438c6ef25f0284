"""Layouts applied to one model (or one pipeline stage), in torchtitan's order: float8 linears,
tensor parallel (with or without sequence parallel), then activation checkpointing, then compile,
then the weights are materialised, then FSDP2 (or DDP) over the data-parallel ranks.

TP with sequence parallel (the default): the embedding is row-parallel and hands out sequence
shards; norms run on sequence shards (SequenceParallel); attention and the MLP gather the
sequence, run column-parallel in projections (each rank holds whole heads) and row-parallel out
projections that reduce-scatter back to sequence shards; the output projection gathers the
sequence and the logits (Replicate), so the loss is the same plain cross-entropy on every TP rank.
Without it (``sequence_parallel=False``) the activations between blocks are whole on every TP
rank, norms run on all of it, and each row-parallel projection all-reduces.

Async TP: inductor's micro-pipeline pass splits each all-gather/reduce-scatter of a compiled
block into chunks over symmetric memory and overlaps them with the matmuls next to them; it
needs sequence parallel (the collectives it overlaps) and compiled blocks."""

from __future__ import annotations

import warnings
from collections import Counter
from functools import partial
from typing import Any, cast

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard

from sweepbench.train.model import Transformer


def _tp_plan(*, sequence_parallel: bool) -> tuple[dict, dict]:
    """(the plan of the model's top modules, the plan of each block)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    if not sequence_parallel:
        top = {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
            "output": ColwiseParallel(output_layouts=Replicate()),
        }
        block = {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(),
        }
        return top, block
    top = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }
    block = {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(
            input_layouts=(Shard(1), None, None), desired_input_layouts=(Replicate(), None, None)
        ),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }
    return top, block


def apply_tp(model: Transformer, mesh: DeviceMesh, *, sequence_parallel: bool = True, async_tp: bool = False) -> None:
    from torch.distributed.tensor.parallel import parallelize_module

    top_plan, block_plan = _tp_plan(sequence_parallel=sequence_parallel)
    # a pipeline stage holds only some of the top modules
    parallelize_module(model, mesh, {k: v for k, v in top_plan.items() if getattr(model, k) is not None})
    for block in model.layers.values():
        parallelize_module(block, mesh, block_plan)
        if not sequence_parallel:
            _replicate(cast(nn.Module, block.attention_norm), mesh)
            _replicate(cast(nn.Module, block.ffn_norm), mesh)
    if not sequence_parallel and model.norm is not None:
        _replicate(model.norm, mesh)
    if async_tp:
        maybe_enable_async_tp(mesh)


def _replicate(module: nn.Module, mesh: DeviceMesh) -> None:
    """Without sequence parallel a norm runs on the whole activation on every TP rank: its weight
    becomes a replicated DTensor (so the optimizer steps DTensors only), inputs and outputs stay
    plain local tensors."""
    from torch.distributed.tensor import DTensor, distribute_module

    def to_dtensor(_mod: nn.Module, inputs: tuple, device_mesh: DeviceMesh) -> tuple:
        return tuple(DTensor.from_local(x, device_mesh, [Replicate()], run_check=False) for x in inputs)

    def to_local(_mod: nn.Module, output: DTensor, _mesh: DeviceMesh) -> torch.Tensor:
        return output.to_local()

    # torch annotates input_fn and output_fn as returning None; what they return replaces the inputs/output
    distribute_module(module, mesh, input_fn=to_dtensor, output_fn=to_local)  # type: ignore[arg-type]


def maybe_enable_async_tp(mesh: DeviceMesh) -> None:
    """Turn on inductor's micro-pipelined TP for the blocks compiled from here on, over symmetric
    memory on the TP group (older torch needs the group registered; newer torch does it itself
    and warns that the call is no longer needed)."""
    import torch._inductor.config
    from torch.distributed import _symmetric_memory

    torch._inductor.config._micro_pipeline_tp = True
    if hasattr(_symmetric_memory, "enable_symm_mem_for_group"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            _symmetric_memory.enable_symm_mem_for_group(mesh.get_group().group_name)


# Selective AC keeps the outputs of the compute-heavy ops (matmuls, attention, TP's
# reduce-scatters) and recomputes the cheap pointwise ones, as torchtitan's op-level policy does;
# like torchtitan it recomputes every second matmul, to trade some compute for memory.
_SAVE_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops.aten.max.default,
}


def _selective_context():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    counts: Counter = Counter()

    def policy(ctx, op, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if op == torch.ops.aten.mm.default:
            counts[f"{mode}_mm"] += 1
        save = op in _SAVE_OPS and not (op == torch.ops.aten.mm.default and counts[f"{mode}_mm"] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def apply_ac(model: Transformer, mode: str) -> None:
    """Wrap each block: ``full`` recomputes the whole block in backward, ``selective`` the ops
    outside the save list."""
    if mode == "none":
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    extra: dict[str, Any] = {"context_fn": _selective_context} if mode == "selective" else {}
    for key, block in list(model.layers.items()):
        model.layers[key] = checkpoint_wrapper(block, preserve_rng_state=False, **extra)


def apply_compile(model: Transformer) -> None:
    """Compile each block on its own (repeated blocks reuse one compiled graph)."""
    for block in model.layers.values():
        block.compile()


def apply_fsdp(model: Transformer, mesh: DeviceMesh, *, precision: str, reshard_after_forward: bool) -> None:
    """FSDP2: each block its own unit, then the rest; bf16 compute, fp32 gradient reduction."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    param_dtype = torch.bfloat16 if precision in ("bf16", "mixed", "fp8") else torch.float32
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    shard = partial(fully_shard, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    for block in model.layers.values():
        shard(block)
    shard(model)


def apply_ddp(model: nn.Module, mesh: DeviceMesh, device: torch.device) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(
        model,
        process_group=mesh.get_group(),
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=100,
    )
