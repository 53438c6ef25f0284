"""Real sweeps through the CLI: job dirs named by tag, per-job files, results.csv, failure
handling (raise, exit, kill, hang + timeout), resume, sweep.force and dry run."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from omegaconf import OmegaConf

from tests.conftest import MAIN_GRID, TINY, SweepRun, planned_tag, processes_with_env, run_sweepbench, wandb_inspect

SWEEP_FILES = {"results.csv", "results.parquet", "multirun.yaml", "report.html"}


# ---------------------------------------------------------------- the main sweep


def test_job_dirs_are_named_by_tag(main_sweep: SweepRun, main_tags: dict[str, list[str]]) -> None:
    assert len(main_tags) == 3
    assert {p.name for p in main_sweep.job_dirs()} == set(main_tags)
    assert {p.name for p in main_sweep.sweep_dir.iterdir() if p.is_file()} == SWEEP_FILES


def test_job_dir_holds_hydra_config_and_rank_logs(main_sweep: SweepRun, main_tags: dict[str, list[str]]) -> None:
    for tag, overrides in main_tags.items():
        job = main_sweep.sweep_dir / tag
        cfg = OmegaConf.load(job / ".hydra" / "config.yaml")
        assert f"parallelism={cfg.parallelism.name}" in overrides
        assert cfg.benchmark.iters == 3 and cfg.benchmark.max_bytes == 4096
        assert OmegaConf.to_container(OmegaConf.load(job / ".hydra" / "overrides.yaml")) == overrides
        world_size = main_sweep.metrics(tag)["world_size"]
        logs = sorted(p.name for p in (job / "logs").iterdir())
        assert logs == [f"rank{r}.log" for r in range(world_size)], (tag, logs)


def test_metrics_json(main_sweep: SweepRun, main_tags: dict[str, list[str]]) -> None:
    expected_ws = {"tp2": 2, "dp2": 2, "tp4": 4}
    for tag in main_tags:
        m = main_sweep.metrics(tag)
        assert m["status"] == "ok", m["error"]
        assert m["error"] is None
        assert m["verified"] is True
        assert m["tag"] == tag
        assert m["benchmark"] == "collective"
        assert m["backend"] == "gloo"
        assert m["world_size"] == expected_ws[m["config"]["parallelism"]["name"]]
        assert m["config"]["benchmark"]["iters"] == 3
        assert 0 < m["wall_time_s"] < 240
        mem = m["memory"]
        assert len(mem["per_rank"]) == m["world_size"]
        assert mem["max"]["host_max_rss_bytes"] == max(r["host_max_rss_bytes"] for r in mem["per_rank"]) > 0
        cases = m["results"]["cases"]
        ops = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv"}
        assert {c["op"] for c in cases} == ops
        assert len(cases) == len(ops) * 2  # sizes 1024 and 4096 (step 4)
        assert m["results"]["skipped_ops"] == []
        assert set(m["results"]["summary"]) == {f"{op}_{k}" for op in ops for k in ("busbw_gbps", "median_s")}


def test_per_iteration_times_and_statistics(main_sweep: SweepRun, main_tags: dict[str, list[str]]) -> None:
    import numpy as np

    for tag in main_tags:
        for case in main_sweep.metrics(tag)["results"]["cases"]:
            times = case["times_s"]
            assert len(times) == case["iters"] == 3 and case["warmup"] == 1
            assert all(t > 0 for t in times)
            assert case["median_s"] == pytest.approx(statistics.median(times))
            assert case["min_s"] == min(times) and case["max_s"] == max(times)
            p25, p75 = np.percentile(times, [25, 75])
            assert case["iqr_s"] == pytest.approx(p75 - p25)
            assert case["mean_s"] == pytest.approx(statistics.fmean(times))
            assert case["min_s"] <= case["median_s"] <= case["max_s"]


def test_env_json(main_sweep: SweepRun, main_tags: dict[str, list[str]]) -> None:
    import torch

    for tag in main_tags:
        env = main_sweep.env_json(tag)
        assert env["torch"] == torch.__version__
        assert env["python"].count(".") == 2
        assert env["gpus"]["count"] == torch.cuda.device_count()
        assert env["cpu_count"] >= 1 and env["host"]
        assert set(env["git"]) == {"commit", "dirty"}
        assert "slurm" in env and isinstance(env["environment"], dict)
        assert "HYDRA_FULL_ERROR" not in env["environment"]


def test_results_csv_one_row_per_job(main_sweep: SweepRun, main_tags: dict[str, list[str]]) -> None:
    table = main_sweep.results()
    assert len(table) == 3
    assert set(table["tag"]) == set(main_tags)
    assert (table["status"] == "ok").all()
    assert table["verified"].all()
    assert not table["resumed"].any()
    for row in table.to_dict("records"):
        m = main_sweep.metrics(row["tag"])
        assert row["world_size"] == m["world_size"]
        assert row["backend"] == "gloo"
        assert row["parallelism"] == m["config"]["parallelism"]["name"]
        assert row["tp"] * row["pp"] * row["ep"] * row["dp"] * row["cp"] == row["world_size"]
        assert row["all_reduce_busbw_gbps"] == pytest.approx(m["results"]["summary"]["all_reduce_busbw_gbps"])
        assert row["wall_time_s"] == pytest.approx(m["wall_time_s"])
    parquet = pd.read_parquet(main_sweep.sweep_dir / "results.parquet")
    assert list(parquet["tag"]) == list(table["tag"])
    assert list(parquet.columns) == list(table.columns)


def test_summary_table_printed(main_sweep: SweepRun, main_tags: dict[str, list[str]]) -> None:
    assert f"sweep {main_sweep.sweep_dir}" in main_sweep.stdout
    for tag in main_tags:
        assert tag in main_sweep.stdout
    assert main_sweep.stderr.count("did not finish ok") == 0


def test_dry_run_lists_the_same_tags_and_starts_nothing(main_sweep: SweepRun, tmp_path: Path) -> None:
    """Tags are equal across two sweeps: a dry run of the main grid names the main sweep's dirs."""
    cwd = tmp_path / "cwd"
    run = run_sweepbench([*MAIN_GRID, "sweep.dry_run=true"], sweep_dir=tmp_path / "sweep", cwd=cwd)
    assert run.rc == 0, run.describe()
    for job in main_sweep.job_dirs():
        assert job.name in run.stdout
    assert "3 jobs" in run.stdout
    assert "Launching" not in run.stdout
    assert not (tmp_path / "sweep").exists()
    assert list(cwd.iterdir()) == []


# ---------------------------------------------------------------- failures

FAULT_TIMEOUT_S = 25  # includes the ranks' start-up (import torch), slow on a loaded 2-core box
FAULT_KINDS = ["hang", "raise", "exit", "kill", "none"]  # hang first: the sweep must go on after it
FAULT_GRID = ["parallelism=tp2", "fault.rank=1", f"fault.kind={','.join(FAULT_KINDS)}",
              f"launch.timeout_s={FAULT_TIMEOUT_S}", *TINY]


@pytest.fixture(scope="module")
def fault_sweep(tmp_path_factory: pytest.TempPathFactory, compose) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("faults")
    run = run_sweepbench(FAULT_GRID, sweep_dir=root / "sweep")
    base = [a for a in FAULT_GRID if not a.startswith("fault.kind=")]
    tags = {kind: planned_tag(compose, *base, f"fault.kind={kind}") for kind in FAULT_KINDS}
    leftovers = processes_with_env("SWEEPBENCH_TEST_RUN", run.env["SWEEPBENCH_TEST_RUN"])
    return {"run": run, "tags": tags, "leftovers": leftovers}


def test_failed_jobs_make_the_sweep_exit_1(fault_sweep: dict[str, Any]) -> None:
    run: SweepRun = fault_sweep["run"]
    assert run.rc == 1, run.describe()
    assert "4 of 5 jobs did not finish ok" in run.stderr
    table = run.results().set_index("tag")
    assert len(table) == 5
    statuses = {kind: table.loc[tag, "status"] for kind, tag in fault_sweep["tags"].items()}
    assert statuses == {"hang": "timeout", "raise": "failed", "exit": "failed", "kill": "failed", "none": "ok"}


def test_other_jobs_results_intact(fault_sweep: dict[str, Any]) -> None:
    run: SweepRun = fault_sweep["run"]
    m = run.metrics(fault_sweep["tags"]["none"])
    assert m["status"] == "ok" and m["verified"] is True
    assert [c["op"] for c in m["results"]["cases"]] == ["all_reduce"]
    assert len(m["results"]["cases"][0]["times_s"]) == 2
    assert (run.sweep_dir / fault_sweep["tags"]["none"] / "env.json").exists()


def test_raise_recorded_as_failed(fault_sweep: dict[str, Any]) -> None:
    run: SweepRun = fault_sweep["run"]
    tag = fault_sweep["tags"]["raise"]
    m = run.metrics(tag)
    assert m["status"] == "failed"
    # the cause, not its echo on rank 0 ("connection closed by peer")
    assert m["error"] == "rank 1: RuntimeError: injected fault: fault.kind=raise on rank 1"
    assert m["verified"] is False and m["results"] == {}  # no times from a failed job
    assert "RuntimeError: injected fault" in (run.sweep_dir / tag / "logs" / "rank1.log").read_text()
    # the failure reaches wandb too
    w = wandb_inspect(m["wandb"]["dir"])
    assert w["name"] == tag and w["exit_code"] == 1 and w["summary"]["status"] == "failed"


@pytest.mark.parametrize(("kind", "how"), [("exit", "exit code 3"), ("kill", "signal SIGKILL")])
def test_rank_death_recorded_as_failed(fault_sweep: dict[str, Any], kind: str, how: str) -> None:
    m = fault_sweep["run"].metrics(fault_sweep["tags"][kind])
    assert m["status"] == "failed"
    assert m["error"] == f"rank 1 died ({how})"
    assert m["verified"] is False and m["results"] == {}


def test_hung_rank_ended_by_timeout(fault_sweep: dict[str, Any]) -> None:
    run: SweepRun = fault_sweep["run"]
    tag = fault_sweep["tags"]["hang"]
    m = run.metrics(tag)
    assert m["status"] == "timeout"
    assert f"launch.timeout_s={FAULT_TIMEOUT_S}" in m["error"] and "2 ranks were killed" in m["error"]
    assert FAULT_TIMEOUT_S <= m["wall_time_s"] < FAULT_TIMEOUT_S + 30
    assert m["verified"] is False and m["results"] == {}


def test_sweep_goes_on_after_the_hang(fault_sweep: dict[str, Any]) -> None:
    run: SweepRun = fault_sweep["run"]
    mtimes = {kind: (run.sweep_dir / tag / "metrics.json").stat().st_mtime_ns
              for kind, tag in fault_sweep["tags"].items()}
    assert all(mtimes["hang"] < mtimes[k] for k in FAULT_KINDS if k != "hang"), mtimes


def test_no_rank_outlives_its_sweep(fault_sweep: dict[str, Any]) -> None:
    assert fault_sweep["leftovers"] == [], f"processes of the sweep still alive: {fault_sweep['leftovers']}"


# ---------------------------------------------------------------- resume and sweep.force

RESUME_GRID = ["parallelism=tp1", "fault.kind=none,raise", *TINY]


def _snapshot(run: SweepRun) -> dict[str, Any]:
    jobs = {}
    for job in run.job_dirs():
        jobs[job.name] = {
            "metrics_mtime": (job / "metrics.json").stat().st_mtime_ns,
            "status": run.metrics(job.name)["status"],
            "launches": (job / "sweepbench.log").read_text().count(f"job {job.name}: collective on 1 ranks"),
            "rank0_log": (job / "logs" / "rank0.log").read_text(),
        }
    return {"rc": run.rc, "stdout": run.stdout, "jobs": jobs,
            "results": run.results().set_index("tag")[["status", "resumed"]].to_dict("index"),
            "this_run": run.results().set_index("tag")["this_run"].to_dict()}


@pytest.fixture(scope="module")
def resume_runs(tmp_path_factory: pytest.TempPathFactory, compose) -> dict[str, Any]:
    sweep_dir = tmp_path_factory.mktemp("resume") / "sweep"
    first = _snapshot(run_sweepbench(RESUME_GRID, sweep_dir=sweep_dir))
    again = _snapshot(run_sweepbench(RESUME_GRID, sweep_dir=sweep_dir))
    forced = _snapshot(run_sweepbench(["parallelism=tp1", "fault.kind=none", *TINY, "sweep.force=true"],
                                      sweep_dir=sweep_dir))
    ok = planned_tag(compose, "parallelism=tp1", "fault.kind=none", *TINY)
    bad = planned_tag(compose, "parallelism=tp1", "fault.kind=raise", *TINY)
    return {"first": first, "again": again, "forced": forced, "ok": ok, "bad": bad}


def test_first_run(resume_runs: dict[str, Any]) -> None:
    first, ok, bad = resume_runs["first"], resume_runs["ok"], resume_runs["bad"]
    assert first["rc"] == 1
    assert set(first["jobs"]) == {ok, bad}
    assert first["jobs"][ok]["status"] == "ok" and first["jobs"][bad]["status"] == "failed"
    assert first["jobs"][ok]["launches"] == first["jobs"][bad]["launches"] == 1
    assert first["results"] == {ok: {"status": "ok", "resumed": False}, bad: {"status": "failed", "resumed": False}}


def test_resume_skips_done_jobs(resume_runs: dict[str, Any]) -> None:
    first, again, ok = resume_runs["first"], resume_runs["again"], resume_runs["ok"]
    assert set(again["jobs"]) == set(first["jobs"])  # same tags, same dirs: no new job dir
    assert again["jobs"][ok]["metrics_mtime"] == first["jobs"][ok]["metrics_mtime"]
    assert again["jobs"][ok]["launches"] == 1
    assert again["jobs"][ok]["rank0_log"] == first["jobs"][ok]["rank0_log"]
    assert again["results"][ok] == {"status": "ok", "resumed": True}
    assert "ok (resumed)" in again["stdout"]  # the summary says so too
    assert "resume: 1 job(s) already ok, skipped; 1 to run (1 it ended failed)" in again["stdout"]
    assert "Launching 1 jobs" in again["stdout"] and "fault.kind=none" not in again["stdout"].split("Launching")[1]


def test_resume_reruns_jobs_not_ok(resume_runs: dict[str, Any]) -> None:
    first, again, bad = resume_runs["first"], resume_runs["again"], resume_runs["bad"]
    assert again["rc"] == 1
    assert again["jobs"][bad]["metrics_mtime"] > first["jobs"][bad]["metrics_mtime"]
    assert again["jobs"][bad]["launches"] == 2
    assert again["results"][bad] == {"status": "failed", "resumed": False}


def test_force_reruns_done_jobs(resume_runs: dict[str, Any]) -> None:
    again, forced, ok, bad = resume_runs["again"], resume_runs["forced"], resume_runs["ok"], resume_runs["bad"]
    assert forced["rc"] == 0
    assert forced["jobs"][ok]["metrics_mtime"] > again["jobs"][ok]["metrics_mtime"]
    assert forced["jobs"][ok]["launches"] == 2
    assert len(forced["jobs"][ok]["rank0_log"]) >= len(again["jobs"][ok]["rank0_log"])
    assert forced["jobs"][ok]["status"] == "ok"
    # results.csv covers every job of the directory, marking the one this invocation ran
    assert forced["results"] == {ok: {"status": "ok", "resumed": False}, bad: {"status": "failed", "resumed": False}}
    assert forced["this_run"] == {ok: True, bad: False}
    assert "Launching 1 jobs" in forced["stdout"]
