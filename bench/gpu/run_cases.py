"""Run GPU cases kept as data (a YAML list of sweepbench overrides) and report each sweep.

    python bench/gpu/run_cases.py bench/gpu/cases_8gpu.yaml --out DIR [--cpu]

With --cpu every case runs at model=tiny on gloo (plus its `cpu` overrides): the check that a
GPU case works before a GPU machine is booked; a case with `gpu_only: <why>` is not run there. Exit 1 if any sweep did not finish ok."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def case_command(case: dict, *, out: Path, cpu: bool) -> list[str]:
    extra = ["model=tiny", "backend=gloo", *case.get("cpu", [])] if cpu else []
    return [sys.executable, "-m", "sweepbench", "-m", *case["overrides"], *extra,
            f"hydra.sweep.dir={out / case['name']}"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cpu", action="store_true", help="run every case at model=tiny on gloo")
    args = parser.parse_args()
    spec = OmegaConf.to_container(OmegaConf.load(args.cases))
    env = {**os.environ, **GPU_ENV}
    failed, not_run = [], []
    for case in spec["cases"]:
        if args.cpu and case.get("gpu_only"):
            print(f"{case['name']}: not run on a CPU ({case['gpu_only']})", flush=True)
            not_run.append(case["name"])
            continue
        proc = subprocess.run(case_command(case, out=args.out, cpu=args.cpu), env=env,
                              capture_output=True, text=True)
        print(f"{case['name']}: exit {proc.returncode} ({args.out / case['name'] / 'results.csv'})", flush=True)
        if proc.returncode:
            failed.append(case["name"])
            print(proc.stderr[-2000:], file=sys.stderr)
    print(f"{len(spec['cases']) - len(failed) - len(not_run)} passed, {len(failed)} failed"
          + (f", {len(not_run)} skipped" if not_run else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
