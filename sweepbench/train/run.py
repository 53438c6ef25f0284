"""A training job on one rank: measure the ceiling, verify the layout, time the steps, report.

    ceiling -> reference vs layout (first steps) -> warm-up -> timed steps -> learning check
            -> memory, MFU -> (profile window) -> TensorBoard scalars

Every rank runs this with the same config (``train.config.TrainJob``); the returned dict is rank 0's report."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from sweepbench.measure import summarize, time_iterations
from sweepbench.measure.timing import sampling
from sweepbench.measure.memory import host_peak_rss_bytes
from sweepbench.measure.progress import case_done
from sweepbench.train.config import TrainJob, TrainKnobs
from sweepbench.train.context import ContextParallel, build_context_parallel
from sweepbench.train.data import SyntheticTask
from sweepbench.train.impls import IMPLS
from sweepbench.train.packing import PackedTask, PaddedTask
from sweepbench.train.flops import bf16_peak, matmul_ceiling
from sweepbench.train.memory import (
    GIB,
    NVML_SHORTFALL_SLACK,
    HostSampler,
    NvmlSampler,
    current_bytes,
    nvml_shortfall,
    reset_torch_peaks,
    torch_memory,
)
from sweepbench.train.plan import TrainPlan, build_plan
from sweepbench.train.recipe import build_reference, describe, tokens_per_step
from sweepbench.train.profile import profile_window, write_scalars
from sweepbench.train.shape import flops_per_token, shape_of
from sweepbench.train.trainer import DTYPES, TrainOptions, build_mesh
from sweepbench.train.verify import (
    check_learning,
    check_grad_norm,
    check_losses,
    free_memory,
    first_steps,
    global_losses,
    run_reference,
    verify_depth,
)
from sweepbench.core import VerificationError

log = logging.getLogger(__name__)


# LoRA's adapters learn at lr * lora_lr_scale * min(1, LORA_LR_WIDTH / hidden size): Adam moves every
# adapter entry by about the learning rate, so the update B A makes to a weight grows with the width.
# At lr * 10 without the width factor, the Mistral-7B (4096) and Llama-2-70B (8192) shapes diverged
# on the learnable task after two falling steps; llama3_1b (2048) and smaller learned.
LORA_LR_WIDTH = 512


def lora_lr(k: TrainKnobs, hidden_size: int) -> float:
    """The adapters' learning rate (see LORA_LR_WIDTH); ``k.lr`` for a full fine-tune."""
    if not k.lora_rank:
        return k.lr
    return k.lr * k.lora_lr_scale * min(1.0, LORA_LR_WIDTH / hidden_size)


def options_of(k: TrainKnobs, hidden_size: int) -> TrainOptions:
    return TrainOptions(
        ac=k.ac,
        compile=k.compile,
        fused_adamw=k.fused_adamw,
        lr=lora_lr(k, hidden_size),
        lora_rank=k.lora_rank,
        lora_alpha=k.lora_alpha,
        dp_shard=k.dp_shard,
        pp_schedule=k.pp_schedule,
        cp_impl=k.cp_impl,
        seed=k.seed,
        tp_sp=k.tp_sp,
        async_tp=k.async_tp,
        fp8_recipe=k.fp8_recipe,
        impl=k.impl,
        quant=k.quant,
        fused=k.fused,
        padding_free=k.padding_free,
        documents=k.documents,
    )


class Batches:
    """This rank's (inputs, targets) of each step, made before any timing, on the device."""

    def __init__(
        self,
        task: SyntheticTask | PackedTask,
        plan: TrainPlan,
        *,
        dp_rank: int,
        cp: ContextParallel | None,
        device: torch.device,
    ) -> None:
        self.task, self.plan, self.dp_rank, self.cp, self.device = task, plan, dp_rank, cp, device
        self._cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def full(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole global batch (the single-device reference's input)."""
        x, y = self.task.batch(step)
        return x.to(self.device), y.to(self.device)

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        if step not in self._cache:
            x, y = self.task.batch(step)
            rows = slice(self.dp_rank * self.plan.local_batch, (self.dp_rank + 1) * self.plan.local_batch)
            x, y = x[rows], y[rows]
            if self.cp is not None:
                x, y = self.cp.shard(x), self.cp.shard(y)
            self._cache[step] = (x.to(self.device), y.to(self.device))
        return self._cache[step]


def run_training(job: TrainJob, *, rank: int, device: torch.device, job_dir: Path | None) -> dict[str, Any]:
    k = job.knobs
    plan, opts = build_plan(job), options_of(k, job.model.hidden_size)
    shape = shape_of(job.model)
    nvml = NvmlSampler(device)  # the starting level, before the job allocates anything
    host = HostSampler(device)  # on a CPU: the anonymous memory the job adds, from here on
    ceiling = matmul_ceiling(device, DTYPES[plan.precision], fp8=plan.precision == "fp8")
    mesh = build_mesh(plan, device)
    cp = build_context_parallel(plan, mesh, opts, device=device)
    dp_rank = mesh["dp"].get_local_rank()
    synthetic = SyntheticTask(
        vocab_size=shape.vocab_size, seq_len=plan.seq_len, global_batch=plan.global_batch, seed=opts.seed
    )
    task: SyntheticTask | PackedTask = synthetic
    if opts.padding_free:  # documents packed into each row; counted in real tokens
        task = PackedTask(synthetic, vocab_size=shape.vocab_size)
    elif opts.documents:  # the same documents, one per row, padded: the packed batch's baseline
        task = PaddedTask(synthetic, vocab_size=shape.vocab_size)
    batches = Batches(task, plan, dp_rank=dp_rank, cp=cp, device=device)
    layout_kw = dict(
        device=device, mesh=mesh, positions=cp.positions if cp else None, attn_fn=cp.attn_fn if cp else None
    )

    # verified before any time counts
    depth = verify_depth(shape, plan, device=device, lora_rank=opts.lora_rank, forced=k.verify_layers)
    vshape = shape_of(job.model, num_layers=depth)
    single = plan.single_device()
    reference, reference_norm = run_reference(
        lambda: build_reference(vshape, single, opts, device=device, batches=batches), batches.full, k.verify_steps
    )
    trainer = IMPLS.get(opts.impl)(vshape, plan, opts, **layout_kw)
    layout_losses, norm = first_steps(trainer, batches, k.verify_steps, pp=plan.pp, reduce=True)
    verified = global_losses(layout_losses, holds_loss=trainer.holds_loss)
    worst = check_losses(reference, verified, precision=plan.precision)
    norm_err = check_grad_norm(reference_norm, norm, precision=plan.precision)
    losses, step_no = list(verified), k.verify_steps
    case_done(f"{len(verified)} steps verified at {depth} layers (max rel err {worst:.2g})", total=2)
    if depth != shape.num_layers:  # verified at reduced depth: now the full model, from step 0
        del trainer
        free_memory()
        trainer = IMPLS.get(opts.impl)(shape, plan, opts, **layout_kw)
        losses, step_no = [], 0

    # timed
    local: list[torch.Tensor] = []
    mem_per_step: list[float] = []
    counter = iter(range(step_no, 10**9))

    def step() -> None:
        local.append(trainer.step(*batches(next(counter))))

    per_sample = k.steps_per_sample
    timed_from, timed_to = step_no + job.warmup, step_no + job.warmup + job.iters * per_sample
    for s in range(step_no, timed_to):
        batches(s)  # made before timing
    reset_torch_peaks(device)
    nvml.resume()
    times = time_iterations(
        step,
        warmup=job.warmup,
        iters=job.iters,
        device=device,
        after=lambda: mem_per_step.append(current_bytes(device) / GIB),
        ops_per_sample=per_sample,
    )
    nvml.pause()
    stats = summarize(times)
    case_done(f"{job.iters} steps timed: median {stats['median_s']:.3g} s", total=2)
    losses += global_losses(local, holds_loss=trainer.holds_loss)
    first_loss, last_loss = check_learning(losses)
    torch_peaks, nvml_peak = torch_memory(device), nvml.peak_above_start()
    short = nvml_shortfall(nvml_peak, torch_peaks["peak_reserved_bytes"])
    memory = {
        **torch_peaks,
        "nvml_peak_bytes": nvml_peak,
        "nvml_start_bytes": nvml.start_level,
        "nvml_shortfall_bytes": short,
        "host_peak_rss_bytes": host_peak_rss_bytes(),  # this job's: its rank reset the peak at its start
        "host_peak_anon_bytes": host.stop(),
    }

    if nvml_peak is not None and short is not None and short > NVML_SHORTFALL_SLACK:
        log.warning(
            "NVML's peak above this job's start (%.3f GiB) is %.3f GiB under torch's reserved peak: the job "
            "reused memory reserved before it started, and the NVML figure undercounts it",
            nvml_peak / GIB,
            short / GIB,
        )

    # derived rates
    step_tokens = tokens_per_step(plan, task, range(timed_from, timed_to))
    tokens_per_s = step_tokens / stats["median_s"]
    fpt = flops_per_token(shape, plan.seq_len, lora_rank=opts.lora_rank)
    achieved = tokens_per_s * fpt / plan.world_size  # model FLOP/s per device
    peak, device_name = bf16_peak(device)
    if achieved > ceiling:
        raise VerificationError(
            f"model FLOP/s per device {achieved:.3e} exceed the matmul ceiling {ceiling:.3e} "
            f"measured in this job: the FLOP count or the timing is wrong"
        )
    out = job_dir or Path.cwd()
    files: dict[str, Any] = {}
    if k.profile:
        files = profile_window(
            step,
            out_dir=out,
            rank=rank,
            skip=k.profile_skip,
            warmup=k.profile_warmup,
            active=k.profile_active,
            device=device,
            memory_snapshot=k.memory_snapshot,
        )
        # a sample's figures at its last step; the memory also after the warm-up (after each of its steps
        # where samples are single steps)
        sample_ends = range(timed_from + per_sample - 1, timed_to, per_sample)
        warm = range(step_no, timed_from) if per_sample == 1 else range(timed_from - bool(job.warmup), timed_from)
        files["tensorboard"] = write_scalars(
            out,
            rank=rank,
            series={
                "loss": (range(len(losses)), losses),
                "memory_gib": ([*warm, *sample_ends], mem_per_step),
                "step_time_s": (sample_ends, times),
                "tokens_per_s": (sample_ends, [plan.tokens_per_step / t for t in times]),
            },
        )
    return {
        "plan": plan,
        "shape": shape,
        "times_s": times,
        "stats": stats,
        "sampling": sampling(warmup=job.warmup, iters=job.iters, ops_per_sample=per_sample, device=device),
        "losses": losses,
        "reference_losses": reference,
        "verified_losses": verified,
        "verify_layers": depth,
        "verify_max_rel_err": worst,
        "grad_norm": norm,
        "reference_grad_norm": reference_norm,
        "grad_norm_rel_err": norm_err,
        "lr": opts.lr,
        "first_loss": first_loss,
        "last_loss": last_loss,
        "tokens_per_s": tokens_per_s,
        "flops_per_token": fpt,
        "achieved_flops": achieved,
        "ceiling_flops": ceiling,
        "peak_flops": peak,
        "device_name": device_name,
        "memory": memory,
        "num_trainable": trainer.num_trainable,
        "files": files,
        "cp": cp.describe() if cp else None,
        "pp_bubble": trainer.bubble(),
        # a peer may say what it applied (recipe_notes: e.g. the plugins and the patches they made)
        "recipe": {
            **describe(opts, device=device),
            **getattr(trainer, "recipe_notes", {}),
            "tokens_per_step": step_tokens,
        },
    }
