"""Planning speed: how long a dry run of a large grid takes, end to end, as a user runs it.

The grid is the README's fine-tune scenario (``experiment=finetune_fms``: 96 jobs) times 11
sequence lengths = 1056 jobs, each composed, validated, fit-checked and tagged, and the plan
printed. Each repeat is a fresh ``python -m sweepbench ... sweep.dry_run=true`` subprocess
(imports included), timed by the wall clock; the child's CPU seconds (user + sys) are kept too,
and the load average around each repeat, since on a shared machine the wall time also measures
the neighbours. Target: a 1000-job grid planned in <= 30 s on a 2-core machine.

    python bench/plan_speed.py --out multirun/plan_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SEQ_LENS = [512, 1024, 1536, 2048, 2560, 3072, 3584, 4096, 5120, 6144, 8192]
GRIDS = {
    "finetune_fms (README, 96 jobs)": ["experiment=finetune_fms"],
    "finetune_fms x 11 seq_len (1056 jobs)": ["experiment=finetune_fms",
                                              "benchmark.seq_len=" + ",".join(map(str, SEQ_LENS))],
}


def dry_run(args: list[str]) -> dict[str, float | int]:
    """One dry run in a fresh process: wall seconds, the child's CPU seconds, jobs listed."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, "-m", "sweepbench", *args, "sweep.dry_run=true", f"hydra.sweep.dir={tmp}/sweep"]
        load_before = os.getloadavg()[0]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        tic = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=tmp)
        wall = time.perf_counter() - tic
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"plan_speed: the dry run failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    jobs = re.search(r"^(\d+) jobs; each alone:$", proc.stdout, re.M)
    assert jobs, proc.stdout[-2000:]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "jobs": int(jobs.group(1)),
            "load1_before": load_before, "load1_after": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True, help="the JSON record to write")
    opts = parser.parse_args()
    root = Path(__file__).resolve().parents[1]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    record: dict[str, object] = {
        "command": f"python bench/plan_speed.py --repeats {opts.repeats} --out {opts.out}",
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                 cwd=root).stdout.strip(),
        "cpu_cores": os.cpu_count(), "python": sys.version.split()[0], "target": "1000-job grid <= 30 s",
        "grids": {},
    }
    for name, args in GRIDS.items():
        runs = [dry_run(args) for _ in range(opts.repeats)]
        walls = [r["wall_s"] for r in runs]
        cpus = [r["cpu_s"] for r in runs]
        record["grids"][name] = {  # type: ignore[index]
            "args": args, "jobs": runs[0]["jobs"], "median_wall_s": statistics.median(walls),
            "min_wall_s": min(walls), "median_cpu_s": statistics.median(cpus), "runs": runs,
        }
        print(f"{name}: {runs[0]['jobs']} jobs, median {statistics.median(walls):.1f} s wall, "
              f"{statistics.median(cpus):.1f} s CPU (load {runs[0]['load1_before']:.1f})", flush=True)
    sys.path.insert(0, str(root))
    from sweepbench.record.atomic import write_atomic

    opts.out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(opts.out, json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
