"""Tiny models, layout pairs and strategy configurations shared by the tests."""

from __future__ import annotations

from typing import Any

from sweepbench.parallel import Layout, model_layout, tensor_layout
from sweepbench.parallel.mesh import DeviceMesh

DENSE = dict(name="tiny-dense", num_layers=4, hidden_size=64, num_heads=4, num_kv_heads=2,
             ffn_hidden_size=128, vocab_size=128, dtype="bfloat16", num_experts=0, moe_top_k=0, seq_len=32)
MOE = dict(name="tiny-moe", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=4,
           ffn_hidden_size=128, vocab_size=128, dtype="float16", num_experts=4, moe_top_k=2, seq_len=32)
MODELS: dict[str, dict[str, Any]] = {"dense": DENSE, "moe": MOE, "dense_kv4": dict(DENSE, num_kv_heads=4)}

# (case id, model, src ranks, src degrees, dst ranks, dst degrees); world has 8 ranks
REFIT_CASES: list[tuple[str, str, range, dict[str, int], range, dict[str, int]]] = [
    # collocated: both layouts on the same ranks
    ("co-dense-tp2pp2-to-dp4", "dense", range(4), dict(tp=2, pp=2), range(4), dict(dp=4)),
    ("co-dense-pp2dp2-to-tp2dp2", "dense", range(4), dict(pp=2, dp=2), range(4), dict(tp=2, dp=2)),
    ("co-dense-tp2pp2cp2-to-tp2dp4", "dense", range(8), dict(tp=2, pp=2, cp=2), range(8), dict(tp=2, dp=4)),
    ("co-moe-ep4-to-tp4", "moe", range(4), dict(ep=4), range(4), dict(tp=4)),
    ("co-moe-tp2ep2pp2-to-tp4ep2", "moe", range(8), dict(tp=2, ep=2, pp=2), range(8), dict(tp=4, ep=2)),
    ("co-moe-tp4pp2-to-ep4dp2", "moe", range(8), dict(tp=4, pp=2), range(8), dict(ep=4, dp=2)),
    # non-collocated: disjoint ranks (unused ranks of the world just take part)
    ("nc-dense-tp2pp2-to-tp2dp2", "dense", range(4), dict(tp=2, pp=2), range(4, 8), dict(tp=2, dp=2)),
    ("nc-dense-pp2-to-tp2", "dense", range(2), dict(pp=2), range(2, 4), dict(tp=2)),
    ("nc-dense-tp1-to-tp2dp3", "dense", range(1), dict(), range(1, 7), dict(tp=2, dp=3)),
    ("nc-moe-ep2tp2-to-tp4", "moe", range(4), dict(ep=2, tp=2), range(4, 8), dict(tp=4)),
    ("nc-moe-tp4-to-ep4", "moe", range(4), dict(tp=4), range(4, 8), dict(ep=4)),
    ("nc-moe-pp2ep2-to-single", "moe", range(4), dict(pp=2, ep=2), range(4, 5), dict()),
    # partially overlapping rank sets
    ("ov-dense-tp2pp2-to-tp2dp2", "dense", range(4), dict(tp=2, pp=2), range(2, 6), dict(tp=2, dp=2)),
]

# megatron-core's refit (a 4-rank world): tp2->tp1, tp1->tp2, tp2pp2->tp4 collocated, tp2->tp1
# non-collocated, and an MoE model whose experts stay whole (ep1 on both sides)
MEGATRON_CASES: list[tuple[str, str, range, dict[str, int], range, dict[str, int]]] = [
    ("co-tp2-to-tp1", "dense", range(4), dict(tp=2, dp=2), range(4), dict(dp=4)),
    ("co-tp1-to-tp2", "dense", range(4), dict(dp=4), range(4), dict(tp=2, dp=2)),
    ("co-tp2pp2-to-tp4", "dense_kv4", range(4), dict(tp=2, pp=2), range(4), dict(tp=4)),
    ("nc-tp2-to-tp1dp2", "dense", range(2), dict(tp=2), range(2, 4), dict(dp=2)),
    ("co-moe-tp2-to-tp1", "moe", range(4), dict(tp=2, dp=2), range(4), dict(dp=4)),
]

# (strategy, balance, options)
STRATEGY_CONFIGS: list[tuple[str, str, dict[str, Any]]] = [
    ("send_recv", "none", {}),
    ("send_recv", "size", {"bucket_bytes": 1024}),
    ("send_recv", "order", {"bucket_bytes": 1 << 14}),
    ("broadcast", "size", {}),
    ("broadcast", "order", {"bucket_bytes": 2048, "local_allgather": True}),
    ("naive", "none", {}),
    ("pipeline", "size", {"bucket_bytes": 1024}),  # many stages: pack/unpack against transfers
    ("pipeline", "none", {}),
]


def refit_layouts(case: tuple[Any, ...]) -> tuple[Layout, Layout]:
    _, model, src_ranks, src_deg, dst_ranks, dst_deg = case
    cfg = MODELS[model]
    return model_layout(cfg, src_ranks, **src_deg), model_layout(cfg, dst_ranks, **dst_deg)


# (case id, shape, dtype, src mesh ranks, src mesh shape, src spec, dst ranks, dst shape, dst spec)
RESHARD_CASES: list[tuple[str, tuple[int, ...], str, list[int], tuple[int, ...], str, list[int], tuple[int, ...], str]] = [
    # 1-to-m: one source rank to meshes of 1, 2 and 4 ranks
    ("1to1", (8, 12), "float32", [0], (1, 1), "RR", [1], (1, 1), "RR"),
    ("1to2-S0R", (8, 12), "float32", [0], (1,), "R" * 2, [1, 2], (2,), "S0R"),
    ("1to2-RS1", (8, 12), "bfloat16", [0], (1, 1), "RR", [1, 2], (1, 2), "RS1"),
    ("1to2-RR", (8, 12), "float16", [0], (1, 1), "RR", [3, 5], (2, 1), "RR"),
    ("1to4-S0S1", (8, 12), "float32", [0], (1, 1), "RR", [1, 2, 3, 4], (2, 2), "S0S1"),
    ("1to4-S01R", (8, 12), "bfloat16", [0], (1, 1), "RR", [4, 5, 6, 7], (2, 2), "S01R"),
    ("1to4-S1R-partial", (8, 12), "float32", [0], (1, 1), "RR", [1, 2, 3, 4], (2, 2), "S1R"),
    # n-to-m
    ("S0R-to-RS1", (8, 12), "float32", [0, 1, 2, 3], (2, 2), "S0R", [4, 5, 6, 7], (2, 2), "RS1"),
    ("S01R-to-RR", (8, 12), "bfloat16", [0, 1, 2, 3], (2, 2), "S01R", [4, 5, 6, 7], (2, 2), "RR"),
    ("S0S1-to-S1S0", (8, 12), "float32", [0, 1, 2, 3], (2, 2), "S0S1", [4, 5, 6, 7], (2, 2), "S1S0"),
    ("RS0-to-S0R-4", (8, 12), "float16", [0, 1, 2, 3], (2, 2), "RS0", [4, 5, 6, 7], (4,), "S0R"),
    ("S0R-to-S0S1-2to6", (8, 12), "float32", [0, 1], (2,), "S0R", [2, 3, 4, 5, 6, 7], (2, 3), "S0S1"),
    ("RR-to-RS0-4to4", (8, 12), "float32", [0, 1, 2, 3], (2, 2), "RR", [4, 5, 6, 7], (2, 2), "RS0"),
    ("3d-S0RS1-to-RS01R", (4, 8, 6), "bfloat16", [0, 1, 2, 3], (2, 2), "S0RS1", [4, 5, 6, 7], (2, 2), "RS01R"),
    ("co-S0R-to-RS1", (8, 12), "float32", [0, 1, 2, 3], (2, 2), "S0R", [0, 1, 2, 3], (2, 2), "RS1"),
    ("co-S0R-to-S1S0-8", (8, 12), "float32", list(range(8)), (4, 2), "S0R", list(range(8)), (2, 4), "S1S0"),
]


def reshard_layouts(case: tuple[Any, ...]) -> tuple[Layout, Layout]:
    _, shape, dtype, sr, ss, sspec, dr, ds, dspec = case
    return (tensor_layout(shape, DeviceMesh.of(sr, ss), sspec, dtype=dtype),
            tensor_layout(shape, DeviceMesh.of(dr, ds), dspec, dtype=dtype))
