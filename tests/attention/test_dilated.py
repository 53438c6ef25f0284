"""Dilated attention distributed as LongNet distributes it (impl=ring, contiguous chunks): a
segment inside a rank's chunk moves no bytes; a segment spanning ranks moves its sparse K/V (and
their gradients back) only among the ranks it covers, point to point; output and dq/dk/dv match the
explicit-math reference on every rank, and ``Comm.traffic`` counts exactly the bytes sent. The
whole-group gather (impl=ring_naive, allgather) is the comparison. Real gloo groups of 2, 4 and 8."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from torch.utils._python_dispatch import TorchDispatchMode

from tests.attention.cases import check_case
from tests.attention.dilated_ranks import recorded
from tests.conftest import run_sweepbench

B, D, F32 = 2, 8, 4  # tests/attention/cases.py: batch, head dim; float32 bytes


def _case(seq: int, segs: list[int], rates: list[int], *, impl: str = "ring", causal: bool = True,
          heads: int = 4, kv_heads: int = 2) -> dict:
    return {"impl": impl, "pattern": "dilated", "causal": causal, "seq": seq, "heads": heads, "kv_heads": kv_heads,
            "segs": segs, "rates": rates}


def _piece(heads: int, chunk: int, rate: int) -> int:
    """Bytes of one rank's sparse K (and V) of a branch, or of their fp32 gradients."""
    return 2 * B * heads * (chunk // rate) * D * F32


class _Ops(TorchDispatchMode):
    """Counts the aten ops run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(("rates", "calls"), [([1, 2, 4], 1), ([1, 4, 2], 3)])
def test_branches_keeping_as_many_tokens_share_one_call(rates: list[int], calls: int) -> None:
    """One device, 64 tokens, segments 8/16/32: at rates 1/2/4 every branch keeps 8 tokens a
    segment, so all their segments are one attention call forward and one backward; at 1/4/2 they
    keep 8, 4 and 16, three calls each. Causal and not, output and dq/dk/dv match the reference."""
    for causal in (True, False):
        with _Ops() as mode:
            assert check_case(0, 1, _case(64, [8, 16, 32], rates, causal=causal)) < 2e-5
        assert mode.ops["_scaled_dot_product_flash_attention_for_cpu"] == calls
        assert mode.ops["_scaled_dot_product_flash_attention_for_cpu_backward"] == calls


def test_segments_inside_chunks_move_nothing(world4) -> None:
    """W=4, 64 tokens (chunks of 16), segments 8 and 16: every branch local, causal or not, GQA."""
    cases = [_case(64, [8, 16], [1, 2], causal=c) for c in (True, False)]
    per_rank = world4.run(recorded, 4, cases)
    for r in per_rank:
        assert [x["sent"] for x in r] == [0, 0] and not any(x["p2p"] or x["collectives"] for x in r)
        assert max(x["error"] for x in r) < 2e-5


def test_spanning_segment_among_its_ranks_only(world4) -> None:
    """W=4, chunks of 16: segment 32 (rate 4) covers ranks {0,1} and {2,3}; causal, the earlier rank
    sends its sparse K/V forward, the later its dK/dV back, to its pair only; non-causal, both ways."""
    piece = _piece(4, 16, 4)
    causal = [r[0] for r in world4.run(recorded, 4, [_case(64, [8, 32], [1, 4])])]
    both = [r[0] for r in world4.run(recorded, 4, [_case(64, [8, 32], [1, 4], causal=False)])]
    assert max(r["error"] for r in causal + both) < 2e-5
    assert not any(r["collectives"] for r in causal + both)
    # (sends with bytes, receives) of the forward's exchange, then the backward's
    assert [r["p2p"] for r in causal] == [
        [([(1, piece)], []), ([], [1])], [([], [0]), ([(0, piece)], [])],
        [([(3, piece)], []), ([], [3])], [([], [2]), ([(2, piece)], [])]]
    assert [r["sent"] for r in causal] == [piece] * 4
    pair = [1, 0, 3, 2]
    assert [r["p2p"] for r in both] == [[([(p, piece)], [p])] * 2 for p in pair]
    assert [r["sent"] for r in both] == [2 * piece] * 4


def test_segment_over_four_ranks_and_the_whole_group_gather(world4) -> None:
    """W=4, segment 64 (rate 2) covers all four chunks: causal, rank j receives from the j ranks
    before it. ring_naive gathers every long branch over the whole group: three copies of its piece
    forward, and in backward the gather again and a reduce-scatter of the fp32 gradients."""
    piece = _piece(4, 16, 2)
    ring = [r[0] for r in world4.run(recorded, 4, [_case(64, [16, 64], [1, 2])])]
    naive = [r[0] for r in world4.run(recorded, 4, [_case(64, [16, 64], [1, 2], impl="ring_naive")])]
    assert max(r["error"] for r in ring + naive) < 2e-5
    for j, r in enumerate(ring):
        fwd, bwd = r["p2p"]
        assert fwd == ([(d, piece) for d in range(j + 1, 4)], list(range(j)))
        assert bwd == ([(s, piece) for s in range(j)], list(range(j + 1, 4)))
    assert [r["sent"] for r in ring] == [3 * piece] * 4  # rank j: 3-j pieces forward, j back
    assert all(r["collectives"] == ["all_gather", "all_gather", "reduce_scatter"] and not r["p2p"] for r in naive)
    assert [r["sent"] for r in naive] == [9 * piece] * 4


def test_two_ranks(world4) -> None:
    """W=2 (a group of two of the four): chunks of 32, segment 64 spans both, causal, GQA."""
    piece = _piece(4, 32, 2)
    per_rank = world4.run(recorded, 2, [_case(64, [8, 64], [1, 2])])
    assert per_rank[2:] == [[], []]
    r0, r1 = (r[0] for r in per_rank[:2])
    assert max(r0["error"], r1["error"]) < 2e-5
    assert r0["p2p"] == [([(1, piece)], []), ([], [1])] and r1["p2p"] == [([], [0]), ([(0, piece)], [])]


def test_eight_ranks(worlds) -> None:
    """W=8, 128 tokens (chunks of 16), segments 16/32/64 at rates 1/2/4: local, pairs, quads; every
    exchange stays inside its segment's ranks."""
    per_rank = worlds.get(8).run(recorded, 8, [_case(128, [16, 32, 64], [1, 2, 4], causal=c) for c in (True, False)])
    # causal: rank j of a group of g sends g-1-j pieces forward and j back; non-causal g-1 each way
    once = _piece(4, 16, 2) + 3 * _piece(4, 16, 4)
    assert [[x["sent"] for x in cases] for cases in per_rank] == [[once, 2 * once]] * 8
    for rank, cases in enumerate(per_rank):
        assert max(x["error"] for x in cases) < 2e-5
        for x in cases:
            assert not x["collectives"] and len(x["p2p"]) == 4  # two spanning branches, forward and backward
            for g, (sends, recvs) in zip((2, 4, 2, 4), x["p2p"]):
                peers = {p for p, _ in sends} | set(recvs)
                assert peers and all(p // g == rank // g and p != rank for p in peers), (rank, g, peers)


def test_seed_grid_traffic_through_the_cli(tmp_path: Path) -> None:
    """The seed's grid at tiny size (segments 32/64/128 x rates 1/2/4, the seed's 2048/4096/8192
    divided by 64) at ring 4: only 256 tokens (chunks of 64) has a spanning segment (128, its pairs of
    ranks), so a rank sends one sparse piece (forward or, fp32, back); 512 and 1024 send nothing.
    metrics.json and results.csv carry it."""
    run = run_sweepbench(["experiment=ring_dilated_seed_cpu", "parallelism=cp4", "benchmark.iters=1",
                          "benchmark.warmup=0"], sweep_dir=tmp_path / "sweep")
    assert run.rc == 0, run.describe()
    cases = {}
    for m in run.all_metrics().values():
        assert m["status"] == "ok" and m["verified"] is True, m.get("error")
        [case] = m["results"]["cases"]
        cases[case["seq_len"]] = case
    piece = 2 * 2 * 8 * (64 // 4) * 8 * 4  # K and V, batch 2, 8 heads, 16 kept tokens, head dim 8, float32
    assert {s: (c["sent_bytes_fwd"], c["sent_bytes"]) for s, c in cases.items()} == \
        {256: (piece, piece), 512: (0, 0), 1024: (0, 0)}
    assert [r["sent_bytes"] for r in cases[256]["per_rank"]] == [piece] * 4
    assert [r["sent_bytes_fwd"] for r in cases[256]["per_rank"]] == [piece, 0, piece, 0]
    assert all(c["placement"] == "contiguous" for c in cases.values())
    assert sorted(run.results()["sent_bytes"]) == [0, 0, piece]
