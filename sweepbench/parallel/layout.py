"""Layouts: which slice of which parameter every rank owns.

A :class:`Layout` is params + the global ranks holding them + a *placement*
(how rank index ``i`` of ``ranks`` maps to shards).  Two placements exist:

* :class:`ModelPlacement` (this file): Megatron-style tp/pp/ep/dp/cp of a model.
* :class:`~sweepbench.parallel.mesh.MeshPlacement`: one tensor sharded over a
  device mesh by an Alpa-style spec ("S0R", "RS1", ...).

Rank order inside a model layout (default ``order=("tp", "cp", "ep", "dp", "pp")``,
Megatron's): ``tp`` varies fastest, then ``cp``, ``ep``, ``dp``, and ``pp``
slowest, so ``ranks[i]`` has ``tp = i % tp``, ``cp = i // tp % cp``, ... and
``pp = i // (tp*cp*ep*dp)``.  ``ep`` is an extra axis: dense weights are
replicated across it, expert weights split along the expert dim.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .boxes import Box, DimSplit, Piece, pieces_from_splits
from .rules import RULES
from .specs import ModelShape, ParamSpec, model_param_specs

AXES = ("tp", "cp", "ep", "dp", "pp")


class Placement(Protocol):
    @property
    def world(self) -> int: ...

    def splits(self, index: int, spec: ParamSpec) -> tuple[DimSplit, ...] | None:
        """Splits of ``spec`` kept by rank index ``index``, or None if it holds none of it."""
        ...

    def describe(self) -> str: ...


@dataclass(frozen=True)
class ShardInfo:
    pieces: tuple[Piece, ...]
    local_shape: tuple[int, ...]


@dataclass(frozen=True)
class Layout:
    """Params laid out over ``ranks`` (global ranks) by ``placement``. Hashable."""

    params: tuple[ParamSpec, ...]
    ranks: tuple[int, ...]
    placement: Any  # a Placement; Any so the frozen dataclass stays hashable/comparable
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.ranks) != self.placement.world:
            raise ValueError(
                f"layout {self.placement.describe()} needs {self.placement.world} ranks, "
                f"got {len(self.ranks)}: {list(self.ranks)}"
            )
        if len(set(self.ranks)) != len(self.ranks) or min(self.ranks, default=0) < 0:
            raise ValueError(f"layout ranks must be distinct non-negative ints, got {list(self.ranks)}")
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError("layout params must have distinct names")
        object.__setattr__(self, "_hash", hash((self.params, self.ranks, self.placement)))

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"Layout({self.describe()}, {len(self.params)} params)"

    def describe(self) -> str:
        r = self.ranks
        contiguous = r == tuple(range(r[0], r[0] + len(r)))
        where = f"ranks {r[0]}-{r[-1]}" if contiguous and len(r) > 1 else f"ranks {list(r)}"
        return f"{self.placement.describe()} on {where}"

    def param(self, name: str) -> ParamSpec:
        return _param_index(self)[name]

    def index(self, rank: int) -> int:
        try:
            return self.ranks.index(rank)
        except ValueError:
            raise ValueError(f"rank {rank} is not in layout {self.describe()}") from None

    def shards(self, rank: int) -> Mapping[str, ShardInfo]:
        """param name -> pieces + local shape for every param ``rank`` holds (empty if none)."""
        return _shards(self, rank) if rank in self.ranks else {}

    def owners(self, name: str) -> tuple[tuple[Box, tuple[tuple[int, Box], ...]], ...]:
        """Distinct global boxes of ``name`` with their holders ``(rank, local box)``, in
        layout order.  The boxes partition the full tensor."""
        return _owners(self, name)

    def local_bytes(self, rank: int) -> int:
        return sum(math.prod(s.local_shape) * self.param(n).itemsize for n, s in self.shards(rank).items())


@functools.lru_cache(maxsize=256)
def _param_index(layout: Layout) -> dict[str, ParamSpec]:
    return {p.name: p for p in layout.params}


@functools.lru_cache(maxsize=4096)
def _shards(layout: Layout, rank: int) -> dict[str, ShardInfo]:
    index = layout.ranks.index(rank)
    out = {}
    for spec in layout.params:
        splits = layout.placement.splits(index, spec)
        if splits is not None:
            pieces, local_shape = pieces_from_splits(spec.shape, splits)
            out[spec.name] = ShardInfo(pieces, local_shape)
    return out


@functools.lru_cache(maxsize=4096)
def _owners(layout: Layout, name: str) -> tuple[tuple[Box, tuple[tuple[int, Box], ...]], ...]:
    layout.param(name)  # raises KeyError on unknown names
    boxes: dict[Box, list[tuple[int, Box]]] = {}
    for rank in layout.ranks:
        info = layout.shards(rank).get(name)
        for piece in info.pieces if info else ():
            boxes.setdefault(piece.global_box, []).append((rank, piece.local_box))
    return tuple((box, tuple(holders)) for box, holders in boxes.items())


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class ModelPlacement:
    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1
    cp: int = 1
    num_layers: int = 1
    order: tuple[str, ...] = AXES

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.ep * self.dp * self.cp

    def coords(self, index: int) -> dict[str, int]:
        out = {}
        for axis in self.order:
            size = getattr(self, axis)
            out[axis] = index % size
            index //= size
        return out

    def stage(self, spec: ParamSpec) -> int:
        if spec.stage == "first":
            return 0
        if spec.stage == "last":
            return self.pp - 1
        assert spec.layer is not None
        return spec.layer // (self.num_layers // self.pp)

    def splits(self, index: int, spec: ParamSpec) -> tuple[DimSplit, ...] | None:
        c = self.coords(index)
        if self.stage(spec) != c["pp"]:
            return None
        return RULES.get(spec.rule)(spec, {"tp": (c["tp"], self.tp), "ep": (c["ep"], self.ep)})

    def describe(self) -> str:
        return f"tp{self.tp}-pp{self.pp}-ep{self.ep}-dp{self.dp}-cp{self.cp}"


def _check_degree(axis: str, value: int, what: str, n: int, valid: Sequence[int]) -> None:
    if n % value:
        raise ValueError(f"{axis}={value} must divide {what}={n} (valid {axis}: {', '.join(map(str, valid))})")


def model_layout(
    model: Any,
    ranks: Sequence[int] | None = None,
    *,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    dp: int = 1,
    cp: int = 1,
    order: Sequence[str] = AXES,
) -> Layout:
    """Layout of a model config (see ``ModelShape.from_config``) over global ``ranks``
    (default ``range(tp*pp*ep*dp*cp)``).  Raises ValueError naming the bad degree."""
    m = ModelShape.from_config(model)
    degrees = {"tp": tp, "pp": pp, "ep": ep, "dp": dp, "cp": cp}
    for axis, value in degrees.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{axis}={value!r} must be a positive integer")
    if sorted(order) != sorted(AXES):
        raise ValueError(f"order={list(order)} must be a permutation of {list(AXES)}")
    tp_ok = [
        d
        for d in _divisors(m.num_heads)
        if m.num_kv_heads % d == 0 and m.ffn_hidden_size % d == 0 and m.vocab_size % d == 0
    ]
    for what, n in (
        ("num_heads", m.num_heads),
        ("num_kv_heads", m.num_kv_heads),
        ("ffn_hidden_size", m.ffn_hidden_size),
        ("vocab_size", m.vocab_size),
    ):
        _check_degree("tp", tp, what, n, tp_ok)
    _check_degree("pp", pp, "num_layers", m.num_layers, _divisors(m.num_layers))
    if ep > 1 and not m.is_moe:
        raise ValueError(f"ep={ep} needs an MoE model but {m.name!r} is dense (num_experts=0): use ep=1")
    if m.is_moe:
        _check_degree("ep", ep, "num_experts", m.num_experts, _divisors(m.num_experts))
    placement = ModelPlacement(tp, pp, ep, dp, cp, m.num_layers, tuple(order))
    rank_tuple = tuple(range(placement.world)) if ranks is None else tuple(int(r) for r in ranks)
    return Layout(model_param_specs(m), rank_tuple, placement)
