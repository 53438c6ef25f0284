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

import importlib
from typing import Any

# name -> submodule. Resolved on first use (PEP 562), so planning and validation (boxes, layouts,
# plans, specs) never import torch: only executing and materialising shards does.
_EXPORTS = {
    **dict.fromkeys(("Box", "DimSplit", "Piece", "box_numel", "box_shape", "box_slices", "intersect"), "boxes"),
    **dict.fromkeys(("DEFAULT_BUCKET_BYTES", "Executor", "subgroup"), "comm"),
    "STRATEGIES": "strategies",
    **dict.fromkeys(("clear_cache", "execute", "make_executor", "plan_for", "strategy_fanout"), "execute"),
    **dict.fromkeys(("AXES", "Layout", "ModelPlacement", "ShardInfo", "model_layout"), "layout"),
    **dict.fromkeys(
        ("allocate_shards", "bit_equal", "build_shards", "expected_shard", "fill_box", "verify_shards"), "materialize"
    ),
    **dict.fromkeys(("DeviceMesh", "MeshPlacement", "parse_spec", "spec_str", "tensor_layout"), "mesh"),
    **dict.fromkeys(("BALANCE", "Plan", "Route", "check_plan", "make_plan"), "plan"),
    "RULES": "rules",
    **dict.fromkeys(
        ("DTYPES", "ModelShape", "ParamSpec", "dtype_name", "model_param_specs", "torch_dtype", "total_bytes"), "specs"
    ),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value
