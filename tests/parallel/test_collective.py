"""The collective benchmark: bus bandwidth as nccl-tests defines it, checked on the main sweep's
real 2- and 4-rank gloo runs, and verification that really catches a wrong result."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Iterator

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

from sweepbench.benchmarks.collective import ALL_OPS, CollectiveBenchmark, message_sizes
from sweepbench.collective.ops import OPS, Buffers, Mismatch, verify_once
from sweepbench.core import RankContext, VerificationError
from sweepbench.measure.stats import summarize

from tests.conftest import SMALL, SweepRun

# nccl-tests' busbw factors (doc/PERFORMANCE.md), written out independently of the code under test
NCCL_TESTS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}


def _cases(main_sweep: SweepRun) -> list[tuple[int, dict[str, Any]]]:
    return [(m["world_size"], c) for m in main_sweep.all_metrics().values() for c in m["results"]["cases"]]


def test_sweep_has_2_and_4_rank_jobs(main_sweep: SweepRun) -> None:
    assert sorted(m["world_size"] for m in main_sweep.all_metrics().values()) == [2, 2, 4]


@pytest.mark.parametrize("op", sorted(NCCL_TESTS_FACTOR))
def test_busbw_is_algbw_times_nccl_tests_factor(main_sweep: SweepRun, op: str) -> None:
    checked = set()
    for n, case in _cases(main_sweep):
        if case["op"] != op:
            continue
        algbw = case["size_bytes"] / case["median_s"] / 1e9
        assert case["algbw_gbps"] == pytest.approx(algbw, rel=1e-9)
        assert case["busbw_gbps"] == pytest.approx(algbw * NCCL_TESTS_FACTOR[op](n), rel=1e-9)
        checked.add(n)
    assert checked == {2, 4}, f"no {op} case at some world size: {checked}"


def test_factors_of_the_code_match_nccl_tests() -> None:
    assert set(OPS) == set(NCCL_TESTS_FACTOR) == set(ALL_OPS)
    for op, spec in OPS.items():
        for n in (1, 2, 3, 4, 8, 64):
            assert spec.busbw_factor(n) == pytest.approx(NCCL_TESTS_FACTOR[op](n)), (op, n)


def test_sizes_and_summary(main_sweep: SweepRun) -> None:
    for m in main_sweep.all_metrics().values():
        n = m["world_size"]
        cases = m["results"]["cases"]
        for case in cases:
            assert case["size_bytes"] in (1024, 4096)
            assert case["size_bytes"] % (4 * n) == 0  # float32, a multiple of n elements
            assert case["dtype"] == "float32"
        for op in NCCL_TESTS_FACTOR:
            mine = [c for c in cases if c["op"] == op]
            assert [c["size_bytes"] for c in mine] == [1024, 4096]
            summary = m["results"]["summary"]
            assert summary[f"{op}_busbw_gbps"] == mine[-1]["busbw_gbps"]
            assert summary[f"{op}_median_s"] == mine[-1]["median_s"]


def test_message_sizes() -> None:
    cfg = type("B", (), {"min_bytes": 1024, "max_bytes": 1 << 20, "step_factor": 4})
    assert message_sizes(cfg) == [1024, 4096, 16384, 65536, 262144, 1048576]
    cfg.max_bytes = 4095
    assert message_sizes(cfg) == [1024]


# ---------------------------------------------------------------- verification, in process


@pytest.fixture(scope="module")
def solo_group() -> Iterator[None]:
    """A real world-size-1 gloo process group in this process."""
    assert not dist.is_initialized(), "a default process group is already up in this process"
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def bench(solo_group: None, compose) -> CollectiveBenchmark:
    cfg = compose("parallelism=tp1", *SMALL)
    ctx = RankContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo", cfg=cfg)
    return CollectiveBenchmark(ctx)


SOLO_OPS = [op for op, spec in OPS.items() if spec.min_ranks <= 1]


@pytest.mark.parametrize("op", SOLO_OPS)
def test_verification_passes_a_right_result(solo_group: None, op: str) -> None:
    bufs = OPS[op].build(64, 0, 1, torch.float32, torch.device("cpu"))
    verify_once(op, bufs, 256, 0)  # no exception
    assert torch.equal(bufs.output, bufs.expected)


@pytest.mark.parametrize("op", SOLO_OPS)
def test_verification_catches_a_wrong_expected_value(solo_group: None, op: str) -> None:
    bufs = OPS[op].build(64, 0, 1, torch.float32, torch.device("cpu"))
    wrong = bufs.expected.clone()
    wrong[17] += 1
    with pytest.raises(Mismatch, match=rf"^{op} at 256 B on rank 0: element 17 is"):
        verify_once(op, dataclasses.replace(bufs, expected=wrong), 256, 0)


def test_verification_catches_a_collective_that_did_nothing() -> None:
    bufs = OPS["all_reduce"].build(8, 0, 1, torch.float32, torch.device("cpu"))
    out = torch.empty(8)
    broken = Buffers(run=lambda: None, reset=lambda: out.fill_(-1), output=out, expected=bufs.expected)
    with pytest.raises(Mismatch, match="element 0 is -1.0, expected"):
        verify_once("all_reduce", broken, 32, 0)


def _doubling(numel: int) -> Buffers:
    """An in-place op whose output doubles at each call, like all_reduce over 2 ranks of equal inputs."""
    buf = torch.empty(numel)
    pattern = torch.arange(numel, dtype=torch.float32) % 3 + 1
    return Buffers(run=lambda: buf.mul_(2), reset=lambda: buf.copy_(pattern), output=buf, expected=pattern * 2,
                   repeatable=False)


def test_a_batch_of_in_place_calls_is_checked_by_its_own_output() -> None:
    """After c calls the in-place all_reduce holds n^(c-1) times one call's output: the sample's own
    output is checked (not one more call after it) wherever the dtype holds that exactly."""
    from sweepbench.collective.ops import _Sample

    bufs = _doubling(16)
    sample = _Sample("all_reduce", bufs, 64, 0, n=2)
    run = sample.counted(bufs.run, 1)
    sample.reset()
    for _ in range(20):
        run()
    sample.check()  # 2^19 times the one-call output: exact in float32
    sample.reset()
    for _ in range(3):
        bufs.run()  # three calls the sample did not count: the output is not what 1 counted call gives
    run()
    with pytest.raises(Mismatch, match="element 0 is 16.0, expected 2.0"):
        sample.check()


def test_a_batch_the_dtype_cannot_hold_exactly_is_checked_by_one_more_call() -> None:
    from sweepbench.collective.ops import _Sample

    bufs = _doubling(16)
    calls = []
    checked = Buffers(run=lambda: (calls.append(1), bufs.run()), reset=bufs.reset, output=bufs.output,
                      expected=bufs.expected, repeatable=False)
    sample = _Sample("all_reduce", checked, 64, 0, n=3)  # 3^(c-1): not exact in float32 after enough calls
    run = sample.counted(lambda: None, 1)
    sample.reset()
    for _ in range(20):
        run()
    sample.check()  # fell back: reset, one real call, its output checked
    assert calls == [1]


def test_verification_error_fails_the_job_check() -> None:
    # a VerificationError is an AssertionError: never swallowed as an ordinary result
    assert issubclass(VerificationError, AssertionError) and issubclass(Mismatch, AssertionError)


def test_solo_run_is_verified_and_skips_send_recv(bench: CollectiveBenchmark) -> None:
    result = bench.run()
    assert result.verified is True
    assert result.extra["skipped_ops"] == ["send_recv"]
    assert {c["op"] for c in result.cases} == set(SOLO_OPS)
    assert result.extra["sampling"]["ops_per_sample"] == 20 and result.extra["sampling"]["samples"] == 3
    for c in result.cases:
        assert len(c["times_s"]) == 3 and c["ops_per_sample"] == 20 and c["impl"] == "torch"
        assert c["busbw_gbps"] == pytest.approx(c["algbw_gbps"] * NCCL_TESTS_FACTOR[c["op"]](1))


# ---------------------------------------------------------------- statistics


def test_summarize_known_values() -> None:
    s = summarize([4.0, 1.0, 3.0, 2.0])
    assert s["median_s"] == 2.5 and s["min_s"] == 1.0 and s["max_s"] == 4.0 and s["mean_s"] == 2.5
    assert s["p25_s"] == 1.75 and s["p75_s"] == 3.25 and s["iqr_s"] == 1.5


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=1e-9, max_value=1e3, allow_nan=False), min_size=1, max_size=50))
def test_summarize_matches_numpy(times: list[float]) -> None:
    import numpy as np

    s = summarize(times)
    p25, p75 = np.percentile(times, [25, 75])
    assert s["median_s"] == pytest.approx(statistics.median(times))
    assert s["p25_s"] == pytest.approx(p25) and s["p75_s"] == pytest.approx(p75)
    assert s["iqr_s"] == pytest.approx(p75 - p25, abs=1e-12)
    assert s["min_s"] == min(times) and s["max_s"] == max(times)
    assert s["min_s"] <= s["p25_s"] <= s["median_s"] <= s["p75_s"] <= s["max_s"]
