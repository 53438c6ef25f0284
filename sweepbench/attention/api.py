"""``cp_attention`` and ``cp_context``: the engine's entry for callers (see the package docstring)."""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Any, ContextManager, Sequence

import torch
import torch.distributed as dist

from sweepbench.attention.comm import Comm
from sweepbench.attention.dilated import branches_of
from sweepbench.attention.ops import SDPA_BACKENDS, backends_for, get_backend
from sweepbench.attention.registry import get_impl

# fastest first, where several can run (on an H200 cuDNN beats flash by ~1.65x: t1_backends in the run behind docs/results/attention_h200x1.md)
PREFERENCE = ("cudnn", "flash", "efficient", "cpu_flash")


def default_sdpa_backend(device: torch.device, dtype: torch.dtype) -> str:
    usable = backends_for(device.type, dtype)
    if "cudnn" in usable and not (torch.backends.cudnn.is_available() and torch.backends.cuda.cudnn_sdp_enabled()):
        usable.remove("cudnn")
    for name in PREFERENCE:
        if name in usable:
            return name
    raise ValueError(f"no SDPA backend runs {dtype} on {device.type}; registered: {', '.join(SDPA_BACKENDS)}")


def cp_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    impl: str = "ring",
    group: dist.ProcessGroup | None = None,
    causal: bool = True,
    scale: float | None = None,
    sdpa_backend: str | None = None,
    pattern: str = "dense",
    segment_lengths: Sequence[int] = (),
    dilation_rates: Sequence[int] = (),
    comm: Comm | None = None,
) -> torch.Tensor:
    """Context-parallel attention of this rank's queries over the whole sequence (autograd-aware)."""
    comm = comm or Comm(group)
    backend = get_backend(sdpa_backend or default_sdpa_backend(q.device, q.dtype))
    return get_impl(impl).load()(
        q,
        k,
        v,
        comm=comm,
        causal=causal,
        scale=scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]),
        backend=backend,
        pattern=pattern,
        branches=branches_of(list(segment_lengths), list(dilation_rates)),
        seq_len=q.shape[2] * comm.size,
    )


def cp_context(impl: str, *, comm: Comm, seq_len: int, device: torch.device, **options: Any) -> ContextManager:
    """The context an impl needs around forward and backward (torch_cp), else a null context."""
    enter = get_impl(impl).load_context()
    return enter(comm, seq_len=seq_len, device=device, **options) if enter else nullcontext()
