"""The attention engine: ring, all-gather, Ulysses and torch's context parallelism, dense or
dilated (LongNet), verified against single-device references. Knows nothing of Hydra or sweeps.

The public API for context parallelism (what a training loop calls)::

    from sweepbench.attention import cp_attention, placement_of, shard_sequence, unshard_sequence

    placement = placement_of("ring")                       # "zigzag": rank r holds chunks r, 2W-1-r
    x_local = shard_sequence(x, dim=1, rank=r, world_size=W, placement=placement)  # tokens
    pos_local = shard_sequence(torch.arange(L), dim=0, rank=r, world_size=W, placement=placement)  # RoPE
    out = cp_attention(q, k, v, impl="ring", group=cp_group, causal=True)   # autograd-aware
    full = unshard_sequence(list_of_local_outputs, dim=2, world_size=W, placement=placement)

``cp_attention(q, k, v, *, impl="ring", group=None, causal=True, scale=None)``: q is
(batch, heads, local_seq, head_dim), k and v (batch, kv_heads, local_seq, head_dim), each rank of
``group`` (None: the default group) holding its tokens in ``placement_of(impl, pattern)`` order; returns the
local output, same shape as q. ``scale`` defaults to 1/sqrt(head_dim). Optional keyword-only
extras: ``sdpa_backend`` (a name in ``SDPA_BACKENDS``; default the fastest kind for the device),
``pattern="dilated"`` with ``segment_lengths``/``dilation_rates``, ``comm`` (a ``LocalComm`` to run
the schedule without communication). ``impl="torch_cp"`` (CUDA only) must be called inside
``cp_context("torch_cp", ...)`` covering forward and backward; the other impls need no context.

Names resolve lazily, so importing a torch-free part (``sweepbench.attention.registry``) stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "cp_attention": "sweepbench.attention.api",
    "cp_context": "sweepbench.attention.api",
    "default_sdpa_backend": "sweepbench.attention.api",
    "shard_sequence": "sweepbench.attention.placement",
    "unshard_sequence": "sweepbench.attention.placement",
    "positions": "sweepbench.attention.placement",
    "placement_of": "sweepbench.attention.registry",
    "IMPLS": "sweepbench.attention.registry",
    "SDPA_BACKENDS": "sweepbench.attention.ops",
    "Comm": "sweepbench.attention.comm",
    "LocalComm": "sweepbench.attention.comm",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'sweepbench.attention' has no attribute {name!r}")
