"""The training benchmark's report figures, from its jobs' metrics.json dicts: tokens/s per GPU
and MFU against the GPU count (one line per model, layout family and the recipe keys that vary),
and each job's peak memory."""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

from sweepbench.draw.plotting import bar_plot, config_value, line_plot, ok_jobs

RECIPE_KEYS = ("seq_len", "precision", "ac", "compile", "dp_shard", "lora_rank", "global_batch")


def _short(key: str, value: Any) -> str:
    """A recipe value as a plot label shows it: ``ac=full`` -> ``AC full``, ``lora_rank=8`` -> ``LoRA 8``."""
    names = {"seq_len": "S", "ac": "AC", "lora_rank": "LoRA", "global_batch": "GB"}
    if key == "compile":
        return "compiled" if str(value) == "True" else "eager"
    return f"{names[key]} {value}" if key in names else str(value)


def training_plots(jobs: list[dict[str, Any]]) -> list[tuple[str, Figure, str]]:
    """tokens/s per GPU and MFU against the number of GPUs (one line per model, layout family
    and recipe), and the peak memory of each job."""
    done = ok_jobs(jobs)
    if not done:
        return []
    varying = [k for k in RECIPE_KEYS if len({str(j["results"]["summary"].get(k)) for j in done}) > 1]

    def label(job: dict[str, Any], *, layout: bool) -> str:
        s = job["results"]["summary"]
        family = "".join(c for c in str(config_value(job, "parallelism.name")) if not c.isdigit())
        parts = [
            str(config_value(job, "model.name")),
            family if not layout else str(config_value(job, "parallelism.name")),
        ]
        return " ".join(parts + [_short(k, s.get(k)) for k in varying])

    rate: dict[str, list[tuple[float, float]]] = {}
    mfu: dict[str, list[tuple[float, float]]] = {}
    for job in done:
        s = job["results"]["summary"]
        rate.setdefault(label(job, layout=False), []).append((job["world_size"], s["tokens_per_s_per_gpu"]))
        mfu.setdefault(label(job, layout=False), []).append((job["world_size"], s["mfu_pct"]))
    peaks = [j["results"]["summary"].get("peak_tflops") for j in done]
    ceilings = [100 * j["results"]["summary"]["ceiling_tflops"] / p for j, p in zip(done, peaks) if p]
    ceiling = max(ceilings) if ceilings else 100.0  # on a CPU MFU is against the ceiling itself
    gpu = bool(ceilings)
    mem_key = "mem_torch_peak_reserved_gib" if gpu else "mem_host_peak_rss_gib"
    memory = {label(j, layout=True): j["results"]["summary"][mem_key] or 0.0 for j in done}
    width = max(6.4, 0.45 * len(memory))
    nvml = {
        label(j, layout=True): f"NVML {j['results']['summary']['mem_nvml_peak_gib']:.1f}"
        for j in done
        if j["results"]["summary"].get("mem_nvml_peak_gib") is not None
    }
    return [
        (
            "tokens/s per GPU",
            line_plot(rate, xlabel="GPUs (ranks)", ylabel="tokens/s per GPU", log2_x=True),
            "Training throughput per GPU against the job's GPU count; flat lines scale linearly.",
        ),
        (
            "MFU",
            line_plot(
                mfu,
                xlabel="GPUs (ranks)",
                ylabel="MFU %",
                log2_x=True,
                ceiling=ceiling,
                ceiling_label="measured matmul ceiling",
            ),
            "MFU = tokens/s per GPU x 6(N - N_emb) + 6 L H 2 d_head S FLOPs/token / bf16 peak "
            "(on a CPU: / the matmul ceiling the job measured).",
        ),
        (
            "peak memory",
            bar_plot(memory, ylabel="peak GiB per rank", annotations=nvml, width=width, height=4.8),
            "torch allocator's peak reserved memory (on a CPU: peak RSS); NVML's peak above the "
            "job's starting level written above each bar.",
        ),
    ]
