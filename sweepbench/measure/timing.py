"""The timing loop: warm up, then time each sample with device events (CUDA) or the host
clock (CPU, where gloo collectives are synchronous), and keep the slowest rank's time.

Two ways to make a sample, and the rule for which one a benchmark uses lives here:
- per step (``ops_per_sample=1``): a sample is one step after a device sync and a barrier. For
  steps that last milliseconds or more (a refit, an attention pass, a training step), where the
  launch latency that sync exposes is lost in the step.
- batched (``ops_per_sample=k``): a sample is k back-to-back calls between one pair of events,
  reported as its time / k, as nccl-tests times its ``-n`` iterations. For short ops
  (collectives), whose one-op time would otherwise be mostly launch latency.

Python's garbage is collected after the warm-up and the collector kept off while timing, as timeit
does: a full collection walks every object of the process (a model's modules, the harness's
configs), so in a process with many objects it lands as a pause of hundreds of milliseconds in
whichever sample triggers it (a 252 ms gen-2 collection inside one 16 ms megatron-core refit,
absent from its standalone twin: docs/results/refit_h100x1.md)."""

from __future__ import annotations

import contextlib
import gc
import time
from typing import Callable

import torch
import torch.distributed as dist

from sweepbench.measure import gpu_state

Hook = Callable[[], None]

# nccl-tests' default -n: short ops are timed in batches of this many back-to-back calls
SHORT_OP_BATCH = 20


def ops_per_sample(requested: int = 0, *, short_ops: bool) -> int:
    """How many calls one timed sample holds: ``requested`` when > 0, else SHORT_OP_BATCH for short
    ops (collectives: launch latency would dominate one op) and 1 for long steps (per-step timing)."""
    if requested > 0:
        return requested
    return SHORT_OP_BATCH if short_ops else 1


def sampling(*, warmup: int, iters: int, ops_per_sample: int, device: torch.device) -> dict[str, object]:
    """How time_iterations made each sample with these arguments, for metrics.json."""
    one = "one call" if ops_per_sample == 1 else f"time of {ops_per_sample} back-to-back calls / {ops_per_sample}"
    return {
        "ops_per_sample": ops_per_sample,
        "samples": iters,
        "warmup_calls": warmup,
        "timer": "cuda events" if device.type == "cuda" else "host clock",
        "sample": f"{one}, slowest rank",
        "gc": "collected after warm-up, off while timing",
    }


# fault.kind=slow (launch.faults): every timed iteration of this rank takes this many times as long
_slowdown = 1.0


def slow_down(factor: float) -> None:
    global _slowdown
    _slowdown = factor


def _slowed(step: Hook, device: torch.device) -> Hook:
    """``step`` followed, inside the timed region, by a wait of (factor - 1) x its own time. The
    wait spins rather than sleeps: a sleep overshoots short iterations (timer slack, waking up on
    a busy machine), a spin adds what it says."""

    def slow_step() -> None:
        tic = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        toc = time.perf_counter()
        until = toc + (_slowdown - 1) * (toc - tic)
        while time.perf_counter() < until:
            pass

    return slow_step


def _nothing() -> None:
    pass


def _all_ready(device: torch.device) -> None:
    """Every rank's ``before`` has run (on its device too) before any rank's step starts: a peer
    that writes straight into this rank's buffers (NCCL with registered buffers) would otherwise
    land its data before this rank's reset, which then overwrites it."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier()


def _sample(step: Hook, device: torch.device) -> float:
    """One per-step sample: every rank ready (:func:`_all_ready`), then ``step`` between events
    (CUDA) or on the host clock (CPU, where gloo collectives are synchronous)."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        _all_ready(device)
        start.record()
        step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    _all_ready(device)
    tic = time.perf_counter()
    step()
    return time.perf_counter() - tic


class _CollectorOff:
    """Python's garbage collector off inside (and back on after, if it was). A class, not a
    generator: a generator's exit allocates after re-enabling, and that can trigger a collection
    inside the timing call."""

    def __enter__(self) -> None:
        self.was_enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self.was_enabled:
            gc.enable()


def _batch(step: Hook, k: int) -> Hook:
    def batch() -> None:
        for _ in range(k):
            step()

    return batch


def time_iterations(
    step: Hook,
    *,
    warmup: int,
    iters: int,
    device: torch.device,
    before: Hook = _nothing,
    after: Hook = _nothing,
    ops_per_sample: int = 1,
    record_gpu: bool = True,
) -> list[float]:
    """Seconds per call of ``step``, one value per sample, of the slowest rank (max over ranks,
    sample by sample).

    With ``ops_per_sample=1`` a sample is one call; ``before`` and ``after`` run around every
    call, ``warmup`` warm-up calls included, outside the timed region (e.g. poison the output
    before, verify it after). With ``ops_per_sample=k > 1`` a sample is k back-to-back calls
    timed together and reported as time / k; ``before`` and ``after`` run around each sample (so
    ``after`` sees the batch's last call), and the warm-up is ``warmup`` back-to-back calls
    between one ``before`` and ``after``. Every rank of the default group must call this with
    the same ``warmup``, ``iters`` and ``ops_per_sample``. ``record_gpu``: the job's GPU-state record
    (``measure.gpu_state``) reads the GPU while the samples run; False for a probe the job makes
    beside its measurement (a link's or a matmul's ceiling)."""
    assert ops_per_sample >= 1, ops_per_sample
    with _CollectorOff():
        return _time_iterations(
            step,
            warmup=warmup,
            iters=iters,
            device=device,
            before=before,
            after=after,
            ops_per_sample=ops_per_sample,
            record_gpu=record_gpu,
        )


def _time_iterations(
    step: Hook,
    *,
    warmup: int,
    iters: int,
    device: torch.device,
    before: Hook,
    after: Hook,
    ops_per_sample: int,
    record_gpu: bool,
) -> list[float]:
    if ops_per_sample > 1:
        if warmup:
            before()
            _all_ready(device)
            _batch(step, warmup)()
            after()
        warmup, step = 0, _batch(step, ops_per_sample)
    for _ in range(warmup):
        before()
        _all_ready(device)
        step()
        after()
    gc.collect()  # the warm-up's garbage, before the first sample; none is collected while timing
    if _slowdown != 1:
        step = _slowed(step, device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    times = []
    with gpu_state.timed() if record_gpu else contextlib.nullcontext():
        for _ in range(iters):
            before()
            times.append(_sample(step, device))
            after()
    t = torch.tensor(times, dtype=torch.float64, device=device) / ops_per_sample
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def time_phases(
    steps: list[Hook], *, warmup: int, iters: int, device: torch.device, before: Hook = _nothing
) -> list[list[float]]:
    """Seconds of each of ``steps``, run in order within one iteration (a forward, then the
    backward over the graph that forward built), one list per step with one value per iteration,
    of the slowest rank (max over ranks, sample by sample).

    Each step is timed as a per-step sample of :func:`time_iterations` is: it starts once every
    rank's device is idle and every rank is there (a sync and a barrier), between events (CUDA) or
    on the host clock. So the backward is timed after a fresh forward, as in a loop that ran an
    untimed forward before each backward, and that forward is the timed one: one forward per
    backward instead of a forward loop beside it. ``before`` runs before each iteration, untimed;
    ``warmup`` iterations run every step untimed. Every rank must call this with the same
    arguments."""
    with _CollectorOff():
        for _ in range(warmup):
            before()
            for step in steps:
                _all_ready(device)
                step()
        gc.collect()
        timed = [_slowed(s, device) if _slowdown != 1 else s for s in steps]
        if device.type == "cuda":
            torch.cuda.synchronize()
        rows: list[list[float]] = []
        with gpu_state.timed():
            for _ in range(iters):
                before()
                rows.append([_sample(step, device) for step in timed])
    t = torch.tensor(rows, dtype=torch.float64, device=device).reshape(iters, len(steps))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [t[:, i].tolist() for i in range(len(steps))]
