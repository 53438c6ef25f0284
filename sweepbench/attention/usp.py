"""USP (Fang & Zhao 2024): Ulysses inside groups of ranks x ring attention across the groups.

The W ranks form R = W/u groups of u consecutive ranks (u = ``usp_degree(W)``: on a node of 4 or 8
GPUs, Ulysses' all-to-alls stay on the fast links and only the ring's point-to-point transfers cross
groups). Inside a group an all-to-all turns each rank's tokens for all heads into the group's tokens
for H/u heads; the ``usp`` placement makes those gathered tokens ring rank i's zigzag shard, so the
zigzag ring (dense) or the dilated engine (dilated) runs across the groups, rank j of every group
forming one ring over its heads. A second all-to-all brings the output back. Heads must divide by
u; kv heads travel as they are when u divides them, else expanded first. At u > 1 the ranks must
be the whole default group (the subgroups are made over it, see ``Comm.split``)."""

from __future__ import annotations

from typing import Any

import torch

from sweepbench.attention.comm import Comm
from sweepbench.attention.dilated import dilated_attention
from sweepbench.attention.registry import usp_degree
from sweepbench.attention.ring import ring_attention
from sweepbench.attention.ulysses import to_heads, to_sequence


def usp_comms(comm: Comm) -> tuple[Comm, Comm]:
    """(this rank's Ulysses group, this rank's ring across the groups); ``comm`` must span the
    default group (``Comm.split``)."""
    u, w = usp_degree(comm.size), comm.size
    return (
        comm.split([list(range(i, i + u)) for i in range(0, w, u)]),
        comm.split([list(range(j, w, u)) for j in range(u)]),
    )


def usp(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> torch.Tensor:
    comm: Comm = kw["comm"]
    if usp_degree(comm.size) == 1:  # W <= 3: no group to split heads over, a plain zigzag ring
        group, ring = type(comm).solo(), comm
    else:
        group, ring = usp_comms(comm)
    qh, kh, vh = to_heads(q, k, v, group) if group.size > 1 else (q, k, v)
    if kw["pattern"] == "dilated":
        out = dilated_attention(
            qh,
            kh,
            vh,
            comm=ring,
            causal=kw["causal"],
            scale=kw["scale"],
            backend=kw["backend"],
            placement="zigzag",
            seq_len=kw["seq_len"],
            branches=kw["branches"],
            head_base=group.rank * qh.shape[1],
        )
    else:
        out = ring_attention(
            qh,
            kh,
            vh,
            comm=ring,
            causal=kw["causal"],
            scale=kw["scale"],
            backend=kw["backend"],
            placement="zigzag",
            overlap=True,
        )
    return to_sequence(out, group) if group.size > 1 else out
