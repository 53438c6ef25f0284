"""FP8 training through torchao: each block's linear layers become Float8Linear (inputs,
weights and gradients cast to float8 with dynamic scales for the matmuls, bf16 weights kept), as
torchtitan's float8 converter does; the output projection stays in bf16 (its logits feed the loss).

    tensorwise  one scale per tensor; under FSDP2 the weights are all-gathered in float8
    rowwise     one scale per row (more accurate, slower matmuls); weights all-gathered in bf16

torchao is an optional dependency (``pip install -e ".[fp8]"``); float8 matmuls need a GPU of
compute capability 8.9 or newer (the plan refuses fp8 elsewhere before any rank starts)."""

from __future__ import annotations

import torch
from torch import nn

FP8_MIN_CAPABILITY = (8, 9)
# float8 matmuls need both dimensions of each weight divisible by 16
_FP8_MULTIPLE = 16


def _converts(module: nn.Module, fqn: str) -> bool:
    if fqn.split(".")[-1] == "output" or fqn == "output":
        return False
    if isinstance(module, nn.Linear):
        return module.in_features % _FP8_MULTIPLE == 0 and module.out_features % _FP8_MULTIPLE == 0
    return True


def apply_fp8(model: nn.Module, *, recipe: str, fsdp: bool) -> None:
    """Swap ``model``'s linear layers for torchao's Float8Linear in place (on the meta device,
    before TP, AC, compile and FSDP)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    if torch.cuda.is_available() and torch.cuda.get_device_capability() < FP8_MIN_CAPABILITY:
        raise ValueError(
            f"benchmark.precision=fp8 needs a GPU of compute capability 8.9 or newer; "
            f"{torch.cuda.get_device_name()} is {torch.cuda.get_device_capability()}: use precision=bf16"
        )
    if recipe == "tensorwise":
        config = Float8LinearConfig(enable_fsdp_float8_all_gather=fsdp)
    else:
        config = Float8LinearConfig.from_recipe_name(recipe)
    convert_to_float8_training(model, config=config, module_filter_fn=_converts)
