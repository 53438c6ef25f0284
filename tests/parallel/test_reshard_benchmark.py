"""The reshard benchmark (Alpa's cross-mesh resharding suites) through the CLI: both suites with
every strategy, verified bit for bit, with per-case statistics, bandwidth and link floor, and the
other options (local all-gather, balance, dtype); then, without ranks, world sizes, the default
suites, custom cases and bad input (exit 2 and one line through the CLI)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from sweepbench.launch.preflight import validate

from tests.conftest import SweepRun, run_sweepbench

# Small and quick: a 96x96 float32 tensor (divisible by 2 and 3), 1 warm-up + 2 timed iterations.
SMALL = ["benchmark=reshard", "benchmark.tensor_bytes=36864", "benchmark.iters=2", "benchmark.warmup=1"]
# The suites as a 4-GPU box runs them: every job has 4 ranks (the defaults need 5 and 8).
FOUR_RANKS = ["benchmark.m=[1,2,3]", "benchmark.mesh_ranks=2"]
STRATEGIES = ("send_recv", "broadcast", "naive")
OPTIONS = ["benchmark.local_allgather=true", "benchmark.balance=order", "benchmark.dtype=bfloat16",
           "benchmark.probe_bytes=65536"]

CASES = {
    "one_to_m": ["1_RR_to_1_RR", "1_RR_to_2_RR", "1_RR_to_2_S0R", "1_RR_to_2_RS0",
                 "1_RR_to_3_RR", "1_RR_to_3_S0R", "1_RR_to_3_RS0"],
    "n_to_m": ["2_S0R_to_2_RS0", "1_S0R_to_2_S0R", "2_S0R_to_1_S0R", "1_S0R_to_2_RR",
               "2x1_S0R_to_2x1_RS1", "2x1_RS0_to_1x2_S1R", "2x1_RR_to_2x1_S0S1"],
}
DEFAULT_CASES = {
    "one_to_m": ["1_RR_to_1_RR", "1_RR_to_2_RR", "1_RR_to_2_S0R", "1_RR_to_2_RS0",
                 "1_RR_to_4_RR", "1_RR_to_4_S0R", "1_RR_to_4_RS0"],
    "n_to_m": ["4_S0R_to_4_RS0", "2_S0R_to_4_S0R", "4_S0R_to_2_S0R", "2_S0R_to_4_RR",
               "2x2_S0R_to_2x2_RS1", "2x2_S01R_to_4_RR", "2x2_RS0_to_1x4_S1R", "2x2_RR_to_2x2_S0S1"],
}
STAT_KEYS = ("median_s", "p25_s", "p75_s", "iqr_s", "mean_s", "min_s", "max_s", "std_s")


@pytest.fixture(scope="module")
def one_to_m_sweep(tmp_path_factory: pytest.TempPathFactory) -> SweepRun:
    """one_to_m x every strategy, default options: 3 jobs of 4 ranks."""
    root = tmp_path_factory.mktemp("reshard_one_to_m")
    run = run_sweepbench([*SMALL, *FOUR_RANKS, "benchmark.suite=one_to_m",
                          f"benchmark.strategy={','.join(STRATEGIES)}"], sweep_dir=root / "sweep")
    assert run.rc == 0, run.describe()
    return run


@pytest.fixture(scope="module")
def n_to_m_sweep(tmp_path_factory: pytest.TempPathFactory) -> SweepRun:
    """n_to_m x every strategy, with the other options (local all-gather, round-robin balance,
    bfloat16, probe size) so that they are covered without more jobs: 3 jobs of 4 ranks."""
    root = tmp_path_factory.mktemp("reshard_n_to_m")
    run = run_sweepbench([*SMALL, *FOUR_RANKS, "benchmark.suite=n_to_m", f"benchmark.strategy={','.join(STRATEGIES)}",
                          *OPTIONS], sweep_dir=root / "sweep")
    assert run.rc == 0, run.describe()
    return run


@pytest.fixture(scope="module")
def sweeps(one_to_m_sweep: SweepRun, n_to_m_sweep: SweepRun) -> list[SweepRun]:
    return [one_to_m_sweep, n_to_m_sweep]


def _jobs(run: SweepRun) -> list[dict[str, Any]]:
    jobs = list(run.all_metrics().values())
    assert jobs, run.describe()
    return jobs


def _check_case(case: dict[str, Any], *, probe_bytes: int, iters: int = 2) -> None:
    assert case["verified"] is True
    assert len(case["times_s"]) == case["iters"] == iters and case["warmup"] == 1
    assert all(t > 0 for t in case["times_s"])
    assert all(k in case for k in STAT_KEYS)
    assert case["min_s"] <= case["median_s"] <= case["max_s"]
    assert case["moved_bytes"] >= case["busiest_rank_bytes"] > 0
    assert case["effective_gbps"] == pytest.approx(case["busiest_rank_bytes"] / case["median_s"] / 1e9)
    assert case["p2p_gbps"] > 0 and case["broadcast_gbps"] > 0 and case["probe_bytes"] == probe_bytes
    p2p = case["busiest_rank_bytes"] / (case["p2p_gbps"] * 1e9)
    bcast = case["fanout_recv_bytes"] / (case["broadcast_gbps"] * 1e9)
    assert case["link_floor_s"] == pytest.approx(max(p2p, bcast)) and case["link_floor_s"] > 0
    assert case["floor_bound"] == ("broadcast" if bcast > p2p else "p2p")
    assert case["fraction_of_link"] == pytest.approx(case["link_floor_s"] / case["median_s"])
    assert case["wire_bytes"] >= case["moved_bytes"] or case["strategy"] == "naive"
    assert set(case["src_ranks"]).isdisjoint(case["dst_ranks"])


def test_both_suites_every_strategy_verify(sweeps: list[SweepRun]) -> None:
    seen = set()
    for run in sweeps:
        for tag, m in run.all_metrics().items():  # progress while it ran: the link probe, then each case
            cases = m["results"]["cases"]
            n = len(cases) + 1
            assert run.progress(tag) == [f"1/{n}: link probed at {cases[0]['probe_bytes']} B", *(
                f"{i}/{n}: case {c['case']}: {c['fraction_of_link']:.2f} of the link" for i, c in enumerate(cases, 2))]
        for m in _jobs(run):
            assert m["status"] == "ok", m["error"]
            assert m["verified"] is True
            assert m["world_size"] == 4 and m["backend"] == "gloo"
            b = m["config"]["benchmark"]
            results = m["results"]
            assert results["suite"] == b["suite"] and results["strategy"] == b["strategy"]
            assert [c["case"] for c in results["cases"]] == CASES[b["suite"]]
            for case in results["cases"]:
                assert case["strategy"] == b["strategy"] and case["suite"] == b["suite"]
                assert case["balance"] == b["balance"] and case["dtype"] == b["dtype"]
                assert case["tensor_bytes"] == math.prod(case["shape"]) * (4 if b["dtype"] == "float32" else 2)
                assert case["tensor_bytes"] <= 36864
                # the local all-gather is a broadcast option: recorded as applied only there
                assert case["local_allgather"] is (b["local_allgather"] and b["strategy"] == "broadcast")
                # the link is probed at the cases' size unless probe_bytes says otherwise
                _check_case(case, probe_bytes=b["probe_bytes"] or 36864)
            seen.add((b["suite"], b["strategy"]))
    assert seen == {(s, t) for s in ("one_to_m", "n_to_m") for t in STRATEGIES}


def test_options_reach_the_cases(n_to_m_sweep: SweepRun) -> None:
    for m in _jobs(n_to_m_sweep):
        for case in m["results"]["cases"]:
            assert case["balance"] == "order" and case["dtype"] == "bfloat16"
            assert case["local_allgather"] is (case["strategy"] == "broadcast")


def test_floor_of_one_to_m(one_to_m_sweep: SweepRun) -> None:
    """Replicated destinations (m >= 2) are bound by the broadcast: each receives the whole tensor;
    sharded ones by the source's p2p egress (it sends the tensor once); 1-to-1 is a p2p copy."""
    for m in _jobs(one_to_m_sweep):
        for case in m["results"]["cases"]:
            t, size = case["tensor_bytes"], len(case["dst_ranks"])
            assert case["shape"] == [96, 96] and t == 36864
            assert case["busiest_rank_bytes"] == t
            assert case["moved_bytes"] == (t * size if case["dst_spec"] == "RR" else t)
            assert case["fanout_recv_bytes"] == (t if case["dst_spec"] == "RR" and size > 1 else 0)


def test_summary_in_results_csv(sweeps: list[SweepRun]) -> None:
    for run in sweeps:
        table = run.results()
        assert len(table) == 3 and (table["status"] == "ok").all() and table["verified"].all()
        for row in table.to_dict("records"):
            m = run.metrics(row["tag"])
            summary = m["results"]["summary"]
            suite = m["config"]["benchmark"]["suite"]
            assert f"-{suite}-{m['config']['benchmark']['strategy']}_" in row["tag"]  # both in the tag
            expected = {"p2p_gbps", "broadcast_gbps"} | {
                f"{n}_{k}" for n in CASES[suite] for k in ("median_s", "effective_gbps", "fraction_of_link")}
            assert set(summary) == expected
            for key, value in summary.items():
                assert row[key] == pytest.approx(value), key
            for case in m["results"]["cases"]:
                assert summary[f"{case['case']}_median_s"] == case["median_s"]
                assert summary[f"{case['case']}_fraction_of_link"] == case["fraction_of_link"]


# ---------------------------------------------------------------- world sizes and cases (no ranks)


@pytest.mark.parametrize(("overrides", "world_size"), [
    ([], 5), (["benchmark.suite=n_to_m"], 8), (FOUR_RANKS, 4), (["benchmark.suite=n_to_m", *FOUR_RANKS], 4),
    (["benchmark.m=[2,7]"], 8), (["benchmark.suite=custom", "benchmark.cases=[2x2_S0R_to_3_RS0]"], 7),
])
def test_world_size_is_the_largest_case(compose, overrides: list[str], world_size: int) -> None:
    assert validate(compose("benchmark=reshard", *overrides)) == world_size


@pytest.mark.parametrize("suite", sorted(DEFAULT_CASES))
def test_default_suites(compose, suite: str) -> None:
    from sweepbench.parallel.reshard_suites import suite_cases

    cfg = compose("benchmark=reshard", f"benchmark.suite={suite}")
    cases = suite_cases(cfg.benchmark)
    assert [c.name for c in cases] == DEFAULT_CASES[suite]
    for c in cases:
        assert c.shape == (1024, 1024)  # 4 MiB of float32
        assert set(c.src.ranks).isdisjoint(c.dst.ranks)


def test_gpu_sized_tensor_shapes(compose) -> None:
    """1 GiB where every split divides it, just under where a 3-way split does not."""
    from sweepbench.parallel.reshard_suites import suite_cases

    cfg = compose("benchmark=reshard", *FOUR_RANKS, "benchmark.tensor_bytes=1073741824")
    sizes = {c.name: c.src.params[0].nbytes for c in suite_cases(cfg.benchmark)}
    assert sizes["1_RR_to_2_RS0"] == 1 << 30
    assert all((1 << 30) * 0.999 < s <= 1 << 30 for s in sizes.values())


def test_custom_cases(compose) -> None:
    from sweepbench.parallel.reshard_suites import suite_cases

    names = ["1_RRR_to_3_RS0R", "2_S0RR_to_1x2_RRS1", "2x2_S1S0_to_4_S0R"]
    cfg = compose("benchmark=reshard", "benchmark.suite=custom", f"benchmark.cases=[{','.join(names)}]")
    cases = suite_cases(cfg.benchmark)
    assert [c.name for c in cases] == names
    assert [len(c.shape) for c in cases] == [3, 3, 2]
    assert cases[0].shape[1] % 3 == 0 and cases[1].shape[0] % 2 == 0 and cases[1].shape[2] % 2 == 0
    assert cases[2].shape[0] % 4 == 0 and cases[2].shape[1] % 2 == 0
    assert [c.case.world for c in cases] == [4, 4, 8]


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(("overrides", "needle"), [
    (["benchmark.suite=n_to_m", "benchmark.mesh_ranks=3"], "benchmark.mesh_ranks=3 must be an even number"),
    (["benchmark.m=[0,2]"], "benchmark.m=[0, 2]"),
    (["benchmark.dst_specs=[S1R]"], "case 1_RR_to_1_S1R: spec 'S1R' uses mesh axis 1"),
    (["benchmark.suite=custom"], "benchmark.suite=custom needs benchmark.cases"),
    (["benchmark.suite=custom", "benchmark.cases=[2x2_S0R_to_4]"], "benchmark.cases contains '2x2_S0R_to_4'"),
    (["benchmark.suite=custom", "benchmark.cases=[2_S0R_to_2_S0]"], "different numbers of tensor dims"),
    (["benchmark.tensor_bytes=8"], "benchmark.tensor_bytes=8 is too small for case 1_RR_to_4_S0R"),
    (["benchmark.dtype=int8"], "benchmark.dtype='int8'"),
    (["benchmark.balance=best"], "benchmark.balance='best'"),
])
def test_bad_values_are_named(compose, overrides: list[str], needle: str) -> None:
    with pytest.raises(ValueError) as info:
        validate(compose("benchmark=reshard", *overrides))
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("override", "needle"), [
    ("benchmark.suite=one_to_m,bogus", "benchmark.suite='bogus'; valid: custom, n_to_m, one_to_m"),
    ("benchmark.strategy=warp", "benchmark.strategy='warp'; valid: "),
    ("benchmark.dst_specs=[RR,S0X]", "benchmark.dst_specs contains 'S0X': bad sharding spec 'S0X'"),
], ids=["suite", "strategy", "spec"])
def test_cli_bad_input_exits_2_with_one_line(tmp_path: Path, override: str, needle: str) -> None:
    sweep_dir = tmp_path / "sweep"
    run = run_sweepbench(["benchmark=reshard", override], sweep_dir=sweep_dir, cwd=tmp_path / "cwd")
    assert run.rc == 2, run.describe()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, f"stderr is not one line:\n{run.stderr}"
    assert lines[0].startswith("sweepbench: error: ") and needle in lines[0], lines[0]
    assert not sweep_dir.exists()
