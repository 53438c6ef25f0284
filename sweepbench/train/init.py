"""Deterministic weights, identical in every layout.

Each parameter's full value is drawn from a generator seeded by (seed, parameter name) on the
rank's own device, then this rank keeps its piece: ``distribute_tensor(..., src_data_rank=None)``
slices locally for a tensor-parallel DTensor, a plain tensor is kept whole. So a tp2 rank's shard
of ``layers.3.attention.wq.weight`` is bit for bit the matching slice of the single-device
model's weight, whatever the layout, and no rank sends anything."""

from __future__ import annotations

import zlib
from typing import Callable

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from sweepbench.parallel.specs import ModelShape
from sweepbench.train.model import Transformer, init_std

_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "module.")


def canonical_name(name: str) -> str:
    """A parameter's name in the plain model (without checkpoint/compile/DDP wrapper prefixes)."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def full_value(name: str, size: torch.Size, *, shape: ModelShape, seed: int, device: torch.device) -> torch.Tensor:
    """The whole value of parameter ``name`` (its name in the plain model) of a model of ``shape``."""
    std = init_std(name, shape)
    if std is None:
        return torch.ones(size, device=device)
    if std == 0.0:
        return torch.zeros(size, device=device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    out = torch.empty(size, device=device)
    nn.init.trunc_normal_(out, std=std, a=-3 * std, b=3 * std, generator=gen)
    return out


@torch.no_grad()
def init_weights(
    model: Transformer,
    *,
    seed: int,
    device: torch.device,
    dtype: torch.dtype,
    each_block: Callable[[nn.Module], None] | None = None,
) -> None:
    """Materialise a meta-device model (any tensor-parallel plan already applied) on ``device``
    in ``dtype`` and fill it deterministically. Called before FSDP/DDP wrap the model.
    ``each_block``: the model is materialised one block at a time, each handed to it as soon as it
    is filled (a quantizer: a 4-bit base then never holds more than one block in ``dtype``)."""
    model.to(dtype=dtype)  # still on meta: only the dtype changes
    if each_block is None:
        model.to_empty(device=device)
        fill_weights(model, shape=model.shape, seed=seed, device=device)
        return
    for key, block in model.layers.items():
        block.to_empty(device=device)
        fill_weights(block, shape=model.shape, seed=seed, device=device, prefix=f"layers.{key}.")
        each_block(block)
    for name, child in model.named_children():
        if name != "layers":
            child.to_empty(device=device)
            fill_weights(child, shape=model.shape, seed=seed, device=device, prefix=f"{name}.")


@torch.no_grad()
def fill_weights(module: nn.Module, *, shape: ModelShape, seed: int, device: torch.device, prefix: str = "") -> None:
    """Fill every parameter of ``module`` (materialised, any tensor-parallel plan applied; its names
    under ``prefix`` those of our model of ``shape``) with its value in every layout. A peer's model
    that names its weights as ours (torchtitan's llama3) is filled the same way."""
    for raw_name, param in module.named_parameters():
        _fill_one(prefix + canonical_name(raw_name), param, shape=shape, seed=seed, device=device)


def _fill_one(name: str, param: torch.Tensor, *, shape: ModelShape, seed: int, device: torch.device) -> None:
    full = full_value(name, param.shape, shape=shape, seed=seed, device=device)
    if isinstance(param, DTensor):
        piece = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
        param.to_local().copy_(piece.to_local())
    else:
        param.copy_(full)
