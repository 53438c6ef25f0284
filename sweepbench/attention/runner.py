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

T1 and the reference come from ``t1`` (each backend in a child process), or from the store
of baselines (``t1_store``, ``sweepbench.measure.store``) where an earlier job measured the same case.
At W=1, where the impl runs the kernel T1 timed (``ImplSpec.one_rank_is_t1``, dense, the same SDPA
backend), the fwd+bwd total is T1's samples of that backend, not timed again.

With ``benchmark.cuda_graph`` every loop above replays the impl's fwd and bwd from CUDA graphs
(``graphs.py``), captured after an eager run has counted the bytes sent; the graphs' first replay
is what is verified, and T1 is timed the same way in its child."""

from __future__ import annotations

import functools
import gc
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, cast

import torch
import torch.distributed as dist

from sweepbench.attention.api import cp_attention, cp_context, default_sdpa_backend
from sweepbench.attention.case import AttentionCase, Baseline, CaseResult, Schedule, Timings
from sweepbench.attention.comm import Comm, LocalComm
from sweepbench.attention.graphs import graphed
from sweepbench.attention.ops import backends_for
from sweepbench.attention.placement import shard_sequence, unshard_sequence
from sweepbench.attention.registry import get_impl
from sweepbench.attention.scaling import make_inputs, mismatch
from sweepbench.attention.summary import report_case
from sweepbench.attention.t1 import T1Case, finish_saves, t1_and_reference, t1_local, warm_spare
from sweepbench.attention.t1_store import measured_note
from sweepbench.core import VerificationError
from sweepbench.measure import summarize, time_iterations, time_phases
from sweepbench.measure.memory import memory_peaks, reset_peaks
from sweepbench.measure.progress import case_done
from sweepbench.measure.store import Store


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
    case: AttentionCase, *, rank: int, world_size: int, device: torch.device, store: Store | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``case`` on this rank of the default group, step by step: T1 and the reference, the impl's
    schedule, one verified run, the timing loops, each rank's numbers gathered; then the case dict
    (metrics.json) and the summary (results.csv, wandb), ``summary.report_case``."""
    phase_s: dict[str, float] = {}
    tic = time.perf_counter()
    inputs = make_inputs(case.shape, dtype=getattr(torch, case.dtype), device=device, seed=case.seed)
    base, reference = measure_t1(case, inputs, rank=rank, world_size=world_size, device=device, store=store)
    schedule = build_schedule(case, base, world_size=world_size)
    phase_s["t1_and_reference"] = time.perf_counter() - tic
    if not base.reused:  # its parts, where this job measured them (T1's children, the reference)
        phase_s.update({f"t1_{k}": v for k, v in (base.t1.get("phase_s") or {}).items()})
    case_done(
        f"T1 (one device, {base.backend}): {base.median_s * 1e3:.3g} ms"
        f"{' (' + measured_note(base.source['measured']) + ')' if base.reused else ''}",
        total=schedule.steps,
    )

    run: ImplRun | None = None
    try:  # whatever ends the job (a failed check included), the store's copy of the reference is finished first
        tic = time.perf_counter()
        run = ImplRun(case, schedule, inputs, rank=rank, world_size=world_size, device=device)
        del inputs
        got, sent = run.first_run()
        phase_s["verify_first_run"] = time.perf_counter() - tic  # part of verify: the first fwd+bwd of this process
        check(run, got, reference)
        del got, reference
        phase_s["verify"] = time.perf_counter() - tic
        case_done(f"{case.impl} W={world_size} verified against T1", total=schedule.steps)

        tic = time.perf_counter()
        timings = time_loops(run, base)
        phase_s["timing"] = time.perf_counter() - tic
        per_rank, context_entries = gather_ranks(run, timings, sent)
    finally:
        if run is not None:
            run.release()
        waited = finish_saves()
    if rank == 0:
        phase_s["t1_reference_save_wait"] = waited  # the store's copy, written while the job went on
        if case.t1_spare and not base.reused:  # its numbers are taken: the spare child may open the device now
            warm_spare(t1_case(case, device), _candidates(device, getattr(torch, case.dtype)))
    return report_case(
        CaseResult(case, world_size, device, schedule, base, timings, per_rank, context_entries, phase_s)
    )


def t1_case(case: AttentionCase, device: torch.device) -> T1Case:
    """What T1's child needs of ``case`` on ``device``."""
    return T1Case(
        case.batch,
        case.heads,
        case.kv_heads,
        case.seq_len,
        case.head_dim,
        case.dtype,
        str(device),
        case.seed,
        case.causal,
        case.backward,
        case.pattern,
        [[b.segment, b.rate] for b in case.branches] if case.pattern == "dilated" else [],
        case.t1_iters,
        torch.get_num_threads(),
        case.cuda_graph,
    )


def measure_t1(
    case: AttentionCase,
    inputs: list[torch.Tensor],
    *,
    rank: int,
    world_size: int,
    device: torch.device,
    store: Store | None,
) -> tuple[Baseline, list[torch.Tensor] | None]:
    """T1 and the reference (rank 0's; None elsewhere), measured in child processes or read from
    the store, and T1 at the per-GPU length."""
    dt = getattr(torch, case.dtype)
    single = t1_case(case, device)
    t1, reference, source = t1_and_reference(
        rank,
        inputs,
        single,
        candidates=_candidates(device, dt),
        fault=case.t1_fault,
        store=store,
        prune_factor=case.t1_prune_factor,
        spare=case.t1_spare,
    )
    stats = t1["stats"]
    backend = min(stats, key=lambda n: stats[n]["median_s"])
    local_s = t1_local(
        rank,
        single,
        world_size=world_size,
        backend=backend,
        candidates=_candidates(device, dt),
        fault=case.t1_fault,
        device=device,
        store=store,
        spare=case.t1_spare,
    )
    return Baseline(t1, source, backend, local_s), reference


def build_schedule(case: AttentionCase, base: Baseline, *, world_size: int) -> Schedule:
    backend = base.backend if case.sdpa_backend == "auto" else case.sdpa_backend
    spec = get_impl(case.impl)
    # W=1 running T1's kernel: its fwd+bwd is what T1 timed, and it has no communication to leave out
    total_is_t1 = (
        world_size == 1
        and spec.one_rank_is_t1
        and case.pattern == "dense"
        and backend == base.backend
        and bool((base.t1.get("times_s") or {}).get(backend))
    )
    return Schedule(spec, spec.placement_for(case.pattern), backend, total_is_t1)


class ImplRun:
    """The impl on this rank: its shard of q, k, v (autograd leaves) and of the output gradient,
    its ``Comm``, and the seconds of each entry of its context."""

    def __init__(
        self,
        case: AttentionCase,
        schedule: Schedule,
        inputs: list[torch.Tensor],
        *,
        rank: int,
        world_size: int,
        device: torch.device,
    ) -> None:
        self.case, self.schedule, self.rank, self.world_size, self.device = case, schedule, rank, world_size, device
        self.shards = [
            shard_sequence(x, dim=2, rank=rank, world_size=world_size, placement=schedule.placement) for x in inputs
        ]
        self.leaves, self.dout = _leaves(*self.shards[:3]), self.shards[3]
        self.comm = Comm()
        self.entries: list[float] = []
        self.graphs: dict[type, Callable[[], torch.Tensor]] = {}  # by kind of comm (case.cuda_graph)

    @contextmanager
    def opened(self) -> Iterator[None]:
        """The impl's context (torch_cp's) entered once around a whole loop, warm-up and timed
        iterations, as its users run it (a null context for impls without one); its entry is timed."""
        c = self.case
        _sync(self.device)
        start = time.perf_counter()
        with cp_context(c.impl, comm=self.comm, seq_len=c.seq_len, device=self.device, rotate_method=c.rotate_method):
            _sync(self.device)
            self.entries.append(time.perf_counter() - start)
            yield

    def forward(self, comm: Comm) -> torch.Tensor:
        """The impl's call over the leaves: eager, or its graphs' replay (``case.cuda_graph``; one
        pair of graphs per kind of comm, captured at the first call)."""
        if not self.case.cuda_graph:
            return self.call(comm, *self.leaves)
        if type(comm) not in self.graphs:
            self.graphs[type(comm)] = graphed(functools.partial(self.call, comm), self.leaves)
        return self.graphs[type(comm)]()

    def release(self) -> None:
        """The graphs and their memory gone before the job ends: NCCL does not tear down a
        communicator (the job's process group) while graphs captured over it are alive."""
        if self.graphs:
            self.graphs.clear()
            _clear(self.leaves)
            gc.collect()  # the replays' outputs and autograd nodes that still reach a graph
            _sync(self.device)

    def call(self, comm: Comm, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        c = self.case
        return cp_attention(
            q,
            k,
            v,
            impl=c.impl,
            causal=c.causal,
            sdpa_backend=self.schedule.backend,
            pattern=c.pattern,
            segment_lengths=c.segment_lengths,
            dilation_rates=c.dilation_rates,
            comm=comm,
        )

    def step(self, comm: Comm) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:  # forward and backward; the output (verification reads it)
            _clear(self.leaves)
            out = self.forward(comm)
            if self.case.backward:
                out.backward(self.dout)
            return out

        return run

    def first_run(self) -> tuple[list[torch.Tensor], dict[str, int]]:
        """One forward and backward, before any time counts: the output and gradients, and the
        bytes this rank sends in them (through the impl's Comm). With ``case.cuda_graph`` the
        output and gradients are those of the graphs' first replay, captured here."""
        with self.opened():
            out = self.call(self.comm, *self.leaves)  # eager: the Comm counts what it sends
            sent = {"sent_bytes_fwd": self.comm.traffic.sent_bytes}
            if self.case.backward:
                out.backward(self.dout)
            out = out.detach()
        sent["sent_bytes"] = self.comm.traffic.sent_bytes
        if self.case.cuda_graph:  # what is timed is the graphs' replay: that is what is checked
            _clear(self.leaves)
            out = self.forward(self.comm)  # captured here, then replayed
            if self.case.backward:
                out.backward(self.dout)
            out = out.detach().clone()  # the graphs' memory: the next replay writes over it
        _sync(self.device)
        grads = (cast(torch.Tensor, x.grad) for x in self.leaves)  # set by the backward
        if self.case.cuda_graph:
            grads = (g.clone() for g in grads)
        return ([out, *grads] if self.case.backward else [out]), sent


def check(run: ImplRun, got: list[torch.Tensor], reference: list[torch.Tensor] | None) -> None:
    """The output and gradients gathered back to sequence order and compared with the reference
    on rank 0; every rank raises ``VerificationError`` on a mismatch."""
    c, w = run.case, run.world_size
    errors = []
    wants: list[torch.Tensor | None] = list(reference) if reference else [None] * len(got)
    for name, x, want in zip(("out", "dq", "dk", "dv"), got, wants):
        whole = unshard_sequence(list(run.comm.all_gather(x)), dim=2, world_size=w, placement=run.schedule.placement)
        if run.rank == 0:
            assert want is not None  # rank 0 holds the reference
            if e := mismatch(name, whole, want):
                errors.append(e)
        del whole
    errors = _broadcast(errors)
    if errors:
        raise VerificationError(f"impl={c.impl} W={w} seq_len={c.seq_len}: " + "; ".join(errors))


def time_loops(run: ImplRun, base: Baseline) -> Timings:
    """Forward, backward, forward+backward (peak memory over it), and forward+backward with
    ``LocalComm`` where the impl communicates through its Comm."""
    c, s, device = run.case, run.schedule, run.device
    loop = dict(warmup=c.warmup, iters=c.iters, device=device)
    holder: dict[str, torch.Tensor] = {}

    def fwd_kept() -> None:  # the forward whose graph the backward then runs over
        holder["out"] = run.forward(run.comm)

    def bwd_only() -> None:
        holder.pop("out").backward(run.dout)

    if s.total_is_t1:  # the peaks then cover the fwd and bwd loops (fwd+bwd each iteration)
        reset_peaks(device)
    with run.opened():
        if c.backward:  # each backward after the (timed) forward that built its graph
            fwd, bwd = time_phases([fwd_kept, bwd_only], before=lambda: _clear(run.leaves), **loop)
        else:
            fwd, bwd = time_iterations(lambda: run.forward(run.comm), **loop), []
    own: list[float] = []
    step = run.step(run.comm)

    def timed_step() -> None:  # this rank's own time as well (the slowest rank's is what counts)
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
        own.append(time.perf_counter() - start)

    if s.total_is_t1:  # what T1 timed (fwd+bwd of this kernel on one device); peaks over the fwd-then-bwd loop
        total = list(base.t1["times_s"][s.backend])
        own = total
        memory = memory_peaks(device)
    else:
        reset_peaks(device)
        with run.opened():
            total = time_iterations(timed_step, **loop)
        memory = memory_peaks(device)
    median_ms = summarize(total)["median_s"] * 1e3
    w = run.world_size
    case_done(f"{c.impl} W={w} {'total from T1' if s.total_is_t1 else 'timed'}: {median_ms:.3g} ms", total=s.steps)
    no_comm = None
    if s.no_comm_loop:
        with run.opened():
            no_comm = time_iterations(run.step(LocalComm()), **loop)
        case_done(f"{c.impl} W={w} timed without communication", total=s.steps)
    return Timings(fwd, bwd, total, own, no_comm, memory)


def gather_ranks(run: ImplRun, timings: Timings, sent: dict[str, int]) -> tuple[list[dict[str, Any]], list[float]]:
    """Each rank's own fwd+bwd median, memory peaks and bytes sent; and each entry of the impl's
    context as the slowest rank saw it."""
    own_median = summarize(timings.own[-len(timings.total) :])["median_s"]
    per_rank: list[Any] = [None] * run.world_size
    own_comm = run.schedule.spec.own_comm
    dist.all_gather_object(per_rank, {"total_median_s": own_median, **timings.memory, **(sent if own_comm else {})})
    worst = torch.tensor(run.entries, dtype=torch.float64, device=run.device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return per_rank, worst.tolist()
