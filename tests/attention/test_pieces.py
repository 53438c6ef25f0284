"""Placement round-trips, the LSE merge, the FLOP count and the verification check, on one process."""

from __future__ import annotations

import pytest
import torch

from sweepbench.attention import placement_of, positions, shard_sequence, unshard_sequence
from sweepbench.attention.comm import LocalComm
from sweepbench.attention.dilated import Branch
from sweepbench.attention.ops import Block, attend, get_backend, new_accumulators
from sweepbench.attention.reference import math_attention
from sweepbench.attention.scaling import Shape, attention_flops, mismatch
from tests.attention.cases import check_case, inputs


@pytest.mark.parametrize("placement", ["zigzag", "contiguous", "usp"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 6, 8])
def test_placement_round_trips(placement: str, world_size: int) -> None:
    x = torch.arange(2 * 3 * 48).reshape(2, 3, 48)
    shards = [shard_sequence(x, dim=2, rank=r, world_size=world_size, placement=placement) for r in range(world_size)]
    assert torch.equal(unshard_sequence(shards, dim=2, world_size=world_size, placement=placement), x)
    assert torch.equal(unshard_sequence(torch.cat(shards, dim=2), dim=2, world_size=world_size,
                                        placement=placement), x)
    pos = [positions(placement, r, world_size, 48) for r in range(world_size)]
    assert sorted(torch.cat(pos).tolist()) == list(range(48))
    for r in range(world_size):
        assert torch.equal(shards[r][0, 0], x[0, 0, pos[r]])


def test_zigzag_holds_head_and_tail() -> None:
    assert positions("zigzag", 0, 2, 8).tolist() == [0, 1, 6, 7]
    assert positions("zigzag", 1, 2, 8).tolist() == [2, 3, 4, 5]
    assert placement_of("ring") == "zigzag" and placement_of("ring_naive") == "contiguous"
    assert placement_of("torch_cp") == "zigzag"  # torch's head-tail load balancer


@pytest.mark.parametrize("world_size", [4, 6, 8])
def test_usp_groups_gather_zigzag_shards(world_size: int) -> None:
    """USP: the tokens of a Ulysses group, in rank order, are its ring rank's zigzag shard."""
    from sweepbench.attention.registry import usp_degree

    u = usp_degree(world_size)
    assert (u, world_size // u) == {4: (2, 2), 6: (3, 2), 8: (4, 2)}[world_size]
    x = torch.arange(world_size * 12)
    for i in range(world_size // u):
        group = [shard_sequence(x, dim=0, rank=i * u + j, world_size=world_size, placement="usp") for j in range(u)]
        assert torch.equal(torch.cat(group), shard_sequence(x, dim=0, rank=i, world_size=world_size // u,
                                                            placement="zigzag"))


def test_accumulators_round_once() -> None:
    """Two bf16 terms (kernel outputs) summed in place equal an fp32 sum rounded once; a third term
    goes through an fp32 accumulator; the merge of two bf16 blocks equals the fp32 merge rounded once."""
    from sweepbench.attention.accum import Merged, RowSum

    g = torch.Generator().manual_seed(1)
    terms = [torch.randn(2, 3, 16, 8, generator=g) for _ in range(3)]
    half = slice(8, 16)
    two = RowSum((2, 3, 16, 8), device=torch.device("cpu"))
    two.add(half, terms[0][:, :, half].bfloat16())
    two.add(slice(None), terms[1].bfloat16())
    want = terms[1].bfloat16().float()
    want[:, :, half] += terms[0][:, :, half].bfloat16().float()
    assert torch.equal(two.result(torch.bfloat16), want.bfloat16())
    three = RowSum((2, 3, 16, 8), device=torch.device("cpu"))
    for t in terms:
        three.add(slice(None), t.bfloat16())
    assert three.acc is not None and three.acc.dtype == torch.float32
    assert torch.equal(three.result(torch.bfloat16), sum(t.bfloat16().float() for t in terms).bfloat16())
    q = torch.zeros(2, 3, 16, 8, dtype=torch.bfloat16)
    lses = [torch.randn(2, 3, 16, generator=g) for _ in range(2)]
    merged = Merged(q)
    merged.add(slice(None), terms[0].bfloat16(), lses[0].clone(), last=False)
    merged.add(half, terms[1][:, :, half].bfloat16(), lses[1][:, :, half], last=True)
    out, lse = merged.result()
    w = torch.sigmoid(lses[1][:, :, half] - lses[0][:, :, half]).unsqueeze(-1)
    want = terms[0].bfloat16().float()
    want[:, :, half] = (1 - w) * want[:, :, half] + w * terms[1][:, :, half].bfloat16().float()
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), want.bfloat16().float(), atol=0, rtol=2 ** -8)
    torch.testing.assert_close(lse[:, :, half], torch.logaddexp(lses[0][:, :, half], lses[1][:, :, half]))


def test_lse_merge_equals_one_attention() -> None:
    """Three key blocks (one causal on the diagonal) merged by LSE == attention over all keys."""
    q, k, v, _ = inputs(48, 4, 4)
    scale = 8 ** -0.5
    out, lse = new_accumulators(q)
    blocks = [Block(slice(32, 48), slice(0, 16), False), Block(slice(32, 48), slice(32, 48), True),
              Block(slice(32, 48), slice(16, 32), False)]
    attend(get_backend("cpu_flash"), q, k, v, blocks, scale=scale, out=out, lse=lse)
    want = math_attention(q, k, v, causal=True, scale=scale)[:, :, 32:48]
    torch.testing.assert_close(out[:, :, 32:48], want, atol=2e-6, rtol=1e-5)
    s = (q[:, :, 32:48] @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(torch.ones(48, 48, dtype=torch.bool).tril()[32:48].logical_not(), float("-inf"))
    torch.testing.assert_close(lse[:, :, 32:48], torch.logsumexp(s, -1), atol=2e-6, rtol=1e-5)
    assert torch.isinf(lse[:, :, :32]).all()  # rows no block touched stay empty


def test_flop_count() -> None:
    shape = Shape(batch=1, heads=32, kv_heads=8, seq_len=16384, head_dim=128)
    dense = 4 * 32 * 128 * 16384 ** 2
    assert attention_flops(shape, causal=False, backward=False, pattern="dense", branches=()) == dense
    assert attention_flops(shape, causal=True, backward=True, pattern="dense", branches=()) == dense * 0.5 * 3.5
    dil = attention_flops(shape, causal=False, backward=False, pattern="dilated",
                          branches=(Branch(2048, 1), Branch(4096, 2)))
    assert dil == 4 * 32 * 128 * (8 * 2048 ** 2 + 4 * 2048 ** 2)


def test_mismatch_catches_a_wrong_result() -> None:
    want = torch.randn(2, 4, 16, 8)
    assert mismatch("out", want.clone(), want) is None
    bad = want.clone()
    bad[1, 2, 3, 4] += 1e-3
    msg = mismatch("out", bad, want)
    assert msg is not None and msg.startswith("out: 1 of 1024 elements off")
    bf = want.bfloat16()
    assert mismatch("dq", bf + 0.01, bf) is None and mismatch("dq", bf + 0.1, bf) is not None


def test_scale_default_is_inverse_sqrt_head_dim() -> None:
    """cp_attention without ``scale`` matches the reference taken at 1/sqrt(head_dim)."""
    assert check_case(0, 1, {"impl": "ring", "causal": True, "pattern": "dense", "seq": 16, "heads": 2,
                             "kv_heads": 2}) < 2e-5


def test_local_comm_runs_the_schedule_but_not_the_answer() -> None:
    """Without communication the result is wrong (what the exposed-comm measure relies on), and
    the verification says so."""
    q, k, v, _ = inputs(32, 2, 2)
    from sweepbench.attention import cp_attention

    comm = LocalComm.solo()
    comm.size, comm.rank = 2, 1  # rank 1 of a ring of 2, with no bytes crossing
    mine = [shard_sequence(x, dim=2, rank=1, world_size=2, placement="zigzag") for x in (q, k, v)]
    out = cp_attention(*mine, impl="ring", comm=comm)
    want = shard_sequence(math_attention(q, k, v, causal=True, scale=8 ** -0.5), dim=2, rank=1, world_size=2,
                          placement="zigzag")
    assert mismatch("out", out, want) is not None


def test_usp_needs_heads_divisible_by_its_ulysses_degree() -> None:
    from sweepbench.attention.registry import why_not

    kw = {"device_type": "cpu", "pattern": "dense", "causal": True}
    assert why_not("usp", world_size=4, num_heads=6, **kw) is None  # 2 groups of 2: 6 heads split over 2
    msg = why_not("usp", world_size=8, num_heads=6, **kw)  # groups of 4
    assert msg is not None and msg.startswith("impl=usp needs model.num_heads=6 divisible by its Ulysses degree "
                                              "at W=8, 4 (use another cp, or impl=ring, ring_naive, ring_lp, allgather")
    assert why_not("usp", world_size=2, num_heads=3, **kw) is None  # W=2: a plain ring


def test_a_gqa_backend_gets_kv_heads_as_they_are() -> None:
    """A backend that does GQA itself (the registry's ``gqa``) is handed the kv heads; one that
    does not gets them expanded; both give the same output and gradients (dK/dV per kv head)."""
    import dataclasses

    from sweepbench.attention.ops import LocalAttention, full_blocks

    real = get_backend("cpu_flash")
    assert real.gqa and not get_backend("efficient").gqa
    q, k, v, dout = inputs(32, 4, 2)
    results = {}
    for gqa in (True, False):
        seen: list[int] = []

        def fwd(q_, k_, v_, *a, _seen=seen):
            _seen.append(k_.shape[1])
            return real.forward(q_, k_, v_, *a)

        def bwd(dout_, q_, k_, *a, _seen=seen):
            _seen.append(k_.shape[1])
            return real.backward(dout_, q_, k_, *a)

        spy = dataclasses.replace(real, forward=fwd, backward=bwd, gqa=gqa)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = LocalAttention.apply(*leaves, spy, full_blocks(32, True), 0.25)
        out.backward(dout)
        assert seen == ([2, 2] if gqa else [4, 4])
        assert leaves[1].grad.shape == k.shape
        results[gqa] = (out, *(t.grad for t in leaves))
    for a, b in zip(results[True], results[False]):
        torch.testing.assert_close(a, b)
