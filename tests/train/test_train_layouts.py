"""benchmark=train through the real CLI on gloo ranks: every layout verifies against the
single-device reference computed in the same job and lowers the loss; the memory columns reach
results.csv; the MFU the job reports follows the formula and a hand count of the tiny shape."""

from __future__ import annotations

import math
from typing import Any

import pytest

from ..conftest import SweepRun, planned_tag, run_sweepbench

LAYOUTS = ("dp2", "tp2", "pp2", "tp2pp2", "cp2")  # cp2: the attention engine's ring
FAST = ["benchmark=train", "model=tiny", "backend=gloo", "benchmark.warmup=1", "benchmark.iters=3",
        "wandb.mode=disabled"]

# tiny: L=4 layers, d=64, 8 heads of 8 (no GQA), ffn 256, vocab 512, seq 128
HAND_PARAMS = 4 * (4 * 64 * 64 + 3 * 64 * 256 + 2 * 64) + 512 * 64 + 64 + 512 * 64  # blocks, emb, norm, output
HAND_FLOPS_PER_TOKEN = 6 * (HAND_PARAMS - 512 * 64) + 6 * 4 * 8 * 2 * 8 * 128


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> SweepRun:
    root = tmp_path_factory.mktemp("train_layouts")
    run = run_sweepbench([*FAST, f"parallelism={','.join(LAYOUTS)}"], sweep_dir=root / "sweep", timeout=600)
    assert run.rc == 0, run.describe()
    return run


def _job(run: SweepRun, compose: Any, layout: str) -> dict[str, Any]:
    return run.metrics(planned_tag(compose, *FAST, f"parallelism={layout}"))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_verifies_and_learns(layouts: SweepRun, compose: Any, layout: str) -> None:
    m = _job(layouts, compose, layout)
    assert m["status"] == "ok" and m["verified"], m.get("error")
    v = m["results"]["verification"]
    assert not v["reduced_depth"] and v["layers"] == 4
    assert len(v["reference_losses"]) == len(v["layout_losses"]) == 2
    for ref, got in zip(v["reference_losses"], v["layout_losses"]):
        assert got == pytest.approx(ref, rel=1e-4)  # fp32 on CPU: tight
    # the first step's whole gradient, each element once across the layout's shards and copies
    assert v["reference_grad_norm"] > 0 and v["grad_norm"] == pytest.approx(v["reference_grad_norm"], rel=1e-4)
    assert v["grad_norm_rel_err"] <= 1e-4
    losses = m["results"]["cases"][0]["loss_per_step"]
    assert len(losses) == 2 + 1 + 3 and all(math.isfinite(x) for x in losses)
    assert sum(losses[-3:]) / 3 < 0.99 * losses[0]
    assert m["results"]["precision"] == "fp32"
    steps = layouts.progress(planned_tag(compose, *FAST, f"parallelism={layout}"))
    assert [s[:3] for s in steps] == ["1/2", "2/2"], steps
    assert "2 steps verified at 4 layers" in steps[0] and "3 steps timed" in steps[1]


def test_all_layouts_start_from_the_same_model(layouts: SweepRun, compose: Any) -> None:
    """Same weights and data whatever the layout: the first loss (a forward pass) agrees."""
    firsts = [_job(layouts, compose, layout)["results"]["verification"]["layout_losses"][0] for layout in LAYOUTS]
    assert max(firsts) - min(firsts) < 1e-4 * firsts[0], firsts


def test_memory_and_rate_columns(layouts: SweepRun) -> None:
    table = layouts.results()
    for col in ("mem_torch_peak_active_gib", "mem_torch_peak_allocated_gib", "mem_torch_peak_reserved_gib",
                "mem_nvml_peak_gib", "mem_host_peak_rss_gib", "tokens_per_s", "tokens_per_s_per_gpu", "mfu_pct",
                "step_median_s", "seq_len", "ac", "precision"):
        assert col in table.columns, col
    assert len(table) == len(LAYOUTS) and (table["status"] == "ok").all()
    assert (table["mem_host_peak_rss_gib"] > 0).all()
    assert table["mem_torch_peak_reserved_gib"].isna().all()  # a CPU has no allocator peaks: empty, not 0


def test_mfu_hand_count(layouts: SweepRun, compose: Any) -> None:
    from sweepbench.parallel.specs import ModelShape
    from sweepbench.train.shape import flops_per_token

    assert ModelShape("t", 4, 64, 8, 8, 256, 512).num_params() == HAND_PARAMS == 328256
    assert flops_per_token(ModelShape("t", 4, 64, 8, 8, 256, 512), 128) == HAND_FLOPS_PER_TOKEN
    for layout in LAYOUTS:
        m = _job(layouts, compose, layout)
        r, s = m["results"], m["results"]["summary"]
        assert r["flops_per_token"] == HAND_FLOPS_PER_TOKEN and r["num_params"] == HAND_PARAMS
        tokens = r["cases"][0]["tokens_per_step"]
        assert s["tokens_per_s"] == pytest.approx(tokens / s["step_median_s"])
        per_gpu = s["tokens_per_s"] / m["world_size"] * HAND_FLOPS_PER_TOKEN
        # a CPU has no tabled peak: MFU is against the ceiling measured in the job, and says so
        assert s["peak_tflops"] is None and "matmul ceiling" in r["mfu_basis"]
        assert s["mfu_pct"] == pytest.approx(100 * per_gpu / (s["ceiling_tflops"] * 1e12))
        assert 0 < s["fraction_of_ceiling"] <= 1


def test_lora_counts_frozen_weights_as_forward_and_input_grad() -> None:
    from sweepbench.parallel.specs import ModelShape
    from sweepbench.train.shape import flops_per_token

    shape, r = ModelShape("t", 4, 64, 8, 8, 256, 512), 8
    adapters = 4 * r * (2 * 64 + 2 * (64 + 64) + 2 * 64)
    assert shape.lora_params(r) * 4 == adapters
    expected = 4 * (HAND_PARAMS - 512 * 64) + 6 * adapters + 6 * 4 * 8 * 2 * 8 * 128
    assert flops_per_token(shape, 128, lora_rank=r) == expected


def test_plots(layouts: SweepRun) -> None:
    from sweepbench.benchmarks.train import TrainBenchmark

    jobs = list(layouts.all_metrics().values())
    plots = TrainBenchmark.plots(jobs)
    assert [p.title for p in plots] == ["tokens/s per GPU", "MFU", "peak memory"]
    lines = plots[0].figure.axes[0].get_lines()
    # one line per layout family (dp, tp, pp, tppp, cp), each through its job's world size
    # (labels also name the recipe fields that vary between the jobs: here the global batch)
    families = {line.get_label().split()[1] for line in lines if line.get_label().startswith("tiny ")}
    assert families == {"dp", "tp", "pp", "tppp", "cp"}
    bars = plots[2].figure.axes[0].patches
    assert len(bars) == len(LAYOUTS) and all(b.get_height() > 0 for b in bars)


def test_mfu_basis_names_the_peak_it_divides_by() -> None:
    """fp8 steps are measured against the bf16 peak (torchtitan's convention): the words say so."""
    from sweepbench.benchmarks.train import mfu_basis

    fp8 = mfu_basis("NVIDIA H200", 989e12, 700e12, precision="fp8")
    assert fp8 == "bf16 dense peak of NVIDIA H200 (989 TFLOP/s, table, fp8 steps measured against it as torchtitan does)"
    assert mfu_basis("NVIDIA H200", 989e12, 700e12, precision="bf16") == "bf16 dense peak of NVIDIA H200 (989 TFLOP/s, table)"
    assert "matmul ceiling measured in this job (0.05 TFLOP/s)" in mfu_basis("cpu", None, 5e10, precision="bf16")
