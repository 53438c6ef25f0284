"""Quantized-base LoRA (QLoRA): the frozen base weights of every block's linear layers held in
4-bit NF4 (bitsandbytes: 64-weight blocks, double-quantized scales), the adapters and everything
else in the training precision. bitsandbytes >= 0.45 runs NF4 on CPU tensors as well as on CUDA.

``quant=nf4`` swaps each block's linear (wq, wk, wv, wo with their adapters; w1, w2, w3) for an
:class:`NF4Linear` whose forward dequantizes the weight block by block inside bitsandbytes'
matmul. ``quant=nf4_dense`` is its reference: the same weights rounded through NF4 and back, kept
dense, so the quantized model must give the same loss and gradients as this plain one (the
first steps' losses are checked against it before any time counts). The embedding and the
output projection stay unquantized, as in QLoRA."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from sweepbench.train.model import Attention, FeedForward, LoRALinear, Transformer

BLOCKSIZE = 64


def quantize(weight: torch.Tensor) -> Any:
    """``weight`` as a frozen NF4 parameter (uint8 packed, with its quant state)."""
    import bitsandbytes as bnb

    p = bnb.nn.Params4bit(weight.detach(), requires_grad=False, quant_type="nf4", blocksize=BLOCKSIZE)
    return p._quantize(weight.device)


def dequantize(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` rounded through NF4 and back (same dtype and device)."""
    import bitsandbytes.functional as BF

    p = quantize(weight)
    return BF.dequantize_4bit(p.data, p.quant_state).to(weight.dtype)


class NF4Linear(nn.Module):
    """y = x dequant(W4)^T (+ (alpha/r) x A^T B^T with adapters): the names of the module it
    replaces (``weight``, ``lora_a``, ``lora_b``), so adapters keep their optimizer and init names."""

    def __init__(self, source: nn.Module) -> None:
        super().__init__()
        weight = source.weight
        assert isinstance(weight, torch.Tensor)
        self.weight = quantize(weight)
        self.out_features, self.in_features = weight.shape
        self.lora = isinstance(source, LoRALinear)
        if self.lora:
            assert isinstance(source, LoRALinear)
            self.lora_a, self.lora_b, self.scale = source.lora_a, source.lora_b, source.scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import bitsandbytes as bnb

        y = bnb.matmul_4bit(x, self.weight.t(), quant_state=self.weight.quant_state)
        if self.lora:
            y = torch.add(y, F.linear(F.linear(x, self.lora_a), self.lora_b), alpha=self.scale)
        return y


def _block_linears(model: Transformer):
    # through any checkpoint wrapper around the blocks
    for parent in [m for m in model.modules() if isinstance(m, (Attention, FeedForward))]:
        for name, child in list(parent.named_children()):
            if isinstance(child, (nn.Linear, LoRALinear)):
                yield parent, name, child


@torch.no_grad()
def apply(model: Transformer, quant: str) -> None:
    """``quant=nf4``: swap each block's linear for an NF4Linear; ``nf4_dense``: round its weight through
    NF4 in place (the reference). Called after the weights are initialised, before FSDP/DDP."""
    for parent, name, child in _block_linears(model):
        if quant == "nf4":
            setattr(parent, name, NF4Linear(child))
        else:
            assert quant == "nf4_dense", quant
            child.weight.copy_(dequantize(child.weight))
