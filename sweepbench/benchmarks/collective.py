"""Collective bandwidth, as nccl-tests defines it.

For each op and message size: fill known inputs, run once and check the output exactly, then
time ``iters`` iterations after ``warmup`` (slowest rank), then check once more. ``size_bytes`` is
nccl-tests' size S (the full buffer: the gathered output for all_gather, the input for
reduce_scatter); algbw = S / t and busbw = algbw * factor(n), with factor 2(n-1)/n for all_reduce,
(n-1)/n for all_gather, reduce_scatter and all_to_all, and 1 for broadcast and send_recv."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist

from sweepbench.benchmarks.base import Benchmark, BenchmarkResult, VerificationError
from sweepbench.benchmarks.registry import register
from sweepbench.config.schema import BenchmarkConfig
from sweepbench.measure import summarize, time_iterations

# torch 2.13 renamed the tensor forms (the old names warn); older torch has only the old names
_all_gather_tensor = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

ALL_OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv"]


@dataclass
class CollectiveConfig(BenchmarkConfig):
    name: str = "collective"
    ops: list[str] = field(default_factory=lambda: list(ALL_OPS))
    min_bytes: int = 1024  # smallest S (bytes); sizes grow by step_factor up to max_bytes
    max_bytes: int = 1 << 20
    step_factor: int = 4
    dtype: str = "float32"


def _pattern(numel: int, rank: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Small integers, exact in every dtype even after summing over 64 ranks."""
    return ((torch.arange(numel, device=device) % 3) + rank + 1).to(dtype)


@dataclass
class Buffers:
    run: Callable[[], None]
    reset: Callable[[], None]
    output: torch.Tensor
    expected: torch.Tensor


def _all_reduce(numel: int, r: int, n: int, dt: torch.dtype, dev: torch.device) -> Buffers:
    buf = torch.empty(numel, dtype=dt, device=dev)
    expected = sum(_pattern(numel, k, torch.float64, dev) for k in range(n)).to(dt)
    return Buffers(lambda: dist.all_reduce(buf), lambda: buf.copy_(_pattern(numel, r, dt, dev)), buf, expected)


def _all_gather(numel: int, r: int, n: int, dt: torch.dtype, dev: torch.device) -> Buffers:
    chunk = numel // n
    inp, out = _pattern(chunk, r, dt, dev), torch.empty(chunk * n, dtype=dt, device=dev)
    expected = torch.cat([_pattern(chunk, k, dt, dev) for k in range(n)])
    return Buffers(lambda: _all_gather_tensor(out, inp), lambda: out.fill_(-1), out, expected)


def _reduce_scatter(numel: int, r: int, n: int, dt: torch.dtype, dev: torch.device) -> Buffers:
    chunk = numel // n
    inp, out = _pattern(chunk * n, r, dt, dev), torch.empty(chunk, dtype=dt, device=dev)
    full = sum(_pattern(chunk * n, k, torch.float64, dev) for k in range(n))
    expected = full[r * chunk:(r + 1) * chunk].to(dt)
    return Buffers(lambda: _reduce_scatter_tensor(out, inp), lambda: out.fill_(-1), out, expected)


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


OPS: dict[str, OpSpec] = {
    "all_reduce": OpSpec(_all_reduce, lambda n: 2 * (n - 1) / n),
    "all_gather": OpSpec(_all_gather, lambda n: (n - 1) / n),
    "reduce_scatter": OpSpec(_reduce_scatter, lambda n: (n - 1) / n),
    "broadcast": OpSpec(_broadcast, lambda n: 1.0),
    "all_to_all": OpSpec(_all_to_all, lambda n: (n - 1) / n),
    "send_recv": OpSpec(_send_recv, lambda n: 1.0, min_ranks=2),
}


def message_sizes(cfg: Any) -> list[int]:
    sizes, s = [], cfg.min_bytes
    while s <= cfg.max_bytes:
        sizes.append(s)
        s *= cfg.step_factor
    return sizes


@register("collective")
class CollectiveBenchmark(Benchmark):
    schema = CollectiveConfig

    @classmethod
    def validate(cls, cfg: Any) -> None:
        b = cfg.benchmark
        for op in b.ops:
            if op not in OPS:
                raise ValueError(f"benchmark.ops contains {op!r}; valid ops: {', '.join(OPS)}")
        if not 0 < b.min_bytes <= b.max_bytes:
            raise ValueError(f"benchmark.min_bytes={b.min_bytes} must be > 0 and <= max_bytes={b.max_bytes}")
        if b.step_factor < 2:
            raise ValueError(f"benchmark.step_factor={b.step_factor} must be >= 2")
        if b.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"benchmark.dtype={b.dtype!r}; valid: float32, bfloat16, float16")

    def _verify(self, op: str, bufs: Buffers, size: int) -> None:
        bufs.reset()
        bufs.run()
        if not torch.equal(bufs.output, bufs.expected):
            bad = (bufs.output != bufs.expected).nonzero()[0].item()
            raise VerificationError(f"{op} at {size} B on rank {self.ctx.rank}: element {bad} is "
                                    f"{bufs.output[bad].item()}, expected {bufs.expected[bad].item()}")

    def _case(self, op: str, size: int) -> dict[str, Any]:
        ctx, n = self.ctx, self.ctx.world_size
        dtype = getattr(torch, self.cfg.dtype)
        itemsize = torch.empty((), dtype=dtype).element_size()
        numel = max(n, size // itemsize // n * n)  # a multiple of n elements, as nccl-tests does
        bufs = OPS[op].build(numel, ctx.rank, n, dtype, ctx.device)
        self._verify(op, bufs, size)
        times = time_iterations(bufs.run, warmup=self.cfg.warmup, iters=self.cfg.iters, device=ctx.device)
        self._verify(op, bufs, size)
        stats = summarize(times)
        s_bytes = numel * itemsize
        algbw = s_bytes / stats["median_s"] / 1e9
        return {"op": op, "size_bytes": s_bytes, "dtype": self.cfg.dtype, "times_s": times, **stats,
                "warmup": self.cfg.warmup, "iters": self.cfg.iters,
                "algbw_gbps": algbw, "busbw_gbps": algbw * OPS[op].busbw_factor(n)}

    def run(self) -> BenchmarkResult:
        ops = [op for op in self.cfg.ops if self.ctx.world_size >= OPS[op].min_ranks]
        cases = [self._case(op, size) for op in ops for size in message_sizes(self.cfg)]
        summary: dict[str, float] = {}
        for op in ops:
            mine = [c for c in cases if c["op"] == op]
            summary[f"{op}_busbw_gbps"] = max(c["busbw_gbps"] for c in mine)
            summary[f"{op}_median_s"] = mine[-1]["median_s"]
        return BenchmarkResult(cases=cases, summary=summary, verified=True,
                               extra={"skipped_ops": sorted(set(self.cfg.ops) - set(ops))})
