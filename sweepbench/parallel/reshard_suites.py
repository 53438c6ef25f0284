"""The cases of the reshard benchmark, and the suites that list them.

A case moves one tensor from a source mesh to a destination mesh on disjoint ranks: the source
mesh holds ranks ``[0, S)``, the destination mesh ``[S, S + D)`` (with ``benchmark.overlap=true``
the destination mesh starts at rank 0 instead and shares ranks with the source). Its name says everything but
the tensor's size, ``<src mesh>_<src spec>_to_<dst mesh>_<dst spec>``: a mesh is its sizes joined
by ``x`` (``4``, ``2x2``, ``1x4``), a spec Alpa's per-dim ``R`` / ``S<mesh axes>`` (``S0R``,
``RS1``, ``S01R``); e.g. ``2x2_S0R_to_1x4_RS1``. The same grammar writes the ``custom`` suite's
cases on the command line.

A suite is a registered function: the benchmark config -> its cases. Each case's tensor shape is
derived from ``tensor_bytes``: as close to a square (cube, ...) as the splits allow, every dim a
multiple of the number of parts either side splits it into."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any, Callable

from sweepbench.core import Registry
from sweepbench.parallel import DeviceMesh, Layout, parse_spec, tensor_layout
from sweepbench.parallel.specs import DTYPES, dtype_name

_MESH = r"[1-9][0-9]*(?:x[1-9][0-9]*)*"
_SPEC = r"(?:R|S[0-9]+)+"
_CASE = re.compile(rf"({_MESH})_({_SPEC})_to_({_MESH})_({_SPEC})")
CASE_GRAMMAR = (
    "<src mesh>_<src spec>_to_<dst mesh>_<dst spec>, e.g. 2x2_S0R_to_1x4_RS1 "
    "(mesh: sizes joined by x; spec: R or S<mesh axes> per tensor dim)"
)


def mesh_str(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape))


@dataclass(frozen=True)
class Case:
    """One tensor from ``src_mesh`` (ranks [0, S)) to ``dst_mesh`` (ranks [S, S + D), or [0, D)
    when ``overlap``)."""

    src_mesh: tuple[int, ...]
    src_spec: str
    dst_mesh: tuple[int, ...]
    dst_spec: str
    overlap: bool = False

    @property
    def name(self) -> str:
        return f"{mesh_str(self.src_mesh)}_{self.src_spec}_to_{mesh_str(self.dst_mesh)}_{self.dst_spec}"

    @property
    def src_ranks(self) -> range:
        return range(math.prod(self.src_mesh))

    @property
    def dst_ranks(self) -> range:
        s = 0 if self.overlap else math.prod(self.src_mesh)
        return range(s, s + math.prod(self.dst_mesh))

    @property
    def world(self) -> int:
        return max(self.src_ranks.stop, self.dst_ranks.stop)

    def parts(self, dim: int) -> int:
        """Number of parts either side splits ``dim`` into, lcm'd: every dim of the tensor is a
        multiple of it. (Axes beyond a mesh count 1 here; tensor_layout reports them.)"""

        def split(mesh: tuple[int, ...], spec: str) -> int:
            axes = parse_spec(spec)[dim]
            return math.prod(mesh[a] if a < len(mesh) else 1 for a in axes)

        return math.lcm(split(self.src_mesh, self.src_spec), split(self.dst_mesh, self.dst_spec))

    def shape(self, tensor_bytes: int, dtype: str) -> tuple[int, ...]:
        """The tensor of about ``tensor_bytes`` (never more) this case moves."""
        ndim = len(parse_spec(self.dst_spec))
        itemsize = DTYPES[dtype_name(dtype)]
        divs = [self.parts(d) for d in range(ndim)]
        rem, dims = tensor_bytes // itemsize, []
        for d in range(ndim - 1):
            side = rem ** (1 / (ndim - d))
            dims.append(max(divs[d], round(side / divs[d]) * divs[d]))
            rem //= dims[-1]
        dims.append(rem // divs[-1] * divs[-1])
        if dims[-1] == 0:
            need = math.prod(divs) * itemsize
            raise ValueError(
                f"benchmark.tensor_bytes={tensor_bytes} is too small for case {self.name} "
                f"(it splits a {dtype} tensor {'x'.join(map(str, divs))} ways: "
                f"at least {need} bytes)"
            )
        return tuple(dims)

    def layouts(self, shape: tuple[int, ...], dtype: str) -> tuple[Layout, Layout]:
        return (
            tensor_layout(shape, DeviceMesh.of(self.src_ranks, self.src_mesh), self.src_spec, dtype=dtype),
            tensor_layout(shape, DeviceMesh.of(self.dst_ranks, self.dst_mesh), self.dst_spec, dtype=dtype),
        )


def parse_case(text: str, *, key: str) -> Case:
    m = _CASE.fullmatch(str(text))
    if not m:
        raise ValueError(f"{key} contains {text!r}: write {CASE_GRAMMAR}")
    src_mesh, src_spec, dst_mesh, dst_spec = m.groups()
    case = Case(tuple(map(int, src_mesh.split("x"))), src_spec, tuple(map(int, dst_mesh.split("x"))), dst_spec)
    if len(parse_spec(src_spec)) != len(parse_spec(dst_spec)):
        raise ValueError(
            f"{key} contains {text!r}: source spec {src_spec} and destination spec {dst_spec} "
            f"have different numbers of tensor dims"
        )
    return case


# ---------------------------------------------------------------------------- suites

Suite = Callable[[Any], list[Case]]
SUITES: Registry[Suite] = Registry("reshard suite")


@SUITES.register("one_to_m")
def one_to_m(b: Any) -> list[Case]:
    """Alpa's 1-to-m: one source rank holding the whole tensor to a 1-D mesh of m ranks, for each
    m in ``benchmark.m`` and each destination spec in ``benchmark.dst_specs`` (``RR`` is the
    broadcast; ``S0R`` row shards; ``RS0`` column shards, strided). A spec that splits nothing on
    a mesh of one rank is the same case as ``RR`` there, and is listed once."""
    sizes = list(b.m)
    if not sizes or any(not isinstance(x, int) or x < 1 for x in sizes):
        raise ValueError(f"benchmark.m={sizes} must be a non-empty list of destination mesh sizes >= 1")
    specs = list(b.dst_specs)
    if not specs:
        raise ValueError("benchmark.dst_specs=[] must list at least one destination spec, e.g. [RR, S0R]")
    for spec in specs:
        try:
            parse_spec(str(spec))
        except ValueError as err:
            raise ValueError(f"benchmark.dst_specs contains {spec!r}: {err}") from None
    return [Case((1,), "R" * len(parse_spec(spec)), (m,), str(spec)) for m in sizes for spec in specs]


@SUITES.register("n_to_m")
def n_to_m(b: Any) -> list[Case]:
    """Meshes of several ranks on both sides, of different sizes and shapes, with n =
    ``benchmark.mesh_ranks`` and h = n/2 (shown for n = 4): sharded on different dims (4_S0R_to_4_RS0),
    a mesh growing (2_S0R_to_4_S0R) or shrinking (4_S0R_to_2_S0R), sharded to replicated on a
    bigger mesh (2_S0R_to_4_RR: each byte fans out to every destination rank), partially replicated
    both sides (2x2_S0R_to_2x2_RS1), fully sharded 2-D to replicated 1-D (2x2_S01R_to_4_RR),
    partially replicated to sharded on the other dim and mesh shape (2x2_RS0_to_1x4_S1R), and
    replicated to fully sharded (2x2_RR_to_2x2_S0S1: every source rank holds everything, so
    ``balance`` decides who sends). At most 2n ranks."""
    n = b.mesh_ranks
    if not isinstance(n, int) or n < 2 or n % 2:
        raise ValueError(
            f"benchmark.mesh_ranks={n} must be an even number >= 2 "
            f"(n_to_m uses meshes of mesh_ranks and mesh_ranks/2 ranks)"
        )
    h, grid = n // 2, (2, n // 2)
    return [
        Case((n,), "S0R", (n,), "RS0"),
        Case((h,), "S0R", (n,), "S0R"),
        Case((n,), "S0R", (h,), "S0R"),
        Case((h,), "S0R", (n,), "RR"),
        Case(grid, "S0R", grid, "RS1"),
        Case(grid, "S01R", (n,), "RR"),
        Case(grid, "RS0", (1, n), "S1R"),
        Case(grid, "RR", grid, "S0S1"),
    ]


@SUITES.register("custom")
def custom(b: Any) -> list[Case]:
    """The cases named in ``benchmark.cases`` (the case-name grammar above)."""
    if not b.cases:
        raise ValueError(f"benchmark.suite=custom needs benchmark.cases, a list of {CASE_GRAMMAR}")
    return [parse_case(text, key="benchmark.cases") for text in b.cases]


# ---------------------------------------------------------------------------- resolving


@dataclass(frozen=True)
class ResolvedCase:
    case: Case
    shape: tuple[int, ...]
    src: Layout
    dst: Layout

    @property
    def name(self) -> str:
        return self.case.name


def suite_cases(b: Any) -> list[ResolvedCase]:
    """The suite's cases with their shapes and layouts, checked (ValueError naming the bad value)
    and listed once each: a case that lays the tensor out exactly as an earlier one is dropped."""
    SUITES.check(b.suite, key="benchmark.suite")
    if b.dtype not in DTYPES:
        raise ValueError(f"benchmark.dtype={b.dtype!r}; valid: {', '.join(DTYPES)}")
    if b.tensor_bytes < 1:
        raise ValueError(f"benchmark.tensor_bytes={b.tensor_bytes} must be >= 1")
    out, seen = [], set()
    for case in SUITES.get(b.suite)(b):
        case = replace(case, overlap=bool(b.overlap))
        shape = case.shape(b.tensor_bytes, b.dtype)
        try:
            src, dst = case.layouts(shape, b.dtype)
        except ValueError as err:
            raise ValueError(f"benchmark.suite={b.suite}: case {case.name}: {err}") from None
        effect = tuple((r, tuple(sorted(layout.shards(r).items()))) for layout in (src, dst) for r in layout.ranks)
        if effect not in seen:
            seen.add(effect)
            out.append(ResolvedCase(case, shape, src, dst))
    return out
