"""Layouts, specs and validation (no processes)."""

from __future__ import annotations

import types

import pytest
from omegaconf import OmegaConf

from sweepbench.parallel import (
    RULES,
    STRATEGIES,
    DeviceMesh,
    model_layout,
    model_param_specs,
    parse_spec,
    spec_str,
    tensor_layout,
)
from sweepbench.core import Registry
from sweepbench.parallel.boxes import box_numel, intersect

from .cases import DENSE, MOE


def test_param_specs_dense_and_moe_shapes() -> None:
    specs = {s.name: s for s in model_param_specs(DENSE)}
    # 1 embedding + 4 layers * 6 + final norm + lm head
    assert len(specs) == 1 + 4 * 6 + 2
    assert specs["embedding"].shape == (128, 64)
    assert specs["layers.0.qkv"].shape == ((4 + 2 * 2) * 16, 64)
    assert specs["layers.0.o_proj"].shape == (64, 64)
    assert specs["layers.3.mlp.gate_up"].shape == (256, 64)
    assert specs["layers.3.mlp.down"].shape == (64, 128)
    assert specs["lm_head"].shape == (128, 64) and specs["final_norm"].shape == (64,)
    moe = {s.name: s for s in model_param_specs(MOE)}
    assert moe["layers.1.moe.router"].shape == (4, 64)
    assert moe["layers.1.moe.experts_gate_up"].shape == (4, 256, 64)
    assert moe["layers.1.moe.experts_down"].shape == (4, 64, 128)
    assert "layers.0.mlp.gate_up" not in moe
    assert {s.dtype for s in moe.values()} == {"float16"}


def test_config_forms_are_equivalent() -> None:
    assert model_param_specs(OmegaConf.create(DENSE)) == model_param_specs(DENSE)
    assert model_param_specs(types.SimpleNamespace(**DENSE)) == model_param_specs(DENSE)


def _pieces(layout, rank, name):  # type: ignore[no-untyped-def]
    return [(p.global_box, p.local_box) for p in layout.shards(rank)[name].pieces]


def test_qkv_gqa_split_keeps_whole_heads() -> None:
    lay = model_layout(DENSE, tp=2)  # 4 q heads, 2 kv heads, head_dim 16 -> q 64 rows, k 32, v 32
    cols = ((0, 64),)
    assert _pieces(lay, 1, "layers.0.qkv") == [
        (((32, 64),) + cols, ((0, 32),) + cols),  # q heads 2, 3
        (((80, 96),) + cols, ((32, 48),) + cols),  # kv head 1 of k
        (((112, 128),) + cols, ((48, 64),) + cols),  # kv head 1 of v
    ]
    assert lay.shards(1)["layers.0.qkv"].local_shape == (64, 64)


def test_gate_up_row_vocab_and_replicated_rules() -> None:
    lay = model_layout(DENSE, tp=2)
    assert [g for g, _ in _pieces(lay, 1, "layers.0.mlp.gate_up")] == [((64, 128), (0, 64)), ((192, 256), (0, 64))]
    assert _pieces(lay, 1, "layers.0.mlp.down") == [(((0, 64), (64, 128)), ((0, 64), (0, 64)))]
    assert _pieces(lay, 1, "layers.0.o_proj") == [(((0, 64), (32, 64)), ((0, 64), (0, 32)))]
    assert _pieces(lay, 1, "embedding")[0][0] == ((64, 128), (0, 64))
    assert _pieces(lay, 1, "lm_head")[0][0] == ((64, 128), (0, 64))
    assert _pieces(lay, 1, "layers.2.input_norm") == [(((0, 64),), ((0, 64),))]


def test_pipeline_stages_and_rank_order() -> None:
    lay = model_layout(DENSE, range(10, 18), tp=2, pp=2, dp=2)  # tp fastest, then dp, pp slowest
    first, last = set(lay.shards(10)), set(lay.shards(17))
    assert "embedding" in first and "lm_head" not in first and "layers.1.qkv" in first
    assert "lm_head" in last and "final_norm" in last and "layers.2.qkv" in last and "embedding" not in last
    assert lay.placement.coords(5) == {"tp": 1, "cp": 0, "ep": 0, "dp": 0, "pp": 1}
    # ranks 10 and 12 differ only in dp: identical shards
    assert lay.shards(10) == lay.shards(12)
    assert lay.shards(10) != lay.shards(11)
    assert lay.shards(3) == {}
    custom = model_layout(DENSE, tp=2, dp=2, order=("dp", "tp", "cp", "ep", "pp"))
    assert custom.placement.coords(1) == {"dp": 1, "tp": 0, "cp": 0, "ep": 0, "pp": 0}


def test_expert_parallel_split_and_dense_replication() -> None:
    lay = model_layout(MOE, tp=2, ep=2)  # index = tp + 2 * ep
    assert _pieces(lay, 2, "layers.0.moe.experts_down") == [
        (((2, 4), (0, 64), (0, 64)), ((0, 2), (0, 64), (0, 64)))]
    gate_up = [g for g, _ in _pieces(lay, 3, "layers.0.moe.experts_gate_up")]
    assert gate_up == [((2, 4), (64, 128), (0, 64)), ((2, 4), (192, 256), (0, 64))]
    assert lay.shards(0)["layers.0.qkv"] == lay.shards(2)["layers.0.qkv"]  # replicated over ep
    assert lay.shards(0)["layers.0.moe.router"].local_shape == (4, 64)


@pytest.mark.parametrize("layout", [
    model_layout(DENSE, tp=2, pp=2, dp=2),
    model_layout(MOE, tp=4, ep=2),
    model_layout(MOE, ep=4, cp=2),
    tensor_layout((8, 12), DeviceMesh.of(range(4), (2, 2)), "S01R"),
    tensor_layout((4, 8, 6), DeviceMesh.of(range(6), (3, 2)), "RS1S0"),
])
def test_distinct_boxes_partition_every_tensor(layout) -> None:  # type: ignore[no-untyped-def]
    for spec in layout.params:
        boxes = [box for box, _ in layout.owners(spec.name)]
        assert sum(box_numel(b) for b in boxes) == spec.numel
        assert all(intersect(a, b) is None for i, a in enumerate(boxes) for b in boxes[i + 1:])


@pytest.mark.parametrize(("model", "kwargs", "needle"), [
    (DENSE, dict(tp=3), "tp=3 must divide num_heads=4 (valid tp: 1, 2)"),
    (DENSE, dict(tp=4), "tp=4 must divide num_kv_heads=2"),
    (dict(DENSE, ffn_hidden_size=90, num_kv_heads=4), dict(tp=4), "tp=4 must divide ffn_hidden_size=90"),
    (dict(DENSE, vocab_size=129), dict(tp=2), "tp=2 must divide vocab_size=129"),
    (DENSE, dict(pp=3), "pp=3 must divide num_layers=4 (valid pp: 1, 2, 4)"),
    (DENSE, dict(ep=2), "ep=2 needs an MoE model"),
    (MOE, dict(ep=3), "ep=3 must divide num_experts=4"),
    (DENSE, dict(tp=0), "tp=0 must be a positive integer"),
    (DENSE, dict(dp=2, ranks=[0, 1, 2]), "needs 2 ranks, got 3"),
    (DENSE, dict(dp=2, ranks=[1, 1]), "distinct"),
    (DENSE, dict(order=("tp", "dp")), "order="),
    (dict(DENSE, dtype="int8"), {}, "unsupported dtype 'int8'"),
    (dict(DENSE, hidden_size=66), {}, "hidden_size=66"),
])
def test_invalid_model_layouts(model, kwargs, needle) -> None:  # type: ignore[no-untyped-def]
    kwargs = dict(kwargs)
    ranks = kwargs.pop("ranks", None)
    with pytest.raises(ValueError) as err:
        model_layout(model, ranks, **kwargs)
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("shape", "mesh_shape", "spec", "needle"), [
    ((8, 12), (2, 2), "S2R", "mesh axis 2"),
    ((8, 12), (2, 2), "S0", "has 1 dims but tensor shape (8, 12) has 2"),
    ((8, 12), (2, 2), "S0S0", "more than once"),
    ((6, 12), (4,), "S0R", "dim 0 of size 6 cannot be split 4 ways"),
    ((8, 12), (2, 2), "X0R", "bad sharding spec 'X0R'"),
])
def test_invalid_tensor_layouts(shape, mesh_shape, spec, needle) -> None:  # type: ignore[no-untyped-def]
    mesh = DeviceMesh.of(range(4), mesh_shape)
    with pytest.raises(ValueError) as err:
        tensor_layout(shape, mesh, spec)
    assert needle in str(err.value)
    with pytest.raises(ValueError, match="does not fit"):
        DeviceMesh.of(range(4), (3,))


def test_spec_parsing_and_mesh_coords() -> None:
    assert parse_spec("S0R") == ((0,), ())
    assert parse_spec("RS1") == ((), (1,))
    assert parse_spec("S01R") == ((0, 1), ())
    assert parse_spec([None, 1]) == ((), (1,))
    assert parse_spec([(1, 0), None]) == ((1, 0), ())
    assert spec_str(((0, 1), ())) == "S01R"
    assert DeviceMesh.of(range(6), (2, 3)).coords(4) == (1, 1)
    lay = tensor_layout((8, 12), DeviceMesh.of([5, 6, 7, 8], (2, 2)), "S01R")
    assert [lay.shards(r)["tensor"].pieces[0].global_box[0] for r in (5, 6, 7, 8)] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    partial = tensor_layout((8, 12), DeviceMesh.of(range(4), (2, 2)), "RS0")  # replicated over axis 1
    assert partial.shards(0) == partial.shards(1) and partial.shards(0) != partial.shards(2)


def test_registries_reject_duplicates_and_unknown_names() -> None:
    reg: Registry[int] = Registry("thing")
    reg.register("a")(1)
    with pytest.raises(ValueError, match="'a' is already registered"):
        reg.register("a")(2)
    with pytest.raises(ValueError, match="unknown strategy 'nope'; valid: broadcast, ipc, naive, nvshmem, pipeline, send_recv"):
        STRATEGIES.get("nope")
    with pytest.raises(ValueError, match="already registered"):
        STRATEGIES.register("send_recv")(object)  # type: ignore[arg-type]
    assert "qkv" in RULES and "experts_down" in RULES.names()
