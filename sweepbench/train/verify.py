"""Proof that a layout trains the same model, before any of its time counts.

The single-device reference (same weights, same data, same optimizer, micro-batched the same
way) runs in the same job on every rank's own device; the layout's global loss of each of its
first steps must match it: fp32 at a tight tolerance, bf16 at a stated one (bf16 sums in a
different order differ in the last bits, which a few optimizer steps amplify). So must the norm
of the first step's whole gradient (every trainable element of every rank, each counted once):
AdamW's first update is about lr x sign(gradient) and the learnable task is memorised in a step,
so the later losses cannot tell a gradient scaled by a wrong factor, or missing a reduction, from
the right one; its norm can. Where the full
model would not fit one device, both run at reduced depth (same widths, 2 layers, or one per
pipeline stage when there are more stages). Then the timed steps must lower the loss: the
synthetic task is learnable and its batches nearly alike, so a layout whose loss does not go
down is broken."""

from __future__ import annotations

import ctypes
import gc
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from sweepbench.core import VerificationError
from sweepbench.train.plan import FIT_FRACTION, TrainPlan, reference_bytes
from sweepbench.parallel.specs import ModelShape

# relative tolerance of each verified step's loss against the reference
# fp8: dp4 on 4 H200s (llama3_8b widths at 4 layers, seq 8192, compiled like its reference) was
# within 5.4e-5 of the reference with tensorwise scales and 5.7e-3 with rowwise ones
LOSS_RTOL = {"fp32": 1e-4, "bf16": 2e-2, "mixed": 1e-2, "fp8": 5e-2}
# the last timed losses must be below the first step's by more than float noise: every batch of the
# task holds nearly the same tokens (the sequences walk one short cycle), so any real drop counts
MIN_DROP = 1e-4


def verify_depth(shape: ModelShape, plan: TrainPlan, *, device: torch.device, lora_rank: int, forced: int) -> int:
    """Layers of the verified model: ``forced`` if set, the full depth if the single-device
    reference fits, else 2 (rounded up to a multiple of the pipeline's stages)."""
    if forced:
        return forced
    if device.type != "cuda":
        return shape.num_layers
    total = torch.cuda.get_device_properties(device).total_memory
    if reference_bytes(shape, plan, lora_rank=lora_rank) <= FIT_FRACTION * total:
        return shape.num_layers
    stages = plan.num_stages
    return stages * -(-2 // stages)


def global_losses(local: list[torch.Tensor], *, holds_loss: bool) -> list[float]:
    """The global batch's loss per step: the mean over the ranks that compute one (the last
    pipeline stage's; tp ranks agree, dp ranks and cp sequence shards are averaged)."""
    weight = 1.0 if holds_loss else 0.0
    t = torch.stack([x.detach().float() for x in local] + [torch.ones((), device=local[0].device)]) * weight
    dist.all_reduce(t)
    return (t[:-1] / t[-1]).tolist()


def free_memory() -> None:
    """Hand what was freed back: the GPU allocator's cache, and on the host glibc's free heap
    (freed tensors of a few MB stay in the process otherwise, so the reference's memory would
    add to the layout's instead of making room for it)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the memory stays with the process
        pass


def check_losses(reference: list[float], got: list[float], *, precision: str) -> float:
    """Raise VerificationError where a step's loss differs; returns the largest relative error.

    Relative to the larger of the step's reference loss and the first step's: a loss the learnable
    task has driven to ~0 (a large model memorises it in one step) has no meaningful relative error."""
    rtol = LOSS_RTOL[precision]
    worst = 0.0
    for i, (r, g) in enumerate(zip(reference, got)):
        err = abs(g - r) / max(abs(r), abs(reference[0]), 1e-12)
        worst = max(worst, err)
        if not err <= rtol:
            raise VerificationError(
                f"step {i}: loss {g:.6f} differs from the single-device reference "
                f"{r:.6f} by {err:.2e} (relative to max(|reference|, first loss); tolerance {rtol:.0e} in {precision})"
            )
    return worst


def check_learning(losses: list[float], *, last: int = 3) -> tuple[float, float]:
    """(first loss, mean of the last ``last``): the latter must be MIN_DROP below the former."""
    first, tail = losses[0], losses[-last:]
    end = sum(tail) / len(tail)
    if not end <= first * (1 - MIN_DROP):
        raise VerificationError(
            f"the timed steps did not lower the loss on the learnable task: first step "
            f"{first:.4f}, mean of the last {len(tail)} {end:.4f} (needs <= "
            f"{first * (1 - MIN_DROP):.4f}); losses {[round(x, 4) for x in losses]}"
        )
    return first, end


def grad_norm(parts: Sequence[nn.Module], *, pp: int, reduce: bool) -> float:
    """The L2 norm of the gradient now held by the trainable parameters of ``parts``, over the
    whole model: with ``reduce``, every rank of the default group calls this and each element
    counts once. A DTensor's local shard counts once per replica set: divided by the sizes of
    its mesh's Replicate dims and by the ranks of its stage outside its mesh (DDP's copies); a
    Partial gradient is reduced first. A plain gradient is a copy on every rank of its stage
    (``pp``: the pipeline's ranks, each holding its own stages, the same on every rank of its
    dp/tp/cp group; ranks of different pipeline ranks hold disjoint parameters). Without ``reduce``
    (the single-device reference): this process's gradients alone."""
    from torch.distributed.tensor import DTensor, Partial, Replicate

    world = dist.get_world_size() if reduce else 1
    per_stage = world // pp  # the ranks that hold the same stages
    total = torch.zeros((), dtype=torch.float64)
    device = None
    for part in parts:
        for p in part.parameters():
            g = p.grad
            if g is None:
                continue
            copies = per_stage
            if isinstance(g, DTensor):
                if any(isinstance(pl, Partial) for pl in g.placements):
                    g = g.redistribute(
                        placements=[Replicate() if isinstance(pl, Partial) else pl for pl in g.placements]
                    )
                mesh = g.device_mesh
                copies = per_stage // mesh.size()
                for dim, pl in enumerate(g.placements):
                    if isinstance(pl, Replicate):
                        copies *= mesh.size(dim)
                g = g.to_local()
            # the norm's own reduction (fp32 accumulation, no upcast copy of the gradient), squared
            local = torch.linalg.vector_norm(g.detach(), dtype=torch.float32).double() ** 2
            device = local.device
            total = total.to(device) + local / copies
    if reduce:
        total = total.to(device or torch.device("cpu"))
        if device is None and dist.get_backend() == "nccl":
            total = total.cuda()
        dist.all_reduce(total)
    return float(total.sqrt())


def check_grad_norm(reference: float, got: float, *, precision: str) -> float:
    """Raise VerificationError where the first step's gradient norm differs from the reference's
    by more than the precision's tolerance (the losses'); returns the relative error."""
    rtol = LOSS_RTOL[precision]
    err = abs(got - reference) / max(abs(reference), 1e-30)
    if not err <= rtol:
        raise VerificationError(
            f"step 0: gradient norm {got:.6g} differs from the single-device reference's {reference:.6g} "
            f"by {err:.2e} (tolerance {rtol:.0e} in {precision}): a gradient scaled by a wrong factor or "
            f"missing a reduction"
        )
    return err


def first_steps(
    trainer: Any, batches: Callable[[int], tuple], steps: int, *, pp: int, reduce: bool
) -> tuple[list[torch.Tensor], float]:
    """A trainer's losses of its first ``steps`` steps, and the norm of its first step's gradient
    (``grad_norm``'s ``pp`` and ``reduce``), read before the next step clears it."""
    losses, norm = [], 0.0
    for s in range(steps):
        losses.append(trainer.step(*batches(s)))
        if s == 0:
            norm = grad_norm(trainer.parts, pp=pp, reduce=reduce)
    return losses, norm


def run_reference(
    build: Callable[[], object], batches: Callable[[int], tuple], steps: int
) -> tuple[list[float], float]:
    """Losses of the first ``steps`` steps of the single-device reference (no communication), and
    the norm of its first step's gradient."""
    trainer = build()
    losses, norm = first_steps(trainer, batches, steps, pp=1, reduce=False)
    del trainer
    free_memory()
    return [float(x) for x in losses], norm
