"""The fine-tune scenarios are saved grids (hydra.sweeper.params): a dry run expands each into
models x num_gpus x recipe options, one tag and one reproducing command per job."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from ..conftest import planned_tag, run_sweepbench

CPU_GRID = {"parallelism": ["tp1", "dp2"], "benchmark.lora_rank": ["0", "8"], "benchmark.ac": ["none", "full"],
            "benchmark.dp_shard": ["fsdp", "ddp"]}


def test_cpu_scenario_expands_to_its_grid(tmp_path: Path, compose: Any) -> None:
    run = run_sweepbench(["experiment=finetune_fms_cpu", "sweep.dry_run=true"], sweep_dir=tmp_path / "sweep",
                         cwd=tmp_path / "cwd")
    assert run.rc == 0, run.describe()
    expected = set()
    for values in itertools.product(*CPU_GRID.values()):
        overrides = [f"{k}={v}" for k, v in zip(CPU_GRID, values)]
        expected.add(planned_tag(compose, "benchmark=train", "experiment=finetune_fms_cpu", *overrides))
    assert len(expected) == 16
    # a dry run through a pipe: one line per job, "TAG: ...; alone: COMMAND"
    listed = {line.strip().split(":")[0] for line in run.stdout.splitlines() if line.strip().startswith("train-")}
    assert listed == expected, run.stdout
    commands = [line.split("alone: ", 1)[1] for line in run.stdout.splitlines() if "alone: python -m sweepbench" in line]
    assert len(commands) == 16 and all("experiment=finetune_fms_cpu" in c for c in commands)
    assert not (tmp_path / "sweep").exists()


def test_gpu_scenario_grid_and_cli_wins(tmp_path: Path) -> None:
    # the saved model and compile lists are replaced by the CLI's; memory is not checked on this CPU box
    run = run_sweepbench(["experiment=finetune_fms", "model=llama3_1b", "benchmark.compile=false", "sweep.dry_run=true",
                          "launch.skip_memory_check=true"], sweep_dir=tmp_path / "sweep", cwd=tmp_path / "cwd")
    assert run.rc == 0, run.describe()
    tags = [line.strip().split(":")[0] for line in run.stdout.splitlines() if line.strip().startswith("train-")]
    assert len(tags) == 3 * 2 * 2 * 2  # num_gpus x lora x ac x dp_shard
    assert all("_llama3_1b_" in t for t in tags)
    for gpus, layout in ((1, "tp1"), (2, "dp2"), (4, "dp4")):
        assert sum(f"_{layout}_" in t and f"_ws{gpus}_" in t for t in tags) == 8
