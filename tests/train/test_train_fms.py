"""The fine-tune recipe knobs of benchmark=train, at tiny size on gloo ranks through the real CLI:
the Hugging Face peer (transformers + peft) beside ours in one sweep, verified against our
single-device reference at the same init; NF4-quantized base weights under LoRA, verified
against the dequantized dense model; padding-free batches, verified against the documents run
one by one, counting real tokens. Bad combinations are refused in one line before any rank."""

from __future__ import annotations

import csv
from typing import Any

import pytest
import torch

from ..conftest import SweepRun, planned_tag, refusal, run_sweepbench, run_sweeps

FAST = ["benchmark=train", "model=tiny", "backend=gloo", "benchmark.warmup=1", "benchmark.iters=3",
        "wandb.mode=disabled", "benchmark.lora_rank=8"]
PEERS = ["benchmark.impl=ours,hf", "parallelism=tp1,dp2"]
QUANT = ["parallelism=dp2", "benchmark.dp_shard=ddp", "benchmark.quant=nf4"]
PACKED = ["parallelism=dp2", "benchmark.padding_free=true", "benchmark.ac=full", "benchmark.impl=ours,hf"]


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SweepRun]:
    root = tmp_path_factory.mktemp("train_fms")
    runs = run_sweeps({name: [*FAST, *args] for name, args in (("peers", PEERS), ("quant", QUANT), ("packed", PACKED))},
                      root, timeout=600)
    for run in runs.values():
        assert run.rc == 0, run.describe()
    return runs


def _verified(m: dict[str, Any], rel: float) -> None:
    assert m["status"] == "ok" and m["verified"], m.get("error")
    v = m["results"]["verification"]
    assert len(v["layout_losses"]) == 2
    for ref, got in zip(v["reference_losses"], v["layout_losses"]):
        assert got == pytest.approx(ref, rel=rel)
    assert v["grad_norm"] == pytest.approx(v["reference_grad_norm"], rel=rel)
    losses = m["results"]["cases"][0]["loss_per_step"]
    assert sum(losses[-3:]) / 3 < losses[0]


@pytest.mark.parametrize("layout", ["tp1", "dp2"])
def test_hf_peer_matches_our_reference_in_one_sweep(sweeps: dict[str, SweepRun], compose: Any, layout: str) -> None:
    run = sweeps["peers"]
    hf = run.metrics(planned_tag(compose, *FAST, "benchmark.impl=hf", f"parallelism={layout}"))
    ours = run.metrics(planned_tag(compose, *FAST, "benchmark.impl=ours", f"parallelism={layout}"))
    _verified(hf, 1e-4)  # fp32: HF's LlamaForCausalLM + peft from our weights computes our function
    _verified(ours, 1e-4)
    assert hf["results"]["recipe"]["impl"] == "hf" and ours["results"]["recipe"]["impl"] == "ours"
    assert hf["results"]["num_trainable"] == ours["results"]["num_trainable"]  # the same adapters
    assert hf["results"]["verification"]["reference_losses"] == ours["results"]["verification"]["reference_losses"]
    for key in ("tokens_per_s_per_gpu", "mfu_pct", "step_median_s", "step_iqr_s", "step_min_s", "step_max_s"):
        assert hf["results"]["summary"][key] > 0


def test_results_csv_has_both_impls(sweeps: dict[str, SweepRun]) -> None:
    with open(sweeps["peers"].sweep_dir / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["impl"] for r in rows) == ["hf", "hf", "ours", "ours"]
    assert all(r["status"] == "ok" and float(r["tokens_per_s_per_gpu"]) > 0 for r in rows)


def test_nf4_lora_verified_against_dequantized_model(sweeps: dict[str, SweepRun], compose: Any) -> None:
    m = sweeps["quant"].metrics(planned_tag(compose, *FAST, *QUANT))
    _verified(m, 1e-4)
    assert m["results"]["summary"]["quant"] == "nf4"


@pytest.mark.parametrize("impl", ["ours", "hf"])
def test_padding_free_verified_and_counts_real_tokens(sweeps: dict[str, SweepRun], compose: Any, impl: str) -> None:
    """hf: transformers masks attention within documents from the restarting position ids, so it
    matches our packed reference (itself checked against the documents run one by one)."""
    m = sweeps["packed"].metrics(planned_tag(compose, *FAST, *PACKED[:-1], f"benchmark.impl={impl}"))
    _verified(m, 1e-4)
    recipe, case = m["results"]["recipe"], m["results"]["cases"][0]
    assert recipe["padding_free"] and recipe["impl"] == impl
    assert recipe["packed_attention"] == {"ours": "sdpa_mask", "hf": "transformers_position_ids"}[impl]
    assert 0 < recipe["tokens_per_step"] < case["tokens_per_step"]  # the rows' padded tails not counted
    assert m["results"]["summary"]["tokens_per_s"] == pytest.approx(recipe["tokens_per_step"] / case["median_s"])


def test_nf4_linear_forward_and_backward_match_dense() -> None:
    from sweepbench.train.model import LoRALinear
    from sweepbench.train.quant import NF4Linear, dequantize

    torch.manual_seed(0)
    dense = LoRALinear(64, 32, rank=4, alpha=8.0)
    for p, std in ((dense.weight, 0.02), (dense.lora_a, 0.02), (dense.lora_b, 0.05)):
        torch.nn.init.normal_(p, std=std)
    base = dense.weight.detach().clone()
    quant = NF4Linear(dense)
    assert quant.weight.dtype == torch.uint8 and quant.weight.numel() * 2 == base.numel()  # 4 bits a weight
    with torch.no_grad():
        dense.weight.copy_(dequantize(base))
    assert (dense.weight - base).abs().max() > 0  # NF4 rounds: the reference is the dequantized model
    x = torch.randn(3, 5, 64, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    y_q, y_d = quant(x), dense(x2)
    torch.testing.assert_close(y_q, y_d, rtol=1e-5, atol=1e-6)
    y_q.square().sum().backward()
    grads_q = (x.grad, quant.lora_a.grad, quant.lora_b.grad)
    quant.lora_a.grad = quant.lora_b.grad = None
    y_d.square().sum().backward()
    for gq, gd in zip(grads_q, (x2.grad, dense.lora_a.grad, dense.lora_b.grad)):
        torch.testing.assert_close(gq, gd, rtol=1e-4, atol=1e-6)


def test_a_4bit_base_is_quantized_block_by_block_as_it_is_initialised() -> None:
    """quant=nf4 hands init_weights its quantizer: each block is quantized as soon as it is filled, so the
    base is never whole in bf16 (a 70B one would fill an H200), and the model is the same, bit for bit, as
    the one initialised whole and quantized after."""
    from omegaconf import OmegaConf

    from sweepbench.train import quant
    from sweepbench.train.init import init_weights
    from sweepbench.train.model import Transformer
    from sweepbench.train.recipe import block_quantizer
    from sweepbench.train.shape import shape_of

    shape = shape_of(OmegaConf.create(dict(name="t", num_layers=3, hidden_size=64, num_heads=4, num_kv_heads=2,
                                           ffn_hidden_size=128, vocab_size=256, dtype="float32", seq_len=32)))
    seen: list[set[str]] = []

    def build() -> Transformer:
        with torch.device("meta"):
            return Transformer(shape, lora_rank=4, lora_alpha=8.0)

    whole = build()
    init_weights(whole, seed=3, device=torch.device("cpu"), dtype=torch.bfloat16)
    quant.apply(whole, "nf4")
    streamed, quantize = build(), block_quantizer(OmegaConf.create({"quant": "nf4"}))
    assert quantize is not None and block_quantizer(OmegaConf.create({"quant": "none"})) is None

    def each(block: torch.nn.Module) -> None:  # when a block is handed over, no later block is on a device yet
        seen.append({str(p.device) for b in streamed.layers.values() if b is not block for p in b.parameters()})
        quantize(block)

    init_weights(streamed, seed=3, device=torch.device("cpu"), dtype=torch.bfloat16, each_block=each)
    assert seen[0] == {"meta"} and seen[1] == {"cpu", "meta"} and len(seen) == 3
    a, b = whole.state_dict(), streamed.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all(isinstance(m, quant.NF4Linear) for k in ("wq", "wo") for m in [streamed.layers["2"].attention.get_submodule(k)])


def test_packed_attention_that_crosses_documents_is_caught() -> None:
    from sweepbench.core import VerificationError
    from sweepbench.train.data import SyntheticTask
    from sweepbench.train.model import Attention, sdpa_attention
    from sweepbench.train.packing import PackedTask, check_documents
    from sweepbench.train.plan import TrainPlan
    from sweepbench.parallel.specs import ModelShape
    from sweepbench.train.trainer import Trainer, TrainOptions

    shape = ModelShape("t", 2, 32, 4, 2, 64, 128)
    plan = TrainPlan(tp=1, pp=1, dp=1, cp=1, seq_len=64, micro_batch=2, global_batch=2, precision="fp32",
                     stages_per_rank=1)
    model = Trainer(shape, plan, TrainOptions(padding_free=True), device=torch.device("cpu")).parts[0]
    task = PackedTask(SyntheticTask(vocab_size=128, seq_len=64, global_batch=2, seed=0), vocab_size=128)
    x, y = task.batch(0)
    assert check_documents(model, x, y, rtol=1e-5) < 1e-5
    for m in model.modules():
        if isinstance(m, Attention):
            m.attn_fn = sdpa_attention  # causal over the whole packed row: documents see each other
    with pytest.raises(VerificationError, match="documents run one by one"):
        check_documents(model, x, y, rtol=1e-5)


def test_packed_batches_reach_a_fused_loss_with_their_targets() -> None:
    """A padding-free model called as the fused recipe calls it, with the targets (its loss then
    computed from the last hidden states, never the logits): the packed row is unpacked for it as for
    the plain call, and the loss is the plain call's cross-entropy."""
    import torch.nn.functional as F

    from sweepbench.train.data import SyntheticTask
    from sweepbench.train.packing import IGNORE, PackedTask
    from sweepbench.train.plan import TrainPlan
    from sweepbench.parallel.specs import ModelShape
    from sweepbench.train.trainer import Trainer, TrainOptions

    shape = ModelShape("t", 2, 32, 4, 2, 64, 128)
    plan = TrainPlan(tp=1, pp=1, dp=1, cp=1, seq_len=64, micro_batch=2, global_batch=2, precision="fp32",
                     stages_per_rank=1)
    model = Trainer(shape, plan, TrainOptions(padding_free=True), device=torch.device("cpu")).parts[0]
    x, y = PackedTask(SyntheticTask(vocab_size=128, seq_len=64, global_batch=2, seed=0), vocab_size=128).batch(0)
    model.fused_loss = lambda w, h, t: F.cross_entropy(F.linear(h, w).flatten(0, 1), t.flatten(), ignore_index=IGNORE)
    with torch.no_grad():
        plain = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=IGNORE)
        fused = model(x, y)
    torch.testing.assert_close(fused, plain)


BASE = ["benchmark=train", "model=tiny", "backend=gloo", "parallelism=tp1"]
BAD = {
    "impl": (["benchmark.impl=nope"], "benchmark.impl='nope'; valid: fms_foak, fms_peft, hf, ours"),
    "hf_tp": (["benchmark.impl=hf", "parallelism=tp2"], "benchmark.impl=hf with parallelism tp=2 pp=1 cp=1"),
    "hf_quant": (["benchmark.impl=hf", "benchmark.lora_rank=8", "benchmark.quant=nf4"],
                 "benchmark.quant=nf4 with benchmark.impl=hf"),
    "hf_ac": (["benchmark.impl=hf", "benchmark.ac=selective"], "benchmark.ac=selective with benchmark.impl=hf"),
    "fused_mixed": (["benchmark.fused=liger", "benchmark.precision=mixed"],
                    "benchmark.fused=liger with benchmark.precision=mixed"),
    "fms_peft_quant": (["benchmark.impl=fms_peft", "benchmark.precision=bf16"],
                       "benchmark.impl=fms_peft needs benchmark.quant=nf4 (got its default)"),
    "fms_peft_dp": (["benchmark.impl=fms_peft", "benchmark.precision=bf16", "benchmark.quant=nf4",
                     "benchmark.dp_shard=ddp", "parallelism=dp2"], "benchmark.impl=fms_peft with parallelism dp=2"),
    "fms_peft_fp32": (["benchmark.impl=fms_peft", "benchmark.quant=nf4"],
                      "benchmark.precision=fp32 with benchmark.impl=fms_peft: it trains in bf16; use that"),
    "fms_foak_cpu": (["benchmark.impl=fms_foak", "benchmark.precision=bf16"],
                     "benchmark.impl=fms_foak needs cuda devices (its fused kernels are Triton kernels"),
    "fms_foak_kept": (["benchmark.impl=fms_foak", "benchmark.precision=bf16", "launch.keep_ranks=true"],
                      "launch.keep_ranks=true with benchmark.impl=fms_foak: its plugin patches transformers'"),
    "quant_full": (["benchmark.quant=nf4"], "benchmark.quant=nf4 needs LoRA (benchmark.lora_rank > 0, got 0)"),
    "quant_fsdp": (["benchmark.quant=nf4", "benchmark.lora_rank=8", "parallelism=dp2"],
                   "benchmark.quant=nf4 with benchmark.dp_shard=fsdp cannot be composed"),
    "quant_name": (["benchmark.quant=int3"], "benchmark.quant='int3'; valid: none, nf4"),
    "fused_pp": (["benchmark.fused=liger", "parallelism=pp2", "benchmark.global_batch=2"],
                 "benchmark.fused=liger with parallelism tp=1 pp=2 cp=1"),
    "packed_cp": (["benchmark.padding_free=true", "parallelism=cp2"],
                  "benchmark.padding_free=true with parallelism tp=1 pp=1 cp=2"),
    "liger_cpu": (["benchmark.fused=liger"], "benchmark.fused=liger needs CUDA GPUs"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_recipe_refused_in_one_line(case: str, compose: Any) -> None:
    overrides, message = BAD[case]
    text = refusal(compose, *BASE, *overrides)
    assert text.startswith(message), text


def test_a_peer_that_patches_its_process_never_keeps_its_rank(compose: Any) -> None:
    """fms_foak's plugin patches transformers' llama module for the life of its process: its job
    never leaves its rank to the sweep's next job, where fms_peft's (which patches nothing) may."""
    from sweepbench.benchmarks.train import TrainBenchmark

    cfg = compose(*BASE, "benchmark.precision=bf16", "benchmark.quant=nf4")
    assert TrainBenchmark.keeps_ranks_for(compose(*BASE, "benchmark.impl=fms_peft", "benchmark.quant=nf4"))
    assert TrainBenchmark.keeps_ranks_for(cfg)  # ours
    assert not TrainBenchmark.keeps_ranks_for(compose(*BASE, "benchmark.impl=fms_foak"))


def test_liger_on_cpu_exits_2_before_ranks(tmp_path: Any) -> None:
    run = run_sweepbench([*BASE, "benchmark.fused=liger"], sweep_dir=tmp_path / "sweep")
    assert run.rc == 2, run.describe()
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "benchmark.fused=liger needs CUDA GPUs" in lines[0], run.stderr
