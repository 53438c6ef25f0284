"""The attention benchmark's report figures, from its jobs' metrics.json dicts: speedup and
efficiency against the ring size (with the ideal), peak memory per rank against the ring size, and
a sequence length x ring size heatmap of efficiency, one series per impl (and model/pattern)."""

from __future__ import annotations

from typing import Any

from matplotlib.figure import Figure

Series = dict[str, list[tuple[float, float]]]


def _label(job: dict[str, Any], case: dict[str, Any]) -> str:
    from sweepbench.draw.plotting import config_value

    model = config_value(job, "model.name", "?")
    return f"{case['impl']} {model} {case['pattern']} kv{case['kv_heads']}"


def scaling_plots(jobs: list[dict[str, Any]]) -> list[tuple[str, Figure, str]]:
    from sweepbench.draw.plotting import heatmap, line_plot, ok_cases

    cases = list(ok_cases(jobs))
    if not cases:
        return []
    longest = max(c["seq_len"] for _, c in cases)
    speedup: Series = {}
    efficiency: Series = {}
    memory: Series = {}
    for job, c in cases:
        if c["seq_len"] != longest:
            continue
        label = _label(job, c)
        speedup.setdefault(label, []).append((c["world_size"], c["t1_s"] / c["median_s"]))
        efficiency.setdefault(label, []).append((c["world_size"], c["efficiency"]))
        peak = max((r.get("peak_allocated_bytes") or r.get("host_max_rss_bytes") or 0) for r in c["per_rank"])
        memory.setdefault(label, []).append((c["world_size"], peak / 2**30))
    sizes = sorted({c["world_size"] for _, c in cases})
    if len(sizes) < 2:  # one ring size: no axis to draw against (the report plots what the sweep varied)
        return []
    figs = [
        (
            f"Speedup over one device @{longest} tokens",
            line_plot(
                speedup,
                xlabel="ring size W",
                ylabel="T1 / T_W",
                log2_x=True,
                ideal=[(w, float(w)) for w in sizes],
                ideal_label="ideal (W)",
            ),
            "T1: the whole sequence on one device with its fastest SDPA backend, measured in the same job.",
        ),
        (
            f"Scaling efficiency @{longest} tokens",
            line_plot(
                efficiency,
                xlabel="ring size W",
                ylabel="T1 / (W T_W)",
                log2_x=True,
                ideal=[(w, 1.0) for w in sizes],
                ideal_label="ideal (1)",
            ),
            "Efficiency = T1 / (W x T_W), fwd+bwd (or fwd only) of the slowest rank.",
        ),
        (
            f"Peak memory per rank @{longest} tokens",
            line_plot(memory, xlabel="ring size W", ylabel="GiB (busiest rank)", log2_x=True),
            "torch's peak allocated memory after a reset (GPU); host max RSS on a CPU.",
        ),
    ]
    for impl in sorted({c["impl"] for _, c in cases}):
        mine = [c for _, c in cases if c["impl"] == impl]
        seqs = sorted({c["seq_len"] for c in mine})
        grid = [
            [next((c["efficiency"] for c in mine if c["seq_len"] == s and c["world_size"] == w), None) for w in sizes]
            for s in seqs
        ]
        figs.append(
            (
                f"Efficiency of {impl}: sequence length x ring size",
                heatmap(
                    grid,
                    rows=[str(s) for s in seqs],
                    cols=[str(w) for w in sizes],
                    xlabel="ring size W",
                    ylabel="tokens",
                    cbar_label="efficiency",
                    fmt="{:.2f}",
                ),
                "Blank: not measured (or the job failed).",
            )
        )
    return figs
