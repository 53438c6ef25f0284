"""Device meshes and Alpa/DTensor-style sharding specs for single-tensor layouts.

A spec says, per tensor dim, which mesh axes shard it: ``"S0R"`` = dim 0 split over
mesh axis 0, dim 1 replicated; ``"RS1"``; ``"S01R"`` = dim 0 split over mesh axes 0
and 1 (axis 0 major); ``"S1S0"``; ``"RR"``.  Equivalent sequence form: one entry per
dim, ``None`` (replicated), an axis int, or a sequence of axes.  Mesh ranks are laid
out row-major over ``mesh.shape``; dims sharded over several axes are split
``prod(sizes)`` ways with the part index row-major over the listed axes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from .boxes import DimSplit
from .layout import Layout
from .specs import ParamSpec, dtype_name

DimAxes = tuple[tuple[int, ...], ...]
SpecLike = str | Sequence[None | int | Sequence[int]]


@dataclass(frozen=True)
class DeviceMesh:
    ranks: tuple[int, ...]
    shape: tuple[int, ...]

    @classmethod
    def of(cls, ranks: Sequence[int], shape: Sequence[int] | None = None) -> DeviceMesh:
        r = tuple(int(x) for x in ranks)
        s = (len(r),) if shape is None else tuple(int(x) for x in shape)
        if math.prod(s) != len(r) or any(x < 1 for x in s):
            raise ValueError(f"mesh shape {s} does not fit {len(r)} ranks {list(r)}")
        return cls(r, s)

    def coords(self, index: int) -> tuple[int, ...]:
        out = []
        for size in reversed(self.shape):
            out.append(index % size)
            index //= size
        return tuple(reversed(out))


_TOKEN = re.compile(r"R|S\d+")


def parse_spec(spec: SpecLike) -> DimAxes:
    """``"S0R"`` -> ``((0,), ())``; sequences like ``[0, None]`` or ``[(0, 1)]`` accepted."""
    if isinstance(spec, str):
        tokens = _TOKEN.findall(spec)
        if "".join(tokens) != spec or not tokens:
            raise ValueError(f"bad sharding spec {spec!r}: use R or S<axes> per dim, e.g. 'S0R', 'RS1', 'S01R'")
        return tuple(() if t == "R" else tuple(int(c) for c in t[1:]) for t in tokens)
    out: list[tuple[int, ...]] = []
    for entry in spec:
        if entry is None:
            out.append(())
        elif isinstance(entry, int):
            out.append((entry,))
        else:
            out.append(tuple(int(a) for a in entry))
    return tuple(out)


def spec_str(dims: DimAxes) -> str:
    return "".join("S" + "".join(map(str, axes)) if axes else "R" for axes in dims)


@dataclass(frozen=True)
class MeshPlacement:
    mesh_shape: tuple[int, ...]
    dims: DimAxes

    @property
    def world(self) -> int:
        return math.prod(self.mesh_shape)

    def splits(self, index: int, spec: ParamSpec) -> tuple[DimSplit, ...]:
        coords = DeviceMesh(tuple(range(self.world)), self.mesh_shape).coords(index)
        out = []
        for dim, axes in enumerate(self.dims):
            parts, part = 1, 0
            for a in axes:
                parts, part = parts * self.mesh_shape[a], part * self.mesh_shape[a] + coords[a]
            if parts > 1:
                out.append(DimSplit(dim, (spec.shape[dim],), parts, part))
        return tuple(out)

    def describe(self) -> str:
        return f"mesh{'x'.join(map(str, self.mesh_shape))}:{spec_str(self.dims)}"


def tensor_layout(
    shape: Sequence[int],
    mesh: DeviceMesh | Sequence[int],
    spec: SpecLike,
    *,
    dtype: str = "float32",
    name: str = "tensor",
) -> Layout:
    """Layout of one tensor of ``shape`` sharded over ``mesh`` by ``spec``."""
    m = mesh if isinstance(mesh, DeviceMesh) else DeviceMesh.of(mesh)
    tshape = tuple(int(x) for x in shape)
    dims = parse_spec(spec)
    shown = spec if isinstance(spec, str) else spec_str(dims)
    if len(dims) != len(tshape):
        raise ValueError(f"spec {shown!r} has {len(dims)} dims but tensor shape {tshape} has {len(tshape)}")
    used = [a for axes in dims for a in axes]
    for a in used:
        if not 0 <= a < len(m.shape):
            raise ValueError(
                f"spec {shown!r} uses mesh axis {a} but mesh shape {m.shape} has axes 0..{len(m.shape) - 1}"
            )
    if len(set(used)) != len(used):
        raise ValueError(f"spec {shown!r} uses a mesh axis more than once")
    for d, axes in enumerate(dims):
        parts = math.prod(m.shape[a] for a in axes)
        if tshape[d] % parts:
            raise ValueError(
                f"spec {shown!r}: dim {d} of size {tshape[d]} cannot be split {parts} ways "
                f"over mesh axes {axes} of mesh shape {m.shape}"
            )
    param = ParamSpec(name, tshape, dtype_name(dtype))
    return Layout((param,), m.ranks, MeshPlacement(m.shape, dims))
