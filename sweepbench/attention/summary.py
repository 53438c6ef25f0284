"""What a scaling case records: the case dict (metrics.json) and the summary (results.csv, wandb)
of a ``CaseResult``, with the derived rates (efficiency, TFLOP/s, exposed communication)."""

from __future__ import annotations

import math
import statistics
from typing import Any

from sweepbench.attention.case import CaseResult
from sweepbench.attention.efficiency import efficiency, efficiency_local
from sweepbench.attention.scaling import attention_flops, peak_tflops
from sweepbench.core import VerificationError
from sweepbench.measure import summarize

FLOP_NOTE = (
    "forward 4*B*H*D per attended (query, key) pair, causal = half the pairs, dilated = the "
    "branches' pairs; backward 2.5x forward; TFLOP/s = FLOPs / median time"
)


def timed_parts(r: CaseResult) -> dict[str, float]:
    """The seconds of the timed samples behind the case by loop: fwd, bwd, fwd+bwd (0 where it is
    T1's), no_comm, and t1 (every backend's samples, 0 where the store gave T1)."""
    t = r.timings
    t1 = [] if r.baseline.reused else list((r.baseline.t1.get("times_s") or {}).values())
    return {
        "fwd": float(sum(t.fwd)),
        "bwd": float(sum(t.bwd)),
        "total": 0.0 if r.schedule.total_is_t1 else float(sum(t.total)),
        "no_comm": float(sum(t.no_comm or [])),
        "t1": float(sum(sum(samples) for samples in t1)),
    }


def report_case(r: CaseResult) -> tuple[dict[str, Any], dict[str, Any]]:
    """The case dict (metrics.json) and the summary (results.csv, wandb) of one measured case."""
    c, w, shape, spec, base, times = r.case, r.world_size, r.case.shape, r.schedule.spec, r.baseline, r.timings
    stats = {"fwd": summarize(times.fwd), "total": summarize(times.total)}
    if c.backward:
        stats["bwd"] = summarize(times.bwd)
    t = stats["total"]["median_s"]
    t1 = base.median_s
    flops = attention_flops(shape, causal=c.causal, backward=c.backward, pattern=c.pattern, branches=c.branches)
    per_gpu = flops / t / 1e12 / w
    peak = peak_tflops(r.device)
    if peak is not None and per_gpu > peak:
        raise VerificationError(
            f"{per_gpu:.0f} TFLOP/s per GPU is above the device's peak of {peak:.0f}: "
            f"the timing or the FLOP count is wrong"
        )
    exposed = None if times.no_comm is None else t - summarize(times.no_comm)["median_s"]
    case: dict[str, Any] = {
        "impl": c.impl,
        "pattern": c.pattern,
        "world_size": w,
        "seq_len": shape.seq_len,
        "batch_size": shape.batch,
        "heads": shape.heads,
        "kv_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "causal": c.causal,
        "backward": c.backward,
        "dtype": c.dtype,
        "segment_lengths": c.segment_lengths if c.pattern == "dilated" else None,
        "dilation_rates": c.dilation_rates if c.pattern == "dilated" else None,
        "sdpa_backend": r.schedule.backend,
        "cuda_graph": c.cuda_graph,  # fwd and bwd (T1's too) replayed from CUDA graphs
        "placement": r.schedule.placement,
        "schedule": spec.summary,
        "rotation_dtype": c.dtype,
        "accumulation_dtype": "float32",
        "rotate_method": c.rotate_method if spec.context else None,  # an option of the impl's context
        "times_s": times.total,
        # every device-timed sample this job took for the case (the job's measuring time): the fwd
        # and bwd samples (one loop, each backward after its timed forward), the fwd+bwd loop (not
        # when it is T1's), the no-communication loop, and T1's samples of every backend where this
        # job measured T1 (not when the store gave it)
        "timed_parts_s": (parts := timed_parts(r)),
        "timed_s": sum(parts.values()),
        **stats["total"],
        **{f"{k}_{s}": x for k, st in stats.items() for s, x in st.items()},
        "per_rank": r.per_rank,
        "t1_backend": base.backend,
        "t1_s": t1,
        "t1_backends": {n: s["median_s"] for n, s in base.stats.items()},
        "t1_refused": base.t1["refused"],  # backend -> why it cannot run this case (its probe failed or died)
        "t1_reused": base.reused,
        "reference_reused": base.reused,  # from the store: an earlier job's
        # where and when T1 and the reference were measured ({"at", "host", "job", "store"}; None without a store)
        "t1_measured": base.source["measured"],
        "t1_pruned": base.t1.get("pruned") or {},  # backend -> why it was not timed at this length
        "t1_prune_factor": c.t1_prune_factor,
        # "t1": the fwd+bwd samples are T1's of the same kernel (W=1), not timed again; "timed": this job's
        "total_from": "t1" if r.schedule.total_is_t1 else "timed",
        "total_iters": len(times.total),
        "t1_iters": c.t1_iters,
        "phase_s": r.phase_s,  # wall seconds of T1+reference, verify (its first run), timing
        # an impl with a context (torch_cp): entered once around each loop, warm-up and timed iterations
        "context_entries": len(r.context_entries) if spec.context else None,
        "context_entry_s": statistics.median(r.context_entries) if spec.context else None,
        "efficiency": efficiency(t1, t, w),
        "t1_local_s": base.local_s,
        "efficiency_local": None if base.local_s is None else efficiency_local(base.local_s, t, w),
        "efficiency_note": "efficiency = T1 / (W * T_W), T1 one device over the whole length; efficiency_local = "
        "W * T1(L/W) / T_W, T1(L/W) one device at the per-GPU length",
        "flop_count": flops,
        "flop_count_note": FLOP_NOTE,
        "tflops": flops / t / 1e12,
        "tflops_per_gpu": per_gpu,
        "device_peak_tflops": peak,
        "tokens_per_s": shape.batch * shape.seq_len / t,
        "no_comm_median_s": None if exposed is None else t - exposed,
        "exposed_comm_s": exposed,
        "exposed_comm_fraction": None if exposed is None else max(exposed, 0.0) / t,
        "exposed_comm_note": "median(total) - median(total with communication replaced by local copies)",
        "verified": True,
        "warmup": c.warmup,
        "iters": c.iters,
        # bytes sent to other ranks in one forward (+backward), the busiest rank's (each rank's: per_rank);
        # None where the impl communicates through another library (torch_cp)
        **{k: max(p[k] for p in r.per_rank) if spec.own_comm else None for k in ("sent_bytes", "sent_bytes_fwd")},
        "sent_bytes_note": "bytes of this rank's data the other ranks received: an all-gather over g ranks "
        "counts g-1 copies, a reduce-scatter or all-to-all the g-1 parts for others",
    }
    summary = {
        "total_median_ms": t * 1e3,
        "fwd_median_ms": stats["fwd"]["median_s"] * 1e3,
        "t1_ms": t1 * 1e3,
        "efficiency": case["efficiency"],
        "tflops": case["tflops"],
        "tflops_per_gpu": per_gpu,
        "tokens_per_s": case["tokens_per_s"],
        "peak_allocated_bytes_max": max((p["peak_allocated_bytes"] or 0) for p in r.per_rank),
    }
    if c.backward:
        summary["bwd_median_ms"] = stats["bwd"]["median_s"] * 1e3
    if exposed is not None:
        summary["exposed_comm_fraction"] = case["exposed_comm_fraction"]
    if base.local_s is not None:  # then case["efficiency_local"] is measured too
        summary["t1_local_ms"], summary["efficiency_local"] = base.local_s * 1e3, case["efficiency_local"]
    if spec.own_comm:
        summary["sent_bytes"] = case["sent_bytes"]
    if spec.context:
        summary["context_entry_ms"] = case["context_entry_s"] * 1e3
    summary["t1_reused"] = float(base.reused)
    summary["total_from_t1"] = float(r.schedule.total_is_t1)
    assert all(math.isfinite(x) for x in summary.values())
    measured = base.source["measured"] or {}
    text = {
        "t1_measured_at": measured.get("at"),
        "t1_measured_on": measured.get("host"),
        "t1_measured_by": measured.get("job"),
    }
    return case, {**summary, **{k: x for k, x in text.items() if x}}
