"""FP8 training through torchao: each block's linear layers become Float8Linear (inputs,
weights and gradients cast to float8 with dynamic scales for the matmuls, bf16 weights kept), as
torchtitan's float8 converter does; the output projection stays in bf16 (its logits feed the loss).

    tensorwise  one scale per tensor; under FSDP2 the weights are all-gathered in float8, their
                scales computed for all weights at once after each optimizer step
    rowwise     one scale per row (more accurate, slower matmuls); weights all-gathered in bf16;
                compiled with inductor's casts rounded as eager rounds them (torchtitan's fix for
                the NaN loss of compiled rowwise with RMSNorm; ours went NaN at its third step
                without it)

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


# inductor's setting before this process first changed it (None: never changed), restored for
# every later job that is not fp8 rowwise
_eager_casts_default: bool | None = None


def set_inductor_casts(*, fp8_recipe: str | None) -> None:
    """Make inductor round its casts as eager does for fp8 rowwise, and leave it at its default for
    every other job (ranks kept between jobs would otherwise carry one job's setting into the next).
    A process that never ran fp8 rowwise does not import inductor here (about 0.8 s a job)."""
    global _eager_casts_default
    if fp8_recipe != "rowwise" and _eager_casts_default is None:
        return  # never changed: nothing to restore
    import torch._inductor.config as inductor

    if _eager_casts_default is None:
        _eager_casts_default = bool(inductor.emulate_precision_casts)
    inductor.emulate_precision_casts = fp8_recipe == "rowwise" or _eager_casts_default


def scales_precomputed(*, recipe: str, fsdp: bool) -> bool:
    """Whether the float8 weights' scales are computed once per step for all of them
    (:func:`precompute_scales` after each optimizer step): tensorwise under FSDP2."""
    return recipe == "tensorwise" and fsdp


def precompute_scales(parts: list[nn.Module]) -> None:
    """Compute every float8 weight's scale in one pass after the optimizer step, where each
    all-gather would otherwise compute its own (torchao's precompute_float8_dynamic_scale_for_fsdp)."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    for part in parts:
        precompute_float8_dynamic_scale_for_fsdp(part)


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
