"""One scaling case on every rank of the default group: T1 and the reference on rank 0, the impl
verified on every rank against it, then timed (slowest rank), with and without communication.

Timing order: forward alone; backward alone (its forward run untimed just before each iteration);
forward+backward (peak memory is read over these iterations, after a reset, and each rank's own
times are kept for the per-rank medians); forward+backward again with ``LocalComm`` (the same
schedule, no bytes between ranks). Exposed communication = median(total) - median(no-comm total):
the communication time that compute did not hide (``torch_cp`` cannot run without communication,
so it has none). An impl with a context (``ImplSpec.context``, torch_cp's ``context_parallel``) has
it opened once around each loop (verification; each timing loop's warm-up and timed iterations
together), as its users run it, not per iteration; each entry's time is kept (``context_entry_s``).

T1 and the reference come from ``single`` (each backend in a child process), or from the store
of baselines (``reuse``, ``sweepbench.measure.store``) where an earlier job measured the same case.
At W=1, where the impl runs the kernel T1 timed (``ImplSpec.one_rank_is_t1``, dense, the same SDPA
backend), the fwd+bwd total is T1's samples of that backend, not timed again."""

from __future__ import annotations

import math
import statistics
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from sweepbench.attention.api import cp_attention, cp_context, default_sdpa_backend
from sweepbench.attention.comm import Comm, LocalComm
from sweepbench.attention.dilated import branches_of
from sweepbench.attention.ops import backends_for
from sweepbench.attention.placement import shard_sequence, unshard_sequence
from sweepbench.attention.registry import get_impl
from sweepbench.attention.reuse import measured_note
from sweepbench.attention.scaling import Shape, attention_flops, make_inputs, mismatch, peak_tflops
from sweepbench.attention.efficiency import efficiency, efficiency_local
from sweepbench.attention.single import T1Case, t1_and_reference, t1_local
from sweepbench.core import VerificationError
from sweepbench.measure import summarize, time_iterations
from sweepbench.measure.memory import memory_peaks, reset_peaks
from sweepbench.measure.progress import case_done
from sweepbench.measure.store import Store

FLOP_NOTE = (
    "forward 4*B*H*D per attended (query, key) pair, causal = half the pairs, dilated = the "
    "branches' pairs; backward 2.5x forward; TFLOP/s = FLOPs / median time"
)


def _leaves(*xs: torch.Tensor) -> list[torch.Tensor]:
    return [x.detach().clone().requires_grad_() for x in xs]


def _clear(xs: list[torch.Tensor]) -> None:
    for x in xs:
        x.grad = None


def _broadcast(obj: Any) -> Any:
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _candidates(device: torch.device, dtype: torch.dtype) -> list[str]:
    names = backends_for(device.type, dtype)
    best = default_sdpa_backend(device, dtype)
    return [n for n in names if n != "cudnn" or best == "cudnn"]  # cuDNN only where it is enabled


def run_case(
    *,
    rank: int,
    world_size: int,
    device: torch.device,
    seed: int,
    batch: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    seq_len: int,
    dtype: str,
    causal: bool,
    backward: bool,
    impl: str,
    pattern: str,
    segment_lengths: list[int],
    dilation_rates: list[int],
    sdpa_backend: str,
    rotate_method: str,
    warmup: int,
    iters: int,
    t1_iters: int,
    t1_fault: str = "",
    t1_prune_factor: float = 0.0,
    store: Store | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    phase_s: dict[str, float] = {}
    tic = time.perf_counter()
    dt = getattr(torch, dtype)
    shape = Shape(batch, heads, kv_heads, seq_len, head_dim)
    branches = branches_of(segment_lengths, dilation_rates)
    inputs = make_inputs(shape, dtype=dt, device=device, seed=seed)
    t1_case = T1Case(
        batch,
        heads,
        kv_heads,
        seq_len,
        head_dim,
        dtype,
        str(device),
        seed,
        causal,
        backward,
        pattern,
        [[b.segment, b.rate] for b in branches] if pattern == "dilated" else [],
        t1_iters,
        torch.get_num_threads(),
    )
    t1, reference, t1_source = t1_and_reference(
        rank,
        inputs,
        t1_case,
        candidates=_candidates(device, dt),
        fault=t1_fault,
        store=store,
        prune_factor=t1_prune_factor,
    )
    t1_reused = t1_source["reused"]
    t1_stats = t1["stats"]
    t1_backend = min(t1_stats, key=lambda n: t1_stats[n]["median_s"])
    backend = t1_backend if sdpa_backend == "auto" else sdpa_backend
    t1_local_s = t1_local(
        rank,
        t1_case,
        world_size=world_size,
        backend=t1_backend,
        candidates=_candidates(device, dt),
        fault=t1_fault,
        device=device,
        store=store,
    )
    spec = get_impl(impl)
    placement = spec.placement_for(pattern)
    # W=1 running T1's kernel: its fwd+bwd is what T1 timed, and it has no communication to leave out
    total_is_t1 = (
        world_size == 1
        and spec.one_rank_is_t1
        and pattern == "dense"
        and backend == t1_backend
        and bool((t1.get("times_s") or {}).get(backend))
    )
    no_comm_loop = spec.own_comm and not total_is_t1
    steps = 3 + no_comm_loop  # T1, verified, timed, and the same without communication
    phase_s["t1_and_reference"] = time.perf_counter() - tic
    if not t1_reused:  # its parts, where this job measured them (T1's children, the reference)
        phase_s.update({f"t1_{k}": v for k, v in (t1.get("phase_s") or {}).items()})
    case_done(
        f"T1 (one device, {t1_backend}): {t1_stats[t1_backend]['median_s'] * 1e3:.3g} ms"
        f"{' (' + measured_note(t1_source['measured']) + ')' if t1_reused else ''}",
        total=steps,
    )
    tic = time.perf_counter()
    mine = [shard_sequence(x, dim=2, rank=rank, world_size=world_size, placement=placement) for x in inputs]
    del inputs
    leaves, ldout = _leaves(*mine[:3]), mine[3]
    comm = Comm()
    entries: list[float] = []

    @contextmanager
    def opened() -> Iterator[None]:
        """The impl's context (torch_cp's) entered once around a whole loop, warm-up and timed
        iterations, as its users run it (a null context for impls without one); its entry is timed."""
        _sync(device)
        start = time.perf_counter()
        with cp_context(impl, comm=comm, seq_len=seq_len, device=device, rotate_method=rotate_method):
            _sync(device)
            entries.append(time.perf_counter() - start)
            yield

    def forward(c: Comm) -> torch.Tensor:
        return cp_attention(
            *leaves,
            impl=impl,
            causal=causal,
            sdpa_backend=backend,
            pattern=pattern,
            segment_lengths=segment_lengths,
            dilation_rates=dilation_rates,
            comm=c,
        )

    def total(c: Comm) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:  # forward and backward; the output (verification reads it)
            _clear(leaves)
            out = forward(c)
            if backward:
                out.backward(ldout)
            return out

        return run

    # verify once, before any time counts: the output and gradients of one forward and backward,
    # and the bytes this rank sends in them (through the impl's Comm)
    with opened():
        out = forward(comm)
        sent = {"sent_bytes_fwd": comm.traffic.sent_bytes}
        if backward:
            out.backward(ldout)
        out = out.detach()
    sent["sent_bytes"] = comm.traffic.sent_bytes
    _sync(device)
    phase_s["verify_first_run"] = time.perf_counter() - tic  # part of verify: the first fwd+bwd of this process
    got = [out, *(x.grad for x in leaves)] if backward else [out]
    errors = []
    for name, x, want in zip(("out", "dq", "dk", "dv"), got, reference or [None] * len(got)):
        whole = unshard_sequence(list(comm.all_gather(x)), dim=2, world_size=world_size, placement=placement)
        if rank == 0 and (e := mismatch(name, whole, want)):
            errors.append(e)
        del whole
    errors = _broadcast(errors)
    if errors:
        raise VerificationError(f"impl={impl} W={world_size} seq_len={seq_len}: " + "; ".join(errors))
    del got, out, reference
    phase_s["verify"] = time.perf_counter() - tic
    case_done(f"{impl} W={world_size} verified against T1", total=steps)
    tic = time.perf_counter()

    holder: dict[str, torch.Tensor] = {}

    def prepare_bwd() -> None:
        _clear(leaves)
        holder["out"] = forward(comm)

    def bwd_only() -> None:
        holder.pop("out").backward(ldout)

    if total_is_t1:  # the peaks then cover the fwd and bwd loops (fwd+bwd each iteration)
        reset_peaks(device)
    with opened():
        fwd = time_iterations(lambda: forward(comm), warmup=warmup, iters=iters, device=device)
    with opened():
        bwd = (
            time_iterations(bwd_only, warmup=warmup, iters=iters, device=device, before=prepare_bwd) if backward else []
        )
    own: list[float] = []
    step = total(comm)

    def timed_step() -> None:  # this rank's own time as well (the slowest rank's is what counts)
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
        own.append(time.perf_counter() - start)

    if total_is_t1:  # what T1 timed (fwd+bwd of this kernel on one device); peaks over the bwd loop's fwd+bwd
        tot = list(t1["times_s"][backend])
        own = tot
        memory = memory_peaks(device)
    else:
        reset_peaks(device)
        with opened():
            tot = time_iterations(timed_step, warmup=warmup, iters=iters, device=device)
        memory = memory_peaks(device)
    tot_stats = summarize(tot)
    case_done(
        f"{impl} W={world_size} {'total from T1' if total_is_t1 else 'timed'}: {tot_stats['median_s'] * 1e3:.3g} ms",
        total=steps,
    )
    no_comm = None
    if no_comm_loop:
        with opened():
            no_comm = time_iterations(total(LocalComm()), warmup=warmup, iters=iters, device=device)
        case_done(f"{impl} W={world_size} timed without communication", total=steps)
    phase_s["timing"] = time.perf_counter() - tic
    own_median = summarize(own[-len(tot) :])["median_s"]
    per_rank = [None] * world_size
    dist.all_gather_object(per_rank, {"total_median_s": own_median, **memory, **(sent if spec.own_comm else {})})
    worst = torch.tensor(entries, dtype=torch.float64, device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # each entry as the slowest rank saw it
    context_entries = worst.tolist()
    return _report(locals())


def _report(v: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The case dict (metrics.json) and the summary (results.csv, wandb) of ``run_case``'s locals."""
    w, shape, device, spec = v["world_size"], v["shape"], v["device"], v["spec"]
    stats = {"fwd": summarize(v["fwd"]), "total": v["tot_stats"]}
    if v["backward"]:
        stats["bwd"] = summarize(v["bwd"])
    t = stats["total"]["median_s"]
    t1 = v["t1_stats"][v["t1_backend"]]["median_s"]
    flops = attention_flops(
        shape, causal=v["causal"], backward=v["backward"], pattern=v["pattern"], branches=v["branches"]
    )
    per_gpu = flops / t / 1e12 / w
    peak = peak_tflops(device)
    if peak is not None and per_gpu > peak:
        raise VerificationError(
            f"{per_gpu:.0f} TFLOP/s per GPU is above the device's peak of {peak:.0f}: "
            f"the timing or the FLOP count is wrong"
        )
    exposed = None if v["no_comm"] is None else t - summarize(v["no_comm"])["median_s"]
    case: dict[str, Any] = {
        "impl": v["impl"],
        "pattern": v["pattern"],
        "world_size": w,
        "seq_len": shape.seq_len,
        "batch_size": shape.batch,
        "heads": shape.heads,
        "kv_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "causal": v["causal"],
        "backward": v["backward"],
        "dtype": v["dtype"],
        "segment_lengths": v["segment_lengths"] if v["pattern"] == "dilated" else None,
        "dilation_rates": v["dilation_rates"] if v["pattern"] == "dilated" else None,
        "sdpa_backend": v["backend"],
        "placement": v["placement"],
        "schedule": v["spec"].summary,
        "rotation_dtype": v["dtype"],
        "accumulation_dtype": "float32",
        "rotate_method": v["rotate_method"] if v["spec"].context else None,  # an option of the impl's context
        "times_s": v["tot"],
        **stats["total"],
        **{f"{k}_{s}": x for k, st in stats.items() for s, x in st.items()},
        "per_rank": v["per_rank"],
        "t1_backend": v["t1_backend"],
        "t1_s": t1,
        "t1_backends": {n: s["median_s"] for n, s in v["t1_stats"].items()},
        "t1_refused": v["t1"]["refused"],  # backend -> why it cannot run this case (its probe failed or died)
        "t1_reused": v["t1_reused"],
        "reference_reused": v["t1_reused"],  # from the store: an earlier job's
        # where and when T1 and the reference were measured ({"at", "host", "job", "store"}; None without a store)
        "t1_measured": v["t1_source"]["measured"],
        "t1_pruned": v["t1"].get("pruned") or {},  # backend -> why it was not timed at this length
        "t1_prune_factor": v["t1_prune_factor"],
        # "t1": the fwd+bwd samples are T1's of the same kernel (W=1), not timed again; "timed": this job's
        "total_from": "t1" if v["total_is_t1"] else "timed",
        "total_iters": len(v["tot"]),
        "t1_iters": v["t1_iters"],
        "phase_s": v["phase_s"],  # wall seconds of T1+reference, verify (its first run), timing
        # an impl with a context (torch_cp): entered once around each loop, warm-up and timed iterations
        "context_entries": len(v["context_entries"]) if spec.context else None,
        "context_entry_s": statistics.median(v["context_entries"]) if spec.context else None,
        "efficiency": efficiency(t1, t, w),
        "t1_local_s": v["t1_local_s"],
        "efficiency_local": None if v["t1_local_s"] is None else efficiency_local(v["t1_local_s"], t, w),
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
        "warmup": v["warmup"],
        "iters": v["iters"],
        # bytes sent to other ranks in one forward (+backward), the busiest rank's (each rank's: per_rank);
        # None where the impl communicates through another library (torch_cp)
        **{k: max(r[k] for r in v["per_rank"]) if spec.own_comm else None for k in ("sent_bytes", "sent_bytes_fwd")},
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
        "peak_allocated_bytes_max": max((r["peak_allocated_bytes"] or 0) for r in v["per_rank"]),
    }
    if v["backward"]:
        summary["bwd_median_ms"] = stats["bwd"]["median_s"] * 1e3
    if exposed is not None:
        summary["exposed_comm_fraction"] = case["exposed_comm_fraction"]
    if case["efficiency_local"] is not None:
        summary["t1_local_ms"], summary["efficiency_local"] = v["t1_local_s"] * 1e3, case["efficiency_local"]
    if spec.own_comm:
        summary["sent_bytes"] = case["sent_bytes"]
    if spec.context:
        summary["context_entry_ms"] = case["context_entry_s"] * 1e3
    summary["t1_reused"] = float(v["t1_reused"])
    summary["total_from_t1"] = float(v["total_is_t1"])
    assert all(math.isfinite(x) for x in summary.values())
    measured = v["t1_source"]["measured"] or {}
    text = {
        "t1_measured_at": measured.get("at"),
        "t1_measured_on": measured.get("host"),
        "t1_measured_by": measured.get("job"),
    }
    return case, {**summary, **{k: x for k, x in text.items() if x}}
