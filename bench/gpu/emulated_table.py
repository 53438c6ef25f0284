"""The lines of bench/gpu/ring_views.sh's emulated.txt as a CSV (one row per process and impl) and a markdown table
of the medians over processes (min-max) per (heads, length, impl, code, rank).

    python bench/gpu/emulated_table.py emulated.txt results.csv      # prints the table"""
from __future__ import annotations

import csv
import re
import statistics
import sys
from collections import defaultdict

LINE = re.compile(r"(?P<round>round\d+|gqa) (?P<code>\w+) (?P<impl>ring|ulysses) W=(?P<w>\d+) rank(?P<rank>\d+) "
                  r"seq=(?P<seq>\d+) kvh=(?P<kvh>\d+): (?:first step (?P<first>[\d.]+) s|compute-only (?P<ms>[\d.]+) ms)")


def main() -> None:
    src, dst = sys.argv[1], sys.argv[2]
    rows: dict[tuple, dict] = {}
    for line in open(src):
        if not (m := LINE.match(line)):
            continue
        g = m.groupdict()
        key = tuple(g[k] for k in ("round", "code", "impl", "w", "rank", "seq", "kvh"))
        row = rows.setdefault(key, dict(zip(("round", "code", "impl", "w", "rank", "seq", "kvh"), key)))
        if g["first"]:
            row["first_step_s"] = float(g["first"])
        else:
            row["compute_ms"] = float(g["ms"])
    fields = ["round", "code", "impl", "w", "rank", "seq", "kvh", "first_step_s", "compute_ms"]
    with open(dst, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows.values())
    groups: dict[tuple, list[float]] = defaultdict(list)
    for r in rows.values():
        if "compute_ms" in r:
            groups[(int(r["kvh"]), int(r["seq"]), r["impl"], r["code"], r["rank"])].append(r["compute_ms"])
    print("| kv heads | length | impl | code | rank | compute ms, median (min-max) | processes |")
    print("|---|---|---|---|---|---|---|")
    for (kvh, seq, impl, code, rank), v in sorted(groups.items(), key=lambda kv: (-kv[0][0], *kv[0][1:])):
        print(f"| {kvh} | {seq // 1024}K | {impl} | {code} | {rank} | {statistics.median(v):.2f} "
              f"({min(v):.2f}-{max(v):.2f}) | {len(v)} |")


if __name__ == "__main__":
    main()
