"""Where each token lives: the sequence placements of context parallelism.

``contiguous``: rank r holds chunk r of W equal chunks. ``zigzag`` (head-tail): the sequence is
cut into 2W chunks and rank r holds chunks r and 2W-1-r, so that under a causal mask every rank
has the same amount of work (an early chunk, cheap, with a late one, expensive). A rank keeps its
chunks concatenated in that order along the sequence dim. ``usp``: zigzag over groups of ranks
(see ``_usp``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from sweepbench.attention.registry import usp_degree
from sweepbench.core import Registry

# placement -> (rank, W) -> the chunk indices the rank holds
PLACEMENTS: Registry[Callable[[int, int], list[int]]] = Registry("placement", ordered=True)


@PLACEMENTS.register("contiguous")
def _contiguous(rank: int, world_size: int) -> list[int]:
    return [rank]


@PLACEMENTS.register("zigzag")
def _zigzag(rank: int, world_size: int) -> list[int]:
    return [rank, 2 * world_size - 1 - rank]


@PLACEMENTS.register("usp")
def _usp(rank: int, world_size: int) -> list[int]:
    """Ulysses groups of u = usp_degree(W) consecutive ranks x a zigzag ring of R = W/u groups: the
    sequence is cut into 2W pieces (each of the ring's 2R zigzag chunks into u); group i's ranks
    split its zigzag share (chunks i and 2R-1-i) in order, two pieces each, so that the group's
    tokens gathered in rank order (Ulysses' all-to-all) are exactly ring rank i's zigzag shard."""
    u = usp_degree(world_size)
    ring, (i, j) = world_size // u, divmod(rank, u)
    share = [i * u + p for p in range(u)] + [(2 * ring - 1 - i) * u + p for p in range(u)]
    return share[2 * j : 2 * j + 2]


def num_chunks(placement: str, world_size: int) -> int:
    """How many equal chunks the whole sequence is cut into."""
    return world_size * len(chunks_of(placement, 0, world_size))


def chunks_of(placement: str, rank: int, world_size: int) -> list[int]:
    """The chunk indices rank ``rank`` holds, in its local order."""
    return PLACEMENTS.get(placement)(rank, world_size)


@dataclass(frozen=True)
class Span:
    """A local chunk: where it sits in the rank's buffer and in the whole sequence."""

    local_start: int
    global_start: int
    length: int


def spans(placement: str, rank: int, world_size: int, seq_len: int) -> list[Span]:
    """The local chunks of ``rank`` for a whole sequence of ``seq_len`` tokens."""
    n = num_chunks(placement, world_size)
    assert seq_len % n == 0, f"seq_len={seq_len} is not divisible by {n} chunks"
    c = seq_len // n
    return [Span(i * c, k * c, c) for i, k in enumerate(chunks_of(placement, rank, world_size))]


def positions(placement: str, rank: int, world_size: int, seq_len: int) -> torch.Tensor:
    """Global token positions of a rank's local tokens (for RoPE), in local order."""
    return torch.cat(
        [torch.arange(s.global_start, s.global_start + s.length) for s in spans(placement, rank, world_size, seq_len)]
    )


def shard_sequence(x: torch.Tensor, *, dim: int, rank: int, world_size: int, placement: str) -> torch.Tensor:
    """The part of the whole-sequence tensor ``x`` that ``rank`` holds (a new tensor)."""
    parts = x.chunk(num_chunks(placement, world_size), dim=dim)
    return torch.cat([parts[k] for k in chunks_of(placement, rank, world_size)], dim=dim)


def unshard_sequence(
    chunks_or_x: torch.Tensor | Sequence[torch.Tensor], *, dim: int, world_size: int, placement: str
) -> torch.Tensor:
    """Back to sequence order: from every rank's local tensor (a list, rank order) or from their
    concatenation along ``dim`` in rank order (what an all-gather gives)."""
    per_rank = (
        list(chunks_or_x) if not isinstance(chunks_or_x, torch.Tensor) else list(chunks_or_x.chunk(world_size, dim=dim))
    )
    assert len(per_rank) == world_size, f"{len(per_rank)} local tensors for {world_size} ranks"
    n = num_chunks(placement, world_size)
    ordered: list[torch.Tensor | None] = [None] * n
    for rank, local in enumerate(per_rank):
        mine = chunks_of(placement, rank, world_size)
        for k, part in zip(mine, local.chunk(len(mine), dim=dim)):
            ordered[k] = part
    return torch.cat(ordered, dim=dim)  # type: ignore[arg-type]
