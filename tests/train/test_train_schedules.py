"""Layout recipes beyond the default ones, on gloo ranks through the real CLI: TP without sequence
parallel and the pipeline schedules with more micro-batches (interleaved 1F1B, interleaved zero
bubble, ZBV) verify against the single-device reference and report their bubble; async TP and
fp8, which need CUDA, are refused before any rank starts; fp8's conversion is checked on the
meta device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ..conftest import SweepRun, planned_tag, refusal, run_sweepbench

SCHEDULES = ("interleaved_1f1b", "interleaved_zb", "zbv")
# tp2pp2 without sequence parallel, 4 micro-batches per step, each schedule: 4 ranks a job
FAST = ["benchmark=train", "model=tiny", "backend=gloo", "benchmark.warmup=1", "benchmark.iters=3",
        "wandb.mode=disabled", "parallelism=tp2pp2", "benchmark.tp_sp=false", "benchmark.global_batch=4"]


@pytest.fixture(scope="module")
def schedules(tmp_path_factory: pytest.TempPathFactory) -> SweepRun:
    root = tmp_path_factory.mktemp("train_schedules")
    run = run_sweepbench([*FAST, f"benchmark.pp_schedule={','.join(SCHEDULES)}"], sweep_dir=root / "sweep",
                         timeout=600)
    assert run.rc == 0, run.describe()
    return run


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_schedule_verifies_and_reports_its_bubble(schedules: SweepRun, compose: Any, schedule: str) -> None:
    m = schedules.metrics(planned_tag(compose, *FAST, f"benchmark.pp_schedule={schedule}"))
    assert m["status"] == "ok" and m["verified"], m.get("error")
    v = m["results"]["verification"]
    assert v["layers"] == 4 and not v["reduced_depth"]
    for ref, got in zip(v["reference_losses"], v["layout_losses"]):
        assert got == pytest.approx(ref, rel=1e-4)  # fp32 on CPU
    # every virtual stage's gradient counts once (interleaved: two stages a rank)
    assert v["grad_norm"] == pytest.approx(v["reference_grad_norm"], rel=1e-4)
    s = m["results"]["summary"]
    assert s["grad_accum"] == 4 and s["pp_schedule"] == schedule and s["tp_sp"] is False
    planned = s["pp_bubble_schedule"]
    assert 0 < planned < 0.5  # torch's plan of time slots, each action one slot
    if schedule == "interleaved_1f1b":  # (p-1)/(v*m+p-1), p=2 ranks, v=2 stages each, m=4
        assert s["pp_bubble"] == pytest.approx(1 / 9)
    else:  # zero bubble: no closed form, the plan's count stands for it
        assert s["pp_bubble"] == planned


def test_zero_bubble_idles_less_than_interleaved_1f1b(schedules: SweepRun, compose: Any) -> None:
    planned = {name: schedules.metrics(planned_tag(compose, *FAST, f"benchmark.pp_schedule={name}"))
               ["results"]["summary"]["pp_bubble_schedule"] for name in SCHEDULES}
    assert planned["interleaved_zb"] < planned["interleaved_1f1b"], planned
    assert planned["zbv"] < planned["interleaved_1f1b"], planned


BASE = ["benchmark=train", "model=tiny", "backend=gloo"]
REFUSED = {
    "async_tp_needs_compile": (["parallelism=tp2", "benchmark.async_tp=true"],
                               "benchmark.async_tp=true needs parallelism.tp > 1 (got 2), benchmark.tp_sp=true"),
    "async_tp_needs_sp": (["parallelism=tp2", "benchmark.async_tp=true", "benchmark.compile=true",
                           "benchmark.tp_sp=false"], "benchmark.async_tp=true needs parallelism.tp > 1"),
    "async_tp_cpu": (["parallelism=tp2", "benchmark.async_tp=true", "benchmark.compile=true"],
                     "benchmark.async_tp=true needs CUDA GPUs"),
    "fp8_cpu": (["parallelism=dp2", "benchmark.precision=fp8"],
                "benchmark.precision=fp8 needs CUDA GPUs of compute capability 8.9 or newer"),
    "fp8_tp": (["parallelism=tp2", "benchmark.precision=fp8"],
               "benchmark.precision=fp8 with parallelism.tp=2 cannot be composed"),
    "fp8_lora": (["parallelism=dp2", "benchmark.precision=fp8", "benchmark.lora_rank=4"],
                 "benchmark.precision=fp8 with benchmark.lora_rank=4 cannot be composed"),
    "fp8_recipe": (["benchmark.fp8_recipe=blockwise"],
                   "benchmark.fp8_recipe='blockwise' is not valid; choose one of tensorwise, rowwise"),
    "zb_compile": (["parallelism=pp2", "benchmark.pp_schedule=zbv", "benchmark.compile=true"],
                   "benchmark.pp_schedule=zbv with benchmark.compile=true cannot run"),
    "zb_selective_ac": (["parallelism=pp2", "benchmark.pp_schedule=interleaved_zb", "benchmark.ac=selective"],
                        "benchmark.pp_schedule=interleaved_zb with benchmark.ac=selective cannot run"),
    "schedule": (["parallelism=pp2", "benchmark.pp_schedule=dualpipe"],
                 "benchmark.pp_schedule='dualpipe' is not valid; choose one of gpipe, 1f1b, interleaved_1f1b, "
                 "interleaved_zb, zbv"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_in_one_line(case: str, compose: Any) -> None:
    overrides, message = REFUSED[case]
    text = refusal(compose, *BASE, *overrides)
    assert text.startswith(message), text


def test_cli_refuses_fp8_on_cpu_before_ranks(tmp_path: Path) -> None:
    run = run_sweepbench([*BASE, "parallelism=dp2", "benchmark.precision=fp8,bf16"], sweep_dir=tmp_path / "sweep")
    assert run.rc == 2, run.describe()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sweepbench: error: benchmark.precision=fp8 needs CUDA"), run.stderr
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_converts_block_linears_not_the_output(recipe: str) -> None:
    import torch
    from torchao.float8.float8_linear import Float8Linear

    from sweepbench.train.fp8 import apply_fp8
    from sweepbench.train.model import Transformer
    from sweepbench.parallel.specs import ModelShape

    with torch.device("meta"):
        model = Transformer(ModelShape("t", 2, 64, 8, 8, 256, 512))
    apply_fp8(model, recipe=recipe, fsdp=True)
    converted = {name for name, mod in model.named_modules() if isinstance(mod, Float8Linear)}
    linears = {name for name, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)}
    assert converted == linears - {"output"} and len(converted) == 2 * 7
    gathers = {mod.config.enable_fsdp_float8_all_gather for mod in model.modules() if isinstance(mod, Float8Linear)}
    assert gathers == {recipe == "tensorwise"}  # weights all-gathered in float8 only with one scale per tensor


def test_fp8_rowwise_compiles_with_eager_casts_and_no_other_job_does() -> None:
    import torch._inductor.config as inductor

    from sweepbench.train.fp8 import scales_precomputed, set_inductor_casts

    before = inductor.emulate_precision_casts
    try:
        set_inductor_casts(fp8_recipe="rowwise")
        assert inductor.emulate_precision_casts is True
        for recipe in ("tensorwise", None):  # the next job in kept ranks gets inductor's default back
            set_inductor_casts(fp8_recipe=recipe)
            assert inductor.emulate_precision_casts is before
    finally:
        inductor.emulate_precision_casts = before
    assert scales_precomputed(recipe="tensorwise", fsdp=True)
    assert not scales_precomputed(recipe="tensorwise", fsdp=False) and not scales_precomputed(recipe="rowwise", fsdp=True)


def test_page_keeps_each_schedule_a_case_of_its_own(schedules: SweepRun) -> None:
    from sweepbench.benchmarks.train import TrainBenchmark

    spec = TrainBenchmark.page()
    rows = [spec.rows(job)[0] for job in schedules.all_metrics().values()]
    assert sorted(r["variant"] for r in rows) == [f"no SP, {name}, 4 micro-batches" for name in sorted(SCHEDULES)]
    assert len({tuple(r[k] for k in spec.case) for r in rows}) == len(SCHEDULES)


def last_stage_after_a_step(rank: int, world_size: int, config: dict[str, Any]) -> list[int]:
    """One pipeline step of ours on 2 gloo ranks: how many forward outputs each stage still holds."""
    import torch
    from omegaconf import OmegaConf

    from sweepbench.benchmarks.train import build_job
    from sweepbench.train.data import SyntheticTask
    from sweepbench.train.plan import build_plan
    from sweepbench.train.run import Batches, options_of
    from sweepbench.train.shape import shape_of
    from sweepbench.train.trainer import Trainer, build_mesh

    job = build_job(OmegaConf.create(config))
    plan, opts = build_plan(job), options_of(job.knobs, job.model.hidden_size)
    device = torch.device("cpu")
    mesh = build_mesh(plan, device)
    shape = shape_of(job.model)
    task = SyntheticTask(vocab_size=shape.vocab_size, seq_len=plan.seq_len, global_batch=plan.global_batch, seed=0)
    trainer = Trainer(shape, plan, opts, device=device, mesh=mesh)
    trainer.step(*Batches(task, plan, dp_rank=0, cp=None, device=device)(0))
    assert trainer.schedule is not None
    stages = getattr(trainer.schedule, "_stages", None) or [trainer.schedule._stage]  # type: ignore[attr-defined]
    return [len(s.output_chunks) for s in stages]


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved_1f1b"])
def test_the_last_stage_keeps_no_micro_batch_outputs(worlds: Any, compose: Any, schedule: str) -> None:
    """A pipeline step asks for no merged outputs (its loss comes from the schedule's losses), so the
    last stage holds none of its micro-batches' logits after the step (with 8 micro-batches of an 8B
    model at 8192 tokens they ran an 80 GB GPU out of memory); its micro-batches still all ran."""
    from omegaconf import OmegaConf

    cfg = compose("benchmark=train", "model=tiny", "backend=gloo", "parallelism=pp2", "benchmark.seq_len=32",
                  "benchmark.global_batch=4", f"benchmark.pp_schedule={schedule}", "benchmark.precision=fp32")
    held = worlds.get(2).run(last_stage_after_a_step, OmegaConf.to_container(cfg, resolve=True))
    assert held == [[0] * len(h) for h in held] and all(held), held
