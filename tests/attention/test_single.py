"""T1 and the reference: each SDPA backend probed in its own process (a backend that kills its
process is left out, the job goes on), both kept in the sweep directory and reused by the
sweep's later jobs (re-measured under sweep.force=true), and an impl's context (torch_cp's
structure) entered once per loop, not per iteration."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.attention.test_benchmark import FAST, _case
from tests.conftest import run_sweepbench


def test_context_entered_once_per_loop(worlds: Any) -> None:
    from tests.attention.counted import run_counted

    warmup, iters = 2, 3
    for case, counts in worlds.get(2).run(run_counted, warmup, iters):
        # verification, then fwd, bwd, fwd+bwd and fwd+bwd without communication: one entry each
        assert counts["entries"] == 5 == case["context_entries"], counts
        assert counts["calls"] == 1 + 4 * (warmup + iters) and counts["calls_outside"] == 0, counts
        assert counts["open"] == 0
        assert case["verified"] and case["context_entry_s"] >= 0


def test_a_reused_reference_is_what_verification_checks(worlds: Any, tmp_path: Path) -> None:
    """The stored reference is the one the result is checked against: spoil it and the next job's
    verification fails (reuse keeps the guarantee; it does not skip the check)."""
    import torch

    from tests.attention.counted import run_stored

    (tmp_path / "multirun.yaml").write_text("{}\n")
    world = worlds.get(2)
    assert world.run(run_stored, str(tmp_path)) == [(False, None)] * 2  # measured and stored
    assert world.run(run_stored, str(tmp_path)) == [(True, None)] * 2  # reused, verified
    [entry] = [e for e in (tmp_path / ".sweepbench-cache" / "attention").iterdir() if (e / "reference.pt").is_file()]
    out, dq, dk, dv = torch.load(entry / "reference.pt")
    torch.save([out, dq + 1.0, dk, dv], entry / "reference.pt")
    results = world.run(run_stored, str(tmp_path))
    assert all(not reused and err and "dq: 512 of 512 elements off" in err for reused, err in results), results


def test_t1_probe_survives_a_dying_backend(tmp_path: Path) -> None:
    run = run_sweepbench([*FAST, "parallelism=cp1", "benchmark.seq_len=64", "benchmark.t1_fault=kill,raise"],
                         sweep_dir=tmp_path / "sweep")
    assert run.rc == 0, run.describe()
    why = {}
    for m in run.all_metrics().values():
        case = _case(m)
        assert case["t1_backend"] == "cpu_flash" and set(case["t1_backends"]) == {"cpu_flash"}
        assert set(case["t1_refused"]) == {"fault"}
        why[m["config"]["benchmark"]["t1_fault"]] = case["t1_refused"]["fault"]
    assert why == {"kill": "its probe process died (killed by SIGKILL)",
                   "raise": "injected fault: benchmark.t1_fault=raise"}


def _t1(run: Any) -> dict[str, dict[str, Any]]:
    return {_case(m)["impl"]: _case(m) for m in run.all_metrics().values()}


def test_t1_and_reference_reused_in_the_sweep_and_remeasured_under_force(tmp_path: Path) -> None:
    args = [*FAST, "parallelism=cp2", "benchmark.seq_len=64", "benchmark.impl=ring,allgather"]
    first = run_sweepbench(args, sweep_dir=tmp_path / "sweep")
    assert first.rc == 0, first.describe()
    cases = _t1(first)
    assert sorted(c["t1_reused"] for c in cases.values()) == [False, True]  # the second job reused the first's
    assert all(c["reference_reused"] == c["t1_reused"] for c in cases.values())
    measured = next(c for c in cases.values() if not c["t1_reused"])
    assert all(c["t1_backends"] == measured["t1_backends"] for c in cases.values())
    entries = list((tmp_path / "sweep" / ".sweepbench-cache" / "attention").iterdir())
    [entry] = [e for e in entries if (e / "reference.pt").is_file()]  # T1's; beside it T1 at the per-GPU length
    [local] = [json.loads((e / "entry.json").read_text()) for e in entries if (e / "entry.json").is_file() and e != entry]
    assert local["key"]["seq_len"] == 32 and local["key"]["t1_local"] == "cpu_flash"
    # measured by the first job, reused by the second
    assert {c["t1_local_s"] for c in cases.values()} == {local["t1_local_s"]}
    meta = json.loads((entry / "entry.json").read_text())
    assert meta["t1"]["stats"]["cpu_flash"]["median_s"] == measured["t1_s"]
    assert meta["key"]["seq_len"] == 64 and meta["key"]["torch"] and (entry / "reference.pt").is_file()
    rows = first.results()
    assert sorted(rows["t1_reused"]) == [0.0, 1.0]
    for case in cases.values():  # where each job's case spent its time; the reused T1 costs less
        phases = case["phase_s"]
        # where it measured T1: the child computed the reference with the fastest backend and wrote it
        # for the store, rank 0 read it back
        t1_parts = {f"t1_first_call_{b}" for b in case["t1_backends"]} | {
            "t1_child_start", "t1_children", "t1_child_reference", "t1_reference_load"}
        assert set(phases) == {"t1_and_reference", "verify", "verify_first_run", "timing"} | (
            set() if case["t1_reused"] else t1_parts), phases
        assert 0 < phases["verify_first_run"] <= phases["verify"]
        if not case["t1_reused"]:  # the child's start and first calls are parts of the children's time
            firsts = sum(phases[f"t1_first_call_{b}"] for b in case["t1_backends"])
            assert 0 < phases["t1_child_start"] and 0 < firsts
            assert phases["t1_child_start"] + firsts + phases["t1_child_reference"] < phases["t1_children"]
            assert phases["t1_children"] + phases["t1_reference_load"] <= phases["t1_and_reference"]
    assert measured["phase_s"]["t1_and_reference"] > next(c for c in cases.values() if c["t1_reused"])["phase_s"][
        "t1_and_reference"]

    again = run_sweepbench([*args, "sweep.force=true"], sweep_dir=tmp_path / "sweep")
    assert again.rc == 0, again.describe()
    redo = _t1(again)
    assert sorted(c["t1_reused"] for c in redo.values()) == [False, True]  # measured anew once, then reused
    remeasured = next(c for c in redo.values() if not c["t1_reused"])
    assert remeasured["t1_backends"] != measured["t1_backends"]
    assert all(c["verified"] for c in redo.values())
    assert json.loads((entry / "entry.json").read_text())["run"] != meta["run"]


def test_the_t1_childs_reference_is_its_fastest_backends_output(tmp_path: Path) -> None:
    """The reference a T1 child writes (for the sweep's store, in place of rank 0's recomputation)
    is the output and gradients of the backend it timed fastest, on the seed's inputs."""
    import torch

    from sweepbench.attention.dilated import Branch
    from sweepbench.attention.ops import backends_for
    from sweepbench.attention.scaling import Shape, make_inputs, single_device
    from sweepbench.attention.single import T1Case, probe_backends
    from sweepbench.measure import summarize

    case = T1Case(batch=1, heads=4, kv_heads=2, seq_len=128, head_dim=8, dtype="float32", device="cpu", seed=7,
                  causal=True, backward=True, pattern="dilated", branches=[[32, 1], [64, 2]], iters=2, num_threads=1)
    spent: dict[str, float] = {}
    candidates = backends_for("cpu", torch.float32)
    times, refused, made = probe_backends(case, candidates, spent=spent, reference_to=tmp_path / "ref.pt")
    assert refused == {} and sorted(times) == sorted(candidates)
    assert made == min(times, key=lambda n: summarize(times[n])["median_s"])  # the child's fastest
    assert spent["child_reference"] > 0
    got = torch.load(tmp_path / "ref.pt", weights_only=True)
    q, k, v, dout = make_inputs(Shape(1, 4, 2, 128, 8), dtype=torch.float32, device=torch.device("cpu"), seed=7)
    leaves = [x.detach().requires_grad_() for x in (q, k, v)]
    out = single_device(*leaves, backend=made, causal=True, pattern="dilated", branches=(Branch(32, 1), Branch(64, 2)))
    out.backward(dout)
    assert len(got) == 4
    for g, want in zip(got, [out.detach(), *(x.grad for x in leaves)]):
        torch.testing.assert_close(g, want, rtol=1e-5, atol=1e-6)
    # without a place to write it, no child computes one (rank 0 does, as for a single run)
    assert probe_backends(case, candidates[:1])[2] is None


def t1_local_from_store(rank: int, world_size: int, sweep_dir: str) -> float | None:
    """T1 at the per-GPU length (seq 64 over 2 ranks: 32) with rank 0 reading the store of
    ``sweep_dir``, where rank 0 first files a T1 of 0.125 s for seq 32, as a job at that length would."""
    import torch

    from sweepbench.attention.reuse import SweepStore
    from sweepbench.attention.single import T1Case, _t1_key, t1_local

    case = T1Case(1, 2, 2, 64, 8, "float32", "cpu", 0, True, True, "dense", [], 1, torch.get_num_threads())
    store = SweepStore(Path(sweep_dir), force=False) if rank == 0 else None
    if store:
        shorter = T1Case(1, 2, 2, 32, 8, "float32", "cpu", 0, True, True, "dense", [], 1, torch.get_num_threads())
        with store.entry(_t1_key(shorter, ["cpu_flash"], "", torch.device("cpu"))) as entry:
            entry.save({"stats": {"cpu_flash": {"median_s": 0.125}}, "refused": {}}, [torch.zeros(1)])
    return t1_local(rank, case, world_size=world_size, backend="cpu_flash", candidates=["cpu_flash"], fault="",
                    device=torch.device("cpu"), store=store)


def test_t1_at_the_per_gpu_length_is_taken_from_a_job_that_measured_that_length(worlds: Any, tmp_path: Path) -> None:
    """A sweep's job at length L/W left its T1 in the store: a W-rank job at L takes T1(L/W) from it
    (efficiency_local's base) rather than timing one device again."""
    (tmp_path / "multirun.yaml").write_text("{}\n")
    assert worlds.get(2).run(t1_local_from_store, str(tmp_path)) == [0.125, 0.125]
