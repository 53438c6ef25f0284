"""Summarise a torch.profiler Chrome trace (.pt.trace.json.gz): GPU kernel time by kernel family, to
see what a training step spends its time on; with --against, two traces side by side per profiled
step (kernel time by family, the GPU's idle time, and what the host ran while the GPU waited).

    python bench/gpu/trace_top.py JOB_DIR/profile/rank0.*.pt.trace.json.gz [--top 25]
    python bench/gpu/trace_top.py TWIN.pt.trace.json.gz --against PEER.pt.trace.json.gz [--top 12]
    python bench/gpu/trace_top.py JOB.pt.trace.json.gz --gaps --min-gap-us 80   # where each step idles

Per step: the kernels the step's host part launched (its ``ProfilerStep#N`` range, or the annotation
``--step-name`` names: the fms twin marks each Trainer step ``trainer_step``), their span on the GPU
(first start to last end), the time the GPU ran any of them, and idle = span less busy. The host
range's lead (its start to the first kernel's) and tail (the last kernel's end to its end) say what
they name only where the step synchronises at both ends (the twin's timer does; the harness's
profiled steps run back to back, the GPU behind the host)."""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import Counter

import numpy as np


def family(name: str) -> str:
    """Group kernels by what they do (GEMMs, attention, elementwise, ...), not by template arguments."""
    rules = [("gemm|cutlass|sm90_xmma|nvjet|cublas", "matmul (GEMM)"), ("flash|fmha|cudnn|sdpa|attention", "attention"),
             ("cross_entropy|log_softmax|nll_loss|softmax", "softmax / cross-entropy"),
             ("adam|multi_tensor|foreach", "optimizer"), ("triton", "triton (compiled fusions)"),
             ("reduce|norm", "reductions / norms"), ("copy|cast|cat|elementwise|vectorized", "elementwise / casts")]
    low = name.lower()
    return next((label for pattern, label in rules if re.search(pattern, low)), "other")


def busy_intervals(kernels: list[dict]) -> list[tuple[float, float]]:
    """The kernels' [start, end) intervals merged: where the GPU ran anything."""
    merged: list[list[float]] = []
    for e in sorted(kernels, key=lambda e: e["ts"]):
        start, end = e["ts"], e["ts"] + e["dur"]
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def step_ranges(events: list[dict], step_name: str) -> list[tuple[float, float]]:
    """The host's [start, end) of each profiled step: the user annotations named ``step_name`` (a
    trailing ``*``: a prefix, as torch.profiler's ``ProfilerStep#N``), one per name."""
    seen: dict[str, tuple[float, float]] = {}
    for e in events:
        name = str(e.get("name", ""))
        match = name.startswith(step_name[:-1]) if step_name.endswith("*") else name == step_name
        if e.get("cat") == "user_annotation" and "dur" in e and match:
            seen[f"{name}@{e['ts']}" if not step_name.endswith("*") else name] = (e["ts"], e["ts"] + e["dur"])
    return sorted(seen.values())


def step_kernels(events: list[dict], step_name: str) -> list[tuple[tuple[float, float], list[dict]]]:
    """Each profiled step's host range (:func:`step_ranges`) and the kernels it launched (those whose
    launch call, runtime or driver API, falls in that range), in start order."""
    launch = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    kernels = sorted((e for e in events if e.get("cat") == "kernel" and "dur" in e), key=lambda e: e["ts"])
    return [
        ((r0, r1), [k for k in kernels if r0 <= launch.get(k.get("args", {}).get("correlation"), -1) < r1])
        for r0, r1 in step_ranges(events, step_name)
    ]


def per_step(path: str, min_gap_us: float, step_name: str) -> dict:
    """Per profiled step: the GPU work its host part launched (kernels whose launch call falls in the
    step's host range), that work's span (first start to last end), busy and idle time within it, its
    kernel time by family, and the host ops that overlapped its idle gaps."""
    events = json.load(gzip.open(path))["traceEvents"]
    steps = step_kernels(events, step_name)
    if not steps:
        raise SystemExit(f"trace_top: {path} holds no step annotated {step_name!r}")
    ops = [
        e
        for e in events
        if e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver", "user_annotation")
        and "dur" in e
        and not str(e["name"]).startswith("ProfilerStep#")
        and e["name"] != step_name
    ]
    starts = np.array([e["ts"] for e in ops], dtype=float)
    ends = starts + np.array([e["dur"] for e in ops], dtype=float)
    names = [str(e["name"])[:80] for e in ops]
    families, by_name, host, sized = Counter(), Counter(), Counter(), Counter()
    total = {"span": 0.0, "busy": 0.0, "gap_time": 0.0, "gaps": 0, "kernels": 0, "range": 0.0, "lead": 0.0, "tail": 0.0}
    for (r0, r1), mine in steps:
        busy = busy_intervals(mine)
        if not busy:
            continue
        gaps = [(a[1], b[0]) for a, b in zip(busy, busy[1:]) if b[0] - a[1] >= min_gap_us]
        total["span"] += busy[-1][1] - busy[0][0]
        total["range"] += r1 - r0
        total["lead"] += busy[0][0] - r0  # the host's time in the step before its first kernel ran
        total["tail"] += r1 - busy[-1][1]  # after its last kernel (negative: the GPU ran past the host)
        total["busy"] += sum(b - a for a, b in busy)
        total["gap_time"] += sum(b - a for a, b in gaps)
        total["gaps"] += len(gaps)
        total["kernels"] += len(mine)
        for e in mine:
            families[family(e["name"])] += e["dur"]
            by_name[e["name"][:100]] += e["dur"]
            sized[(e["name"][:100], str(e.get("args", {}).get("grid")))] += 1
        for g0, g1 in gaps:
            overlap = np.minimum(g1, ends) - np.maximum(g0, starts)
            for i in np.nonzero(overlap > 0)[0]:
                host[names[i]] += float(overlap[i])
    n = len(steps)
    return {
        "steps": n,
        "window": total["span"] / n,
        "busy": total["busy"] / n,
        "idle": (total["span"] - total["busy"]) / n,
        "gaps": total["gaps"] / n,
        "gap_time": total["gap_time"] / n,
        "families": {k: v / n for k, v in families.items()},
        "names": {k: v / n for k, v in by_name.items()},
        "launches": {k: v / n for k, v in sized.items()},
        "host": {k: v / n for k, v in host.items()},
        "kernels": total["kernels"] / n,
        "range": total["range"] / n,
        "lead": total["lead"] / n,
        "tail": total["tail"] / n,
    }


def side_by_side(a_path: str, b_path: str, top: int, min_gap_us: float, names: tuple[str, str]) -> None:
    a, b = per_step(a_path, min_gap_us, names[0]), per_step(b_path, min_gap_us, names[1])
    print(f"per profiled step, ms: A {a_path} ({a['steps']} steps), B {b_path} ({b['steps']} steps)")
    print(f"  {'':40s} {'A':>9s} {'B':>9s} {'A - B':>9s}")
    rows = [("host range of the step", "range"), ("  its start to the first kernel's", "lead"),
            ("  the last kernel's end to its end", "tail"), ("GPU span of the step's work", "window"), ("GPU busy", "busy"), ("GPU idle", "idle"),
            (f"  of it in gaps >= {min_gap_us:.0f} us", "gap_time")]
    for label, key in rows:
        print(f"  {label:40s} {a[key] / 1e3:9.2f} {b[key] / 1e3:9.2f} {(a[key] - b[key]) / 1e3:9.2f}")
    print(f"  {'kernels launched':40s} {a['kernels']:9.0f} {b['kernels']:9.0f} {a['kernels'] - b['kernels']:9.0f}")
    print(f"  {'gaps':40s} {a['gaps']:9.0f} {b['gaps']:9.0f}")
    print("kernel time by family:")
    fams = sorted(set(a["families"]) | set(b["families"]), key=lambda k: -(a["families"].get(k, 0)))
    for k in fams:
        x, y = a["families"].get(k, 0), b["families"].get(k, 0)
        print(f"  {k:40s} {x / 1e3:9.2f} {y / 1e3:9.2f} {(x - y) / 1e3:9.2f}")
    print(f"kernels whose time differs most (top {top}):")
    diff = Counter({k: a["names"].get(k, 0) - b["names"].get(k, 0) for k in set(a["names"]) | set(b["names"])})
    most = sorted(diff, key=lambda k: -abs(diff[k]))[:top]
    for k in most:
        x, y = a["names"].get(k, 0), b["names"].get(k, 0)
        print(f"  {x / 1e3:9.2f} {y / 1e3:9.2f} {(x - y) / 1e3:9.2f}  {k}")
    print("launches a step of those kernels, by grid, where the two differ:")
    for k in most:
        for (name, grid), x in sorted(a["launches"].items()):
            y = b["launches"].get((name, grid), 0)
            if name == k and x != y:
                print(f"  {x:9.1f} {y:9.1f}  grid {grid}  {name[:60]}")
    for name, d in (("A", a), ("B", b)):
        print(f"host ops overlapping {name}'s idle gaps (ms per step, nested ops each counted):")
        for op, us in Counter(d["host"]).most_common(top):
            print(f"  {us / 1e3:9.2f}  {op}")


def print_gaps(events: list[dict], min_gap_us: float, step_name: str) -> None:
    """Each profiled step's idle gaps of at least ``min_gap_us`` within the GPU work it launched: where
    in the step (ms after its first kernel started), how long, the kernel that ended the wait, and the
    innermost host ops running meanwhile."""
    ops = [e for e in events if e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver") and "dur" in e]
    for i, (_, mine) in enumerate(step_kernels(events, step_name)):
        if not mine:
            continue
        first = mine[0]["ts"]
        print(f"step {i + 1}: gaps >= {min_gap_us:.0f} us in its GPU work (ms into it, us, the kernel after, host ops)")
        end = mine[0]["ts"] + mine[0]["dur"]
        for k in mine[1:]:
            if k["ts"] - end >= min_gap_us:
                inner = sorted((o for o in ops if o["ts"] < k["ts"] and o["ts"] + o["dur"] > end), key=lambda o: o["dur"])
                host = ", ".join(dict.fromkeys(str(o["name"])[:28] for o in inner[:4]))
                print(f"  {(end - first) / 1e3:8.2f} {k['ts'] - end:7.0f}  {k['name'][:44]:44s}  {host}")
            end = max(end, k["ts"] + k["dur"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--against", help="a second trace: both side by side, per profiled step")
    parser.add_argument("--min-gap-us", type=float, default=50.0, help="with --against: idle gaps counted from")
    parser.add_argument("--step-name", default="ProfilerStep#*", help="with --against: the first trace's step annotation")
    parser.add_argument("--against-step-name", default="ProfilerStep#*", help="the second trace's step annotation")
    parser.add_argument("--gaps", action="store_true", help="list each step's idle gaps of at least --min-gap-us")
    args = parser.parse_args()
    if args.against:
        side_by_side(args.trace, args.against, args.top, args.min_gap_us, (args.step_name, args.against_step_name))
        return
    events = json.load(gzip.open(args.trace))["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    total = sum(e["dur"] for e in kernels)
    span = (max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)) if kernels else 0
    print(f"{len(kernels)} kernels, {total / 1e3:.1f} ms of kernel time over a {span / 1e3:.1f} ms window "
          f"({len(steps)} profiled steps): GPU busy {total / max(span, 1):.1%}")
    by_family, by_name = Counter(), Counter()
    for e in kernels:
        by_family[family(e["name"])] += e["dur"]
        by_name[e["name"][:110]] += e["dur"]
    for name, dur in by_family.most_common():
        print(f"  {dur / total:6.1%}  {dur / 1e3:9.1f} ms  {name}")
    print(f"top {args.top} kernels:")
    for name, dur in by_name.most_common(args.top):
        print(f"  {dur / total:6.1%}  {dur / 1e3:9.1f} ms  {name}")
    if args.gaps:
        print_gaps(events, args.min_gap_us, args.step_name)


if __name__ == "__main__":
    main()
