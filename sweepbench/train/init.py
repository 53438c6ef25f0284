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

from sweepbench.train.model import Transformer, init_std

_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "module.")


def canonical_name(name: str) -> str:
    """A parameter's name in the plain model (without checkpoint/compile/DDP wrapper prefixes)."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def full_value(name: str, shape: torch.Size, *, model: Transformer, seed: int, device: torch.device) -> torch.Tensor:
    std = init_std(name, model.shape)
    if std is None:
        return torch.ones(shape, device=device)
    if std == 0.0:
        return torch.zeros(shape, device=device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    out = torch.empty(shape, device=device)
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
        _fill(model, "", model=model, seed=seed, device=device)
        return
    for key, block in model.layers.items():
        block.to_empty(device=device)
        _fill(block, f"layers.{key}.", model=model, seed=seed, device=device)
        each_block(block)
    for name, child in model.named_children():
        if name != "layers":
            child.to_empty(device=device)
            _fill(child, f"{name}.", model=model, seed=seed, device=device)


def _fill(module: nn.Module, prefix: str, *, model: Transformer, seed: int, device: torch.device) -> None:
    for raw_name, param in module.named_parameters():
        _fill_one(prefix + canonical_name(raw_name), param, model=model, seed=seed, device=device)


def _fill_one(name: str, param: torch.Tensor, *, model: Transformer, seed: int, device: torch.device) -> None:
    full = full_value(name, param.shape, model=model, seed=seed, device=device)
    if isinstance(param, DTensor):
        piece = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
        param.to_local().copy_(piece.to_local())
    else:
        param.copy_(full)
