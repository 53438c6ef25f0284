"""Collective bandwidth, as nccl-tests defines it.

For each op and message size: fill known inputs, run once and check the output exactly, then
time ``iters`` iterations after ``warmup`` (slowest rank), then check once more. ``size_bytes`` is
nccl-tests' size S (the full buffer: the gathered output for all_gather, the input for
reduce_scatter); algbw = S / t and busbw = algbw * factor(n), with factor 2(n-1)/n for all_reduce,
(n-1)/n for all_gather, reduce_scatter and all_to_all, and 1 for broadcast and send_recv."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from sweepbench.benchmarks.base import Benchmark, BenchmarkResult, Headline
from sweepbench.benchmarks.registry import register
from sweepbench.config.schema import BenchmarkConfig
from sweepbench.core import VerificationError
from sweepbench.report.units import format_bytes

ALL_OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv"]  # measure.collectives.OPS
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class CollectiveConfig(BenchmarkConfig):
    name: str = "collective"
    ops: list[str] = field(default_factory=lambda: list(ALL_OPS))
    min_bytes: int = 1024  # smallest S (bytes); sizes grow by step_factor up to max_bytes
    max_bytes: int = 1 << 20
    step_factor: int = 4
    dtype: str = "float32"


def message_sizes(cfg: Any) -> list[int]:
    sizes, s = [], cfg.min_bytes
    while s <= cfg.max_bytes:
        sizes.append(s)
        s *= cfg.step_factor
    return sizes


@register("collective")
class CollectiveBenchmark(Benchmark):
    schema = CollectiveConfig
    tag_groups = ("model", "parallelism", "backend")

    @classmethod
    def validate(cls, cfg: Any) -> None:
        b = cfg.benchmark
        for op in b.ops:
            if op not in ALL_OPS:
                raise ValueError(f"benchmark.ops contains {op!r}; valid ops: {', '.join(ALL_OPS)}")
        if not 0 < b.min_bytes <= b.max_bytes:
            raise ValueError(f"benchmark.min_bytes={b.min_bytes} must be > 0 and <= max_bytes={b.max_bytes}")
        if b.step_factor < 2:
            raise ValueError(f"benchmark.step_factor={b.step_factor} must be >= 2")
        if b.dtype not in DTYPE_BYTES:
            raise ValueError(f"benchmark.dtype={b.dtype!r}; valid: {', '.join(DTYPE_BYTES)}")

    @classmethod
    def headline(cls, cfg: DictConfig) -> list[Headline]:
        at = format_bytes(message_sizes(cfg.benchmark)[-1])
        return [Headline(f"{op}_{key}", f"{op} {label} @{at}") for op in cfg.benchmark.ops
                for key, label in (("busbw_gbps", "busbw GB/s"), ("median_s", "median s"))]

    @classmethod
    def memory_bytes(cls, cfg: DictConfig, world_size: int) -> int:
        # the largest case holds an input, an output and the fp64 expectation (3 buffers of S)
        return 4 * cfg.benchmark.max_bytes

    @classmethod
    def plots(cls, jobs: list[dict[str, Any]]) -> list[Plot]:
        """busbw over message size, a line per op and world size, against each world size's
        fastest send/recv ring: the link ceiling the job measured itself."""
        from sweepbench.benchmarks.base import Plot
        from sweepbench.report.plotting import line_plot, ok_cases

        series: dict[str, list[tuple[float, float]]] = {}
        ceilings: dict[str, float] = {}
        per_ws = {}  # several jobs of one world size (dtypes, backends): name them apart
        for job, _ in ok_cases(jobs):
            per_ws.setdefault(job["world_size"], set()).add(job["tag"])
        for job, case in ok_cases(jobs):
            ws = job["world_size"]
            which = f" {job['backend']} {case['dtype']}" if len(per_ws[ws]) > 1 else ""
            series.setdefault(f"{case['op']} ws{ws}{which}", []).append((case["size_bytes"], case["busbw_gbps"]))
            if case["op"] == "send_recv":
                key = f"ceiling ws{ws}{which} (send/recv)"
                ceilings[key] = max(ceilings.get(key, 0.0), case["busbw_gbps"])
        if not series:
            return []
        fig = line_plot(series, xlabel="message size S", ylabel="busbw (GB/s)", log2_x=True, bytes_x=True,
                        ceiling=ceilings, width=7.5, height=4.2)
        return [Plot("collective busbw vs message size", fig,
                     "nccl-tests' bus bandwidth per op and world size; dotted: the fastest send/recv ring "
                     "of that world size, the link ceiling")]

    def _verify(self, op: str, bufs: Any, size: int) -> None:
        import torch

        bufs.reset()
        bufs.run()
        if not torch.equal(bufs.output, bufs.expected):
            bad = (bufs.output != bufs.expected).nonzero()[0].item()
            raise VerificationError(f"{op} at {size} B on rank {self.ctx.rank}: element {bad} is "
                                    f"{bufs.output[bad].item()}, expected {bufs.expected[bad].item()}")

    def _case(self, op: str, size: int) -> dict[str, Any]:
        import torch

        from sweepbench.measure import summarize, time_iterations
        from sweepbench.measure.collectives import OPS

        ctx, n = self.ctx, self.ctx.world_size
        dtype = getattr(torch, self.cfg.dtype)
        itemsize = DTYPE_BYTES[self.cfg.dtype]
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
        from sweepbench.measure.collectives import OPS
        from sweepbench.measure.progress import case_done

        ops = [op for op in self.cfg.ops if self.ctx.world_size >= OPS[op].min_ranks]
        grid = [(op, size) for op in ops for size in message_sizes(self.cfg)]
        cases = []
        for op, size in grid:
            cases.append(self._case(op, size))
            case_done(f"{op} {format_bytes(cases[-1]['size_bytes'])}: busbw {cases[-1]['busbw_gbps']:.3g} GB/s",
                      total=len(grid))
        summary: dict[str, float] = {}
        for op in ops:  # the headline numbers are the largest message's, as the headline labels say
            largest = [c for c in cases if c["op"] == op][-1]
            summary[f"{op}_busbw_gbps"] = largest["busbw_gbps"]
            summary[f"{op}_median_s"] = largest["median_s"]
        return BenchmarkResult(cases=cases, summary=summary, verified=True,
                               extra={"skipped_ops": sorted(set(self.cfg.ops) - set(ops))})
