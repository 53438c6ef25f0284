"""Cross-mesh resharding of one tensor, after Alpa's microbenchmarks ("On Optimizing the
Communication of Model Parallelism", Zhuang et al., MLSys 2023).

``benchmark.suite`` picks the cases (see ``parallel.reshard_suites``): ``one_to_m`` (one source rank to
destination meshes of m ranks, replicated = the broadcast case, and sharded), ``n_to_m`` (meshes
of different sizes and shapes on both sides, specs replicated, sharded on different dims,
partially replicated) or ``custom`` (``benchmark.cases``). Source and destination meshes are
always on disjoint ranks (``mode`` is not used); the job has as many ranks as its largest case.

Each case: build the source shards, allocate the destination shards, and for each of ``warmup``
+ ``iters`` iterations poison the destination (NaN), run the strategy's executor (timed after the
warm-up; the slowest rank's time), then check every destination shard bit for bit; a wrong shard
raises ``VerificationError`` naming the case. ``verified`` is true only when every rank checked
every iteration of every case.

The link floor of each case (``effective_gbps``, ``fraction_of_link``) is ``parallel.link_floor``'s."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from sweepbench.benchmarks.base import Benchmark, BenchmarkResult, Headline, PageSpec, Plot
from sweepbench.benchmarks.registry import register
from sweepbench.parallel import make_plan
from sweepbench.parallel.link_floor import Floor
from sweepbench.parallel.reshard_suites import ResolvedCase, mesh_str, suite_cases
from sweepbench.parallel.transfer import TransferConfig, check_transfer_options, time_transfer, transfer_strategy

# the summary (results.csv, wandb) holds these per case, as <case>_<key>
SUMMARY_KEYS = ("median_s", "effective_gbps", "fraction_of_link")


@dataclass
class ReshardConfig(TransferConfig):
    """Reshard's probe_bytes default (0): the size of the largest case tensor."""

    name: str = "reshard"
    suite: str = "one_to_m"  # one_to_m | n_to_m | custom (sweep: benchmark.suite=one_to_m,n_to_m)
    m: list[int] = field(default_factory=lambda: [1, 2, 4])  # one_to_m: destination mesh sizes; 1 + max(m) ranks
    # one_to_m: destination specs (RR: the broadcast case)
    dst_specs: list[str] = field(default_factory=lambda: ["RR", "S0R", "RS0"])
    mesh_ranks: int = 4  # n_to_m: ranks of the larger meshes (even; others have half); 2 * mesh_ranks ranks
    cases: list[str] = field(default_factory=list)  # custom: case names, e.g. [2x2_S0R_to_1x4_RS1]
    overlap: bool = False  # destination mesh starts at rank 0, sharing ranks with the source mesh
    tensor_bytes: int = 4 << 20  # bytes of each case's tensor (at most; GPU: 1073741824)
    dtype: str = "float32"  # float32 | bfloat16 | float16


def _page_rows(job: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "impl": c["strategy"],
            "strategy": c["strategy"],
            "world_size": job["world_size"],
            "suite": c["suite"],
            "case": c["case"],
            "variant": f"local_allgather balance={c['balance']}" if c.get("local_allgather") else "",
            "size_bytes": c["tensor_bytes"],
            "iters": c["iters"],
            "median_ms": c["median_s"] * 1e3,
            "iqr_ms": c["iqr_s"] * 1e3,
            "floor_ms": c["link_floor_s"] * 1e3,
            "effective_gbps": c["effective_gbps"],
            "fraction_of_link": c["fraction_of_link"],
        }
        for c in job["results"]["cases"]
    ]


def _page_derive(rows: list[dict[str, Any]], pool: list[dict[str, Any]]) -> None:
    for r in rows:
        if r.get("floor_ms"):
            r["ratio_to_floor"] = float(r["median_ms"]) / float(r["floor_ms"])


@register("reshard")
class ReshardBenchmark(Benchmark):
    schema = ReshardConfig
    tag_keys = ("suite", "strategy")
    tag_groups = ("backend",)  # its meshes come from the suite, not from model/parallelism/mode

    @classmethod
    def page(cls) -> PageSpec:
        return PageSpec(
            case=("impl", "world_size", "suite", "case", "variant", "size_bytes"),
            columns=(
                "suite",
                "case",
                "variant",
                "size_bytes",
                "floor_ms",
                "ratio_to_floor",
                "effective_gbps",
                "fraction_of_link",
                "verified",
            ),
            rows=_page_rows,
            derive=_page_derive,
            notes=(
                "`case`: source mesh and placement to destination mesh and placement (S0 = sharded on dim 0, "
                "R = replicated); `ratio_to_floor` = median / link floor.",
            ),
        )

    @classmethod
    def headline(cls, cfg: DictConfig) -> list[Headline]:
        """The suite's largest non-trivial case (the 1-to-1 copy says little about a strategy)."""
        cases = [rc for rc in suite_cases(cfg.benchmark) if rc.case.world > 2] or suite_cases(cfg.benchmark)
        name = max(cases, key=lambda rc: (rc.case.world, rc.name)).name
        return [
            Headline(f"{name}_{k}", f"{name} {label}")
            for k, label in (("median_s", "median s"), ("effective_gbps", "GB/s"), ("fraction_of_link", "floor/time"))
        ]

    @classmethod
    def memory_bytes(cls, cfg: DictConfig, world_size: int) -> int:
        # a rank holds at most a source and a destination copy of a case's tensor, plus the probe's
        return 4 * cfg.benchmark.tensor_bytes + 2 * (cfg.benchmark.probe_bytes or cfg.benchmark.tensor_bytes)

    @classmethod
    def plots(cls, jobs: list[dict[str, Any]]) -> list[Plot]:
        """Effective bandwidth per case against the bandwidth its floor allows, per job; and
        fraction_of_link per case and job when there are several jobs."""
        from sweepbench.benchmarks.base import Plot
        from sweepbench.draw.plotting import bar_plot, config_value, heatmap, ok_jobs

        plots, fractions = [], {}
        for job in ok_jobs(jobs):
            name = f"{config_value(job, 'benchmark.suite')} {config_value(job, 'benchmark.strategy')}"
            cases = job["results"]["cases"]
            rate = {c["case"]: c["effective_gbps"] for c in cases}
            floor = {
                c["case"]: c["busiest_rank_bytes"] / c["link_floor_s"] / 1e9
                for c in cases
                if 0 < c["link_floor_s"] < float("inf")
            }
            fractions[name] = {c["case"]: c["fraction_of_link"] for c in cases}
            fig = bar_plot(
                rate,
                ylabel="effective GB/s",
                floor=floor,
                floor_label="floor's bandwidth",
                annotations={c["case"]: f"{c['fraction_of_link']:.2f}" for c in cases},
                width=max(6.4, 0.7 * len(rate)),
            )
            plots.append(
                Plot(
                    f"reshard {name}: bandwidth per case",
                    fig,
                    "the busiest rank's bytes / median time; black line: the same bytes over the "
                    "link floor's time; note: fraction_of_link",
                )
            )
        if len(fractions) > 1:
            cases = list(dict.fromkeys(c for f in fractions.values() for c in f))
            grid = [[fractions[j].get(c) for j in fractions] for c in cases]
            plots.append(
                Plot(
                    "reshard fraction_of_link per case and job",
                    heatmap(grid, rows=cases, cols=list(fractions), cbar_label="floor / time"),
                )
            )
        return plots

    @classmethod
    def world_size(cls, cfg: DictConfig) -> int:
        return max(c.case.world for c in suite_cases(cfg.benchmark))

    @classmethod
    def validate(cls, cfg: DictConfig) -> None:
        b = cfg.benchmark
        check_transfer_options(b, backend=cfg.backend.name)
        if b.probe_bytes < 0:
            raise ValueError(f"benchmark.probe_bytes={b.probe_bytes} must be >= 0 (0: the default size)")
        suite_cases(b)

    def run(self) -> BenchmarkResult:
        from sweepbench.parallel.link import probe_links
        from sweepbench.measure.progress import case_done

        ctx, cfg = self.ctx, self.cfg
        strategy = transfer_strategy(ctx.backend, cfg.strategy)
        resolved = suite_cases(cfg)
        # the link at the cases' message size (a smaller probe would understate it)
        probe_bytes = cfg.probe_bytes or max(rc.src.params[0].nbytes for rc in resolved)
        link = probe_links(nbytes=max(4, probe_bytes // 4 * 4), device=ctx.device)
        case_done(f"link probed at {link['probe_bytes']} B", total=len(resolved) + 1)
        cases = []
        for rc in resolved:
            cases.append(self._case(rc, strategy, link))
            case_done(f"case {rc.name}: {cases[-1]['fraction_of_link']:.2f} of the link", total=len(resolved) + 1)
        summary: dict[str, float] = {"p2p_gbps": link["p2p_gbps"], "broadcast_gbps": link["broadcast_gbps"]}
        for case in cases:
            summary.update({f"{case['case']}_{k}": case[k] for k in SUMMARY_KEYS})
        return BenchmarkResult(
            cases=cases,
            summary=summary,
            verified=all(c["verified"] for c in cases),
            extra={"suite": cfg.suite, "strategy": strategy},
        )

    def _case(self, rc: ResolvedCase, strategy: str, link: dict[str, float]) -> dict[str, Any]:
        from sweepbench.measure import summarize

        ctx, cfg = self.ctx, self.cfg
        src, dst = rc.src, rc.dst
        floor = Floor.of(make_plan(src, dst, balance="size", fanout=True))
        run = time_transfer(src, dst, ctx=ctx, cfg=cfg, strategy=strategy, label=f"reshard case {rc.name}")
        times, plan, options = run.times_s, run.plan, run.options
        assert plan is not None  # our implementation's plan (only a peer implementation has none)
        stats = summarize(times)
        floor_s, bound = floor.seconds(link)
        tensor_bytes = src.params[0].nbytes
        c = rc.case
        case = {
            "case": rc.name,
            "suite": cfg.suite,
            "src_mesh": mesh_str(c.src_mesh),
            "src_spec": c.src_spec,
            "dst_mesh": mesh_str(c.dst_mesh),
            "dst_spec": c.dst_spec,
            "src_ranks": list(c.src_ranks),
            "dst_ranks": list(c.dst_ranks),
            "shape": list(rc.shape),
            "dtype": cfg.dtype,
            "strategy": strategy,
            "balance": cfg.balance,
            "local_allgather": bool(cfg.local_allgather) and "local_allgather" in options,
            "times_s": times,
            **stats,
            "warmup": cfg.warmup,
            "iters": cfg.iters,
            "tensor_bytes": tensor_bytes,
            "moved_bytes": floor.moved_bytes,
            "busiest_rank_bytes": floor.busiest_rank_bytes,
            "fanout_recv_bytes": floor.fanout_recv_bytes,
            "wire_bytes": sum(s for s, _ in run.traffic),
            "wire_busiest_rank_bytes": max(max(s, r) for s, r in run.traffic),
            "effective_gbps": floor.busiest_rank_bytes / stats["median_s"] / 1e9,
            **link,
            "link_floor_s": floor_s,
            "floor_bound": bound,
            "fraction_of_link": floor_s / stats["median_s"],
            "routes": len(plan.routes),
            "plan_digest": plan.digest,
            "verified": run.verified,
        }
        if ctx.rank == 0:
            print(
                f"reshard {rc.name} {list(rc.shape)} {strategy}: median {stats['median_s']:.6f} s, "
                f"{case['effective_gbps']:.3f} GB/s, {case['fraction_of_link']:.3f} of the link",
                flush=True,
            )
        return case
