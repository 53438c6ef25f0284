"""Straightforward single-device attention in explicit math (scores, masks, softmax), the check
the op-based paths are tested against. O(L^2) memory: for small sizes (tests, CPU jobs).

Dilated: each branch is a mask over the full score matrix (same segment, both tokens kept by the
head, causal); the branches are merged by their log-sum-exp, i.e. a softmax over the branches'
keys taken together (a key kept by two branches counts twice, as in LongNet's weighting)."""

from __future__ import annotations

from typing import Sequence

import torch


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    g = q.shape[1] // k.shape[1]
    return (q.float() @ k.repeat_interleave(g, dim=1).float().transpose(-1, -2)) * scale


def _values(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return v.repeat_interleave(q.shape[1] // v.shape[1], dim=1).float()


def _causal(n: int, device: torch.device) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def math_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float) -> torch.Tensor:
    """Dense attention in fp32 (returned in q's dtype)."""
    s = _scores(q, k, scale)
    if causal:
        s = s.masked_fill(~_causal(q.shape[2], q.device), float("-inf"))
    return (s.softmax(-1) @ _values(q, v)).to(q.dtype)


def branch_mask(
    seq_len: int, heads: int, segment: int, rate: int, *, causal: bool, device: torch.device
) -> torch.Tensor:
    """(heads, L, L): which key each query sees in branch (segment, rate)."""
    pos = torch.arange(seq_len, device=device)
    same = (pos[:, None] // segment) == (pos[None, :] // segment)
    mask = same & _causal(seq_len, device) if causal else same
    kept = (pos[None, :] % rate) == (torch.arange(heads, device=device)[:, None] % rate)  # (H, L)
    return mask[None] & kept[:, :, None] & kept[:, None, :]


def math_dilated_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool,
    scale: float,
    segment_lengths: Sequence[int],
    dilation_rates: Sequence[int],
) -> torch.Tensor:
    s, vals = _scores(q, k, scale), _values(q, v)
    l, h = q.shape[2], q.shape[1]
    # a large finite "minus infinity" keeps rows that a branch leaves empty finite (and their
    # gradients defined); their weight exp(lse_b - lse) is then exactly 0
    outs, lses, covered = [], [], torch.zeros(h, l, dtype=torch.bool, device=q.device)
    for w, r in zip(segment_lengths, dilation_rates):
        mask = branch_mask(l, h, w, r, causal=causal, device=q.device)
        masked = s.masked_fill(~mask, -1e30)
        outs.append(masked.softmax(-1) @ vals)
        lses.append(torch.logsumexp(masked, dim=-1))
        covered |= mask.any(-1)
    lse_all = torch.logsumexp(torch.stack(lses), dim=0)
    out = sum(torch.exp(lb - lse_all)[..., None] * ob for ob, lb in zip(outs, lses))
    return (out * covered[None, :, :, None]).to(q.dtype)
