"""Bad train configs are refused before any rank starts, with one line naming the bad value and
what would be valid: through the CLI once (exit 2, no sweep directory), and each case through the
same validation the CLI runs (Hydra's compose API, in process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ..conftest import refusal, run_sweepbench

BASE = ["benchmark=train", "model=tiny", "backend=gloo"]

BAD = {
    # degrees that do not divide heads / layers / batch
    "tp_heads": (["parallelism=tp2", "parallelism.tp=3"], "parallelism.tp=3 does not divide model.num_heads=8"),
    "pp_layers": (["parallelism=pp2", "model.num_layers=3"], "parallelism.pp=2 does not divide model.num_layers=3"),
    "batch": (["parallelism=dp2", "benchmark.global_batch=3"],
              "benchmark.global_batch=3 is not divisible by dp*micro_batch=2*1=2"),
    "seq": (["parallelism=tp2", "benchmark.seq_len=130"], "benchmark.seq_len=130 is not divisible by tp*2*cp=4"),
    "pp_micro": (["parallelism=pp2", "benchmark.global_batch=1"],
                 "parallelism.pp=2 needs a multiple of 2 micro-batches per step"),
    "lora_rank": (["parallelism=dp2", "benchmark.lora_rank=65"],
                  "benchmark.lora_rank=65 is larger than the smallest attention projection of model=tiny (64)"),
    "ddp_tp": (["parallelism=tp2", "benchmark.dp_shard=ddp"],
               "benchmark.dp_shard=ddp with parallelism=tp2 (tp=2, pp=1) cannot be composed"),
    "lora_tp": (["parallelism=tp2", "benchmark.lora_rank=4"],
                "benchmark.lora_rank=4 with parallelism.tp=2 cannot be composed"),
    "ep": (["parallelism=ep2", "model=tiny_moe"], "benchmark=train does not train expert-parallel or MoE models"),
    "interleaved_layers": (["parallelism=pp2", "model.num_layers=2", "benchmark.pp_schedule=interleaved_1f1b"],
                           "model.num_layers=2 is not divisible into 4 pipeline stages"),
    "compile_tp_cpu": (["parallelism=tp2", "benchmark.compile=true"],
                       "benchmark.compile=true with parallelism.tp=2 fails on a CPU"),
    "cp_impl": (["parallelism=cp2", "benchmark.cp_impl=torch_cp"], "benchmark.cp_impl='torch_cp' cannot train here"),
    "ac": (["parallelism=dp2", "benchmark.ac=some"], "benchmark.ac='some' is not valid; choose one of none, selective, full"),
    "steps_per_sample": (["parallelism=dp2", "benchmark.steps_per_sample=0"],
                         "benchmark.steps_per_sample=0 must be a positive integer"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_refused_in_one_line(case: str, compose: Any) -> None:
    overrides, message = BAD[case]
    text = refusal(compose, *BASE, *overrides)
    assert text.startswith(message), text
    if case in ("ddp_tp", "ep"):  # a layout the engine cannot compose: it says which it can
        assert "the train engine composes tp" in text


def test_cli_exit_2_one_line_no_sweep_dir(tmp_path: Path) -> None:
    run = run_sweepbench([*BASE, "parallelism=tp2,pp2", "benchmark.lora_rank=4"], sweep_dir=tmp_path / "sweep")
    assert run.rc == 2, run.describe()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sweepbench: error: benchmark.lora_rank=4 with parallelism.tp=2"), \
        run.stderr
    assert not (tmp_path / "sweep").exists()
