"""Run GPU cases kept as data (a YAML list of sweepbench overrides) and report each sweep.

    python bench/gpu/run_cases.py bench/gpu/cases_8gpu.yaml --out DIR [--cpu] [--case NAME ...]
        [--archive FILE.tar] [--timeout SECONDS] [--deadline SECONDS]

With --cpu every case runs at model=tiny on gloo (plus its `cpu` overrides): the check that a
GPU case works before a GPU machine is booked; a case with `gpu_only: <why>` is not run there.
A case is either a sweep (`overrides`) or a command (`command`: a list of arguments, `{out}` being
the case's own output folder, `{python}` this interpreter; `cpu_command` replaces it with --cpu),
such as a peer's standalone twin or a `sweepbench compare` of earlier cases.
--case runs only the cases named, in the order named; --archive appends each case's folder to a
tar file as soon as the case ends, so what finished is kept if a later case is stopped; --timeout
stops a case (SIGTERM to its process group, SIGKILL 30 s later) that runs longer; --deadline bounds
all the cases together (a case is stopped at it, and the rest are listed as not run).
Exit 1 if any case did not finish ok."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from omegaconf import OmegaConf

GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def case_command(case: dict, *, out: Path, cpu: bool) -> list[str]:
    """The argv of one case: a sweep of its overrides, or its own command."""
    if "command" in case:
        argv = case.get("cpu_command", case["command"]) if cpu else case["command"]
        return [str(a).format(out=out / case["name"], python=sys.executable, root=out) for a in argv]
    extra = ["model=tiny", "backend=gloo", *case.get("cpu", [])] if cpu else []
    return [
        sys.executable,
        "-m",
        "sweepbench",
        "-m",
        *case["overrides"],
        *extra,
        f"hydra.sweep.dir={out / case['name']}",
    ]


def run_one(argv: list[str], env: dict[str, str], timeout: float | None, log: Path) -> int:
    """Run a case in its own process group (its ranks with it), its output in ``log``; stop it at ``timeout``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        proc = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"  stopped after {timeout:.0f} s (SIGTERM to its process group)", flush=True)
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                return proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                return proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cpu", action="store_true", help="run every case at model=tiny on gloo")
    parser.add_argument("--case", action="append", default=[], help="run only this case (repeatable)")
    parser.add_argument("--archive", type=Path, help="append each finished case's folder to this tar file")
    parser.add_argument("--timeout", type=float, help="stop a case that runs longer than this many seconds")
    parser.add_argument(
        "--deadline",
        type=float,
        help="seconds for all the cases: a case still running then is stopped, and cases not yet started are not run",
    )
    args = parser.parse_args()
    spec = OmegaConf.to_container(OmegaConf.load(args.cases))
    known = [c["name"] for c in spec["cases"]]
    unknown = [n for n in args.case if n not in known]
    if unknown:
        print(f"run_cases: no case {unknown[0]!r} in {args.cases}; cases: {', '.join(known)}", file=sys.stderr)
        return 2
    by_name = {c["name"]: c for c in spec["cases"]}
    cases = [by_name[n] for n in args.case] if args.case else spec["cases"]
    env = {**os.environ, **GPU_ENV}
    failed, not_run = [], []
    begin = time.monotonic()
    for case in cases:
        left = args.deadline - (time.monotonic() - begin) if args.deadline else None
        if left is not None and left < 1:
            print(f"{case['name']}: not run (the {args.deadline:.0f} s deadline passed)", flush=True)
            not_run.append(case["name"])
            continue
        timeout = min((t for t in (args.timeout, left) if t is not None), default=None)
        if args.cpu and case.get("gpu_only"):
            print(f"{case['name']}: not run on a CPU ({case['gpu_only']})", flush=True)
            not_run.append(case["name"])
            continue
        log = args.out / "logs" / f"{case['name']}.log"
        if "command" in case:  # a sweep makes its own folder; a command gets it made
            (args.out / case["name"]).mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        rc = run_one(case_command(case, out=args.out, cpu=args.cpu), env, timeout, log)
        print(f"{case['name']}: exit {rc} in {time.monotonic() - start:.1f} s ({args.out / case['name']})", flush=True)
        if rc:
            failed.append(case["name"])
            print(log.read_text()[-2000:], file=sys.stderr)
        if args.archive:
            with tarfile.open(args.archive, "a") as tar:
                if (args.out / case["name"]).exists():
                    tar.add(args.out / case["name"], arcname=case["name"])
                tar.add(log, arcname=f"logs/{log.name}")
    print(
        f"{len(cases) - len(failed) - len(not_run)} passed, {len(failed)} failed"
        + (f", {len(not_run)} not run: {' '.join(not_run)}" if not_run else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
