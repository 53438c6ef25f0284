"""Collective bandwidth, as nccl-tests defines and times it.

For each op and message size: fill known inputs, run once and check the output exactly, warm up,
then time ``iters`` samples, each ``ops_per_sample`` back-to-back ops (nccl-tests' ``-n``) whose
time / ops_per_sample is the sample (slowest rank), each sample's output checked before its time
counts. ``benchmark.impl`` picks who runs the cases (collective.impls): ``torch``
(torch.distributed) or the peer ``nccl_tests`` (NVIDIA's binaries), parsed into the same cases. ``size_bytes`` is
nccl-tests' size S (the full buffer: the gathered output for all_gather, the input for
reduce_scatter); algbw = S / t and busbw = algbw * factor(n), with factor 2(n-1)/n for all_reduce,
(n-1)/n for all_gather, reduce_scatter and all_to_all, and 1 for broadcast and send_recv."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from sweepbench.benchmarks.base import Benchmark, BenchmarkResult, Headline, PageSpec, Plot
from sweepbench.benchmarks.registry import register
from sweepbench.collective.impls import ALL_OPS, DTYPE_BYTES, IMPLS, buffers_of, check_buffers, get_impl
from sweepbench.config.schema import BenchmarkConfig
from sweepbench.core import VerificationError
from sweepbench.draw.units import format_bytes


@dataclass
class CollectiveConfig(BenchmarkConfig):
    name: str = "collective"
    warmup: int = 5  # untimed samples of each op and message size before timing
    iters: int = 20  # timed samples of each op and message size
    ops: list[str] = field(default_factory=lambda: list(ALL_OPS))
    min_bytes: int = 1024  # smallest S (bytes); sizes grow by step_factor up to max_bytes
    max_bytes: int = 1 << 20
    step_factor: int = 4
    dtype: str = "float32"
    # ops one timed sample runs back to back (nccl-tests -n); 0 = measure.timing's rule for short ops (20)
    ops_per_sample: int = 0
    # who runs the cases: torch | torch_graph (CUDA graphs, CUDA only) | nccl_tests | nccl_tests_graph
    # (nccl-tests -G 1; both need benchmark.nccl_tests_dir)
    impl: str = "torch"
    # where the torch impls allocate a case's buffers: caching (torch's caching allocator) | nccl (NCCL's
    # own allocator, ncclMemAlloc through torch.cuda.MemPool: what nccl-tests allocates, which NCCL
    # registers itself when a CUDA graph captures the call; NCCL backend only). Peers allocate as they do.
    buffers: str = "caching"
    nccl_tests_dir: str = ""  # impl=nccl_tests: the build directory holding all_reduce_perf, ... (nccl-tests' build/)


def message_sizes(cfg: Any) -> list[int]:
    sizes, s = [], cfg.min_bytes
    while s <= cfg.max_bytes:
        sizes.append(s)
        s *= cfg.step_factor
    return sizes


def _page_rows(job: dict[str, Any]) -> list[dict[str, Any]]:
    b = job["config"]["benchmark"]
    return [
        {
            "impl": b.get("impl", "torch"),
            "buffers": c.get("buffers") or buffers_of(b.get("impl", "torch"), b.get("buffers", "caching")),
            "world_size": job["world_size"],
            "op": c["op"],
            "size_bytes": c["size_bytes"],
            "dtype": c["dtype"],
            "iters": c["iters"],
            "ops_per_sample": b.get("ops_per_sample", 1),
            "median_ms": c["median_s"] * 1e3,
            "iqr_ms": c["iqr_s"] * 1e3,
            "busbw_gbps": c["busbw_gbps"],
        }
        for c in job["results"]["cases"]
    ]


def _page_derive(rows: list[dict[str, Any]], pool: list[dict[str, Any]]) -> None:
    """nccl-tests' busbw beside each row, timed the same way (eager against nccl-tests as it runs by
    default, graph-captured against nccl-tests -G) in the same run, and the ratio to it."""
    by_case = {(r["impl"], r["run"], r["world_size"], r["op"], r["size_bytes"]): r for r in pool}
    for r in rows:
        # a run from before benchmark.buffers allocated as the impl does, torch's impls from torch's cache
        r["buffers"] = r.get("buffers") or buffers_of(r["impl"], "caching")
        impl = IMPLS.get(r["impl"]) if r["impl"] in IMPLS else None  # a run's impl this install may not have
        ref = by_case.get((impl.reference, r["run"], r["world_size"], r["op"], r["size_bytes"])) if impl else None
        if ref and r.get("busbw_gbps"):
            ratio = float(r["busbw_gbps"]) / float(ref["busbw_gbps"])
            r.update(nccl_tests_busbw_gbps=ref["busbw_gbps"], ratio=ratio, meets_target=abs(ratio - 1) <= 0.05)


@register("collective")
class CollectiveBenchmark(Benchmark):
    schema = CollectiveConfig
    tag_keys = ("impl",)
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
        if b.ops_per_sample < 0:
            raise ValueError(f"benchmark.ops_per_sample={b.ops_per_sample} must be >= 1 (or 0: the default, 20)")
        check_buffers(cfg)
        get_impl(b.impl).check(cfg, cls.world_size(cfg))

    @classmethod
    def page(cls) -> PageSpec:
        return PageSpec(
            case=("impl", "buffers", "world_size", "op", "size_bytes"),
            columns=(
                "buffers",
                "op",
                "size_bytes",
                "dtype",
                "ops_per_sample",
                "busbw_gbps",
                "nccl_tests_busbw_gbps",
                "ratio",
                "meets_target",
                "verified",
            ),
            rows=_page_rows,
            derive=_page_derive,
            ways=("buffers",),
            notes=(
                "`busbw_gbps`: bus bandwidth as nccl-tests defines it (GB/s = 1e9 B/s), from the slowest "
                "rank's median time.",
                "`ratio`: busbw over nccl-tests' busbw for the same op and size, measured in the same run, "
                "timed the same way: `torch` against nccl-tests as it runs by default, `torch_graph` against "
                "nccl-tests with CUDA graphs (`-G 1`); `meets_target`: within ±5%.",
                "`buffers`: where a case's buffers were allocated: `caching` (torch's caching allocator) or "
                "`nccl` (NCCL's allocator, ncclMemAlloc, as nccl-tests allocates; a CUDA graph that captures "
                "the call has NCCL register them and copy straight between them).",
            ),
        )

    @classmethod
    def headline(cls, cfg: DictConfig) -> list[Headline]:
        at = format_bytes(message_sizes(cfg.benchmark)[-1])
        return [
            Headline(f"{op}_{key}", f"{op} {label} @{at}")
            for op in cfg.benchmark.ops
            for key, label in (("busbw_gbps", "busbw GB/s"), ("median_s", "median s"))
        ]

    @classmethod
    def memory_bytes(cls, cfg: DictConfig, world_size: int) -> int:
        # the largest case holds an input, an output and the fp64 expectation (3 buffers of S)
        return 4 * cfg.benchmark.max_bytes

    @classmethod
    def compared(cls, job: dict[str, Any], case: dict[str, Any]) -> bool:
        """A collective on one rank moves no data: its busbw is a memory copy's, not a link's."""
        return job.get("world_size") != 1

    @classmethod
    def plots(cls, jobs: list[dict[str, Any]]) -> list[Plot]:
        """busbw over message size, a line per op and world size, against each world size's
        fastest send/recv ring: the link ceiling the job measured itself."""
        from sweepbench.benchmarks.base import Plot
        from sweepbench.draw.plotting import line_plot, ok_cases

        series: dict[str, list[tuple[float, float]]] = {}
        ceilings: dict[str, float] = {}

        def kind(job: dict[str, Any], case: dict[str, Any]) -> tuple[str, str, str]:
            return job["backend"], case["dtype"], case.get("impl", "torch")

        per_ws: dict[int, set[tuple[str, str, str]]] = {}  # jobs of one world size: name what differs
        moving = [(job, case) for job, case in ok_cases(jobs) if cls.compared(job, case)]
        for job, case in moving:
            per_ws.setdefault(job["world_size"], set()).add(kind(job, case))
        for job, case in moving:
            ws, kinds = job["world_size"], per_ws[job["world_size"]]
            which = "".join(f" {v}" for i, v in enumerate(kind(job, case)) if len({k[i] for k in kinds}) > 1)
            series.setdefault(f"{case['op']} ws{ws}{which}", []).append((case["size_bytes"], case["busbw_gbps"]))
            if case["op"] == "send_recv":
                key = f"ceiling ws{ws}{which} (send/recv)"
                ceilings[key] = max(ceilings.get(key, 0.0), case["busbw_gbps"])
        if not series:
            return []
        fig = line_plot(
            series,
            xlabel="message size S",
            ylabel="busbw (GB/s)",
            log2_x=True,
            bytes_x=True,
            ceiling=ceilings,
            width=7.5,
            height=4.2,
        )
        return [
            Plot(
                "collective busbw vs message size",
                fig,
                "nccl-tests' bus bandwidth per op and world size; dotted: the fastest send/recv ring "
                "of that world size, the link ceiling",
            )
        ]

    def run(self) -> BenchmarkResult:
        from sweepbench.collective.ops import OPS, Mismatch
        from sweepbench.measure.progress import case_done

        ops = [op for op in self.cfg.ops if self.ctx.world_size >= OPS[op].min_ranks]
        grid = [(op, size) for op in ops for size in message_sizes(self.cfg)]

        def on_case(case: dict[str, Any]) -> None:
            case_done(
                f"{case['op']} {format_bytes(case['size_bytes'])}: busbw {case['busbw_gbps']:.3g} GB/s", total=len(grid)
            )

        try:
            done = get_impl(self.cfg.impl).load()(self.ctx, self.cfg, grid, on_case)
        except Mismatch as err:
            raise VerificationError(str(err)) from err
        cases = done["cases"]  # rank 0's count (a peer's other ranks may hold none)
        summary: dict[str, float] = {}
        for op in ops:  # the headline numbers are the largest message's, as the headline labels say
            largest = [c for c in cases if c["op"] == op][-1:]
            for c in largest:
                summary[f"{op}_busbw_gbps"] = c["busbw_gbps"]
                summary[f"{op}_median_s"] = c["median_s"]
        return BenchmarkResult(
            cases=cases,
            summary=summary,
            verified=True,
            extra={"skipped_ops": sorted(set(self.cfg.ops) - set(ops)), "sampling": done["sampling"]},
        )
