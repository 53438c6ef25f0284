"""What a scaling measurement of attention needs besides the implementations: inputs, the
single-device run (T1 and the reference), tolerances, the FLOP count and the device's peak."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from sweepbench.attention.comm import Comm
from sweepbench.attention.dilated import Branch, dilated_attention
from sweepbench.attention.ops import get_backend, sdpa_attention

# elementwise |got - want| <= atol + rtol * |want|; bf16/fp16 as TransformerEngine's CP tests
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-4, 1e-4),
    torch.bfloat16: (2.5e-2, 2.5e-2),
    torch.float16: (1e-2, 1e-2),
}
# half precision only: a few stray elements (at most this fraction, each within 4x the tolerance)
# are rounding at a different summation order over long sequences, not a wrong result
STRAY_FRACTION, STRAY_FACTOR = 1e-5, 4.0
# dense bf16/fp16 tensor-core peak of one GPU, TFLOP/s (SXM parts), by a substring of its name
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "B200": 2250.0}


@dataclass(frozen=True)
class Shape:
    batch: int
    heads: int
    kv_heads: int
    seq_len: int  # the whole sequence
    head_dim: int


def make_inputs(shape: Shape, *, dtype: torch.dtype, device: torch.device, seed: int) -> list[torch.Tensor]:
    """q, k, v and the output gradient of the whole sequence, the same on every rank."""
    g = torch.Generator(device=device).manual_seed(seed)
    b, h, kv, l, d = shape.batch, shape.heads, shape.kv_heads, shape.seq_len, shape.head_dim
    return [
        torch.randn(s, generator=g, device=device, dtype=dtype)
        for s in ((b, h, l, d), (b, kv, l, d), (b, kv, l, d), (b, h, l, d))
    ]


def single_device(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    backend: str,
    causal: bool,
    pattern: str,
    branches: Sequence[Branch],
) -> torch.Tensor:
    """The whole sequence on one device (T1, and the reference the distributed result must match)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    if pattern == "dilated":
        return dilated_attention(
            q,
            k,
            v,
            comm=Comm.solo(),
            causal=causal,
            scale=scale,
            backend=get_backend(backend),
            placement="contiguous",
            seq_len=q.shape[2],
            branches=tuple(branches),
        )
    return sdpa_attention(q, k, v, backend=backend, causal=causal, scale=scale)


def mismatch(name: str, got: torch.Tensor, want: torch.Tensor) -> str | None:
    """None if ``got`` matches ``want`` within the dtype's tolerance, else a one-line account."""
    atol, rtol = TOLERANCES[want.dtype]
    w = want.float()
    limit = w.abs().mul_(rtol).add_(atol)
    err = (got.float() - w).abs_()  # the error and the limit computed once each (fp32)
    del w
    bad = err > limit
    if not bad.any():
        return None
    num_bad = int(bad.sum())
    if (
        want.dtype != torch.float32
        and num_bad <= STRAY_FRACTION * bad.numel()
        and not (err > STRAY_FACTOR * limit).any()
    ):
        return None
    return (
        f"{name}: {num_bad} of {bad.numel()} elements off (max abs err "
        f"{err.max().item():.3g}, atol {atol}, rtol {rtol})"
    )


def attention_flops(shape: Shape, *, causal: bool, backward: bool, pattern: str, branches: Sequence[Branch]) -> float:
    """Matmul FLOPs: forward 4·B·H·D per (query, key) pair (QK^T and PV), causal counting half the
    pairs; backward 2.5x the forward (five matmuls to two), as FlashAttention counts."""
    if pattern == "dilated":  # per branch: L/w segments of (w/r)^2 pairs per head
        pairs = sum((shape.seq_len // br.segment) * (br.segment // br.rate) ** 2 for br in branches)
    else:
        pairs = shape.seq_len**2
    fwd = 4.0 * shape.batch * shape.heads * shape.head_dim * pairs * (0.5 if causal else 1.0)
    return fwd * (3.5 if backward else 1.0)


def peak_tflops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((p for key, p in PEAK_TFLOPS.items() if key in name), None)
