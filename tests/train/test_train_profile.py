"""benchmark.profile=true: per-rank gzipped Chrome traces and TensorBoard event files under the
job directory, read back with their own readers (json + gzip, TensorBoard's EventAccumulator).
The job also trains LoRA adapters (base frozen) with selective activation checkpointing, verified
at reduced depth (2 of 4 layers) as a model too large for one device would be, and times its steps
two back to back per sample (benchmark.steps_per_sample=2)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from ..conftest import SweepRun, planned_tag, run_sweepbench

ARGS = ["benchmark=train", "model=tiny", "backend=gloo", "parallelism=dp2", "benchmark.warmup=1",
        "benchmark.iters=3", "benchmark.profile=true", "benchmark.profile_skip=1", "benchmark.profile_warmup=1",
        "benchmark.profile_active=2", "benchmark.lora_rank=8", "benchmark.ac=selective", "benchmark.verify_layers=2",
        "benchmark.steps_per_sample=2", "wandb.mode=disabled"]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory, compose: Any) -> tuple[SweepRun, Path, dict[str, Any]]:
    run = run_sweepbench(ARGS, sweep_dir=tmp_path_factory.mktemp("train_profile") / "sweep", timeout=600)
    assert run.rc == 0, run.describe()
    tag = planned_tag(compose, *ARGS)
    return run, run.sweep_dir / tag, run.metrics(tag)


def test_traces_per_rank_open_as_chrome_traces(profiled: tuple[SweepRun, Path, dict[str, Any]]) -> None:
    _, job, metrics = profiled
    for rank in (0, 1):
        traces = sorted((job / "profile").glob(f"rank{rank}.*.pt.trace.json.gz"))
        assert len(traces) == 1, list((job / "profile").iterdir())
        trace = json.loads(gzip.decompress(traces[0].read_bytes()))
        names = {e.get("name", "") for e in trace["traceEvents"]}
        assert any(n.startswith("ProfilerStep#") for n in names)  # the active steps
        assert any("aten::mm" in n or "aten::addmm" in n for n in names)  # the model ran in the window
    assert metrics["results"]["files"]["traces"][0].startswith("profile/rank0.")


def test_tensorboard_scalars_read_back(profiled: tuple[SweepRun, Path, dict[str, Any]]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, job, metrics = profiled
    losses = metrics["results"]["cases"][0]["loss_per_step"]
    for rank in (0, 1):
        acc = EventAccumulator(str(job / "tensorboard" / f"rank{rank}"))
        acc.Reload()
        tags = set(acc.Tags()["scalars"])
        assert {"loss", "tokens_per_s", "step_time_s", "memory_gib"} <= tags
        logged = [e.value for e in acc.Scalars("loss")]
        assert logged == pytest.approx(losses, rel=1e-6)  # every rank logs the global loss
        assert [e.step for e in acc.Scalars("loss")] == list(range(7))
        # 1 warm-up step, then 3 samples of 2 steps: each sample's figures at its last step
        for tag in ("tokens_per_s", "step_time_s"):
            assert [e.step for e in acc.Scalars(tag)] == [2, 4, 6] and all(e.value > 0 for e in acc.Scalars(tag))
        assert [e.step for e in acc.Scalars("memory_gib")] == [0, 2, 4, 6]  # after the warm-up, then each sample
        assert all(e.value > 0 for e in acc.Scalars("memory_gib"))
    assert [e.value for e in acc.Scalars("step_time_s")] == pytest.approx(metrics["results"]["cases"][0]["times_s"])


def test_steps_back_to_back_are_timed_per_sample_and_all_trained(profiled: tuple[SweepRun, Path, dict[str, Any]]) -> None:
    run, job, metrics = profiled
    r = metrics["results"]
    case = r["cases"][0]
    assert r["sampling"]["ops_per_sample"] == 2 and r["sampling"]["samples"] == 3
    assert "time of 2 back-to-back calls / 2" in r["sampling"]["sample"]
    assert case["steps_per_sample"] == r["summary"]["steps_per_sample"] == 2 and len(case["times_s"]) == 3
    assert len(case["loss_per_step"]) == 1 + 3 * 2  # the warm-up step and every timed step trained
    assert run.results()["steps_per_sample"].tolist() == [2]


def test_lora_trains_adapters_only(profiled: tuple[SweepRun, Path, dict[str, Any]]) -> None:
    _, _, metrics = profiled
    r = metrics["results"]
    assert metrics["verified"] and r["verification"]["max_rel_err"] <= 1e-4
    adapters = 4 * 8 * (2 * 64 + 2 * (64 + 64) + 2 * 64)
    assert r["num_params"] == 328256 + adapters
    assert r["num_trainable"] == adapters  # the whole base model is frozen
    assert r["summary"]["loss_last"] < r["summary"]["loss_first"]


def test_reduced_depth_verification_is_said(profiled: tuple[SweepRun, Path, dict[str, Any]]) -> None:
    _, _, metrics = profiled
    v = metrics["results"]["verification"]
    assert v["reduced_depth"] and v["layers"] == 2 and "reduced depth (2 of 4 layers" in v["note"]
    assert metrics["results"]["summary"]["verify_layers"] == 2
    # the full model is timed from its own first step: warm-up + timed steps, all recorded
    assert len(metrics["results"]["cases"][0]["loss_per_step"]) == 1 + 3 * 2
    assert v["layout_losses"] != metrics["results"]["cases"][0]["loss_per_step"][:2]  # 2 layers != 4 layers
