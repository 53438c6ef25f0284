"""The fine-tuning recipe knobs beyond the layout: who trains (``impl``: ours or a peer), quantized
base weights (``quant``), fused kernels (``fused``) and padding-free batches (``padding_free``).

The checks are torch-free (the driver runs them before any rank starts: one line, exit 2); the
rest says how each knob changes a model (``apply_recipe``, after initialisation, before FSDP/DDP),
what the single-device reference it is verified against runs (``reference_options``), and how
many real tokens a step trains."""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from typing import Any, Callable

from sweepbench.core import Registry
from sweepbench.train.config import TrainKnobs
from sweepbench.train.impls import IMPLS, PEERS, check_impl

# knob value -> ``apply(model, value)``, which changes a freshly initialised model (None: nothing)
Apply = Callable[[Any, str], None] | None
QUANTS: Registry[Apply] = Registry("quantization", ordered=True)
QUANTS.add("none", None)
QUANTS.declare("nf4", "sweepbench.train.quant:apply")  # bitsandbytes 4-bit NormalFloat base (QLoRA)
# the reference's (not a choice of benchmark.quant): the same weights rounded through NF4, kept dense
REFERENCE_QUANTS: Registry[Apply] = Registry("reference quantization")
REFERENCE_QUANTS.declare("nf4_dense", "sweepbench.train.quant:apply")
FUSED: Registry[Apply] = Registry("fused kernels", ordered=True)
FUSED.add("none", None)
# liger-kernel: SwiGLU, RoPE, fused linear CE; the residual add + RMSNorm: the engine's own kernels
FUSED.declare("liger", "sweepbench.train.fused:apply")
# knob -> its default (a peer implementation is refused a knob set away from it); tp_sp and async_tp
# count only where tp > 1
DEFAULTS = {
    "quant": "none",
    "fused": "none",
    "padding_free": False,
    "documents": False,
    "lora_rank": 0,
    "tp_sp": True,
    "async_tp": False,
}
TP_KNOBS = ("tp_sp", "async_tp")
EXTRA = 'pip install "sweepbench[fms]"'


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


def check_recipe(b: TrainKnobs, plan: Any) -> None:
    """ValueError (one line) for a recipe this engine cannot run (``b``: the job's knobs)."""
    knobs = {
        k: getattr(b, k)
        for k, default in DEFAULTS.items()
        if getattr(b, k) != default and (plan.tp > 1 or k not in TP_KNOBS)
    }
    check_impl(
        b.impl,
        tp=plan.tp,
        pp=plan.pp,
        cp=plan.cp,
        dp=plan.dp,
        dp_shard=b.dp_shard,
        ac=b.ac,
        precision=plan.precision,
        knobs=knobs,
    )
    QUANTS.check(b.quant, key="benchmark.quant")
    FUSED.check(b.fused, key="benchmark.fused")
    if b.quant != "none":
        if not b.lora_rank:
            raise ValueError(
                f"benchmark.quant={b.quant} needs LoRA (benchmark.lora_rank > 0, got 0): the quantized "
                f"base weights are frozen, only adapters train; set e.g. benchmark.lora_rank=16"
            )
        if plan.dp * plan.cp > 1 and b.dp_shard == "fsdp":
            raise ValueError(
                f"benchmark.quant={b.quant} with benchmark.dp_shard=fsdp cannot be composed: FSDP2 does "
                f"not shard bitsandbytes' packed 4-bit weights; use benchmark.dp_shard=ddp"
            )
        if not _installed("bitsandbytes"):
            raise ValueError(
                f"benchmark.quant={b.quant} needs bitsandbytes, which is not installed; install it with: {EXTRA}"
            )
    if b.fused != "none":
        if max(plan.tp, plan.pp, plan.cp) > 1:
            raise ValueError(
                f"benchmark.fused={b.fused} with parallelism tp={plan.tp} pp={plan.pp} cp={plan.cp}: the "
                f"fused kernels run on whole sequences and whole models; use a dp layout or fused=none"
            )
        if plan.precision not in ("bf16", "fp32"):
            raise ValueError(
                f"benchmark.fused={b.fused} with benchmark.precision={plan.precision}: the fused kernels "
                f"run on the weights' own dtype; use precision=bf16 or fp32"
            )
        if not _installed("liger_kernel"):
            raise ValueError(
                f"benchmark.fused={b.fused} needs liger-kernel, which is not installed; install it with: {EXTRA}"
            )
    if b.padding_free and max(plan.tp, plan.pp, plan.cp) > 1:
        raise ValueError(
            f"benchmark.padding_free=true with parallelism tp={plan.tp} pp={plan.pp} cp={plan.cp}: "
            f"packed documents run with dp layouts; use a dp layout or padding_free=false"
        )


def check_recipe_device(b: TrainKnobs, device_type: str) -> str | None:
    """Why this recipe cannot run on ``device_type`` (torch-free), or None."""
    peer = PEERS.get(b.impl)
    if peer is not None and device_type not in peer.devices:
        return (
            f"benchmark.impl={b.impl} needs {' or '.join(peer.devices)} devices ({peer.device_note}); "
            f"this job would run on {device_type}: use impl=hf or ours here"
        )
    if b.fused == "liger" and device_type != "cuda":
        return (
            f"benchmark.fused=liger needs CUDA GPUs (liger-kernel's Triton kernels for CUDA); "
            f"this job would run on {device_type}: use fused=none here"
        )
    return None


def reference_options(opts: Any) -> Any:
    """The single-device reference's options: our engine, unfused, and for quantized weights the
    same weights rounded through the quantizer and kept dense."""
    return replace(opts, impl="ours", fused="none", quant=f"{opts.quant}_dense" if opts.quant != "none" else "none")


def block_quantizer(opts: Any) -> Callable[[Any], None] | None:
    """``benchmark.quant``'s quantizer for one block, to apply as each block is initialised (the
    base is then never whole in the training precision: a 70B base in bf16 fills an H200), or None
    where the job's base is not quantized (the reference's dense rounding runs in apply_recipe)."""
    apply = QUANTS.get(opts.quant) if opts.quant in QUANTS else None
    if apply is None:
        return None
    return lambda block: apply(block, opts.quant)


def apply_recipe(model: Any, opts: Any, *, device: Any) -> None:
    """Quantize, fuse and pack ``model`` (a whole or pipeline-stage Transformer) as ``opts`` say.
    Blocks already quantized as they were initialised (``block_quantizer``) hold no dense linear
    for the quantizer to swap: it leaves them as they are."""
    quant = (REFERENCE_QUANTS if opts.quant in REFERENCE_QUANTS else QUANTS).get(opts.quant)
    for apply, value in ((quant, opts.quant), (FUSED.get(opts.fused), opts.fused)):
        if apply is not None:
            apply(model, value)
    if opts.padding_free:
        from sweepbench.train.packing import apply_padding_free, kernel_name

        apply_padding_free(model, kernel=kernel_name(device))


def describe(opts: Any, *, device: Any) -> dict[str, Any]:
    """The recipe's knobs as recorded with the job."""
    out: dict[str, Any] = {
        "impl": opts.impl,
        "quant": opts.quant,
        "fused": opts.fused,
        "padding_free": opts.padding_free,
        "documents": opts.documents or opts.padding_free,
    }
    if opts.padding_free:
        from sweepbench.train.packing import kernel_name

        peer = PEERS.get(opts.impl)  # a peer masks documents its own way (ours: varlen or masked SDPA)
        out["packed_attention"] = peer.packed_attention if peer else kernel_name(device)
    return out


def build_reference(shape: Any, plan: Any, opts: Any, *, device: Any, batches: Any) -> Any:
    """The single-device reference trainer (``reference_options``); with padding-free batches its
    packed forward is first checked against the documents of step 0's first row run one by one."""
    from sweepbench.train.verify import LOSS_RTOL

    trainer = IMPLS.get("ours")(shape, plan, reference_options(opts), device=device)
    if opts.padding_free:
        from sweepbench.train.packing import check_documents

        check_documents(trainer.parts[0], *batches.full(0), rtol=LOSS_RTOL[plan.precision])
    return trainer


def tokens_per_step(plan: Any, task: Any, steps: range) -> float:
    """Tokens a step trains, averaged over ``steps``: real tokens (padding excluded) for packed
    batches, every token otherwise."""
    if not hasattr(task, "real_tokens"):
        return float(plan.tokens_per_step)
    return sum(task.real_tokens(s) for s in steps) / len(steps)
