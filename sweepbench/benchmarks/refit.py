"""RL refit: move the weights from the training layout (``parallelism``) to the inference
layout (``benchmark.inference``), on the same ranks (``mode=collocated``) or on disjoint ones
(``mode=non_collocated``), as Megatron-RL's refit benchmark does.

Collocated, both layouts span lcm(train, inference) ranks (each replicated with dp to fill them);
non-collocated, training holds ranks [0, T) and inference [T, T+I). Each iteration poisons the
inference shards (NaN), refits (timed), then checks every inference shard bit for bit against the
matching slice of the training weights; ``verified`` is true only when all did. The job first
probes its own links, so the result carries ``link_floor_s`` (the busiest rank's bytes that must
cross a link / the faster of the measured NCCL p2p and copy-engine bandwidths) and
``fraction_of_link`` (floor / refit time). ``benchmark.impl`` picks who refits: ``sweepbench``
(the plan and ``benchmark.strategy``) or a peer (``megatron``: megatron-core's own refit on the
same shapes and layouts), timed and verified by the same loop."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from sweepbench.benchmarks.base import Benchmark, BenchmarkResult, Headline, PageSpec, Plot
from sweepbench.benchmarks.registry import register
from sweepbench.config.validate import check_layout, device_type
from sweepbench.parallel import Layout, make_plan, model_layout, model_param_specs, total_bytes
from sweepbench.parallel.impls import check_impl
from sweepbench.parallel.layout_names import as_node, degrees_of, parse_layout, world_of
from sweepbench.parallel.transfer import TransferConfig, check_transfer_options, time_transfer, transfer_strategy


@dataclass
class RefitConfig(TransferConfig):
    """Refit's probe_bytes default (0): 1 GiB on GPU (the large-message ceiling), 4 MiB on CPU."""

    name: str = "refit"
    inference: str = "tp1"  # inference layout, e.g. tp1, tp4, tp4pp1, ep4 (sweep: benchmark.inference=tp1,tp4)
    # who refits: sweepbench (benchmark.strategy) | megatron (megatron-core's swap_model_weights, which
    # ignores benchmark.strategy; pip install "sweepbench[megatron]")
    impl: str = "sweepbench"


def _placements(cfg: DictConfig) -> tuple[dict[str, int], range, dict[str, int], range]:
    """(training degrees, its ranks, inference degrees, its ranks) for the job's mode."""
    train = degrees_of(cfg.parallelism)
    infer = parse_layout(cfg.benchmark.inference, key="benchmark.inference")
    t, i = world_of(train), world_of(infer)
    if cfg.mode.name == "non_collocated":
        return train, range(t), infer, range(t, t + i)
    world = math.lcm(t, i)
    return (
        {**train, "dp": train["dp"] * world // t},
        range(world),
        {**infer, "dp": infer["dp"] * world // i},
        range(world),
    )


def _layouts(cfg: DictConfig) -> tuple[Layout, Layout]:
    """The training and inference layouts of the job's model, placed for its mode."""
    train, train_ranks, infer, infer_ranks = _placements(cfg)
    return model_layout(cfg.model, train_ranks, **train), model_layout(cfg.model, infer_ranks, **infer)


def _probe_bytes(b: Any, *, gpu: bool) -> int:
    """The link probe's message: benchmark.probe_bytes, else 1 GiB on GPU (the large-message
    ceiling) and 4 MiB on CPU."""
    return b.probe_bytes or (1 << 30 if gpu else 4 << 20)


def _page_rows(job: dict[str, Any]) -> list[dict[str, Any]]:
    cfg, (c, *_) = job["config"], job["results"]["cases"]
    b = cfg["benchmark"]
    return [
        {
            "impl": b.get("impl", "sweepbench"),
            "strategy": b["strategy"],
            "world_size": job["world_size"],
            "model": cfg["model"]["name"],
            "src": cfg["parallelism"]["name"],
            "dst": b["inference"],
            "mode": cfg["mode"]["name"],
            "backend": job["backend"],
            "variant": "",
            "iters": c["iters"],
            "median_ms": c["median_s"] * 1e3,
            "iqr_ms": c["iqr_s"] * 1e3,
            "floor_ms": c["link_floor_s"] * 1e3,
        }
    ]


def _page_derive(rows: list[dict[str, Any]], pool: list[dict[str, Any]]) -> None:
    for r in rows:
        if r.get("floor_ms") and float(r["floor_ms"]) > 0:  # a refit that moves no bytes has no floor to meet
            ratio = float(r["median_ms"]) / float(r["floor_ms"])
            r.update(ratio_to_floor=ratio, meets_target=ratio <= 1.2)


@register("refit")
class RefitBenchmark(Benchmark):
    schema = RefitConfig
    tag_keys = ("inference", "strategy", "impl")

    @classmethod
    def world_size(cls, cfg: DictConfig) -> int:
        _, train_ranks, _, infer_ranks = _placements(cfg)
        return len(set(train_ranks) | set(infer_ranks))

    @classmethod
    def page(cls) -> PageSpec:
        return PageSpec(
            case=("impl", "strategy", "model", "src", "dst", "mode", "backend", "variant"),
            columns=(
                "strategy",
                "model",
                "src",
                "dst",
                "mode",
                "backend",
                "variant",
                "floor_ms",
                "ratio_to_floor",
                "meets_target",
                "verified",
            ),
            rows=_page_rows,
            derive=_page_derive,
            notes=(
                "`floor_ms`: the link floor, the busiest rank's bytes over the link's measured bandwidth; "
                "`ratio_to_floor` = median / floor; `meets_target`: within 1.2× of the floor.",
                "`impl`: `sweepbench` (ours) or `megatron` (megatron-core's refit as a peer); megatron-core "
                "runs its own copy service whatever `strategy` says, so its rows repeat one measurement.",
            ),
        )

    @classmethod
    def headline(cls, cfg: DictConfig) -> list[Headline]:
        return [
            Headline("refit_median_s", "refit median s"),
            Headline("refit_iqr_s", "IQR s"),
            Headline("refit_link_floor_s", "link floor s"),
            Headline("fraction_of_link", "floor/time"),
            Headline("effective_gbps", "effective GB/s"),
        ]

    @classmethod
    def memory_bytes(cls, cfg: DictConfig, world_size: int) -> int:
        """The busiest rank's training and inference shards, two buckets and the link probe's
        buffers (the naive strategy gathers the whole model on one rank)."""
        src, dst = _layouts(cfg)
        shards = max(src.local_bytes(r) + dst.local_bytes(r) for r in {*src.ranks, *dst.ranks})
        gathered = total_bytes(model_param_specs(cfg.model)) if cfg.benchmark.strategy == "naive" else 0
        probe = _probe_bytes(cfg.benchmark, gpu=device_type(cfg) == "cuda")
        return shards + gathered + 2 * cfg.benchmark.bucket_bytes + 2 * probe

    @classmethod
    def plots(cls, jobs: list[dict[str, Any]]) -> list[Plot]:
        """Refit time per layout pair, strategy and mode, against its link floor."""
        from sweepbench.benchmarks.base import Plot
        from sweepbench.draw.plotting import bar_plot, config_value, ok_cases

        times: dict[str, float] = {}
        floors: dict[str, float] = {}
        notes: dict[str, str] = {}
        for job, case in ok_cases(jobs):
            label = (
                f"{config_value(job, 'parallelism.name')}->{config_value(job, 'benchmark.inference')} "
                f"{case.get('impl', 'sweepbench')}:{case['strategy']} {config_value(job, 'mode.name')}"
            )
            times[label] = case["median_s"] * 1e3
            if 0 < case["link_floor_s"] < float("inf"):
                floors[label] = case["link_floor_s"] * 1e3
                notes[label] = f"{case['fraction_of_link']:.2f} of link"
        if not times:
            return []
        fig = bar_plot(
            times, ylabel="refit median (ms)", floor=floors, annotations=notes, width=max(6.4, 0.8 * len(times))
        )
        return [
            Plot(
                "refit time per layout and strategy",
                fig,
                "median refit time; black line: the link floor (the busiest rank's bytes / the faster "
                "of the measured NCCL p2p and copy-engine bandwidths); note: fraction_of_link = floor / time",
            )
        ]

    @classmethod
    def validate(cls, cfg: DictConfig) -> None:
        b = cfg.benchmark
        infer = parse_layout(b.inference, key="benchmark.inference")
        check_layout(cfg.model, as_node(infer, b.inference), where="benchmark.inference")
        check_transfer_options(b, backend=cfg.backend.name)
        train, _, infer, _ = _placements(cfg)
        check_impl(b.impl, train, infer)

    def layouts(self) -> tuple[Layout, Layout]:
        return _layouts(self.ctx.cfg)

    def run(self) -> BenchmarkResult:
        from sweepbench.measure import summarize
        from sweepbench.parallel.link import probe_links
        from sweepbench.measure.progress import case_done

        ctx, cfg = self.ctx, self.cfg
        src, dst = self.layouts()
        strategy = transfer_strategy(ctx.backend, cfg.strategy)
        floor_plan = make_plan(src, dst, balance=cfg.balance)  # what must cross a link, strategy aside
        probe_bytes = _probe_bytes(cfg, gpu=ctx.device.type == "cuda")
        link = probe_links(nbytes=probe_bytes, device=ctx.device)
        case_done(
            "one rank: no link to probe" if link["link_gbps"] is None else f"link probed: {link['link_gbps']:.3g} GB/s",
            total=2,
        )
        run = time_transfer(src, dst, ctx=ctx, cfg=cfg, strategy=strategy, label="refit", impl=cfg.impl)
        case_done(f"refit {cfg.impl}/{strategy} verified and timed", total=2)
        stats = summarize(run.times_s)
        busiest = max(
            max(floor_plan.send_bytes.get(r, 0), floor_plan.recv_bytes.get(r, 0)) for r in range(ctx.world_size)
        )
        floor_s = busiest / (link["link_gbps"] * 1e9) if busiest else 0.0  # the faster of NCCL p2p and copy engines
        case = {
            "impl": cfg.impl,
            "strategy": strategy,
            "method": run.method,
            "balance": cfg.balance,
            "local_allgather": cfg.local_allgather,
            "train_layout": src.describe(),
            "inference_layout": dst.describe(),
            "times_s": run.times_s,
            **stats,
            "warmup": cfg.warmup,
            "iters": cfg.iters,
            "model_bytes": floor_plan.model_bytes,
            "moved_bytes": floor_plan.moved_bytes,
            "local_bytes": floor_plan.local_bytes,
            "busiest_rank_bytes": busiest,
            "wire_bytes": sum(s for s, _ in run.traffic),
            "wire_busiest_rank_bytes": max(max(s, r) for s, r in run.traffic),
            "effective_gbps": busiest / stats["median_s"] / 1e9,
            **link,
            "link_floor_s": floor_s,
            "fraction_of_link": floor_s / stats["median_s"],
            "plan_digest": run.plan_digest,
        }
        summary = {
            k: case[k]
            for k in (
                "median_s",
                "iqr_s",
                "min_s",
                "max_s",
                "model_bytes",
                "moved_bytes",
                "local_bytes",
                "effective_gbps",
                "link_floor_s",
                "fraction_of_link",
            )
        }
        summary = {f"refit_{k}" if k.endswith("_s") else k: v for k, v in summary.items()}
        return BenchmarkResult(cases=[case], summary=summary, verified=run.verified)
