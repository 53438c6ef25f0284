"""Parameter and FLOP counts of the Llama-3-style decoder, in plain Python (no torch).

The driver uses these before any rank starts (memory estimate, validation), the job uses them for
MFU, and a test checks them against a hand count. The MFU numerator is torchtitan's:

    FLOPs/token = 6 * (N - N_embedding) + 6 * L * H * 2 * d_head * S

(6 = forward 2 + backward 4 per parameter and token; the second term is the attention score and
value matmuls, 2 * d_head * S per head and token, counted for the full S x S square as torchtitan
does, causal mask or not). With LoRA the frozen base weights have no weight gradient, so they
count 4 FLOPs per parameter and token instead of 6; the adapters count 6."""

from __future__ import annotations

from typing import Any

from sweepbench.parallel.specs import ModelShape


def shape_of(model: Any, *, num_layers: int | None = None) -> ModelShape:
    """The model's shape (``ModelShape``, the one type every engine reads a model as), at another
    depth where ``num_layers`` is given (a reduced-depth reference)."""
    return ModelShape.from_config(model).with_layers(num_layers)


def flops_per_token(shape: ModelShape, seq_len: int, *, lora_rank: int = 0) -> float:
    """Training FLOPs per token (torchtitan's formula; see the module docstring)."""
    n = shape.num_params(lora_rank=lora_rank) - shape.embedding_params()
    adapters = shape.num_layers * shape.lora_params(lora_rank)
    dense = 4 * (n - adapters) + 6 * adapters if lora_rank else 6 * n
    attention = 6 * shape.num_layers * shape.num_heads * 2 * shape.head_dim * seq_len
    return float(dense + attention)


def bytes_per_param(precision: str, *, trainable: bool) -> int:
    """Weights + gradient + AdamW's two moments, in the precision's storage dtypes."""
    if precision in ("bf16", "fp8"):  # fp8 keeps bf16 weights and states (float8 only inside the matmuls)
        return 2 + (2 + 2 + 2 if trainable else 0)
    return 4 + (4 + 4 + 4 if trainable else 0)  # fp32 and mixed keep fp32 weights and states
