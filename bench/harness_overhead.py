"""Harness overhead: an 8-job sweepbench sweep vs the same 8 jobs as bare torchrun commands.

    python bench/harness_overhead.py [--repeats 3] [--out multirun/harness_overhead.json]

Both sides run the smallest collective config (one 1 KiB message, 5 timed iterations) over
parallelism tp1,tp2 x ops all_reduce,broadcast x dtype float32,bfloat16, on gloo. sweepbench's
wall time includes Hydra, validation, tagging, rank spawning, env capture, an offline wandb run per
job, metrics.json, results.csv and the summary table. Target: sweepbench <= 1.25x bare."""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sweepbench.record.atomic import write_atomic

REPO = Path(__file__).resolve().parents[1]
GRID = {"tp": [1, 2], "ops": ["all_reduce", "broadcast"], "dtype": ["float32", "bfloat16"]}
SMALLEST = {"min_bytes": 1024, "max_bytes": 1024, "warmup": 1, "iters": 5}


def run_sweepbench(workdir: Path) -> float:
    cmd = [sys.executable, "-m", "sweepbench", "-m", "benchmark=collective", "parallelism=tp1,tp2",
           "benchmark.ops=[all_reduce],[broadcast]", "benchmark.dtype=float32,bfloat16",
           *(f"benchmark.{k}={v}" for k, v in SMALLEST.items()), f"hydra.sweep.dir={workdir}/sweep"]
    tic = time.perf_counter()
    subprocess.run(cmd, cwd=workdir, check=True, capture_output=True)
    return time.perf_counter() - tic


def run_bare(workdir: Path) -> float:
    tic = time.perf_counter()
    for tp, op, dtype in itertools.product(*GRID.values()):
        bench = {"ops": [op], "dtype": dtype, **SMALLEST}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={tp}",
               str(REPO / "bench" / "bare_collective.py"), json.dumps({"benchmark": bench})]
        subprocess.run(cmd, cwd=workdir, check=True, capture_output=True)
    return time.perf_counter() - tic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("multirun") / "harness_overhead.json")
    args = parser.parse_args()
    times: dict[str, list[float]] = {"sweepbench": [], "torchrun": []}
    for _ in range(args.repeats):  # interleaved, so drift hits both sides alike
        with tempfile.TemporaryDirectory() as d:
            times["sweepbench"].append(run_sweepbench(Path(d)))
        with tempfile.TemporaryDirectory() as d:
            times["torchrun"].append(run_bare(Path(d)))
    med = {k: statistics.median(v) for k, v in times.items()}
    report = {"jobs": 8, "repeats": args.repeats, "wall_s": times, "median_wall_s": med,
              "ratio": med["sweepbench"] / med["torchrun"], "target_ratio": 1.25,
              "command": "python bench/harness_overhead.py --repeats %d" % args.repeats}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(args.out, json.dumps(report, indent=2) + "\n")
    print(f"8 jobs: sweepbench {med['sweepbench']:.1f} s, bare torchrun {med['torchrun']:.1f} s, "
          f"ratio {report['ratio']:.2f} (target <= 1.25)")


if __name__ == "__main__":
    main()
