"""What a person opens after a training job: profiler traces, TensorBoard scalars, a memory
snapshot, all under the job directory, as fairseq2 does.

- ``profile/rank<N>.<time>.pt.trace.json.gz``: a torch.profiler window (skip, warm-up and active
  steps as fields) of steps run after the timed ones, so the profiler never slows a timed step.
  Gzipped Chrome traces: they open in Perfetto (ui.perfetto.dev) and TensorBoard's profiler.
- ``tensorboard/rank<N>/events.out.tfevents.*``: loss, step time, tokens/s and memory per step.
- ``memory_snapshot_rank<N>.pickle`` (GPU, ``memory_snapshot=true``): the allocator's history of
  the profiled steps, for https://pytorch.org/memory_viz."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Callable, Sequence

import torch

from sweepbench.record.atomic import write_atomic


def profile_window(
    step: Callable[[], None],
    *,
    out_dir: Path,
    rank: int,
    skip: int,
    warmup: int,
    active: int,
    device: torch.device,
    memory_snapshot: bool,
) -> dict[str, object]:
    """Run ``skip + warmup + active`` steps under torch.profiler; returns what was written."""
    from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

    trace_dir = out_dir / "profile"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    snapshot = memory_snapshot and device.type == "cuda"
    if snapshot:
        torch.cuda.memory._record_memory_history(max_entries=100_000)
    with profile(
        activities=activities,
        profile_memory=True,
        record_shapes=True,
        schedule=schedule(skip_first=skip, wait=0, warmup=warmup, active=active, repeat=1),
        on_trace_ready=tensorboard_trace_handler(str(trace_dir), worker_name=f"rank{rank}", use_gzip=True),
    ) as prof:
        for _ in range(skip + warmup + active):
            step()
            prof.step()
    written: dict[str, object] = {
        "traces": sorted(str(p.relative_to(out_dir)) for p in trace_dir.glob(f"rank{rank}.*.pt.trace.json.gz"))
    }
    if snapshot:
        path = out_dir / f"memory_snapshot_rank{rank}.pickle"
        write_atomic(path, pickle.dumps(torch.cuda.memory._snapshot()))
        torch.cuda.memory._record_memory_history(enabled=None)
        written["memory_snapshot"] = path.name
    elif memory_snapshot:
        written["memory_snapshot"] = "not taken: the allocator's history exists on CUDA devices only"
    return written


def write_scalars(out_dir: Path, *, rank: int, series: dict[str, tuple[Sequence[int], list[float]]]) -> str:
    """One TensorBoard event file per rank: series tag -> (the steps its values belong to, its values)."""
    from torch.utils.tensorboard import SummaryWriter

    log_dir = out_dir / "tensorboard" / f"rank{rank}"
    writer = SummaryWriter(log_dir=str(log_dir))
    try:
        for tag, (steps, values) in series.items():
            assert len(steps) == len(values), (tag, len(steps), len(values))
            for step, value in zip(steps, values):
                writer.add_scalar(tag, value, step)
    finally:
        writer.close()
    return str(log_dir.relative_to(out_dir))
