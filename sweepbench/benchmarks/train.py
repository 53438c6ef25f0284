"""Training throughput of a parallel layout: tokens/s (global and per GPU), MFU, step times,
loss and memory per rank, after the layout is shown to train the same model as one device.

The engine is ``sweepbench/train/`` (model, layouts, verification, measurement); this plugin reads
the config, calls it, and turns its report into the job's result. MFU is torchtitan's:
FLOPs/token = 6(N - N_emb) + 6·L·H·2·d_head·S, times tokens/s per GPU, over the GPU's bf16 dense
peak (on a CPU, over the matmul ceiling the job measures, since no CPU peak is tabled)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from omegaconf import DictConfig

from sweepbench.benchmarks.base import Benchmark, BenchmarkResult, Headline, PageSpec, Plot
from sweepbench.benchmarks.registry import register
from sweepbench.config.schema import BenchmarkConfig
from sweepbench.core import NotOnThisMachine
from sweepbench.parallel.specs import ModelShape
from sweepbench.train.config import TrainJob, TrainKnobs

GIB = float(1 << 30)


@dataclass
class TrainConfig(TrainKnobs, BenchmarkConfig):
    """The train engine's knobs (``train.config.TrainKnobs``: types, defaults, meanings) and every
    benchmark's fields, as this benchmark's Hydra schema."""

    name: str = "train"


_CASTS = {"int": int, "float": float, "bool": bool, "str": str}  # TrainKnobs' field types


def build_job(cfg: DictConfig) -> TrainJob:
    """The train engine's config of this job, built once: each knob cast to its declared type, the
    model read as every engine reads it, the layout's degrees."""
    b, p = cfg.benchmark, cfg.parallelism
    knobs = TrainKnobs(**{f.name: _CASTS[str(f.type)](b[f.name]) for f in fields(TrainKnobs)})
    return TrainJob(
        knobs=knobs,
        warmup=int(b.warmup),
        iters=int(b.iters),
        model=ModelShape.from_config(cfg.model),
        layout=str(p.name),
        tp=int(p.tp),
        pp=int(p.pp),
        dp=int(p.dp),
        cp=int(p.cp),
        ep=int(p.ep),
    )


def _gib(x: Any) -> float | None:
    return None if x is None else x / GIB


def _max(per_rank: list[dict[str, Any]], key: str) -> Any:
    values = [m[key] for m in per_rank if m.get(key) is not None]
    return max(values) if values else None


# MFU targets (%), by (model, layout, seq_len, ac, precision, compile); None: any value of that field
MFU_TARGETS = {
    ("llama3_1b", "tp1", 8192, "none", "bf16", False): 50.0,
    ("llama3_1b", "tp1", 8192, "none", "bf16", True): 55.0,
    ("llama3_1b", "tp1", 8192, "none", "mixed", False): 46.0,
    ("llama3_1b", "tp1", 8192, "none", "mixed", True): 53.0,
    ("llama3_8b", "dp2", 8192, None, None, None): 50.0,
}


def _page_derive(rows: list[dict[str, Any]], pool: list[dict[str, Any]]) -> None:
    for r in rows:
        have = (r["model"], r["layout"], int(r["seq_len"]), r["ac"], r["precision"], str(r["compile"]) == "True")
        for key, target in MFU_TARGETS.items():
            if r.get("mfu_pct") and all(k is None or k == h for k, h in zip(key, have)):
                r["mfu_target"], r["meets_target"] = target, float(r["mfu_pct"]) >= target


def _variant(s: dict[str, Any], *, pp: int) -> str:
    """What sets a job's layout recipe apart from the default one (empty for it): TP without
    sequence parallel or with async TP, a pipeline schedule or micro-batch count other than 1F1B
    over pp micro-batches, fp8's scaling, a quantized base, fused kernels, padding-free batches;
    so the page keeps such runs as cases of their own."""
    parts = ["no SP"] if s.get("tp_sp") is False else []
    if s.get("async_tp"):
        parts.append("async TP")
    if s.get("pp_schedule") and (s["pp_schedule"] != "1f1b" or s["grad_accum"] != pp):
        parts.append(f"{s['pp_schedule']}, {s['grad_accum']} micro-batches")
    if s.get("fp8_recipe"):
        parts.append(f"fp8 {s['fp8_recipe']}")
    if s.get("quant") not in (None, "none"):  # the fine-tune recipe knobs (train/recipe.py)
        parts.append(f"{s['quant']} base")
    if s.get("fused") not in (None, "none"):
        parts.append(f"{s['fused']} kernels")
    if s.get("padding_free"):
        parts.append("padding-free")
    if s.get("documents") and not s.get("padding_free"):
        parts.append("padded documents")
    if (s.get("steps_per_sample") or 1) > 1:
        parts.append(f"timed {s['steps_per_sample']} steps back to back")
    return ", ".join(parts)


def _page_rows(job: dict[str, Any]) -> list[dict[str, Any]]:
    cfg, (c, *_) = job["config"], job["results"]["cases"]
    s = job["results"]["summary"]
    impl = s.get("impl", "ours")  # ours is "sweepbench" on the pages, as in every benchmark's
    return [
        {
            "impl": "sweepbench" if impl == "ours" else impl,
            "world_size": job["world_size"],
            "model": cfg["model"]["name"],
            "layout": c["layout"],
            "variant": _variant(s, pp=int(cfg["parallelism"]["pp"])),
            "dp_shard": s["dp_shard"],
            "seq_len": c["seq_len"],
            "ac": s["ac"],
            "compile": s["compile"],
            "precision": c["precision"],
            "lora_rank": s["lora_rank"],
            "iters": c["iters"],
            "median_ms": c["median_s"] * 1e3,
            "iqr_ms": c["iqr_s"] * 1e3,
            "tokens_per_s_per_gpu": s["tokens_per_s_per_gpu"],
            "mfu_pct": c["mfu_pct"],
            "peak_allocated_gib": s.get("mem_torch_peak_allocated_gib"),
            "nvml_peak_gib": s.get("mem_nvml_peak_gib"),
        }
    ]


@register("train")
class TrainBenchmark(Benchmark):
    schema = TrainConfig
    tag_keys = ("seq_len", "ac", "compile", "precision", "dp_shard", "lora_rank", "impl")
    tag_groups = ("model", "parallelism", "backend")
    keeps_ranks = True  # step medians and peaks the same kept or fresh (train_h200x1 sweep_time runs)
    rank_imports = ("torch._dynamo",)  # torch.optim's optimizers import it as they are made: ~1 s a rank

    @classmethod
    def keeps_ranks_for(cls, cfg: DictConfig) -> bool:
        # one rank only: on 4 GPUs every 4-rank job run in kept ranks died at its start (rank 0,
        # SIGSEGV) where the same jobs in new processes ran (docs/running.md)
        from sweepbench.train.impls import PEERS

        peer = PEERS.get(cfg.benchmark.impl)
        return cls.keeps_ranks and cls.world_size(cfg) == 1 and not (peer and peer.own_process)

    @classmethod
    def validate(cls, cfg: DictConfig) -> None:
        from sweepbench.config.validate import device_type
        from sweepbench.train.context import check_cp
        from sweepbench.train.impls import PEERS
        from sweepbench.train.plan import check_device, check_plan
        from sweepbench.train.recipe import check_recipe, check_recipe_device

        job = build_job(cfg)
        plan = check_plan(job)
        device = device_type(cfg)
        check_cp(job, plan, device)
        check_recipe(job.knobs, plan)
        peer = PEERS.get(job.knobs.impl)
        if peer and peer.own_process and cfg.launch.get("keep_ranks"):
            raise ValueError(
                f"launch.keep_ranks=true with benchmark.impl={job.knobs.impl}: {peer.own_process}, so its "
                f"job runs in a process of its own; leave launch.keep_ranks unset or false"
            )
        if why := check_recipe_device(job.knobs, device):
            raise NotOnThisMachine(why)
        if why := check_device(job, plan, device):
            raise NotOnThisMachine(why)
        if job.knobs.compile and plan.tp > 1 and device == "cpu":
            # torch 2.13 on CPU: a DTensor redistribute's backward gets a plain tensor from a
            # compiled block ('Tensor' object has no attribute '_local_tensor')
            raise NotOnThisMachine(
                f"benchmark.compile=true with parallelism.tp={plan.tp} fails on a CPU (torch "
                f"{_torch_version()}: DTensor backward through a compiled block); use compile=false "
                f"with tp on a CPU, or compile with dp/pp/cp layouts"
            )

    @classmethod
    def world_size(cls, cfg: DictConfig) -> int:
        p = cfg.parallelism
        return p.tp * p.pp * p.cp * p.dp

    @classmethod
    def memory_bytes(cls, cfg: DictConfig, world_size: int) -> int:
        """A rank's peak: the single-device reference it verifies against, or its share of the
        layout (DDP: the whole model per rank), activations included (``train.plan.rank_bytes``)."""
        from sweepbench.config.validate import device_type, visible_gpu_memory
        from sweepbench.train.plan import rank_bytes

        gpu = min(visible_gpu_memory(), default=0) if device_type(cfg) == "cuda" else None
        return rank_bytes(build_job(cfg), device_bytes=gpu or None)

    @classmethod
    def page(cls) -> PageSpec:
        return PageSpec(
            case=(
                "impl",
                "model",
                "layout",
                "variant",
                "dp_shard",
                "seq_len",
                "ac",
                "compile",
                "precision",
                "lora_rank",
            ),
            columns=(
                "model",
                "layout",
                "variant",
                "dp_shard",
                "seq_len",
                "ac",
                "compile",
                "precision",
                "lora_rank",
                "tokens_per_s_per_gpu",
                "mfu_pct",
                "peak_allocated_gib",
                "nvml_peak_gib",
                "mfu_target",
                "meets_target",
                "verified",
            ),
            rows=_page_rows,
            derive=_page_derive,
            notes=(
                "`median_ms`: one optimizer step; `mfu_pct` by torchtitan's formula, 6·(N − N_embedding) + "
                "6·L·H·2·d_head·S FLOPs per token, against the GPU's dense bf16 peak.",
                "Memory two ways, the most of any rank: `peak_allocated_gib`, torch's allocator peak; "
                "`nvml_peak_gib`, the device's used memory as NVML reports it, sampled apart from the step, "
                "above the level the job started at (empty where the run did not record it). Below "
                "`peak_allocated_gib` only in older runs: jobs run in a kept rank before "
                "`train_h200x1_2026-11-29_nvml_kept_ranks` (cuBLAS's workspaces kept a segment of the job before "
                "reserved, which the job reused unseen: that run's notes), and `train_h200x2_2026-11-27_llama3_8b` "
                "(its sampler read other GPUs: its notes).",
                "`mfu_target`: llama3_1b on one GPU at 8192 tokens, no activation checkpointing: 50% eager and "
                "55% compiled with bf16 weights, 46% and 53% with fp32 master weights (mixed); llama3_8b dp2 at "
                "8192 tokens: 50%.",
            ),
        )

    @classmethod
    def headline(cls, cfg: DictConfig) -> list[Headline]:
        b = cfg.benchmark
        at = f"@seq {b.seq_len}"
        return [
            Headline("tokens_per_s_per_gpu", f"tokens/s per GPU {at}"),
            Headline("mfu_pct", f"MFU % {at}"),
            Headline("step_median_s", "step median s"),
            Headline("mem_torch_peak_reserved_gib", "peak reserved GiB (torch)"),
            Headline("mem_nvml_peak_gib", "peak used GiB (NVML)"),
        ]

    def run(self) -> BenchmarkResult:
        import torch.distributed as dist

        from sweepbench.train.run import run_training

        ctx = self.ctx
        job = build_job(ctx.cfg)
        r = run_training(job, rank=ctx.rank, device=ctx.device, job_dir=ctx.job_dir)
        per_rank: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(per_rank, r["memory"])
        stats, plan = r["stats"], r["plan"]
        on_peak = r["peak_flops"] is not None
        mfu = r["achieved_flops"] / (r["peak_flops"] if on_peak else r["ceiling_flops"])
        b = job.knobs
        summary = {  # the recipe first (results.csv columns), then the rates, then memory
            "seq_len": plan.seq_len,
            "global_batch": plan.global_batch,
            "micro_batch": plan.micro_batch,
            "grad_accum": plan.num_micro,
            "precision": plan.precision,
            "ac": b.ac,
            "compile": b.compile,
            "dp_shard": b.dp_shard,
            "lora_rank": b.lora_rank,
            "verify_layers": r["verify_layers"],
            **{k: r["recipe"][k] for k in ("impl", "quant", "fused", "padding_free", "documents")},
            "tp_sp": b.tp_sp if plan.tp > 1 else None,
            "async_tp": b.async_tp if plan.tp > 1 else None,
            "fp8_recipe": b.fp8_recipe if plan.precision == "fp8" else None,
            "pp_schedule": b.pp_schedule if plan.pp > 1 else None,
            "pp_bubble": r["pp_bubble"]["analytic"] if plan.pp > 1 else None,
            "pp_bubble_schedule": r["pp_bubble"]["schedule"],
            "tokens_per_s": r["tokens_per_s"],
            "tokens_per_s_per_gpu": r["tokens_per_s"] / ctx.world_size,
            "mfu_pct": 100 * mfu,
            "fraction_of_ceiling": r["achieved_flops"] / r["ceiling_flops"],
            "achieved_tflops_per_gpu": r["achieved_flops"] / 1e12,
            "ceiling_tflops": r["ceiling_flops"] / 1e12,
            "peak_tflops": r["peak_flops"] / 1e12 if on_peak else None,
            "steps_per_sample": b.steps_per_sample,  # 1: each step timed alone; k: k back to back, per step
            "step_median_s": stats["median_s"],
            "step_iqr_s": stats["iqr_s"],
            "step_min_s": stats["min_s"],
            "step_max_s": stats["max_s"],
            "loss_first": r["first_loss"],
            "loss_last": r["last_loss"],
            "lr": r["lr"],  # the adapters' with LoRA (train/run.py: lora_lr)
            "mem_torch_peak_active_gib": _gib(_max(per_rank, "peak_active_bytes")),
            "mem_torch_peak_allocated_gib": _gib(_max(per_rank, "peak_allocated_bytes")),
            "mem_torch_peak_reserved_gib": _gib(_max(per_rank, "peak_reserved_bytes")),
            "mem_nvml_peak_gib": _gib(_max(per_rank, "nvml_peak_bytes")),
            "mem_alloc_retries": _max(per_rank, "alloc_retries"),
            "mem_ooms": _max(per_rank, "ooms"),
            "mem_host_peak_rss_gib": _gib(_max(per_rank, "host_peak_rss_bytes")),
        }
        case = {
            "layout": job.layout,
            "times_s": r["times_s"],
            **stats,
            "warmup": job.warmup,
            "iters": job.iters,
            "steps_per_sample": b.steps_per_sample,
            "loss_per_step": r["losses"],
            "tokens_per_step": plan.tokens_per_step,
            "global_batch": plan.global_batch,
            "micro_batch": plan.micro_batch,
            "grad_accum": plan.num_micro,
            "seq_len": plan.seq_len,
            "precision": plan.precision,
            "tokens_per_s": r["tokens_per_s"],
            "mfu_pct": 100 * mfu,
        }
        basis = mfu_basis(r["device_name"], r["peak_flops"], r["ceiling_flops"], precision=plan.precision)
        extra = {
            "precision": plan.precision,
            "mfu_basis": basis,
            "flops_per_token": r["flops_per_token"],
            "mfu_formula": "6*(N - N_embedding) + 6*L*H*2*d_head*S FLOPs/token (LoRA: frozen weights 4)",
            "num_params": r["shape"].num_params(lora_rank=b.lora_rank),
            "num_trainable": r["num_trainable"],
            "verification": {
                "steps": len(r["reference_losses"]),
                "reference_losses": r["reference_losses"],
                "layout_losses": r["verified_losses"],
                "max_rel_err": r["verify_max_rel_err"],
                "grad_norm": r["grad_norm"],
                "reference_grad_norm": r["reference_grad_norm"],
                "grad_norm_rel_err": r["grad_norm_rel_err"],
                "layers": r["verify_layers"],
                "reduced_depth": r["verify_layers"] != r["shape"].num_layers,
                "note": _verify_note(r["verify_layers"], r["shape"].num_layers, forced=bool(b.verify_layers)),
                "loss_first": r["first_loss"],
                "loss_last": r["last_loss"],
            },
            "memory_per_rank": per_rank,
            "files": r["files"],
            "context_parallel": r["cp"],
            "recipe": r["recipe"],
            "sampling": r["sampling"],
        }
        return BenchmarkResult(cases=[case], summary=summary, verified=True, extra=extra)

    @classmethod
    def work_per_step(cls, job: dict[str, Any], case: dict[str, Any]) -> tuple[float, str] | None:
        """Tokens per step per GPU: dp2 and pp2 step through more sequences than tp2 or cp2."""
        tokens, ranks = case.get("tokens_per_step"), job.get("world_size")
        return (tokens / ranks, "tokens") if isinstance(tokens, (int, float)) and ranks else None

    @classmethod
    def plots(cls, jobs: list[dict[str, Any]]) -> list[Plot]:
        from sweepbench.train.plots import training_plots

        return [Plot(title, fig, caption) for title, fig, caption in training_plots(jobs)]


def _torch_version() -> str:
    from importlib.metadata import version

    return version("torch")


def mfu_basis(device: str, peak_flops: float | None, ceiling_flops: float, *, precision: str) -> str:
    """What a job's MFU divides by, in words: the tabled bf16 peak (for fp8 too, as torchtitan
    counts it), else the matmul ceiling the job measured."""
    if peak_flops is None:
        return (
            f"no peak is tabled for {device}: MFU is taken against the matmul ceiling "
            f"measured in this job ({ceiling_flops / 1e12:.3g} TFLOP/s)"
        )
    also = ", fp8 steps measured against it as torchtitan does" if precision == "fp8" else ""
    return f"bf16 dense peak of {device} ({peak_flops / 1e12:.0f} TFLOP/s, table{also})"


def _verify_note(layers: int, full: int, *, forced: bool) -> str:
    if layers == full:
        return "verified at full depth against the single-device reference"
    why = "benchmark.verify_layers asks for it" if forced else "the full model does not fit one device"
    return (
        f"{why}: the layout was verified at reduced depth ({layers} of {full} layers, same widths) against "
        f"its single-device reference, then the full model was timed from its first step"
    )
