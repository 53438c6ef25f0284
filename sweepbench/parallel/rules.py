"""Megatron-style sharding rules: parameter rule name -> the splits one rank keeps.

A rule gets the parameter spec and the rank's position on the ``tp`` and ``ep``
axes (``{"tp": (index, size), "ep": (index, size)}``) and returns the
:class:`DimSplit` per split dim (none = fully replicated).  Divisibility is
checked by the layout factories before rules run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from sweepbench.core import Registry

from .boxes import DimSplit
from .specs import ParamSpec

AxisPos = Mapping[str, tuple[int, int]]
Rule = Callable[[ParamSpec, AxisPos], tuple[DimSplit, ...]]

RULES: Registry[Rule] = Registry("sharding rule")


def _split(dim: int, blocks: tuple[int, ...], pos: tuple[int, int]) -> tuple[DimSplit, ...]:
    index, parts = pos
    return () if parts == 1 else (DimSplit(dim, blocks, parts, index),)


@RULES.register("replicated")
def replicated(spec: ParamSpec, pos: AxisPos) -> tuple[DimSplit, ...]:
    """Norms, router: every rank of the stage holds the whole tensor."""
    return ()


@RULES.register("column")
def column(spec: ParamSpec, pos: AxisPos) -> tuple[DimSplit, ...]:
    """Column-parallel linear [out, in]: split the output dim."""
    return _split(0, (spec.shape[0],), pos["tp"])


@RULES.register("row")
def row(spec: ParamSpec, pos: AxisPos) -> tuple[DimSplit, ...]:
    """Row-parallel linear [out, in] (o_proj, down): split the input dim."""
    return _split(1, (spec.shape[1],), pos["tp"])


@RULES.register("vocab")
def vocab(spec: ParamSpec, pos: AxisPos) -> tuple[DimSplit, ...]:
    """Vocab-parallel embedding / lm_head [vocab, hidden]: split the vocab dim."""
    return _split(0, (spec.shape[0],), pos["tp"])


@RULES.register("qkv")
def qkv(spec: ParamSpec, pos: AxisPos) -> tuple[DimSplit, ...]:
    """Fused [q | k | v] rows with GQA: each TP rank keeps whole q heads and its kv heads,
    i.e. three row ranges of the full tensor (tp must divide num_heads and num_kv_heads)."""
    d = spec.meta_value("head_dim")
    q, kv = spec.meta_value("num_heads") * d, spec.meta_value("num_kv_heads") * d
    return _split(0, (q, kv, kv), pos["tp"])


@RULES.register("gate_up")
def gate_up(spec: ParamSpec, pos: AxisPos) -> tuple[DimSplit, ...]:
    """Fused [gate | up] rows: each TP rank keeps matching gate and up rows (two ranges)."""
    f = spec.shape[0] // 2
    return _split(0, (f, f), pos["tp"])


@RULES.register("experts_gate_up")
def experts_gate_up(spec: ParamSpec, pos: AxisPos) -> tuple[DimSplit, ...]:
    """[experts, 2*ffn, hidden]: experts split over ep, fused gate|up rows over tp."""
    f = spec.shape[1] // 2
    return _split(0, (spec.shape[0],), pos["ep"]) + _split(1, (f, f), pos["tp"])


@RULES.register("experts_down")
def experts_down(spec: ParamSpec, pos: AxisPos) -> tuple[DimSplit, ...]:
    """[experts, hidden, ffn]: experts split over ep, ffn (input) dim over tp."""
    return _split(0, (spec.shape[0],), pos["ep"]) + _split(2, (spec.shape[2],), pos["tp"])
