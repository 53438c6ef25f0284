"""fms-acceleration's scenarios as presets (experiment=fms_peft_bnb, fms_foak, fms_padding_free):
each composes, its dry run lists its jobs with their baselines and why a CPU cannot run them,
and its CPU twin at tiny size on gloo runs through the real CLI, every job verified. The shapes
the presets name for larger runs (mistral_7b, llama2_70b) count their published parameters."""

from __future__ import annotations

import csv
import itertools
from pathlib import Path
from typing import Any

import pytest
import torch

from ..conftest import SweepRun, concurrently, run_sweepbench

# preset -> its saved grid (the baselines are points of it)
GRIDS = {
    "fms_peft_bnb": {"benchmark.impl": ["ours"], "benchmark.quant": ["none", "nf4"]},
    "fms_foak": {"benchmark.fused": ["liger", "none"], "benchmark.lora_rank": ["0", "16"]},
    "fms_padding_free": {"benchmark.padding_free": ["true", "false"], "benchmark.impl": ["ours", "hf"]},
}
HF_BASELINE = ["benchmark.impl=hf", "benchmark.quant=none"]  # joins fms_peft_bnb's sweep dir
# fms-acceleration-peft's bitsandbytes plugin as a peer (bf16: the plugin trains in mixed precision)
FMS_PEFT = ["benchmark.impl=fms_peft", "benchmark.quant=nf4", "benchmark.precision=bf16"]
TWIN_ONLY = {"fms_padding_free": ["benchmark.impl=ours"]}
LIGER_NOTE = "no: benchmark.fused=liger needs CUDA GPUs"


def _jobs(preset: str, cpu: bool = False) -> list[list[str]]:
    grid = dict(GRIDS[preset])
    if cpu and "benchmark.lora_rank" in grid:
        grid["benchmark.lora_rank"] = ["0", "8"]
    return [[f"{k}={v}" for k, v in zip(grid, values)] for values in itertools.product(*grid.values())]


def _tag(compose: Any, *overrides: str) -> str:
    """A one-rank job's tag (planned_tag validates on this machine, which refuses liger)."""
    from sweepbench.sweep.tags import make_tag

    return make_tag(compose("benchmark=train", *overrides), world_size=1)


def _listing(stdout: str) -> dict[str, str]:
    """tag -> its fit note, from a dry run's one line per job."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith("  train-"):
            tag, _, rest = line.strip().partition(": ")
            out[tag] = rest.rpartition("; alone: ")[0].partition("fits here: ")[2]
    return out


@pytest.mark.parametrize("preset", sorted(GRIDS))
def test_preset_dry_run_lists_its_jobs_and_baselines(tmp_path: Path, compose: Any, preset: str) -> None:
    run = run_sweepbench([f"experiment={preset}", "sweep.dry_run=true"], sweep_dir=tmp_path / "sweep",
                         cwd=tmp_path / "cwd")
    assert run.rc == 0, run.describe()
    listing = _listing(run.stdout)
    expected = {_tag(compose, f"experiment={preset}", *job): job for job in _jobs(preset)}
    assert set(listing) == set(expected), run.stdout
    for tag, job in expected.items():
        cfg = compose("benchmark=train", f"experiment={preset}", *job)
        assert (cfg.model.name, cfg.benchmark.seq_len, cfg.benchmark.micro_batch) == ("llama3_1b", 4096, 4)
        assert cfg.benchmark.precision == "bf16" and cfg.parallelism.name == "tp1"
        if "benchmark.fused=liger" in job:  # this CPU cannot run liger: one line naming why
            assert listing[tag].startswith(LIGER_NOTE), listing[tag]
    assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize("model,params", [("mistral_7b", 7.24e9), ("llama2_70b", 68.98e9)])
def test_larger_shapes_count_their_published_parameters(compose: Any, model: str, params: float) -> None:
    from sweepbench.train.shape import shape_of

    cfg = compose("benchmark=train", "experiment=fms_peft_bnb", f"model={model}")
    assert cfg.model.seq_len == 4096 and cfg.model.vocab_size == 32000
    assert shape_of(cfg.model).num_params() == pytest.approx(params, rel=0.01)


def test_presets_plan_at_the_larger_shapes(tmp_path: Path, compose: Any) -> None:
    """The headers' larger runs compose and tag: Mistral-7B in each preset, Llama-2-70B NF4 LoRA."""
    for preset, extra in (("fms_peft_bnb", []), ("fms_foak", []), ("fms_padding_free", [])):
        for job in _jobs(preset):
            assert "_mistral_7b_" in _tag(compose, f"experiment={preset}",
                                                 "model=mistral_7b", *job, *extra)
    assert "_llama2_70b_" in _tag(compose, "experiment=fms_peft_bnb", "model=llama2_70b",
                                         "benchmark.quant=nf4")


RUN_70B = Path(__file__).parents[2] / "docs/results/runs/train_h200x1_2026-11-27_fms_peft_bnb_llama2_70b_nf4"


def test_the_70b_nf4_estimate_counts_a_4bit_base_as_measured(compose: Any) -> None:
    """On a GPU the Llama-2-70B NF4 LoRA preset is estimated with its blocks' linears at NF4's 4.13 bits
    and verified at 2 layers: within 10% of the peak the committed H200 run allocated (and under an
    H100's 78 GiB), where bf16 weights made it 215 GiB. A bf16 base of the same job counts 2 bytes."""
    from sweepbench.benchmarks.train import build_job
    from sweepbench.train.plan import rank_bytes

    h200 = int(139.8 * 2**30)
    job = ["benchmark=train", "experiment=fms_peft_bnb", "model=llama2_70b", "benchmark.ac=full",
           "benchmark.micro_batch=1", "benchmark.impl=ours"]
    nf4 = rank_bytes(build_job(compose(*job, "benchmark.quant=nf4")), device_bytes=h200) / 2**30
    bf16 = rank_bytes(build_job(compose(*job, "benchmark.quant=none")), device_bytes=h200) / 2**30
    measured = float(next(csv.DictReader((RUN_70B / "results.csv").open()))["peak_allocated_gib"])
    assert nf4 == pytest.approx(measured, rel=0.10) and nf4 < 78, (nf4, measured)
    assert bf16 > 128 > nf4  # 69B bf16 weights alone are 128 GiB


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SweepRun]:
    root = tmp_path_factory.mktemp("fms_presets")

    def twin(preset: str, *extra: str, into: str = "") -> SweepRun:
        return run_sweepbench([f"experiment={preset}_cpu", "wandb.mode=disabled", *extra],
                              sweep_dir=root / (into or preset), timeout=600)

    def peft_bnb() -> list[SweepRun]:  # the HF baseline and the plugin's peer join its sweep dir, after it
        return [twin("fms_peft_bnb"), twin("fms_peft_bnb", *HF_BASELINE, into="fms_peft_bnb"),
                twin("fms_peft_bnb", *FMS_PEFT, into="fms_peft_bnb")]

    # the hf peer's packed run is tested in test_train_fms.py: here padding-free runs ours only (time)
    (bnb, hf, fms_peft), foak, padding_free = concurrently(
        peft_bnb, lambda: [twin("fms_foak")], lambda: [twin("fms_padding_free", *TWIN_ONLY["fms_padding_free"])]
    )
    return {"fms_peft_bnb": bnb, "fms_foak": foak[0], "fms_padding_free": padding_free[0],
            "hf_baseline": hf, "fms_peft": fms_peft}


def _verified(m: dict[str, Any]) -> None:
    assert m["status"] == "ok" and m["verified"], m.get("error")
    v = m["results"]["verification"]
    for ref, got in zip(v["reference_losses"], v["layout_losses"], strict=True):
        assert got == pytest.approx(ref, rel=1e-4)
    assert m["results"]["summary"]["tokens_per_s"] > 0


def _rows(run: SweepRun) -> list[dict[str, str]]:
    with open(run.sweep_dir / "results.csv") as f:
        return list(csv.DictReader(f))


def test_peft_bnb_twin_nf4_beside_both_bf16_loras(twins: dict[str, SweepRun], compose: Any) -> None:
    run = twins["fms_peft_bnb"]
    assert run.rc == 0, run.describe()
    assert twins["hf_baseline"].rc == 0, twins["hf_baseline"].describe()
    for job in [*_jobs("fms_peft_bnb"), HF_BASELINE]:
        m = run.metrics(_tag(compose, "experiment=fms_peft_bnb_cpu", *job))
        _verified(m)
        assert m["results"]["num_trainable"] < m["results"]["num_params"]  # LoRA: adapters only
    rows = _rows(run)  # the hf baseline and the fms-acceleration peer joined the same results.csv
    assert sorted((r["impl"], r["quant"]) for r in rows) == [
        ("fms_peft", "nf4"), ("hf", "none"), ("ours", "nf4"), ("ours", "none")]
    assert all(r["status"] == "ok" for r in rows)


def test_fms_peft_peer_loads_a_4bit_base_through_its_plugin_and_matches_our_reference(
        twins: dict[str, SweepRun], compose: Any) -> None:
    """fms-acceleration-peft's bitsandbytes plugin loads a checkpoint of our initial weights in NF4
    (every block linear a bitsandbytes Linear4bit) and installs peft's LoRA; its first steps match
    our reference over the same weights rounded through NF4 (bf16, HF's S-1 predictions a row), and
    it trains the adapters alone, as many as ours."""
    assert twins["fms_peft"].rc == 0, twins["fms_peft"].describe()
    run = twins["fms_peft_bnb"]
    m = run.metrics(_tag(compose, "experiment=fms_peft_bnb_cpu", *FMS_PEFT))
    assert m["status"] == "ok" and m["verified"], m.get("error")
    v, recipe = m["results"]["verification"], m["results"]["recipe"]
    assert v["max_rel_err"] < 5e-3 and abs(v["grad_norm"] / v["reference_grad_norm"] - 1) < 2e-2, v
    assert recipe["fms_plugins"] == {"peft": {"quantization": {"bitsandbytes": {"quant_type": "nf4",
                                                                                 "no_peft_model": False}}}}
    cfg = compose("benchmark=train", "experiment=fms_peft_bnb_cpu")
    assert recipe["fms_4bit_linears"] == 7 * cfg.model.num_layers  # q, k, v, o, gate, up, down
    ours = run.metrics(_tag(compose, "experiment=fms_peft_bnb_cpu", "benchmark.impl=ours", "benchmark.quant=nf4"))
    assert m["results"]["num_trainable"] == ours["results"]["num_trainable"]
    losses = m["results"]["cases"][0]["loss_per_step"]
    assert sum(losses[-3:]) / 3 < losses[0]


def test_foak_twin_runs_unfused_and_skips_liger_in_one_line_each(twins: dict[str, SweepRun], compose: Any) -> None:
    from sweepbench.sweep.driver import EXIT_SKIPPED

    run = twins["fms_foak"]
    assert run.rc == EXIT_SKIPPED, run.describe()
    for job in _jobs("fms_foak", cpu=True):
        tag = _tag(compose, "experiment=fms_foak_cpu", *job)
        if "benchmark.fused=liger" in job:
            # one line before the run ("skipping ... jobs") and one in the closing list ("skipped")
            lines = [line for line in run.stdout.splitlines() if line.strip().startswith(f"{tag}: ")]
            assert len(lines) == 2 and all("benchmark.fused=liger needs CUDA GPUs" in x for x in lines), run.stdout
            assert "skipped" in lines[1]
            assert not (run.sweep_dir / tag / "metrics.json").exists()
        else:
            _verified(run.metrics(tag))


def test_padding_free_twin_packed_against_the_same_documents_padded(twins: dict[str, SweepRun], compose: Any) -> None:
    run = twins["fms_padding_free"]
    assert run.rc == 0, run.describe()
    real = {}
    for job in _jobs("fms_padding_free")[::2]:  # impl=ours
        m = run.metrics(_tag(compose, "experiment=fms_padding_free_cpu", *job))
        _verified(m)
        recipe, case = m["results"]["recipe"], m["results"]["cases"][0]
        assert recipe["documents"] and m["results"]["summary"]["documents"]
        # real tokens only on both sides: the padded tails are not counted
        assert 0 < recipe["tokens_per_step"] < case["tokens_per_step"]
        assert m["results"]["summary"]["tokens_per_s"] == pytest.approx(recipe["tokens_per_step"] / case["median_s"])
        real[tuple(job)] = recipe["tokens_per_step"]
        assert ("packed_attention" in recipe) == ("benchmark.padding_free=true" in job)
    # a packed row holds one or more documents, a padded row one
    assert real[("benchmark.padding_free=true", "benchmark.impl=ours")] > real[("benchmark.padding_free=false",
                                                                                "benchmark.impl=ours")]
    assert len(_rows(run)) == 2


def test_padded_rows_are_the_packed_documents() -> None:
    """PaddedTask's rows: the packed batch's first documents, in order, each from position 0."""
    from sweepbench.train.data import SyntheticTask
    from sweepbench.train.packing import IGNORE, PackedTask, PaddedTask

    task = SyntheticTask(vocab_size=512, seq_len=128, global_batch=4, seed=0)
    packed, padded = PackedTask(task, vocab_size=512), PaddedTask(task, vocab_size=512)
    for step in range(3):
        (tokens, positions), targets = (lambda b: (b[0].unbind(1), b[1]))(packed.batch(step))
        docs = []  # the packed documents, read back from the positions (0 starts one)
        for row in range(4):
            starts = [*positions[row].eq(0).nonzero().flatten().tolist(), 128]
            for a, e in itertools.pairwise(starts):
                if targets[row, a] != IGNORE:
                    docs.append((tokens[row, a:e], targets[row, a:e]))
        x, y = padded.batch(step)
        assert x.shape == y.shape == (4, 128)
        for row, (doc_x, doc_y) in enumerate(docs[:4]):
            n = len(doc_x)
            assert torch.equal(x[row, :n], doc_x) and torch.equal(y[row, :n], doc_y)
            assert (y[row, n:] == IGNORE).all() and (x[row, n:] == 0).all()
        assert padded.real_tokens(step) == sum(len(d) for d, _ in docs[:4]) < packed.real_tokens(step)
