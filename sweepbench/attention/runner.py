"""One scaling case on every rank of the default group: T1 and the reference on rank 0, the impl
verified on every rank against it, then timed (slowest rank), with and without communication.

Timing order: forward alone; backward alone (its forward run untimed just before each iteration);
forward+backward (peak memory is read over these iterations, after a reset, and each rank's own
times are kept for the per-rank medians); forward+backward again with ``LocalComm`` (the same
schedule, no bytes between ranks). Exposed communication = median(total) - median(no-comm total):
the communication time that compute did not hide (``torch_cp`` cannot run without communication,
so it has none)."""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import torch
import torch.distributed as dist

from sweepbench.attention.api import cp_attention, cp_context, default_sdpa_backend
from sweepbench.attention.comm import Comm, LocalComm
from sweepbench.attention.dilated import branches_of
from sweepbench.attention.ops import backends_for
from sweepbench.attention.placement import shard_sequence, unshard_sequence
from sweepbench.attention.registry import get_impl
from sweepbench.attention.scaling import Shape, attention_flops, make_inputs, mismatch, peak_tflops, single_device
from sweepbench.core import VerificationError
from sweepbench.measure import summarize, time_iterations
from sweepbench.measure.memory import memory_peaks, reset_peaks
from sweepbench.measure.progress import case_done

FLOP_NOTE = ("forward 4*B*H*D per attended (query, key) pair, causal = half the pairs, dilated = the "
             "branches' pairs; backward 2.5x forward; TFLOP/s = FLOPs / median time")


def _leaves(*xs: torch.Tensor) -> list[torch.Tensor]:
    return [x.detach().clone().requires_grad_() for x in xs]


def _clear(xs: list[torch.Tensor]) -> None:
    for x in xs:
        x.grad = None


def _broadcast(obj: Any) -> Any:
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _candidates(device: torch.device, dtype: torch.dtype) -> list[str]:
    names = backends_for(device.type, dtype)
    best = default_sdpa_backend(device, dtype)
    return [n for n in names if n != "cudnn" or best == "cudnn"]  # cuDNN only where it is enabled


def single_device_times(rank: int, inputs: list[torch.Tensor], *, device: torch.device, causal: bool,
                        backward: bool, pattern: str, branches: Any, iters: int) -> tuple[dict[str, Any], Any]:
    """Rank 0 times the whole sequence with each SDPA backend that runs it (the other ranks wait;
    a backend that raises, out of memory included, is left out, and none left fails the job);
    returns {backend: stats}, and on rank 0 the reference (out, dq, dk, dv) of the fastest."""
    q, k, v, dout = inputs
    leaves = _leaves(q, k, v)

    def step(name: str) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            _clear(leaves)
            out = single_device(*leaves, backend=name, causal=causal, pattern=pattern, branches=branches)
            if backward:
                out.backward(dout)
            return out
        return run

    ok: list[str] = []
    refused: dict[str, str] = {}
    if rank == 0:
        for name in _candidates(device, q.dtype):
            try:
                step(name)()
                ok.append(name)
            except RuntimeError as err:  # a backend that refuses this shape (or runs out of memory) is no candidate
                refused[name] = str(err).splitlines()[0][:200]
                print(f"attention: SDPA backend {name} cannot run this case: {refused[name]}", flush=True)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    ok, refused = _broadcast((ok, refused))
    if not ok:
        raise RuntimeError(f"the whole sequence does not run on one device with any SDPA backend, so there is "
                           f"no T1 and no reference: {refused}")
    stats = {}
    for name in ok:
        run = step(name) if rank == 0 else (lambda: None)
        stats[name] = summarize(time_iterations(run, warmup=1, iters=iters, device=device))
    reference = None
    if rank == 0 and ok:
        best = min(ok, key=lambda n: stats[n]["median_s"])
        out = step(best)().detach()
        reference = (out, *(x.grad for x in leaves)) if backward else (out,)
    return stats, reference


def run_case(*, rank: int, world_size: int, device: torch.device, seed: int, batch: int, heads: int, kv_heads: int,
             head_dim: int, seq_len: int, dtype: str, causal: bool, backward: bool, impl: str, pattern: str,
             segment_lengths: list[int], dilation_rates: list[int], sdpa_backend: str, rotate_method: str,
             warmup: int, iters: int, t1_iters: int) -> tuple[dict[str, Any], dict[str, float]]:
    dt = getattr(torch, dtype)
    shape = Shape(batch, heads, kv_heads, seq_len, head_dim)
    branches = branches_of(segment_lengths, dilation_rates)
    inputs = make_inputs(shape, dtype=dt, device=device, seed=seed)
    t1_stats, reference = single_device_times(rank, inputs, device=device, causal=causal, backward=backward,
                                              pattern=pattern, branches=branches, iters=t1_iters)
    t1_backend = min(t1_stats, key=lambda n: t1_stats[n]["median_s"])
    backend = t1_backend if sdpa_backend == "auto" else sdpa_backend
    spec = get_impl(impl)
    steps = 3 + spec.own_comm  # T1, verified, timed, and the same without communication
    case_done(f"T1 (one device, {t1_backend}): {t1_stats[t1_backend]['median_s'] * 1e3:.3g} ms", total=steps)
    mine = [shard_sequence(x, dim=2, rank=rank, world_size=world_size, placement=spec.placement) for x in inputs]
    leaves, ldout = _leaves(*mine[:3]), mine[3]
    comm = Comm()

    def forward(c: Comm) -> torch.Tensor:
        return cp_attention(*leaves, impl=impl, causal=causal, sdpa_backend=backend, pattern=pattern,
                            segment_lengths=segment_lengths, dilation_rates=dilation_rates, comm=c)

    def context() -> Any:
        return cp_context(impl, comm=comm, seq_len=seq_len, device=device, rotate_method=rotate_method)

    def total(c: Comm) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:  # forward and backward; the output (verification reads it)
            _clear(leaves)
            with context():
                out = forward(c)
                if backward:
                    out.backward(ldout)
            return out
        return run

    # verify once, before any time counts: the output and gradients of one forward and backward
    out = total(comm)().detach()
    got = [out, *(x.grad for x in leaves)] if backward else [out]
    gathered = [unshard_sequence(list(comm.all_gather(x)), dim=2, world_size=world_size, placement=spec.placement)
                for x in got]
    errors = [] if rank else [e for n, g, w in zip(("out", "dq", "dk", "dv"), gathered, reference)
                              if (e := mismatch(n, g, w))]
    errors = _broadcast(errors)
    if errors:
        raise VerificationError(f"impl={impl} W={world_size} seq_len={seq_len}: " + "; ".join(errors))
    del gathered, got, out
    case_done(f"{impl} W={world_size} verified against T1", total=steps)

    holder: dict[str, torch.Tensor] = {}

    def fwd_only() -> None:
        with context():
            forward(comm)

    def prepare_bwd() -> None:
        _clear(leaves)
        with context():
            holder["out"] = forward(comm)

    def bwd_only() -> None:
        with context():
            holder.pop("out").backward(ldout)

    fwd = time_iterations(fwd_only, warmup=warmup, iters=iters, device=device)
    bwd = time_iterations(bwd_only, warmup=warmup, iters=iters, device=device, before=prepare_bwd) if backward else []
    own: list[float] = []
    step = total(comm)

    def timed_step() -> None:  # this rank's own time as well (the slowest rank's is what counts)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        tic = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        own.append(time.perf_counter() - tic)

    reset_peaks(device)
    tot = time_iterations(timed_step, warmup=warmup, iters=iters, device=device)
    memory = memory_peaks(device)
    tot_stats = summarize(tot)
    case_done(f"{impl} W={world_size} timed: {tot_stats['median_s'] * 1e3:.3g} ms", total=steps)
    no_comm = (time_iterations(total(LocalComm()), warmup=warmup, iters=iters, device=device)
               if spec.own_comm else None)
    if no_comm is not None:
        case_done(f"{impl} W={world_size} timed without communication", total=steps)
    own_median = summarize(own[-iters:])["median_s"]
    per_rank = [None] * world_size
    dist.all_gather_object(per_rank, {"total_median_s": own_median, **memory})
    return _report(locals())


def _report(v: dict[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
    """The case dict (metrics.json) and the summary (results.csv, wandb) of ``run_case``'s locals."""
    w, shape, device = v["world_size"], v["shape"], v["device"]
    stats = {"fwd": summarize(v["fwd"]), "total": v["tot_stats"]}
    if v["backward"]:
        stats["bwd"] = summarize(v["bwd"])
    t = stats["total"]["median_s"]
    t1 = v["t1_stats"][v["t1_backend"]]["median_s"]
    flops = attention_flops(shape, causal=v["causal"], backward=v["backward"], pattern=v["pattern"],
                            branches=v["branches"])
    per_gpu = flops / t / 1e12 / w
    peak = peak_tflops(device)
    if peak is not None and per_gpu > peak:
        raise VerificationError(f"{per_gpu:.0f} TFLOP/s per GPU is above the device's peak of {peak:.0f}: "
                                f"the timing or the FLOP count is wrong")
    exposed = None if v["no_comm"] is None else t - summarize(v["no_comm"])["median_s"]
    case: dict[str, Any] = {
        "impl": v["impl"], "pattern": v["pattern"], "world_size": w, "seq_len": shape.seq_len,
        "batch_size": shape.batch, "heads": shape.heads, "kv_heads": shape.kv_heads, "head_dim": shape.head_dim,
        "causal": v["causal"], "backward": v["backward"], "dtype": v["dtype"],
        "segment_lengths": v["segment_lengths"] if v["pattern"] == "dilated" else None,
        "dilation_rates": v["dilation_rates"] if v["pattern"] == "dilated" else None,
        "sdpa_backend": v["backend"], "placement": v["spec"].placement, "schedule": v["spec"].summary,
        "rotation_dtype": v["dtype"], "accumulation_dtype": "float32",
        "rotate_method": v["rotate_method"] if v["spec"].context else None,  # an option of the impl's context
        "times_s": v["tot"], **stats["total"], **{f"{k}_{s}": x for k, st in stats.items() for s, x in st.items()},
        "per_rank": v["per_rank"], "t1_backend": v["t1_backend"], "t1_s": t1,
        "t1_backends": {n: s["median_s"] for n, s in v["t1_stats"].items()},
        "efficiency": t1 / (w * t), "flop_count": flops, "flop_count_note": FLOP_NOTE,
        "tflops": flops / t / 1e12, "tflops_per_gpu": per_gpu, "device_peak_tflops": peak,
        "tokens_per_s": shape.batch * shape.seq_len / t,
        "no_comm_median_s": None if exposed is None else t - exposed,
        "exposed_comm_s": exposed, "exposed_comm_fraction": None if exposed is None else max(exposed, 0.0) / t,
        "exposed_comm_note": "median(total) - median(total with communication replaced by local copies)",
        "verified": True, "warmup": v["warmup"], "iters": v["iters"],
    }
    summary = {"total_median_ms": t * 1e3, "fwd_median_ms": stats["fwd"]["median_s"] * 1e3,
               "t1_ms": t1 * 1e3, "efficiency": case["efficiency"], "tflops": case["tflops"],
               "tflops_per_gpu": per_gpu, "tokens_per_s": case["tokens_per_s"],
               "peak_allocated_bytes_max": max((r["peak_allocated_bytes"] or 0) for r in v["per_rank"])}
    if v["backward"]:
        summary["bwd_median_ms"] = stats["bwd"]["median_s"] * 1e3
    if exposed is not None:
        summary["exposed_comm_fraction"] = case["exposed_comm_fraction"]
    assert all(math.isfinite(x) for x in summary.values())
    return case, summary
