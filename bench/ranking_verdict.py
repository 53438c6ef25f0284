"""Whether a default sweep's ranking names its winner with a verdict: run one sweep several times
(default: the attention sweep on CPU with the benchmark's default iterations) and record, per run
and group, the winner, the runner-up's ratio, the verdict, its p and, where it did not decide,
why. Writes OUT.json and OUT.md.

    PYTHONPATH=$PWD python bench/ranking_verdict.py --runs 3 --work /tmp/ranking_verdict \\
        --out multirun/ranking_verdict_attention_cpu
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

GRID = ["benchmark=attention", "model=tiny", "backend=gloo", "parallelism=cp2", "benchmark.impl=ring,ulysses",
        "benchmark.seq_len=512,1024"]


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_once(grid: list[str], sweep_dir: Path) -> dict:
    from sweepbench.report.answer import answer_jobs
    from sweepbench.report.load import load_sweep

    shutil.rmtree(sweep_dir, ignore_errors=True)
    env = {**os.environ, "WANDB_MODE": "disabled"}
    before, tic = load(), time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "sweepbench", "-m", *grid, f"hydra.sweep.dir={sweep_dir}"],
                          env=env, capture_output=True, text=True)
    info = {"rc": proc.returncode, "wall_s": round(time.monotonic() - tic, 1), "load_before": before,
            "load_after": load(), "groups": []}
    if proc.returncode != 0:
        info["stderr_tail"] = proc.stderr[-2000:]
        return info
    for answer in answer_jobs(load_sweep(sweep_dir).jobs):
        for r in answer.rankings:
            if len(r.entries) < 2:
                continue
            v = r.verdict
            info["groups"].append({
                "benchmark": answer.benchmark, "where": r.where, "fastest": r.entries[0].label,
                "fastest_median_s": r.entries[0].median_s, "runner_up": r.entries[1].label,
                "runner_up_median_s": r.entries[1].median_s, "ratio": r.entries[1].median_s / r.entries[0].median_s,
                "verdict": v.verdict if v else "", "p_value": v.p_value if v else None,
                "threshold": v.threshold if v else None, "n": [v.n_baseline, v.n_candidate] if v else None,
                "reason": (v.reason if v else r.note), "gap": r.gap()})
    return info


def markdown(summary: dict) -> str:
    lines = ["# Does a default sweep's ranking name its winner?", "",
             f"Command: `{summary['command']}`", "",
             f"Each run: `sweepbench -m {' '.join(summary['grid'])}` (the benchmark's default iterations), then "
             f"the ranking of its answer (runner-up against winner, compare's rule on the samples of one process "
             f"per job: ratio beyond 1 + max(0.05, 2 x the winner's noise) and Mann-Whitney p < 0.002).", "",
             f"- runs: {len(summary['runs'])}; groups ranked: {summary['groups']}",
             f"- groups with a gap of 1.5x or more: {summary['wide']}; of those named with `slower`: "
             f"{summary['wide_slower']}",
             f"- verdicts over all groups: {summary['verdicts']}",
             f"- {summary['cpu_count']} cores, shared with other work; load average (1, 5, 15 min) before and "
             f"after each run in the table", "",
             "| run | where | fastest | runner-up | ratio | verdict | p | why not decided | load before -> after |",
             "|---|---|---|---|---|---|---|---|---|"]
    for n, run in enumerate(summary["runs"], start=1):
        for g in run["groups"]:
            p = "" if g["p_value"] is None else f"{g['p_value']:.2g}"
            lines.append(f"| {n} | {g['where']} | {g['fastest']} | {g['runner_up']} | {g['ratio']:.2f} | "
                         f"{g['verdict']} | {p} | {g['reason']} | {run['load_before']} -> {run['load_after']} |")
        if run["rc"] != 0:
            lines.append(f"| {n} | (sweep exited {run['rc']}) | | | | | | | |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--grid", default="", help=f"the sweep's overrides (default: {' '.join(GRID)})")
    parser.add_argument("--work", type=Path, default=Path("/tmp/ranking_verdict"))
    parser.add_argument("--out", type=Path, default=Path("multirun/ranking_verdict_attention_cpu"))
    args = parser.parse_args()
    grid = args.grid.split() if args.grid else GRID
    runs = []
    for i in range(1, args.runs + 1):
        runs.append(run_once(grid, args.work / f"run{i:02d}"))
        print(f"run {i}: rc {runs[-1]['rc']}, " + "; ".join(g["gap"] for g in runs[-1]["groups"]), flush=True)
    groups = [g for r in runs for g in r["groups"]]
    wide = [g for g in groups if g["ratio"] >= 1.5]
    verdicts: dict[str, int] = {}
    for g in groups:
        verdicts[g["verdict"]] = verdicts.get(g["verdict"], 0) + 1
    summary = {"command": shlex.join(["python", "bench/ranking_verdict.py", *sys.argv[1:]]), "grid": grid,
               "runs": runs, "groups": len(groups), "wide": len(wide),
               "wide_slower": sum(1 for g in wide if g["verdict"] == "slower"), "verdicts": verdicts,
               "cpu_count": os.cpu_count()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.json").write_text(json.dumps(summary, indent=2) + "\n")
    Path(f"{args.out}.md").write_text(markdown(summary))
    print(markdown(summary))


if __name__ == "__main__":
    main()
