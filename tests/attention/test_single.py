"""T1 and the reference: each SDPA backend probed in its own process (a backend that kills its
process is left out, the job goes on), both kept in the store of baselines and reused by later
jobs and sweeps, saying where and when they were measured (re-measured under store.refresh=true),
a backend that lost clearly at a shorter length left out, and an impl's context (torch_cp's
structure) entered once per loop, not per iteration."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.attention.test_benchmark import FAST, _case
from tests.conftest import run_sweepbench


def test_context_entered_once_per_loop(worlds: Any) -> None:
    from tests.attention.counted import run_counted

    warmup, iters = 2, 3
    for case, counts in worlds.get(2).run(run_counted, warmup, iters):
        # verification, then fwd and bwd (one loop: each backward over its timed forward's graph),
        # fwd+bwd and fwd+bwd without communication: one entry each
        assert counts["entries"] == 4 == case["context_entries"], counts
        assert counts["calls"] == 1 + 3 * (warmup + iters) and counts["calls_outside"] == 0, counts
        assert counts["open"] == 0
        assert case["verified"] and case["context_entry_s"] >= 0


def test_a_reused_reference_is_what_verification_checks(worlds: Any, tmp_path: Path) -> None:
    """The stored reference is the one the result is checked against: spoil it and the next job's
    verification fails (reuse keeps the guarantee; it does not skip the check)."""
    import torch

    from tests.attention.counted import run_stored

    world = worlds.get(2)
    assert world.run(run_stored, str(tmp_path)) == [(False, None)] * 2  # measured and stored
    assert world.run(run_stored, str(tmp_path)) == [(True, None)] * 2  # reused, verified
    [entry] = [e for e in (tmp_path / "attention-t1").iterdir() if (e / "reference.pt").is_file()]
    out, dq, dk, dv = torch.load(entry / "reference.pt")
    torch.save([out, dq + 1.0, dk, dv], entry / "reference.pt")
    results = world.run(run_stored, str(tmp_path))
    assert all(not reused and err and "dq: 512 of 512 elements off" in err for reused, err in results), results
    torch.save([out[:, :, :1], dq, dk, dv], entry / "reference.pt")  # another case's shape: measured again
    assert world.run(run_stored, str(tmp_path)) == [(False, None)] * 2
    assert world.run(run_stored, str(tmp_path)) == [(True, None)] * 2  # and stored
    meta = json.loads((entry / "entry.json").read_text())  # a T1 whose samples are not times: measured again
    (entry / "entry.json").write_text(json.dumps({**meta, "t1": {**meta["t1"], "times_s": {"cpu_flash": ["x"]}}}))
    assert world.run(run_stored, str(tmp_path)) == [(False, None)] * 2


def test_t1_probe_survives_a_dying_backend(tmp_path: Path) -> None:
    """Both jobs in one kept rank with a spare child: the second job's first child is the spare
    the first job warmed, and a backend that kills or fails it is still left out, the job goes on."""
    run = run_sweepbench([*FAST, "parallelism=cp1", "benchmark.seq_len=64", "benchmark.t1_fault=kill,raise",
                          "store.enabled=false",  # probed every time
                          "launch.keep_ranks=true", "benchmark.t1_spare=true"],
                         sweep_dir=tmp_path / "sweep")
    assert run.rc == 0, run.describe()
    why, spared = {}, []
    for m in run.all_metrics().values():
        case = _case(m)
        assert case["t1_backend"] == "cpu_flash" and set(case["t1_backends"]) == {"cpu_flash"}
        assert set(case["t1_refused"]) == {"fault"}
        why[m["config"]["benchmark"]["t1_fault"]] = case["t1_refused"]["fault"]
        if "t1_spare_start" in case["phase_s"]:
            spared.append(m["rank_start"])
    assert why == {"kill": "its probe process died (killed by SIGKILL)",
                   "raise": "injected fault: benchmark.t1_fault=raise"}
    assert spared == ["kept"]  # the second job's


def _t1(run: Any) -> dict[str, dict[str, Any]]:
    return {_case(m)["impl"]: _case(m) for m in run.all_metrics().values()}


STORED = [*FAST, "parallelism=cp2", "benchmark.seq_len=64", "benchmark.impl=ring,allgather"]


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Any]:
    """Two sweeps of the same two jobs, one after the other, with one store: (the store, first, second)."""
    root = tmp_path_factory.mktemp("stored")
    args = [*STORED, f"store.dir={root / 'store'}"]
    first = run_sweepbench(args, sweep_dir=root / "first")
    assert first.rc == 0, first.describe()
    second = run_sweepbench(args, sweep_dir=root / "second")
    assert second.rc == 0, second.describe()
    return root / "store", first, second


def test_t1_and_reference_measured_once_in_the_sweep_and_stored(stored: tuple[Path, Any, Any]) -> None:
    store, first, _ = stored
    cases = _t1(first)
    assert sorted(c["t1_reused"] for c in cases.values()) == [False, True]  # the second job reused the first's
    assert all(c["reference_reused"] == c["t1_reused"] for c in cases.values())
    measured = next(c for c in cases.values() if not c["t1_reused"])
    assert all(c["t1_backends"] == measured["t1_backends"] for c in cases.values())
    assert all(c["t1_measured"] == measured["t1_measured"] for c in cases.values())  # one measurement, said so
    assert measured["t1_measured"]["job"].startswith(str(first.sweep_dir / "attention-"))
    entries = list((store / "attention-t1").iterdir())
    [entry] = [e for e in entries if (e / "reference.pt").is_file()]  # T1's; beside it T1 at the per-GPU length
    metas = [json.loads((e / "entry.json").read_text()) for e in entries if e != entry]
    [local] = [m for m in metas if m["key"].get("t1_local")]
    [ranking] = [m for m in metas if m["key"].get("ranking")]  # the backends by length, for pruning
    assert local["key"]["seq_len"] == 32 and local["key"]["t1_local"] == "cpu_flash"
    assert set(ranking["lengths"]) == {"64"} and "seq_len" not in ranking["key"]
    # measured by the first job, reused by the second
    assert {c["t1_local_s"] for c in cases.values()} == {local["t1_local_s"]}
    meta = json.loads((entry / "entry.json").read_text())
    assert meta["t1"]["stats"]["cpu_flash"]["median_s"] == measured["t1_s"]
    assert meta["measured"] == measured["t1_measured"]
    assert meta["key"]["seq_len"] == 64 and meta["key"]["torch"] and meta["key"]["device"]
    assert "driver" in meta["key"] and (entry / "reference.pt").is_file()
    rows = first.results()
    assert sorted(rows["t1_reused"]) == [0.0, 1.0]
    assert set(rows["t1_measured_at"]) == {meta["measured"]["at"]}
    for case in cases.values():  # where each job's case spent its time; the reused T1 costs less
        phases = case["phase_s"]
        # where it measured T1: rank 0 computed the reference with the fastest backend, copied it to the
        # host for the store, whose file a thread wrote while the job went on (waited for at its end)
        t1_parts = {f"t1_first_call_{b}" for b in case["t1_backends"]} | {
            "t1_child_start", "t1_children", "t1_reference", "t1_reference_copy"}
        assert set(phases) == {"t1_and_reference", "verify", "verify_first_run", "timing",
                               "t1_reference_save_wait"} | (set() if case["t1_reused"] else t1_parts), phases
        assert 0 < phases["verify_first_run"] <= phases["verify"]
        if not case["t1_reused"]:  # the child's start and first calls are parts of the children's time
            firsts = sum(phases[f"t1_first_call_{b}"] for b in case["t1_backends"])
            assert 0 < phases["t1_child_start"] and 0 < firsts
            assert phases["t1_child_start"] + firsts < phases["t1_children"]
            assert phases["t1_children"] + phases["t1_reference"] + phases["t1_reference_copy"] <= phases[
                "t1_and_reference"]
    assert measured["phase_s"]["t1_and_reference"] > next(c for c in cases.values() if c["t1_reused"])["phase_s"][
        "t1_and_reference"]


def test_the_measuring_time_counts_every_timed_loop_and_t1_only_where_measured(stored: tuple[Path, Any, Any]) -> None:
    """A case's timed_s (the job's measuring time) holds its fwd, bwd and fwd+bwd loops and T1's
    samples of every backend where the job measured T1, never a stored T1's; the record sums it."""
    store, first, second = stored
    [entry] = [e for e in (store / "attention-t1").iterdir() if (e / "reference.pt").is_file()]
    t1 = sum(sum(s) for s in json.loads((entry / "entry.json").read_text())["t1"]["times_s"].values())
    for run in (first, second):
        for m in run.all_metrics().values():
            case = _case(m)
            parts = case["timed_parts_s"]
            for loop, mean in (("fwd", "fwd_mean_s"), ("bwd", "bwd_mean_s"), ("total", "mean_s")):
                assert parts[loop] == pytest.approx(case["iters"] * case[mean], rel=1e-9), loop
            assert (parts["no_comm"] > 0) == (case["exposed_comm_s"] is not None)
            assert parts["t1"] == (0.0 if case["t1_reused"] else pytest.approx(t1, rel=1e-9))
            assert case["timed_s"] == pytest.approx(sum(parts.values()), rel=1e-12)
            assert m["timed_s"] == pytest.approx(case["timed_s"], rel=1e-12)
            assert 0 < m["measuring_fraction"] < 1
    # one job of the first sweep measured T1; the second sweep's came from the store, not counted
    assert [_case(m)["timed_parts_s"]["t1"] > 0 for m in first.all_metrics().values()].count(True) == 1
    assert all(_case(m)["timed_parts_s"]["t1"] == 0 for m in second.all_metrics().values())


def test_a_later_sweep_reuses_the_store_and_says_where_and_when(stored: tuple[Path, Any, Any]) -> None:
    store, first, second = stored
    before = next(c for c in _t1(first).values() if not c["t1_reused"])
    cases = _t1(second)
    assert all(c["t1_reused"] and c["t1_measured"] == before["t1_measured"] for c in cases.values())
    assert all(c["t1_s"] == before["t1_s"] and c["t1_local_s"] == before["t1_local_s"] for c in cases.values())
    assert all(c["verified"] for c in cases.values())
    where = before["t1_measured"]
    rows = second.results()
    assert set(rows["t1_measured_at"]) == {where["at"]} and set(rows["t1_measured_by"]) == {where["job"]}
    assert set(rows["t1_measured_on"]) == {where["host"]}
    for tag in rows["tag"]:  # the job's progress line names where T1 came from
        assert f"(reused: measured {where['at']} on {where['host']} by {where['job']})" in second.progress(tag)[0]
    report = (second.sweep_dir / "report.html").read_text()
    assert f"measured {where['at']} on {where['host']}" in report


def test_refresh_measures_once_per_sweep_and_replaces_and_rounds_reuse(stored: tuple[Path, Any, Any]) -> None:
    """store.refresh=true with two rounds of each job: the sweep's first round of the key measures
    afresh and replaces the entry; every other round of either job reuses that."""
    store, first, _ = stored
    again = run_sweepbench([*STORED, f"store.dir={store}", "store.refresh=true", "sweep.repeats=2"],
                           sweep_dir=store.parent / "refreshed")
    assert again.rc == 0, again.describe()
    rounds = [_case(json.loads(p.read_text())) for p in sorted(again.sweep_dir.glob("*/rounds/*/metrics.json"))]
    assert len(rounds) == 4 and sorted(c["t1_reused"] for c in rounds) == [False, True, True, True]
    remeasured = next(c for c in rounds if not c["t1_reused"])
    assert remeasured["t1_measured"]["job"].startswith(str(again.sweep_dir))
    assert remeasured["t1_measured"]["job"].endswith("/rounds/1")
    assert all(c["verified"] and c["t1_measured"] == remeasured["t1_measured"] for c in rounds)
    [entry] = [e for e in (store / "attention-t1").iterdir() if (e / "reference.pt").is_file()]
    assert json.loads((entry / "entry.json").read_text())["measured"] == remeasured["t1_measured"]  # replaced


def test_a_spare_child_is_started_ahead_warmed_and_never_left_holding(tmp_path: Path) -> None:
    """A spare child imports ahead and serves the next probe (its start is then only the case's
    inputs); a warmed spare that no case reaches leaves by itself, as does a dropped one."""
    import torch

    from sweepbench.attention import t1
    from sweepbench.attention.ops import backends_for

    case = t1.T1Case(batch=1, heads=4, kv_heads=2, seq_len=128, head_dim=8, dtype="float32", device="cpu", seed=7,
                     causal=True, backward=True, pattern="dense", branches=[], iters=2, num_threads=1)
    candidates = backends_for("cpu", torch.float32)
    spent: dict[str, float] = {}
    times, refused = t1.probe_backends(case, candidates, spent=spent, spare=True)
    assert refused == {} and sorted(times) == sorted(candidates) and "spare_start" not in spent  # a fresh child
    first = t1._spare
    assert first is not None and first.poll() is None  # kept for the next probe
    t1.warm_spare(case, candidates)
    spent = {}
    times, refused = t1.probe_backends(case, candidates, spent=spent, spare=True)
    assert refused == {} and sorted(times) == sorted(candidates)
    assert 0 < spent["spare_start"] == spent["child_start"]  # the warmed spare served it
    assert first.returncode == 0 and t1._spare is not None and t1._spare.pid != first.pid
    second = t1._spare
    t1.warm_spare(case, candidates, wait_s=0.5)
    assert second.wait(60) == 0  # no case came: it left, its device with it
    spent = {}
    t1.probe_backends(case, candidates[:1], spent=spent, spare=True)  # a dead spare: a fresh child instead
    assert "spare_start" not in spent and t1._spare is not None
    third = t1._spare
    t1.drop_spare()
    assert third.poll() == 0 and t1._spare is None


def t1_local_from_store(rank: int, world_size: int, store_dir: str) -> float | None:
    """T1 at the per-GPU length (seq 64 over 2 ranks: 32) with rank 0 reading the store in
    ``store_dir``, where rank 0 first files a T1 of 0.125 s for seq 32, as a job at that length would."""
    import torch

    from sweepbench.attention.t1_store import t1_entry
    from sweepbench.attention.t1 import T1Case, _t1_key, t1_local
    from sweepbench.measure.store import Store

    case = T1Case(1, 2, 2, 64, 8, "float32", "cpu", 0, True, True, "dense", [], 1, torch.get_num_threads())
    store = Store(Path(store_dir)) if rank == 0 else None
    if store:
        shorter = T1Case(1, 2, 2, 32, 8, "float32", "cpu", 0, True, True, "dense", [], 1, torch.get_num_threads())
        with t1_entry(store, _t1_key(shorter, ["cpu_flash"], "", torch.device("cpu"))) as entry:
            entry.save({"stats": {"cpu_flash": {"median_s": 0.125}}, "refused": {}}, [torch.zeros(1)])
    return t1_local(rank, case, world_size=world_size, backend="cpu_flash", candidates=["cpu_flash"], fault="",
                    device=torch.device("cpu"), store=store)


def test_t1_at_the_per_gpu_length_is_taken_from_a_job_that_measured_that_length(worlds: Any, tmp_path: Path) -> None:
    """A job at length L/W left its T1 in the store: a W-rank job at L takes T1(L/W) from it
    (efficiency_local's base) rather than timing one device again."""
    assert worlds.get(2).run(t1_local_from_store, str(tmp_path)) == [0.125, 0.125]


def t1_after_a_ranking(rank: int, world_size: int, store_dir: str, slower: float) -> dict[str, Any]:
    """T1 at 64 tokens of candidates cpu_flash and cudnn (which cannot run on a CPU), where the store's
    ranking says that at 32 tokens cudnn took ``slower`` x cpu_flash's time (samples apart)."""
    import torch

    from sweepbench.attention.t1_store import t1_entry
    from sweepbench.attention.scaling import Shape, make_inputs
    from sweepbench.attention.t1 import T1Case, _ranking_key, _t1_key, t1_and_reference
    from sweepbench.measure.store import Store

    case = T1Case(1, 2, 2, 64, 8, "float32", "cpu", 0, True, True, "dense", [], 1, torch.get_num_threads())
    candidates = ["cpu_flash", "cudnn"]
    store = Store(Path(store_dir)) if rank == 0 else None
    if store:
        ranking = {"cpu_flash": {"median_s": 1.0, "min_s": 0.9, "max_s": 1.1},
                   "cudnn": {"median_s": slower, "min_s": slower * 0.95, "max_s": slower * 1.05}}
        with t1_entry(store, _ranking_key(_t1_key(case, candidates, "", torch.device("cpu")))) as entry:
            entry.put("lengths", {"32": ranking, "128": {"cudnn": {"median_s": 0.1, "min_s": 0.1, "max_s": 0.1}}})
    inputs = make_inputs(Shape(1, 2, 2, 64, 8), dtype=torch.float32, device=torch.device("cpu"), seed=0)
    t1, _, _ = t1_and_reference(rank, inputs, case, candidates=candidates, fault="", store=store, prune_factor=2.0)
    return t1


def test_a_backend_that_lost_clearly_at_a_shorter_length_is_not_timed(worlds: Any, tmp_path: Path) -> None:
    """At a shorter length of the same shape (the longest below, 32 of 32 and 128) cudnn took 4x the
    best's time: it is left out, with the rule's numbers; at 1.5x it is within the factor and is
    tried (and refused: no CUDA here). A longer length says nothing."""
    world = worlds.get(2)
    [pruned, _] = world.run(t1_after_a_ranking, str(tmp_path / "a"), 4.0)
    assert set(pruned["stats"]) == {"cpu_flash"} and "cudnn" not in pruned["refused"]
    assert set(pruned["pruned"]) == {"cudnn"}
    assert pruned["pruned"]["cudnn"].startswith("left out at this length: at 32 tokens its median 4 s was 4.00x "
                                                "the best's (cpu_flash 1 s; > factor 2)")
    [tried, _] = world.run(t1_after_a_ranking, str(tmp_path / "b"), 1.5)
    assert tried["pruned"] == {} and set(tried["refused"]) == {"cudnn"} and set(tried["stats"]) == {"cpu_flash"}


def test_the_prune_rule_needs_the_factor_and_separated_samples() -> None:
    from sweepbench.attention.t1_store import prune

    def at_32(median: float, low: float) -> dict[str, Any]:
        return {"32": {"a": {"median_s": 1.0, "min_s": 0.8, "max_s": 1.2},
                       "b": {"median_s": median, "min_s": low, "max_s": median * 2}}}

    assert set(prune(at_32(3.0, 1.5), seq_len=64, candidates=["a", "b"], factor=2.0)) == {"b"}
    assert prune(at_32(3.0, 1.1), seq_len=64, candidates=["a", "b"], factor=2.0) == {}  # samples overlap: noise
    assert prune(at_32(1.9, 1.5), seq_len=64, candidates=["a", "b"], factor=2.0) == {}  # within the factor
    assert prune(at_32(3.0, 1.5), seq_len=64, candidates=["a", "b"], factor=0) == {}  # off
    assert prune(at_32(3.0, 1.5), seq_len=32, candidates=["a", "b"], factor=2.0) == {}  # not shorter
    assert prune({"32": "junk", "x": 1}, seq_len=64, candidates=["a"], factor=2.0) == {}  # hostile: nothing pruned
    # left out at 32 (not timed there): it stays out at 64, and says since when and why
    carried = {"16": {"a": {"median_s": 1.0, "min_s": 0.8, "max_s": 1.2}, "b": {"median_s": 3.0, "min_s": 2.5, "max_s": 4}},
               "32": {"a": {"median_s": 4.0, "min_s": 3.8, "max_s": 4.2}, "c": {"median_s": 4.5, "min_s": 4.1, "max_s": 5},
                      "b": {"pruned": "left out at this length: at 16 tokens its median 3 s was 3.00x the best's"}}}
    why = prune(carried, seq_len=64, candidates=["a", "b", "c"], factor=2.0)
    assert set(why) == {"b"} and why["b"].startswith("left out since 32 tokens, where it was left out at this length: at 16")
    # where only the best was left to time at 32 (every other backend left out), they all stay out at 64
    alone = {"32": {"a": {"median_s": 4.0, "min_s": 3.8, "max_s": 4.2}, "b": {"pruned": "left out at this length"},
                    "c": {"pruned": "left out at this length"}}}
    assert set(prune(alone, seq_len=64, candidates=["a", "b", "c"], factor=1.5)) == {"b", "c"}


def test_a_cold_store_sweep_and_its_warm_rerun_compare_case_by_case(stored: tuple[Path, Any, Any]) -> None:
    """Where T1 came from (measured, or reused from the store) is not part of what a case is: the
    first sweep (one job measured T1) and the second (both reused it) are compared case by case."""
    import csv
    import subprocess
    import sys

    _, first, second = stored
    proc = subprocess.run([sys.executable, "-m", "sweepbench", "compare", str(first.sweep_dir), str(second.sweep_dir)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(second.sweep_dir / "compare.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 2 and all(r["verdict"] != "not compared" for r in rows), rows
