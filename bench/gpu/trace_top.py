"""Summarise a torch.profiler Chrome trace (.pt.trace.json.gz): GPU kernel time by kernel family, to
see what a training step spends its time on.

    python bench/gpu/trace_top.py JOB_DIR/profile/rank0.*.pt.trace.json.gz [--top 25]"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import Counter


def family(name: str) -> str:
    """Group kernels by what they do (GEMMs, attention, elementwise, ...), not by template arguments."""
    rules = [("gemm|cutlass|sm90_xmma|nvjet|cublas", "matmul (GEMM)"), ("flash|fmha|cudnn|sdpa|attention", "attention"),
             ("cross_entropy|log_softmax|nll_loss|softmax", "softmax / cross-entropy"),
             ("adam|multi_tensor|foreach", "optimizer"), ("triton", "triton (compiled fusions)"),
             ("reduce|norm", "reductions / norms"), ("copy|cast|cat|elementwise|vectorized", "elementwise / casts")]
    low = name.lower()
    return next((label for pattern, label in rules if re.search(pattern, low)), "other")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
