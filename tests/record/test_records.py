"""What a job leaves behind besides its numbers: the offline wandb run (read back with wandb's
own reader), wandb failures that never fail a job, and env.json without secrets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sweepbench.config.validate import resolve_backend
from sweepbench.core import JobOutcome
from sweepbench.record.env import REDACTED, relevant_environment

from tests.conftest import SECRETS, TINY, VISIBLE, SweepRun, base_env, run_sweepbench, wandb_inspect

# ---------------------------------------------------------------- the offline wandb run


@pytest.fixture(scope="module")
def wandb_runs(main_sweep: SweepRun) -> dict[str, dict[str, Any]]:
    return {job.name: wandb_inspect(main_sweep.metrics(job.name)["wandb"]["dir"]) for job in main_sweep.job_dirs()}


def test_wandb_run_is_in_the_job_dir(main_sweep: SweepRun) -> None:
    for job in main_sweep.job_dirs():
        w = main_sweep.metrics(job.name)["wandb"]
        assert w["error"] is None
        run_dir = Path(w["dir"])
        assert run_dir.parent == job / "wandb" and run_dir.name.startswith("offline-run-")
        assert list(run_dir.glob("run-*.wandb"))


def test_wandb_run_holds_the_metrics(main_sweep: SweepRun, wandb_runs: dict[str, dict[str, Any]]) -> None:
    assert set(wandb_runs) == {job.name for job in main_sweep.job_dirs()}
    for tag, w in wandb_runs.items():
        m = main_sweep.metrics(tag)
        assert w["name"] == tag
        assert w["project"] == "sweepbench"
        assert w["state"] == "finished" and w["exit_code"] == 0
        s = w["summary"]
        assert s["status"] == "ok" and s["verified"] is True
        assert s["world_size"] == m["world_size"] and s["backend"] == "gloo"
        for key, value in m["results"]["summary"].items():
            assert s[key] == pytest.approx(value), key
        assert s["all_reduce_busbw_gbps"] > 0
        # one history step per measured case
        assert s["_step"] == len(m["results"]["cases"]) - 1
        assert w["config"]["parallelism.name"] == m["config"]["parallelism"]["name"]
        assert w["config"]["benchmark.iters"] == 3


# ---------------------------------------------------------------- wandb failing

FAKE_KEY = "sekrit" + "0" * 34  # 40 characters, like a real key


@pytest.fixture(scope="module")
def wandb_down(tmp_path_factory: pytest.TempPathFactory) -> SweepRun:
    """A plain run (no -m: a sweep of one job) with wandb online against a port nobody serves."""
    root = tmp_path_factory.mktemp("wandb_down")
    env = base_env(WANDB_MODE="online", WANDB_BASE_URL="http://127.0.0.1:9", WANDB_API_KEY=FAKE_KEY)
    return run_sweepbench(["parallelism=tp1", *TINY, "wandb.init_timeout_s=5"], sweep_dir=root / "sweep",
                          multirun=False, env=env, timeout=180)


def test_wandb_failure_never_fails_the_job(wandb_down: SweepRun) -> None:
    assert wandb_down.rc == 0, wandb_down.describe()
    (job,) = wandb_down.job_dirs()  # a plain run is a sweep of one job
    m = wandb_down.metrics(job.name)
    assert m["status"] == "ok" and m["verified"] is True and m["error"] is None
    assert m["results"]["cases"]
    assert m["wandb"]["dir"] is None
    assert m["wandb"]["error"].startswith("wandb init (online): ")
    table = wandb_down.results()
    assert list(table["tag"]) == [job.name] and list(table["status"]) == ["ok"]


def test_wandb_failure_keeps_the_key_out(wandb_down: SweepRun) -> None:
    (job,) = wandb_down.job_dirs()
    for name in ("metrics.json", "env.json"):
        assert FAKE_KEY not in (job / name).read_text()
    assert wandb_down.env_json(job.name)["environment"]["WANDB_API_KEY"] == REDACTED


# ---------------------------------------------------------------- secrets


def _all_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]


def test_env_json_redacts_secrets(main_sweep: SweepRun) -> None:
    for job in main_sweep.job_dirs():
        env = main_sweep.env_json(job.name)["environment"]
        # relevant and secret-looking: kept, value redacted
        assert env["WANDB_API_KEY"] == REDACTED
        assert env["NCCL_FAKE_TOKEN"] == REDACTED
        assert env["TORCH_SECRET_THING"] == REDACTED
        # not relevant: not kept at all (or, if ever kept, redacted)
        assert env.get("MY_PASSWORD", REDACTED) == REDACTED
        # relevant and harmless: kept as is, so the capture itself is checked too
        assert env["TORCH_SWEEPBENCH_MARKER"] == VISIBLE["TORCH_SWEEPBENCH_MARKER"]


def test_no_secret_written_anywhere(main_sweep: SweepRun) -> None:
    files = _all_files(main_sweep.sweep_dir)
    assert any(p.name == "env.json" for p in files) and any(p.name == "metrics.json" for p in files)
    for path in files:
        data = path.read_bytes()
        for name, secret in SECRETS.items():
            assert secret.encode() not in data, f"{name}'s value is in {path}"
    assert all(s not in main_sweep.stdout + main_sweep.stderr for s in SECRETS.values())


def test_relevant_environment_redaction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "eth0")
    monkeypatch.setenv("SLURM_MY_Secret", "s3")
    monkeypatch.setenv("HYDRA_API_KEY", "s4")
    monkeypatch.setenv("GLOO_PASSWORD_FILE", "s5")
    monkeypatch.setenv("UNRELATED_THING", "nope")
    env = relevant_environment()
    assert env["SLURM_JOB_ID"] == "4242" and env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["SLURM_MY_Secret"] == env["HYDRA_API_KEY"] == env["GLOO_PASSWORD_FILE"] == REDACTED
    assert "UNRELATED_THING" not in env


# ---------------------------------------------------------------- metrics.json from an outcome


def test_unverified_result_is_a_failed_job_without_times(compose) -> None:
    from sweepbench.record.recorder import build_metrics

    cfg = compose("parallelism=tp1")
    result = {"verified": False, "summary": {"all_reduce_busbw_gbps": 1.0},
              "cases": [{"op": "all_reduce", "times_s": [1.0]}], "extra": {}}
    m = build_metrics(cfg, JobOutcome("ok", payload={"result": result, "backend": "gloo",
                                                     "memory_per_rank": [{"host_max_rss_bytes": 5}]}),
                      tag="t", world_size=1, overrides=[], wall_time_s=1.0)
    assert m["status"] == "failed" and m["verified"] is False
    assert "did not verify" in m["error"]
    assert m["results"] == {}
    assert m["memory"]["max"] == {"host_max_rss_bytes": 5}
    json.dumps(m)  # serialisable as is


def test_failed_outcome_keeps_its_error(compose) -> None:
    from sweepbench.record.recorder import build_metrics

    cfg = compose("parallelism=tp2")
    m = build_metrics(cfg, JobOutcome("timeout", "job exceeded launch.timeout_s=1s"), tag="t", world_size=2,
                      overrides=["parallelism=tp2"], wall_time_s=1.5)
    assert (m["status"], m["error"], m["verified"], m["results"]) == ("timeout", "job exceeded launch.timeout_s=1s",
                                                                      False, {})
    assert m["backend"] == resolve_backend("auto") and m["overrides"] == ["parallelism=tp2"] and m["wall_time_s"] == 1.5
    assert m["wall_phases_s"] is None  # no rank reported where its time went: nothing is made up


def test_a_killed_write_leaves_nothing_for_the_next_launch(tmp_path: Path) -> None:
    """A rank SIGKILLed in the middle of writing its error note or rank 0's payload leaves
    write_atomic's temporaries; the next launch in that job dir clears them with the notes."""
    import subprocess
    import sys

    from sweepbench.launch.local import clear_leftovers

    for name in (".rank1_error.json", ".rank0_payload.0123456789ab.json"):
        killed = subprocess.run([sys.executable, "-c", (
            "import os, signal\n"
            "from sweepbench.record import atomic\n"
            "atomic.os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # dies before the rename\n"
            f"atomic.write_json_atomic({str(tmp_path / name)!r}, {{'rank': 1}})\n")])
        assert killed.returncode == -9
    (tmp_path / ".rank0_error.json").write_text("{}")  # a finished note of an earlier launch
    (tmp_path / "metrics.json").write_text("{}")  # not a leftover
    assert len(list(tmp_path.glob(".*.tmp"))) == 2
    clear_leftovers(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]


def test_timed_seconds_counts_every_op_a_sample_stands_for() -> None:
    """measuring_fraction's numerator: a sample of k back-to-back ops records time / k, so it counts k times."""
    from sweepbench.record.recorder import sample_ops, timed_seconds

    cases = [{"times_s": [1.0, 2.0]}, {"times_s": [1.0], "ops_per_sample": 3}, {"op": "no times"}]
    assert timed_seconds(cases) == 3.0 + 3.0
    assert timed_seconds(cases, ops_per_sample=sample_ops({"sampling": {"ops_per_sample": 2}})) == 6.0 + 3.0
    assert sample_ops({}) == sample_ops({"sampling": {"ops_per_sample": 0}}) == 1
