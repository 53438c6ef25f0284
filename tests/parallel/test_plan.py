"""Resharding plans: properties over random layout pairs and plan semantics (no processes)."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sweepbench.parallel import (
    BALANCE,
    STRATEGIES,
    DeviceMesh,
    Layout,
    Plan,
    check_plan,
    make_plan,
    model_layout,
    plan_for,
    tensor_layout,
)

from .cases import DENSE, MOE

# --------------------------------------------------------------------------- independent simulator


def _index_shard(layout: Layout, rank: int, name: str) -> np.ndarray:
    """Local shard whose elements are their flat index in the full tensor."""
    spec = layout.param(name)
    full = np.arange(spec.numel, dtype=np.int64).reshape(spec.shape)
    info = layout.shards(rank)[name]
    out = np.full(info.local_shape, -1, dtype=np.int64)
    for p in info.pieces:
        out[tuple(slice(a, b) for a, b in p.local_box)] = full[tuple(slice(a, b) for a, b in p.global_box)]
    return out


def _sl(box: tuple[tuple[int, int], ...]) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in box)


def simulate_and_check(plan: Plan) -> None:
    """Apply the plan to index-valued shards: every destination element must be written
    exactly once, with the right source element, read from a rank that holds it."""
    src = {(r, n): _index_shard(plan.src, r, n) for r in plan.src.ranks for n in plan.src.shards(r)}
    dst = {(r, n): np.full(info.local_shape, -1, dtype=np.int64)
           for r in plan.dst.ranks for n, info in plan.dst.shards(r).items()}
    count = {k: np.zeros(v.shape, dtype=np.int64) for k, v in dst.items()}
    regions = Counter()
    for route in plan.routes:
        data = src[(route.src, route.param)][_sl(route.src_box)]
        assert (data >= 0).all()
        if route.is_local:
            assert route.dsts[0][0] == route.src
        else:
            assert all(rank != route.src for rank, _ in route.dsts)
            assert all(route.param not in plan.src.shards(rank) or
                       not any(_contains(p.global_box, route.global_box)
                               for p in plan.src.shards(rank)[route.param].pieces)
                       for rank, _ in route.dsts), "remote route to a rank that already holds the region"
            regions[(route.param, route.global_box)] += 1
            if not plan.fanout:
                assert len(route.dsts) == 1
        for rank, box in route.dsts:
            dst[(rank, route.param)][_sl(box)] = data
            count[(rank, route.param)][_sl(box)] += 1
    for key, arr in dst.items():
        assert (count[key] == 1).all(), f"{key} written {count[key].min()}..{count[key].max()} times"
        assert np.array_equal(arr, _index_shard(plan.dst, *key)), key
    if plan.fanout:
        assert all(v == 1 for v in regions.values())
    assert sum(plan.send_bytes.values()) == plan.moved_bytes == sum(plan.recv_bytes.values())


def _contains(outer: tuple[tuple[int, int], ...], inner: tuple[tuple[int, int], ...]) -> bool:
    return all(a0 <= b0 and b1 <= a1 for (a0, a1), (b0, b1) in zip(outer, inner))


# --------------------------------------------------------------------------- hypothesis strategies

DEGREES = {
    "dense": dict(tp=[1, 2], pp=[1, 2, 4], ep=[1], dp=[1, 2, 3], cp=[1, 2]),
    "moe": dict(tp=[1, 2, 4], pp=[1, 2], ep=[1, 2, 4], dp=[1, 2], cp=[1]),
}
MAX_WORLD = 16


@st.composite
def degrees(draw: st.DrawFn, model: str) -> dict[str, int]:
    d = {axis: draw(st.sampled_from(opts)) for axis, opts in DEGREES[model].items()}
    while math.prod(d.values()) > MAX_WORLD:
        axis = draw(st.sampled_from(sorted(a for a, v in d.items() if v > 1)))
        d[axis] = 1
    return d


@st.composite
def rank_sets(draw: st.DrawFn, n_src: int, n_dst: int) -> tuple[list[int], list[int]]:
    """Collocated (same ranks, any order), disjoint or partially overlapping, shuffled."""
    pool = list(range(n_src + n_dst))
    src = draw(st.permutations(pool))[:n_src]
    if n_src == n_dst and draw(st.booleans()):
        return src, draw(st.permutations(src))
    return src, draw(st.permutations(pool))[:n_dst]


@st.composite
def model_pairs(draw: st.DrawFn) -> tuple[Layout, Layout]:
    name = draw(st.sampled_from(["dense", "moe"]))
    cfg = DENSE if name == "dense" else MOE
    sd, dd = draw(degrees(name)), draw(degrees(name))
    src_ranks, dst_ranks = draw(rank_sets(math.prod(sd.values()), math.prod(dd.values())))
    return model_layout(cfg, src_ranks, **sd), model_layout(cfg, dst_ranks, **dd)


@st.composite
def tensor_side(draw: st.DrawFn, ndim: int, unit: int) -> tuple[DeviceMesh, list[tuple[int, ...]]]:
    mesh_shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 4]), min_size=1, max_size=2)))
    axes = draw(st.permutations(range(len(mesh_shape))))
    dims: list[list[int]] = [[] for _ in range(ndim)]
    for a in axes:
        choice = draw(st.integers(-1, ndim - 1))
        if choice >= 0:
            dims[choice].append(a)
    n = math.prod(mesh_shape)
    return DeviceMesh.of(range(n), mesh_shape), [tuple(d) for d in dims]


@st.composite
def tensor_pairs(draw: st.DrawFn) -> tuple[Layout, Layout]:
    ndim = draw(st.integers(1, 3))
    (m1, s1), (m2, s2) = draw(tensor_side(ndim, 0)), draw(tensor_side(ndim, 0))
    # every dim a multiple of how many ways both sides split it
    shape = []
    for d in range(ndim):
        p1 = math.prod(m1.shape[a] for a in s1[d])
        p2 = math.prod(m2.shape[a] for a in s2[d])
        shape.append(math.lcm(p1, p2) * draw(st.integers(1, 2)))
    src_ranks, dst_ranks = draw(rank_sets(len(m1.ranks), len(m2.ranks)))
    dtype = draw(st.sampled_from(["float32", "bfloat16"]))
    return (tensor_layout(shape, DeviceMesh.of(src_ranks, m1.shape), s1, dtype=dtype),
            tensor_layout(shape, DeviceMesh.of(dst_ranks, m2.shape), s2, dtype=dtype))


SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(pair=model_pairs(), balance=st.sampled_from(BALANCE.names()), fanout=st.booleans())
def test_model_plans_cover_every_destination_element_once(pair, balance, fanout) -> None:  # type: ignore[no-untyped-def]
    plan = make_plan(*pair, balance=balance, fanout=fanout)
    simulate_and_check(plan)
    check_plan(plan)


@SETTINGS
@given(pair=tensor_pairs(), balance=st.sampled_from(BALANCE.names()), fanout=st.booleans())
def test_tensor_plans_cover_every_destination_element_once(pair, balance, fanout) -> None:  # type: ignore[no-untyped-def]
    plan = make_plan(*pair, balance=balance, fanout=fanout)
    simulate_and_check(plan)
    check_plan(plan)


# --------------------------------------------------------------------------- plan semantics


def test_same_layout_same_ranks_is_all_local() -> None:
    lay = model_layout(MOE, range(8), tp=2, ep=2, pp=2)
    plan = make_plan(lay, model_layout(MOE, range(8), tp=2, ep=2, pp=2))
    assert plan.moved_bytes == 0 and plan.local_bytes == sum(lay.local_bytes(r) for r in lay.ranks)
    assert all(r.is_local for r in plan.routes)


def test_plans_are_cached_and_deterministic() -> None:
    a, b = model_layout(DENSE, range(4), tp=2, pp=2), model_layout(DENSE, range(4, 8), dp=4)
    p = make_plan(a, b, balance="size")
    assert make_plan(model_layout(DENSE, range(4), tp=2, pp=2), b, balance="size") is p
    assert make_plan(a, b, balance="order") is not p
    assert plan_for(a, b, strategy="broadcast").fanout and not plan_for(a, b, strategy="send_recv").fanout
    assert p.summary()["model_bytes"] == p.model_bytes == sum(s.nbytes for s in a.params)
    assert p.moved_bytes == 4 * p.model_bytes and len(p.digest) == 16


def test_load_balance_modes() -> None:
    src = model_layout(DENSE, range(4), dp=4)  # four full replicas
    dst = model_layout(DENSE, range(4, 8), tp=2, dp=2)
    first = make_plan(src, dst, balance="none")
    assert set(first.send_bytes) == {0}
    by_size = make_plan(src, dst, balance="size")
    assert set(by_size.send_bytes) == {0, 1, 2, 3}
    assert max(by_size.send_bytes.values()) <= 1.2 * min(by_size.send_bytes.values())
    rr = make_plan(src, dst, balance="order")
    senders = [r.src for r in rr.routes if r.param == "layers.0.qkv"]
    assert senders[:4] == [0, 1, 2, 3]
    for plan in (first, by_size, rr):
        assert plan.moved_bytes == sum(dst.local_bytes(r) for r in dst.ranks)


def test_fanout_groups_receivers_and_prefers_local_copies() -> None:
    src = model_layout(DENSE, [0], tp=1)
    dst = model_layout(DENSE, range(0, 4), dp=4)  # rank 0 keeps its copy, 1..3 receive
    fan = make_plan(src, dst, fanout=True)
    remote = [r for r in fan.routes if not r.is_local]
    assert all(tuple(d for d, _ in r.dsts) == (1, 2, 3) for r in remote)
    assert fan.local_bytes == fan.model_bytes and fan.moved_bytes == 3 * fan.model_bytes
    one = make_plan(src, dst, fanout=False)
    assert len([r for r in one.routes if not r.is_local]) == 3 * len(remote)


def test_plan_errors() -> None:
    a = model_layout(DENSE, tp=2)
    with pytest.raises(ValueError, match="unknown load-balance mode 'fast'; valid: none, order, size"):
        make_plan(a, a, balance="fast")
    with pytest.raises(ValueError, match="different params"):
        make_plan(a, model_layout(MOE, tp=2))
    plan = make_plan(a, model_layout(DENSE, [5, 6], tp=2))
    with pytest.raises(AssertionError):
        check_plan(dataclasses.replace(plan, routes=plan.routes[1:]))
    with pytest.raises(ValueError, match="fanout=True"):
        STRATEGIES.get("broadcast")(plan)
