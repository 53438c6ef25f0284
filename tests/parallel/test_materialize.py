"""Deterministic shard values and bit-exact verification (no processes)."""

from __future__ import annotations

import pytest
import torch

from sweepbench.parallel import (
    DeviceMesh,
    allocate_shards,
    bit_equal,
    build_shards,
    expected_shard,
    model_layout,
    tensor_layout,
    verify_shards,
)
from sweepbench.parallel import materialize

from .cases import DENSE, MOE


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_values_exact_in_every_dtype(dtype: str) -> None:
    lay = tensor_layout((16, 40), [0], "RR", dtype=dtype)
    t = expected_shard(lay, 0, "tensor", seed=3)
    f32 = expected_shard(lay, 0, "tensor", seed=3, dtype="float32")
    assert t.dtype == getattr(torch, dtype)
    assert torch.equal(t.float(), f32)  # no rounding happened
    assert len(torch.unique(f32)) > 100  # values vary enough to catch misplaced elements
    assert not torch.equal(f32, expected_shard(lay, 0, "tensor", seed=4, dtype="float32"))


def test_shards_are_slices_of_the_full_tensor() -> None:
    full = {n: t for n, t in build_shards(model_layout(MOE), 0, seed=7).items()}
    lay = model_layout(MOE, range(8), tp=2, ep=2, dp=2)
    for rank in (0, 3, 6):
        shards = build_shards(lay, rank, seed=7)
        for name, info in lay.shards(rank).items():
            for p in info.pieces:
                g = tuple(slice(a, b) for a, b in p.global_box)
                loc = tuple(slice(a, b) for a, b in p.local_box)
                assert bit_equal(shards[name][loc].contiguous(), full[name][g].contiguous()), name
    # params hash differently: two same-shape params do not share values
    assert not torch.equal(full["layers.0.input_norm"], full["layers.0.post_norm"])


def test_chunked_generation_matches(monkeypatch: pytest.MonkeyPatch) -> None:
    lay = model_layout(MOE, tp=2)
    whole = build_shards(lay, 1, seed=1)
    monkeypatch.setattr(materialize, "CHUNK_ELEMS", 100)
    chunked = build_shards(lay, 1, seed=1)
    assert all(bit_equal(whole[n], chunked[n]) for n in whole)


def test_verify_detects_problems() -> None:
    lay = model_layout(DENSE, tp=2)
    good = build_shards(lay, 0, seed=0)
    assert verify_shards(lay, 0, good, seed=0) == []
    assert verify_shards(lay, 0, good, seed=1)  # other seed, other values
    empty = allocate_shards(lay, 0, fill=float("nan"))
    assert any("differs" in p for p in verify_shards(lay, 0, empty, seed=0))
    bad = dict(good)
    bad["layers.1.qkv"] = good["layers.1.qkv"].clone()
    bad["layers.1.qkv"][40, 3] += 1
    assert verify_shards(lay, 0, bad, seed=0) == [
        "rank 0: 'layers.1.qkv' differs (1 of 4096 elements, shape (64, 64))"]
    del bad["embedding"]
    assert "rank 0: 'embedding' missing" in verify_shards(lay, 0, bad, seed=0)
    assert allocate_shards(lay, 0)["lm_head"].shape == (64, 64)


def test_tensor_layout_shards_on_mesh() -> None:
    lay = tensor_layout((8, 12), DeviceMesh.of([4, 5, 6, 7], (2, 2)), "S0S1", dtype="bfloat16")
    shard = build_shards(lay, 7, seed=0)["tensor"]
    full = expected_shard(tensor_layout((8, 12), [0], "RR", dtype="bfloat16"), 0, "tensor", seed=0)
    assert bit_equal(shard, full[4:8, 6:12].contiguous())
    assert build_shards(lay, 0, seed=0) == {}
