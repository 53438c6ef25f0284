"""False alarms and power of ``sweepbench compare`` on the CPU.

Pair i is three sweeps run one after the other, the same config each time:
  base_i:  benchmark=collective model=tiny backend=gloo parallelism=tp1,tp2 benchmark.iters=30 sweep.repeats=3
  twin_i:  the same again
  slow_i:  the same with fault.kind=slow fault.factor=1.5
then ``sweepbench compare base_i twin_i --fail-on-regression`` (target: no `slower`, no `faster`)
and ``sweepbench compare base_i slow_i --fail-on-regression`` (target: `slower`, exit 1). Writes
OUT.json and OUT.md. ``--grid`` replaces the sweep's overrides; ``--busy N`` keeps N cores busy
with a load generator (a Python busy loop per core) for the whole run.

    PYTHONPATH=$PWD nohup python bench/compare_noise.py --pairs 10 --work /tmp/compare_noise \\
        --out multirun/compare_noise_cpu > /tmp/compare_noise.log 2>&1 &

Resumable: a sweep whose results.csv says every job is ok is not run again (rerun the same
command after a stop); the comparisons are always recomputed from the sweeps on disk.

``--interleave``: the three sweeps of a pair take turns round by round, as a user alternates two
checkouts on one machine: base, twin and slow each run rounds 1-2 (``sweep.repeats=2``), then each
adds round 3 (``sweep.repeats=3``: resume runs only the round not yet done), and so on up to
``--repeats``. Every side's rounds then span the same minutes, so a change of the machine between
sweeps falls on all three alike instead of on one side."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pandas as pd

GRID = ["benchmark=collective", "model=tiny", "backend=gloo", "parallelism=tp1,tp2"]
SLOW = ["fault.kind=slow", "fault.factor=1.5"]


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def sweep_args(args: argparse.Namespace, kind: str, repeats: int = 0) -> list[str]:
    grid = args.grid.split() if args.grid else GRID
    return [*grid, f"benchmark.iters={args.iters}", f"sweep.repeats={repeats or args.repeats}",
            *(SLOW if kind == "slow" else [])]


def complete(sweep_dir: Path) -> bool:
    csv = sweep_dir / "results.csv"
    return csv.exists() and len(t := pd.read_csv(csv)) > 0 and bool((t["status"] == "ok").all())


def run_sweep(args: argparse.Namespace, sweep_dir: Path, kind: str, repeats: int = 0) -> dict:
    if not repeats and complete(sweep_dir):  # its combined records rebuilt from its rounds by this checkout's code
        from sweepbench.sweep.rounds import write_combined

        tags = [p.name for p in sweep_dir.iterdir() if (p / "rounds").is_dir()]
        write_combined(sweep_dir, tags, repeats=args.repeats, crashed={})
        return {"dir": str(sweep_dir), "ran": False}
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    argv = [sys.executable, "-m", "sweepbench", "-m", *sweep_args(args, kind, repeats), f"hydra.sweep.dir={sweep_dir}"]
    before, tic = load(), time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    info = {"dir": str(sweep_dir), "ran": True, "rc": proc.returncode, "wall_s": round(time.monotonic() - tic, 1),
            "load_before": before, "load_after": load()}
    if proc.returncode != 0:
        info["stderr_tail"] = proc.stderr[-2000:]
    print(f"  {kind}: rc {proc.returncode} in {info['wall_s']} s (load {before} -> {info['load_after']})", flush=True)
    return info


def compare(base: Path, cand: Path, out: Path) -> dict:
    argv = [sys.executable, "-m", "sweepbench", "compare", str(base), str(cand), "-o", str(out), "--fail-on-regression"]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode not in (0, 1, 3, 4):  # the gate's codes: pass, regression, not judged, undecided
        return {"rc": proc.returncode, "error": proc.stderr[-2000:]}
    table = pd.read_csv(out / "compare.csv")
    counts = Counter(table["verdict"])
    flagged = table[table["verdict"].isin(["slower", "faster"])]
    return {"cases": len(table), "counts": dict(counts), "gate_rc": proc.returncode,
            "gate": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "",
            "basis": sorted(set(table.get("basis", pd.Series(dtype=str)).dropna())),
            "ratio_min": float(table["ratio"].min()), "ratio_max": float(table["ratio"].max()),
            "flagged": [f"{r.verdict} {r.candidate_tag} {r.case} ratio {r.ratio:.3f} p {r.p_value:.2g} q {q:.2g}"
                        for r, q in zip(flagged.itertuples(), flagged.get("q_value", pd.Series(float("nan"), flagged.index)))],
            # the twin cases nearest to a verdict: the smallest q (or p) of the comparison
            "nearest": [f"{r.verdict} {r.case} ratio {r.ratio:.3f} p {r.p_value:.2g} q {r.q_value:.2g}"
                        for r in table.nsmallest(3, "q_value").itertuples()] if "q_value" in table else []}


def markdown(summary: dict) -> str:
    lines = [f"# compare on identical CPU sweeps: false alarms and power", "",
             f"Command: `{summary['command']}`", "",
             f"Each pair: base, twin (same config) and slow (`{' '.join(SLOW)}`) sweeps of "
             f"`{' '.join(summary['sweep'])}`, "
             + ("taking turns round by round (`--interleave`: base, twin and slow each add one round per turn); "
                if summary.get("interleave") else "run one after the other; ")
             + f"`sweepbench compare base twin` and `sweepbench compare base slow`. compare's rule (docs/reports.md): the ratio beyond the noise "
             f"threshold and a t-test on the rounds whose p, adjusted over the comparison's cases "
             f"(Benjamini-Hochberg q), is < 0.01.", "",
             f"- pairs: {summary['pairs']} of {summary['pairs_asked']} asked, cases per comparison: "
             f"{summary['cases_per_pair']}",
             f"- **false alarms** (slower/faster in base vs twin): {summary['false_alarms']} of "
             f"{summary['twin_cases']} cases (target 0)",
             f"- **power** (slower in base vs slow): {summary['slow_found']} of {summary['slow_cases']} cases "
             f"({summary['power']:.1%}); pairs where the slow sweep is found slower (cases slower, none "
             f"faster): {summary['pairs_slower']} of {summary['pairs']}; pairs with every case slower: "
             f"{summary['pairs_all_slower']} of {summary['pairs']}",
             f"- twin pairs with no `slower` and no `faster`: {summary.get('twin_pairs_clean')} of {summary['pairs']}",
             f"- `--fail-on-regression` exit codes (0 pass, 1 regression, 3 not judged, 4 undecided): twin "
             f"{_codes(summary, 'twin')}; slow {_codes(summary, 'slow')}",
             f"- sweeps' wall time: {summary['sweep_wall_s']:.0f} s in all; load average (1, 5, 15 min) per sweep "
             f"in the JSON, here at the start {summary['load_start']} and end {summary['load_end']} of the last "
             f"invocation ({summary.get('cpu_count')} cores, {summary.get('busy_cores', 0)} kept busy by a load "
             f"generator, shared with other work)", "",
             "| pair | twin verdicts | slow verdicts | twin ratio range | slow ratio range | gate exit twin / slow |",
             "|---|---|---|---|---|---|"]
    for p in summary["per_pair"]:
        t, s = p["twin"], p["slow"]
        fmt = lambda c: ", ".join(f"{k} {v}" for k, v in sorted(c.get("counts", {}).items()))  # noqa: E731
        lines.append(f"| {p['pair']} | {fmt(t)} | {fmt(s)} | {t.get('ratio_min', 0):.2f}-{t.get('ratio_max', 0):.2f} "
                     f"| {s.get('ratio_min', 0):.2f}-{s.get('ratio_max', 0):.2f} "
                     f"| {t.get('gate_rc', '')} / {s.get('gate_rc', '')} |")
    flagged = [f"- pair {p['pair']}: {f}" for p in summary["per_pair"] for f in p["twin"].get("flagged", [])]
    if flagged:
        lines += ["", "False alarms:", *flagged]
    nearest = [f"- pair {p['pair']}: {n}" for p in summary["per_pair"] for n in p["twin"].get("nearest", [])[:1]]
    if nearest:
        lines += ["", "Each twin comparison's case nearest to a verdict (smallest q):", *nearest]
    return "\n".join(lines) + "\n"


def _codes(summary: dict, side: str) -> str:
    codes = summary.get("gate_rcs", {}).get(side, {})
    return ", ".join(f"{k}: {v} pairs" for k, v in sorted(codes.items(), key=lambda kv: str(kv[0]))) or "none"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--grid", default="", help=f"the sweep's overrides (default: {' '.join(GRID)})")
    parser.add_argument("--busy", type=int, default=0, help="cores kept busy by a load generator during the run")
    parser.add_argument("--interleave", action="store_true",
                        help="the pair's three sweeps take turns round by round (see the module docstring)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/compare_noise"), help="where the sweeps go")
    parser.add_argument("--out", type=Path, default=Path("multirun/compare_noise_cpu"),
                        help="OUT.json and OUT.md are written")
    args = parser.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        run_pairs(args)
    finally:
        for proc in busy:  # the load generators this run started, by pid
            proc.kill()
            proc.wait()


def run_pairs(args: argparse.Namespace) -> None:
    tic, load_start = time.monotonic(), load()
    earlier = {}  # a resumed run keeps what the run that made a sweep measured (its wall time, load)
    if Path(f"{args.out}.json").exists():
        old = json.loads(Path(f"{args.out}.json").read_text())
        earlier = {(p["pair"], k): v for p in old.get("per_pair", []) for k, v in p["sweeps"].items() if v.get("ran")}
    per_pair = []
    for i in range(1, args.pairs + 1):
        print(f"pair {i}/{args.pairs}", flush=True)
        dirs = {k: args.work / f"pair{i:02d}" / k for k in ("base", "twin", "slow")}
        if args.interleave and not all(complete(d) for d in dirs.values()):
            turns = [{k: run_sweep(args, d, k, repeats=r) for k, d in dirs.items()} for r in range(2, args.repeats + 1)]
            sweeps = {k: {"dir": str(d), "ran": True, "turns": [t[k] for t in turns],
                          "wall_s": round(sum(t[k].get("wall_s", 0) for t in turns), 1),
                          "rc": max(t[k].get("rc", 0) for t in turns)} for k, d in dirs.items()}
        else:
            sweeps = {k: run_sweep(args, d, k) for k, d in dirs.items()}
        sweeps = {k: v if v["ran"] else earlier.get((i, k), v) for k, v in sweeps.items()}
        twin = compare(dirs["base"], dirs["twin"], dirs["twin"])
        slow = compare(dirs["base"], dirs["slow"], dirs["slow"])
        print(f"  twin: {twin.get('counts')}; slow: {slow.get('counts')}", flush=True)
        per_pair.append({"pair": i, "sweeps": sweeps, "twin": twin, "slow": slow})
        write(args, per_pair, tic=tic, load_start=load_start)  # after every pair: a stop keeps what is done
    print(markdown(summarize(args, per_pair, tic=tic, load_start=load_start)))


def summarize(args: argparse.Namespace, per_pair: list[dict], *, tic: float, load_start: str) -> dict:
    twin_cases = sum(p["twin"].get("cases", 0) for p in per_pair)
    slow_cases = sum(p["slow"].get("cases", 0) for p in per_pair)
    found = sum(p["slow"].get("counts", {}).get("slower", 0) for p in per_pair)
    return {
        "command": shlex.join(["python", "bench/compare_noise.py", *sys.argv[1:]]),
        "sweep": sweep_args(args, "base"), "pairs": len(per_pair), "pairs_asked": args.pairs,
        "cases_per_pair": per_pair[0]["twin"].get("cases") if per_pair else 0,
        "false_alarms": sum(p["twin"].get("counts", {}).get(v, 0) for p in per_pair for v in ("slower", "faster")),
        "twin_cases": twin_cases, "slow_cases": slow_cases, "slow_found": found,
        "power": found / slow_cases if slow_cases else 0.0,
        "pairs_all_slower": sum(1 for p in per_pair if p["slow"].get("cases")
                                and p["slow"]["counts"].get("slower", 0) == p["slow"]["cases"]),
        # the slow sweep found slower (some cases slower, none faster)
        "pairs_slower": sum(1 for p in per_pair if p["slow"].get("counts", {}).get("slower", 0)
                            and not p["slow"]["counts"].get("faster", 0)),
        "twin_pairs_clean": sum(1 for p in per_pair if not any(p["twin"].get("counts", {}).get(v, 0)
                                                               for v in ("slower", "faster"))),
        "gate_rcs": {"twin": Counter(p["twin"].get("gate_rc") for p in per_pair),
                     "slow": Counter(p["slow"].get("gate_rc") for p in per_pair)},
        "busy_cores": args.busy, "cpu_count": os.cpu_count(), "interleave": args.interleave,
        "sweep_wall_s": sum(v.get("wall_s", 0) for p in per_pair for v in p["sweeps"].values()),
        "wall_s": time.monotonic() - tic, "load_start": load_start, "load_end": load(), "per_pair": per_pair,
    }


def write(args: argparse.Namespace, per_pair: list[dict], *, tic: float, load_start: str) -> None:
    summary = summarize(args, per_pair, tic=tic, load_start=load_start)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.json").write_text(json.dumps(summary, indent=2) + "\n")
    Path(f"{args.out}.md").write_text(markdown(summary))

if __name__ == "__main__":
    main()
