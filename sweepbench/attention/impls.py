"""The registered implementations' entry points: one signature, dense or dilated.

``(q, k, v, *, comm, causal, scale, backend, pattern, branches, seq_len) -> out``, with q
(B, H, l, D) and k, v (B, kv_heads, l, D) holding this rank's tokens in the impl's placement and
``seq_len`` the whole sequence (W * l)."""

from __future__ import annotations

from typing import Any

import torch

from sweepbench.attention.allgather import allgather_attention
from sweepbench.attention.dilated import dilated_attention
from sweepbench.attention.ring import ring_attention
from sweepbench.attention.ulysses import to_heads, to_sequence


def _dilated(q, k, v, *, placement: str, exchange: str, **kw: Any) -> torch.Tensor:
    return dilated_attention(
        q,
        k,
        v,
        comm=kw["comm"],
        causal=kw["causal"],
        scale=kw["scale"],
        backend=kw["backend"],
        placement=placement,
        seq_len=kw["seq_len"],
        branches=kw["branches"],
        exchange=exchange,
    )


def _ring(q, k, v, kw: dict[str, Any], *, placement: str, overlap: bool, grads_in_input_dtype: bool = False):
    return ring_attention(
        q,
        k,
        v,
        comm=kw["comm"],
        causal=kw["causal"],
        scale=kw["scale"],
        backend=kw["backend"],
        placement=placement,
        overlap=overlap,
        grads_in_input_dtype=grads_in_input_dtype,
    )


def ring(q, k, v, **kw: Any) -> torch.Tensor:
    if kw["pattern"] == "dilated":  # LongNet's distribution: whole segments local, a spanning one among its ranks
        return _dilated(q, k, v, placement="contiguous", exchange="covering", **kw)
    return _ring(q, k, v, kw, placement="zigzag", overlap=True)


def ring_lp(q, k, v, **kw: Any) -> torch.Tensor:
    return _ring(q, k, v, kw, placement="zigzag", overlap=True, grads_in_input_dtype=True)


def ring_naive(q, k, v, **kw: Any) -> torch.Tensor:
    if kw["pattern"] == "dilated":  # the reference code's distribution: contiguous, gathered over every rank
        return _dilated(q, k, v, placement="contiguous", exchange="group", **kw)
    return _ring(q, k, v, kw, placement="contiguous", overlap=False)


def allgather(q, k, v, **kw: Any) -> torch.Tensor:
    if kw["pattern"] == "dilated":  # zigzag, the sparse K/V of long segments gathered over every rank
        return _dilated(q, k, v, placement="zigzag", exchange="group", **kw)
    return allgather_attention(
        q, k, v, comm=kw["comm"], causal=kw["causal"], scale=kw["scale"], backend=kw["backend"], placement="zigzag"
    )


def ulysses(q, k, v, **kw: Any) -> torch.Tensor:
    from sweepbench.attention.ops import LocalAttention, full_blocks

    comm = kw["comm"]
    qh, kh, vh = to_heads(q, k, v, comm)
    if kw["pattern"] == "dilated":
        out = dilated_attention(
            qh,
            kh,
            vh,
            comm=type(comm).solo(),
            causal=kw["causal"],
            scale=kw["scale"],
            backend=kw["backend"],
            placement="contiguous",
            seq_len=kw["seq_len"],
            branches=kw["branches"],
            head_base=comm.rank * qh.shape[1],
        )
    else:
        out = LocalAttention.apply(qh, kh, vh, kw["backend"], full_blocks(qh.shape[2], kw["causal"]), kw["scale"])
    return to_sequence(out, comm)
