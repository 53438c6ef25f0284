"""Collective operations as nccl-tests measures them: for each op, buffers with known inputs, the
call to time, a reset and the exact expected output, plus nccl-tests' bus-bandwidth factor; and
the ``torch`` implementation of the collective benchmark, which times them with torch.distributed."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, cast

import torch
import torch.distributed as dist

from sweepbench.core import Registry
from sweepbench.measure.stats import summarize
from sweepbench.measure.timing import ops_per_sample, sampling, time_iterations

# torch 2.13 renamed the tensor forms (the old names warn); older torch has only the old names.
# The one place these are looked up: every engine that gathers or scatters flat tensors imports them.
all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _pattern(numel: int, rank: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Small integers, exact in every dtype even after summing over 64 ranks."""
    return ((torch.arange(numel, device=device) % 3) + rank + 1).to(dtype)


@dataclass
class Buffers:
    run: Callable[[], object]  # what it returns (a tensor, a work handle) is not used
    reset: Callable[[], object]
    output: torch.Tensor
    expected: torch.Tensor
    # the output still equals ``expected`` after the op runs again on its own output (every op but
    # the in-place all_reduce, whose values grow with each call)
    repeatable: bool = True


def _all_reduce(numel: int, r: int, n: int, dt: torch.dtype, dev: torch.device) -> Buffers:
    buf = torch.empty(numel, dtype=dt, device=dev)
    expected = cast(torch.Tensor, sum(_pattern(numel, k, torch.float64, dev) for k in range(n))).to(dt)
    return Buffers(
        lambda: dist.all_reduce(buf), lambda: buf.copy_(_pattern(numel, r, dt, dev)), buf, expected, repeatable=False
    )


def _all_gather(numel: int, r: int, n: int, dt: torch.dtype, dev: torch.device) -> Buffers:
    chunk = numel // n
    inp, out = _pattern(chunk, r, dt, dev), torch.empty(chunk * n, dtype=dt, device=dev)
    expected = torch.cat([_pattern(chunk, k, dt, dev) for k in range(n)])
    return Buffers(lambda: all_gather_tensor(out, inp), lambda: out.fill_(-1), out, expected)


def _reduce_scatter(numel: int, r: int, n: int, dt: torch.dtype, dev: torch.device) -> Buffers:
    chunk = numel // n
    inp, out = _pattern(chunk * n, r, dt, dev), torch.empty(chunk, dtype=dt, device=dev)
    full = cast(torch.Tensor, sum(_pattern(chunk * n, k, torch.float64, dev) for k in range(n)))
    expected = full[r * chunk : (r + 1) * chunk].to(dt)
    return Buffers(lambda: reduce_scatter_tensor(out, inp), lambda: out.fill_(-1), out, expected)


def _broadcast(numel: int, r: int, n: int, dt: torch.dtype, dev: torch.device) -> Buffers:
    buf = torch.empty(numel, dtype=dt, device=dev)
    reset = (lambda: buf.copy_(_pattern(numel, 0, dt, dev))) if r == 0 else (lambda: buf.fill_(-1))
    return Buffers(lambda: dist.broadcast(buf, src=0), reset, buf, _pattern(numel, 0, dt, dev))


def _all_to_all(numel: int, r: int, n: int, dt: torch.dtype, dev: torch.device) -> Buffers:
    chunk = numel // n
    # rank r's chunk j holds 100*r + j + 1: after the exchange, chunk k of rank r came from rank k
    inp = torch.cat([torch.full((chunk,), 100 * r + j + 1, dtype=dt, device=dev) for j in range(n)])
    out = torch.empty(chunk * n, dtype=dt, device=dev)
    expected = torch.cat([torch.full((chunk,), 100 * k + r + 1, dtype=dt, device=dev) for k in range(n)])
    return Buffers(lambda: dist.all_to_all_single(out, inp), lambda: out.fill_(-1), out, expected)


def _send_recv(numel: int, r: int, n: int, dt: torch.dtype, dev: torch.device) -> Buffers:
    """A ring: every rank sends to r+1 and receives from r-1 at once."""
    send, recv = _pattern(numel, r, dt, dev), torch.empty(numel, dtype=dt, device=dev)

    def run() -> None:
        ops = [dist.P2POp(dist.isend, send, (r + 1) % n), dist.P2POp(dist.irecv, recv, (r - 1) % n)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    return Buffers(run, lambda: recv.fill_(-1), recv, _pattern(numel, (r - 1) % n, dt, dev))


@dataclass(frozen=True)
class OpSpec:
    build: Callable[..., Buffers]
    busbw_factor: Callable[[int], float]
    min_ranks: int = 1


OPS: Registry[OpSpec] = Registry("collective op", ordered=True)
OPS.add("all_reduce", OpSpec(_all_reduce, lambda n: 2 * (n - 1) / n))
OPS.add("all_gather", OpSpec(_all_gather, lambda n: (n - 1) / n))
OPS.add("reduce_scatter", OpSpec(_reduce_scatter, lambda n: (n - 1) / n))
OPS.add("broadcast", OpSpec(_broadcast, lambda n: 1.0))
OPS.add("all_to_all", OpSpec(_all_to_all, lambda n: (n - 1) / n))
OPS.add("send_recv", OpSpec(_send_recv, lambda n: 1.0, min_ranks=2))


class Mismatch(AssertionError):
    """An op's output differs from its expected value."""


def check_output(op: str, bufs: Buffers, size: int, rank: int) -> None:
    """Mismatch naming the first wrong element of this rank's output."""
    if not torch.equal(bufs.output, bufs.expected):
        bad = int((bufs.output != bufs.expected).nonzero()[0].item())
        raise Mismatch(
            f"{op} at {size} B on rank {rank}: element {bad} is "
            f"{bufs.output[bad].item()}, expected {bufs.expected[bad].item()}"
        )


def verify_once(op: str, bufs: Buffers, size: int, rank: int) -> None:
    """Reset the inputs, run the op once and check its output."""
    bufs.reset()
    bufs.run()
    check_output(op, bufs, size, rank)


class _Sample:
    """The reset before a sample and the check after it, counting the calls in between: the output
    of the sample itself is checked where it is known exactly (a repeatable op; the in-place
    all_reduce, whose output after c calls is n^(c-1) times one call's, where the dtype holds that
    exactly), else one more call after a reset is."""

    def __init__(self, op: str, bufs: Buffers, size: int, rank: int, n: int) -> None:
        self.op, self.bufs, self.size, self.rank, self.n, self.calls = op, bufs, size, rank, n, 0

    def counted(self, step: Callable[[], object], calls: int) -> Callable[[], None]:
        def run() -> None:
            step()
            self.calls += calls

        return run

    def reset(self) -> None:
        self.bufs.reset()
        self.calls = 0

    def check(self) -> None:
        b = self.bufs
        if b.repeatable:
            check_output(self.op, b, self.size, self.rank)
            return
        want = b.expected.double() * float(self.n) ** (self.calls - 1)
        exact = want.to(b.expected.dtype)
        if self.calls >= 1 and bool(torch.isfinite(exact).all()) and torch.equal(exact.double(), want):
            check_output(self.op, Buffers(b.run, b.reset, b.output, exact), self.size, self.rank)
        else:
            verify_once(self.op, b, self.size, self.rank)


# the job's NCCL pool: (the default group's backend, device, pool); the backend is held so that a
# kept rank's next job, whose group is new, is told apart from it
_POOL: tuple[Any, torch.device, Any] | None = None


def nccl_pool(device: torch.device) -> Any:
    """The memory pool of NCCL's own allocator (ncclMemAlloc) for the default group's NCCL
    communicator on ``device``: the memory nccl-tests allocates its buffers from. NCCL registers such
    memory itself when a CUDA graph captures a call on it, and then copies straight between the
    ranks' buffers (no staging through its own); caching-allocator memory does not qualify.

    One pool for the job (release_pools at its end), as nccl-tests allocates once for every size: a case's
    buffers go back to it, never to NCCL. With a pool per case, a freed NCCL allocation's addresses
    came back in the next case's, and at 4 ranks a graph-captured all_gather at 16 MiB left peers'
    chunks unwritten on every rank (its check failed in the warm-up, twice); a peer holding a
    registration of the freed memory under the same address would do that."""
    global _POOL
    backend = dist.distributed_c10d._get_default_group()._get_backend(device)
    if _POOL is None or _POOL[0] is not backend or _POOL[1] != device:
        allocator = getattr(backend, "mem_allocator", None)
        if allocator is None:
            raise RuntimeError(
                f"benchmark.buffers=nccl: torch {torch.__version__}'s {type(backend).__name__} has no "
                "mem_allocator (NCCL's allocator); use benchmark.buffers=caching"
            )
        _POOL = (backend, device, torch.cuda.MemPool(allocator))  # another group's pool goes with it
    return _POOL[2]


def release_pools() -> None:
    """Hand the job's NCCL memory back while its communicator is still up (the buffers and graphs
    on it are gone by now): a kept rank's next job, or the process's exit, finds none."""
    global _POOL
    if _POOL is not None:
        torch.cuda.synchronize()
        _POOL = None
        torch.cuda.empty_cache()


def case_buffers(buffers: str, device: torch.device) -> ContextManager[Any]:
    """Where to build a case's buffers: ``caching``, torch's caching allocator; ``nccl``, NCCL's
    (``nccl_pool``, kept for the job)."""
    if buffers == "nccl":
        return torch.cuda.use_mem_pool(nccl_pool(device), device=device)
    return nullcontext()


def _captured(run: Callable[[], object], k: int, device: torch.device) -> torch.cuda.CUDAGraph:
    """k back-to-back calls of ``run`` captured once as a CUDA graph (replay it to run them). The
    calls run once first on a side stream (outside the capture), as torch's CUDA-graph recipe asks."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(k):
            run()
    torch.cuda.synchronize(device)
    return graph


def _timed(
    op: str, size: int, bufs: Buffers, *, rank: int, world_size: int, device: torch.device, cfg: Any, graph: bool
) -> tuple[list[float], int]:
    """time_case's samples on built buffers: (per-call times, calls per sample). A captured graph
    is reset before it returns (NCCL's registration of the buffers ends with it)."""
    verify_once(op, bufs, size, rank)
    k = ops_per_sample(cfg.ops_per_sample, short_ops=True)
    sample = _Sample(op, bufs, size, rank, world_size)
    if not graph:
        times = time_iterations(
            sample.counted(bufs.run, 1),
            warmup=cfg.warmup,
            iters=cfg.iters,
            device=device,
            before=sample.reset,
            after=sample.check,
            ops_per_sample=k,
        )
        return times, k
    captured = _captured(bufs.run, k, device)
    try:
        # cfg.warmup calls: whole replays of k, at least one
        times = time_iterations(
            sample.counted(captured.replay, k),
            warmup=max(1, -(-cfg.warmup // k)),
            iters=cfg.iters,
            device=device,
            before=sample.reset,
            after=sample.check,
        )
    finally:
        captured.reset()
    return [t / k for t in times], k


def time_case(
    op: str, size: int, *, rank: int, world_size: int, device: torch.device, cfg: Any, graph: bool = False
) -> dict[str, Any]:
    """One (op, size) case, timed with torch.distributed: checked once, then ``cfg.iters`` samples
    of ops_per_sample back-to-back ops, each sample's output checked before its time counts
    (``_Sample``). ``graph``: the k calls of a sample are captured once as a CUDA graph and a
    sample is one replay (the host's cost to issue each call is gone: nccl-tests' ``-G``)."""
    n, itemsize = world_size, getattr(torch, cfg.dtype).itemsize
    numel = max(n, size // itemsize // n * n)  # a multiple of n elements, as nccl-tests does
    buffers = getattr(cfg, "buffers", "caching")
    with case_buffers(buffers, device):
        bufs = OPS[op].build(numel, rank, n, getattr(torch, cfg.dtype), device)
    times, k = _timed(op, size, bufs, rank=rank, world_size=n, device=device, cfg=cfg, graph=graph)
    stats = summarize(times)
    s_bytes = numel * itemsize
    algbw = s_bytes / stats["median_s"] / 1e9
    return {
        "op": op,
        "size_bytes": s_bytes,
        "dtype": cfg.dtype,
        "impl": "torch_graph" if graph else "torch",
        "buffers": buffers,
        "times_s": times,
        **stats,
        "warmup": cfg.warmup,
        "iters": cfg.iters,
        "ops_per_sample": k,
        "algbw_gbps": algbw,
        "busbw_gbps": algbw * OPS[op].busbw_factor(n),
    }


def run_torch(
    ctx: Any, cfg: Any, grid: list[tuple[str, int]], on_case: Callable[[dict[str, Any]], None], *, graph: bool = False
) -> dict[str, Any]:
    """The ``torch`` implementation: every rank runs every case; returns the cases and how a sample is made."""
    cases = []
    try:
        for op, size in grid:
            cases.append(
                time_case(op, size, rank=ctx.rank, world_size=ctx.world_size, device=ctx.device, cfg=cfg, graph=graph)
            )
            on_case(cases[-1])
    finally:
        release_pools()
    k = ops_per_sample(cfg.ops_per_sample, short_ops=True)
    how = sampling(warmup=cfg.warmup, iters=cfg.iters, ops_per_sample=k, device=ctx.device)
    if graph:
        how["sample"] = f"one replay of a CUDA graph of {k} back-to-back calls / {k}, slowest rank"
        how["warmup_calls"] = max(1, -(-cfg.warmup // k)) * k  # whole replays
    return {"cases": cases, "sampling": how}


def run_torch_graph(
    ctx: Any, cfg: Any, grid: list[tuple[str, int]], on_case: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """The ``torch_graph`` implementation: ``run_torch`` with each sample's calls captured as a CUDA graph."""
    return run_torch(ctx, cfg, grid, on_case, graph=True)
