"""Boxes (per-dim half-open ranges), pieces and block splits.

A *box* is a tuple of ``(start, stop)`` per tensor dim.  A *piece* says that the
elements of ``global_box`` of the full tensor live at ``local_box`` of a rank's
local shard tensor (both boxes have the same extent).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

Box = tuple[tuple[int, int], ...]


def full_box(shape: tuple[int, ...]) -> Box:
    return tuple((0, n) for n in shape)


def box_shape(box: Box) -> tuple[int, ...]:
    return tuple(b - a for a, b in box)


def box_numel(box: Box) -> int:
    return math.prod(box_shape(box))


def box_slices(box: Box) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in box)


def intersect(a: Box, b: Box) -> Box | None:
    """Intersection of two boxes, or None when empty."""
    out = tuple((max(x0, y0), min(x1, y1)) for (x0, x1), (y0, y1) in zip(a, b, strict=True))
    return out if all(lo < hi for lo, hi in out) else None


def contains(outer: Box, inner: Box) -> bool:
    return all(a0 <= b0 and b1 <= a1 for (a0, a1), (b0, b1) in zip(outer, inner, strict=True))


@dataclass(frozen=True)
class Piece:
    """``global_box`` of the full tensor is stored at ``local_box`` of the local shard."""

    global_box: Box
    local_box: Box

    def to_local(self, sub: Box) -> Box:
        """Translate a global sub-box of ``global_box`` into local coordinates."""
        return tuple(
            (l0 + s0 - g0, l0 + s1 - g0)
            for (g0, _), (l0, _), (s0, s1) in zip(self.global_box, self.local_box, sub, strict=True)
        )


@dataclass(frozen=True)
class DimSplit:
    """Split dim ``dim`` into ``parts``: the dim is a concatenation of ``blocks``
    (e.g. fused q|k|v rows) and each block is split evenly, part ``index`` keeping
    its slice of every block, concatenated in block order in the local tensor."""

    dim: int
    blocks: tuple[int, ...]
    parts: int
    index: int

    def segments(self) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        """[(global range, local range)] for this part along ``dim``."""
        out = []
        goff = loff = 0
        for b in self.blocks:
            step = b // self.parts
            lo = goff + self.index * step
            out.append(((lo, lo + step), (loff, loff + step)))
            goff += b
            loff += step
        return out

    def local_size(self) -> int:
        return sum(b // self.parts for b in self.blocks)


def pieces_from_splits(
    shape: tuple[int, ...], splits: tuple[DimSplit, ...]
) -> tuple[tuple[Piece, ...], tuple[int, ...]]:
    """Pieces and local shape of one shard described by at most one split per dim."""
    by_dim = {s.dim: s for s in splits}
    if len(by_dim) != len(splits):
        raise ValueError(f"more than one split on the same dim: {splits}")
    per_dim: list[list[tuple[tuple[int, int], tuple[int, int]]]] = []
    local_shape = []
    for d, n in enumerate(shape):
        s = by_dim.get(d)
        if s is None:
            per_dim.append([((0, n), (0, n))])
            local_shape.append(n)
            continue
        if sum(s.blocks) != n or any(b % s.parts for b in s.blocks) or not 0 <= s.index < s.parts:
            raise ValueError(f"split {s} does not evenly divide dim {d} of size {n}")
        per_dim.append(s.segments())
        local_shape.append(s.local_size())
    pieces = tuple(
        Piece(tuple(g for g, _ in combo), tuple(loc for _, loc in combo)) for combo in itertools.product(*per_dim)
    )
    return pieces, tuple(local_shape)
