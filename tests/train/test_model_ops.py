"""The training model's RoPE and LoRA: the same numbers as their textbook formulas, forward and
backward, in fewer operations over whole activations (each one a kernel on a GPU in eager mode)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from sweepbench.train.model import LoRALinear, apply_rope, rope_tables


class _Ops(TorchDispatchMode):
    """Counts the aten operations run while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def _pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2).type_as(x)


def _fwd_bwd(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, grad: torch.Tensor) -> tuple[Any, ...]:
    x = x.detach().requires_grad_()
    with _Ops() as counted:
        out = fn(x)
        out.backward(grad)
    return out.detach(), x.grad, sum(counted.ops.values())


@pytest.mark.parametrize("tables", [torch.float32, torch.bfloat16])  # bf16: as FSDP casts a layer's inputs
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_as_complex_turns_is_the_pairs_formula_in_fewer_ops(dtype: torch.dtype, tables: torch.dtype) -> None:
    cos, sin = (t.to(tables) for t in rope_tables(64, torch.arange(3, 131)))  # a shard's positions, as CP has
    x = torch.randn(2, 128, 4, 64, dtype=dtype)
    grad = torch.randn(2, 128, 4, 64, dtype=dtype)
    out, gx, ops = _fwd_bwd(lambda t: apply_rope(t, cos, sin), x, grad)
    ref, gref, ref_ops = _fwd_bwd(lambda t: _pairs(t, cos, sin), x, grad)
    assert torch.equal(out, ref) and torch.equal(gx, gref)
    assert ops < ref_ops, (ops, ref_ops)


def test_lora_adds_its_scaled_update_in_one_op() -> None:
    torch.manual_seed(0)
    lora = LoRALinear(32, 48, rank=4, alpha=16.0)
    with torch.no_grad():
        for p in lora.parameters():
            p.normal_()
    x, grad = torch.randn(2, 8, 32), torch.randn(2, 8, 48)

    def textbook(t: torch.Tensor) -> torch.Tensor:
        return F.linear(t, lora.weight) + F.linear(F.linear(t, lora.lora_a), lora.lora_b) * lora.scale

    out, gx, ops = _fwd_bwd(lora, x, grad)
    ga, gb = lora.lora_a.grad, lora.lora_b.grad
    lora.zero_grad(set_to_none=True)
    ref, gref, ref_ops = _fwd_bwd(textbook, x, grad)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(gx, gref)
    torch.testing.assert_close(ga, lora.lora_a.grad)
    torch.testing.assert_close(gb, lora.lora_b.grad)
    assert ops < ref_ops, (ops, ref_ops)
