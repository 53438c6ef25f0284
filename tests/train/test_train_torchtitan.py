"""The torchtitan peer of benchmark=train, at tiny size on gloo ranks through the real CLI: torchtitan's
own llama3 model, layouts, loss and optimizer beside ours in one sweep, each verified against our
single-device reference at the same init (its RoPE and SwiGLU width checked to be ours); what it
does not run is refused in one line before any rank, a missing install too."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from ..conftest import SweepRun, planned_tag, refusal, run_sweepbench

# GQA (8 query heads, 4 KV heads), so tp2 splits both; pp2: torchtitan's pipeline split and 1F1B schedule
FAST = [
    "benchmark=train",
    "model=tiny",
    "model.num_layers=2",
    "model.num_kv_heads=4",
    "backend=gloo",
    "benchmark.warmup=1",
    "benchmark.iters=3",
    "wandb.mode=disabled",
]
LAYOUTS = ("tp1", "dp2", "tp2", "pp2")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> SweepRun:
    root = tmp_path_factory.mktemp("train_titan")
    run = run_sweepbench(
        [*FAST, "benchmark.impl=ours,torchtitan", f"parallelism={','.join(LAYOUTS)}"],
        sweep_dir=root / "sweep",
        timeout=600,
    )
    assert run.rc == 0, run.describe()
    return run


@pytest.mark.parametrize("layout", LAYOUTS)
def test_torchtitan_matches_our_reference_in_one_sweep(sweep: SweepRun, compose: Any, layout: str) -> None:
    titan = sweep.metrics(planned_tag(compose, *FAST, "benchmark.impl=torchtitan", f"parallelism={layout}"))
    ours = sweep.metrics(planned_tag(compose, *FAST, "benchmark.impl=ours", f"parallelism={layout}"))
    for m in (titan, ours):
        assert m["status"] == "ok" and m["verified"], m.get("error")
        v = m["results"]["verification"]
        assert len(v["layout_losses"]) == 2
        for ref, got in zip(v["reference_losses"], v["layout_losses"]):
            assert got == pytest.approx(ref, rel=1e-5)  # fp32: torchtitan's llama3 from our weights is our function
        assert v["grad_norm"] == pytest.approx(v["reference_grad_norm"], rel=1e-5)  # and so is its gradient
        losses = m["results"]["cases"][0]["loss_per_step"]
        assert sum(losses[-3:]) / 3 < losses[0]
    assert titan["results"]["recipe"]["impl"] == "torchtitan"
    assert titan["results"]["num_trainable"] == ours["results"]["num_trainable"]
    assert titan["results"]["verification"]["reference_losses"] == ours["results"]["verification"]["reference_losses"]
    for key in ("tokens_per_s_per_gpu", "mfu_pct", "step_median_s"):
        assert titan["results"]["summary"][key] > 0


def test_results_csv_has_both_impls(sweep: SweepRun) -> None:
    with open(sweep.sweep_dir / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["impl"], r["parallelism"]) for r in rows) == sorted(
        (impl, layout) for impl in ("ours", "torchtitan") for layout in LAYOUTS
    )
    assert all(r["status"] == "ok" and float(r["tokens_per_s_per_gpu"]) > 0 for r in rows)


def test_rope_and_swiglu_width_are_ours() -> None:
    """torchtitan's llama3 scales RoPE's low frequencies (llama 3.1) unless told not to, and derives
    the SwiGLU width from 4·dim; the peer's args give our tables and our width (llama3_8b's here)."""
    from torchtitan.models.llama3 import Transformer
    from torchtitan.models.llama3.model.args import RoPEScalingArgs
    from torchtitan.models.llama3.model.model import apply_rotary_emb, precompute_freqs_cis

    from sweepbench.parallel.specs import ModelShape
    from sweepbench.train.model import apply_rope, rope_tables
    from sweepbench.train.titan_peer import model_args

    shape = ModelShape("llama3_8b", 1, 4096, 32, 8, 14336, 128256)
    args = model_args(shape, 8192)
    freqs = precompute_freqs_cis(128, 8192, args.rope_theta, args.rope_scaling_args)
    cos, sin = rope_tables(128, torch.arange(8192))
    torch.testing.assert_close(freqs.real, cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(freqs.imag, sin, rtol=0, atol=1e-6)
    default = precompute_freqs_cis(128, 8192, args.rope_theta, RoPEScalingArgs())
    assert (default.real - cos).abs().max() > 0.5  # torchtitan's default would not be our function
    x = torch.randn(1, 8192, 2, 128)
    torch.testing.assert_close(apply_rotary_emb(x, x, freqs)[0], apply_rope(x, cos, sin), rtol=0, atol=1e-5)
    with torch.device("meta"):
        for ffn in (14336, 256, 100):
            block = Transformer(model_args(ModelShape("t", 1, 64 if ffn < 1000 else 4096, 8, 8, ffn, 512), 128))
            assert block.layers["0"].feed_forward.w1.weight.shape[0] == ffn


def test_the_peers_attention_is_plain_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchtitan's SDPA wrapper sets its own backend priority (cuDNN, flash, math); the peer's calls
    plain SDPA, as ours does, so torch picks the same backend for both: no sdpa_kernel context, and
    the same output as the wrapper's own on the CPU."""
    import torch.nn.attention
    from torchtitan.models.attention import ScaledDotProductAttentionWrapper

    from sweepbench.train.titan_peer import _pin_sdpa

    q, k, v = (torch.randn(1, 4, 16, 8) for _ in range(3))
    own = ScaledDotProductAttentionWrapper()(q, k, v)
    model = torch.nn.Sequential(ScaledDotProductAttentionWrapper())
    _pin_sdpa(model)

    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("the peer's attention set a backend priority")

    monkeypatch.setattr(torch.nn.attention, "sdpa_kernel", refuse)
    monkeypatch.setattr("torchtitan.models.attention.sdpa_kernel", refuse)
    torch.testing.assert_close(model[0](q, k, v), own)


BASE = ["benchmark=train", "model=tiny", "backend=gloo", "benchmark.impl=torchtitan"]
BAD = {
    "cp": (["parallelism=cp2"], "benchmark.impl=torchtitan with parallelism tp=1 pp=1 cp=2: it runs"),
    "ddp": (["parallelism=dp2", "benchmark.dp_shard=ddp"], "benchmark.dp_shard=ddp with benchmark.impl=torchtitan"),
    "lora": (["parallelism=tp1", "benchmark.lora_rank=8"], "benchmark.lora_rank=8 with benchmark.impl=torchtitan"),
    "no_sp": (["parallelism=tp2", "benchmark.tp_sp=false"], "benchmark.tp_sp=False with benchmark.impl=torchtitan"),
    "fp8": (["parallelism=tp1", "benchmark.precision=fp8"], "benchmark.precision=fp8 with benchmark.impl=torchtitan"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_torchtitan_refused_in_one_line(case: str, compose: Any) -> None:
    overrides, message = BAD[case]
    text = refusal(compose, *BASE, *overrides)
    assert text.startswith(message), text


def test_cp_exits_2_before_ranks(tmp_path: Path) -> None:
    run = run_sweepbench([*BASE, "parallelism=cp2"], sweep_dir=tmp_path / "sweep")
    assert run.rc == 2, run.describe()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "benchmark.impl=torchtitan with parallelism tp=1 pp=1 cp=2" in lines[0], run.stderr


HIDE = """import sys

class HideTorchtitan:  # as if torchtitan were not installed
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torchtitan":
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, HideTorchtitan())
"""


def test_missing_torchtitan_names_the_extra(tmp_path: Path) -> None:
    from ..conftest import base_env

    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(HIDE)
    path = os.pathsep.join(p for p in (str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")) if p)
    run = run_sweepbench([*BASE, "parallelism=tp1"], sweep_dir=tmp_path / "sweep", env=base_env(PYTHONPATH=path))
    assert run.rc == 2, run.describe()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert (
        "benchmark.impl=torchtitan needs torchtitan, which is not installed; install it with: pip install "
        '"sweepbench[titan]"'
    ) in lines[0], run.stderr
