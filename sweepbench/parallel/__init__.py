"""Layout + resharding engine shared by the refit and cross-mesh resharding benchmarks.

Every rank runs the same code (plans are computed locally, identically)::

    src = model_layout(model_cfg, range(0, 4), tp=2, pp=2)      # training layout
    dst = model_layout(model_cfg, range(4, 8), tp=4)            # inference layout
    plan = plan_for(src, dst, strategy="broadcast", balance="size")
    src_shards = build_shards(src, rank, seed=0, device=dev)    # {} off the src ranks
    dst_shards = allocate_shards(dst, rank, device=dev)
    execute(plan, src_shards, dst_shards, strategy="broadcast")
    assert not verify_shards(dst, rank, dst_shards, seed=0)

A single tensor on device meshes: ``tensor_layout(shape, DeviceMesh.of(ranks,
mesh_shape), "S0R", dtype=...)`` gives a layout used exactly the same way.
"""

from .boxes import Box, DimSplit, Piece, box_numel, box_shape, box_slices, intersect
from .comm import DEFAULT_BUCKET_BYTES, STRATEGIES, Executor, subgroup
from .execute import clear_cache, execute, make_executor, plan_for, strategy_fanout
from .layout import AXES, Layout, ModelPlacement, ShardInfo, model_layout
from .materialize import allocate_shards, bit_equal, build_shards, expected_shard, fill_box, verify_shards
from .mesh import DeviceMesh, MeshPlacement, parse_spec, spec_str, tensor_layout
from .plan import BALANCE, Plan, Route, check_plan, make_plan
from .registry import Registry
from .rules import RULES
from .specs import DTYPES, ModelShape, ParamSpec, dtype_name, model_param_specs, torch_dtype, total_bytes

__all__ = [
    "AXES", "BALANCE", "DEFAULT_BUCKET_BYTES", "DTYPES", "RULES", "STRATEGIES",
    "Box", "DeviceMesh", "DimSplit", "Executor", "Layout", "MeshPlacement", "ModelPlacement",
    "ModelShape", "ParamSpec", "Piece", "Plan", "Registry", "Route", "ShardInfo",
    "allocate_shards", "bit_equal", "box_numel", "box_shape", "box_slices", "build_shards",
    "check_plan", "clear_cache", "dtype_name", "execute", "expected_shard", "fill_box",
    "intersect", "make_executor", "make_plan", "model_layout", "model_param_specs",
    "parse_spec", "plan_for", "spec_str", "strategy_fanout", "subgroup", "tensor_layout",
    "torch_dtype", "total_bytes", "verify_shards",
]
