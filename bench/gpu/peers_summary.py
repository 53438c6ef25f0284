"""Summarise bench/gpu/peers_interleaved.sh's archive: each round's standalone twin against the in-harness
peer, one row per (peer, case, round, side), and the markdown table of docs/results/peers_1gpu_*.

    python bench/gpu/peers_summary.py R_DIR --out docs/results/peers_1gpu_h100/peers.csv
R_DIR is the archive's r/ folder (tar xzf peers.tgz)."""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path


def megatron_rows(r: Path) -> list[dict]:
    rows = []
    for twin in sorted(r.glob("megatron*_twin_r*.csv")):  # megatron{case index, W=2}_twin_r{round}.csv
        c, n = twin.stem.split("_twin_r")
        t = next(csv.DictReader(twin.open()))
        rows.append({"peer": "megatron-core refit", "case": t["case"], "round": n, "side": "twin",
                     "times_ms": [float(x) * 1e3 for x in t["times_s"].split(";")], "verified": True})
        for side, folder in (("harness", f"{c}_r{n}"), ("harness, GC on while timing", f"{c}_gc_on_r{n}")):
            for path in sorted(r.glob(f"{folder}/*/metrics.json")):
                m = json.loads(path.read_text())
                case = m["results"]["cases"][0]
                rows.append({"peer": "megatron-core refit", "case": t["case"], "round": n, "side": side,
                             "times_ms": [x * 1e3 for x in case["times_s"]], "verified": m["verified"]})
    return rows


def torch_cp_rows(r: Path) -> list[dict]:
    rows = []
    for twin in sorted(r.glob("torch_cp_twin_r*.csv")):
        n = twin.stem.rsplit("_r", 1)[1]
        for t in csv.DictReader(twin.open()):
            case = f"W={t['world_size']} L={t['seq_len']} {t['heads']}x{t['head_dim']} {t['dtype']} causal fwd+bwd"
            rows.append({"peer": "torch context_parallel", "case": case, "round": n, "side": "twin",
                         "times_ms": [float(x) for x in t["times_ms"].split()], "verified": True})
            for path in sorted(r.glob(f"torch_cp_r{n}/attention-*-{t['seq_len']}_*/metrics.json")):
                m = json.loads(path.read_text())
                times = [x * 1e3 for x in m["results"]["cases"][0]["times_s"]]
                rows.append({"peer": "torch context_parallel", "case": case, "round": n, "side": "harness",
                             "times_ms": times, "verified": m["verified"]})
    return rows


def stats(times: list[float]) -> dict:
    q = statistics.quantiles(times, n=4)
    return {"median_ms": statistics.median(times), "iqr_ms": q[2] - q[0], "min_ms": min(times), "max_ms": max(times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("r_dir", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = megatron_rows(args.r_dir) + torch_cp_rows(args.r_dir)
    table = [{**{k: v for k, v in row.items() if k != "times_ms"}, **stats(row["times_ms"]),
              "n": len(row["times_ms"]), "times_ms": ";".join(f"{x:.3f}" for x in row["times_ms"])} for row in rows]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    print("| peer | case | round | twin median (IQR) | harness median (IQR) | harness / twin |")
    print("|---|---|---|---|---|---|")
    for row in table:
        if row["side"] != "twin":
            continue
        for h in (x for x in table if x["side"] != "twin" and (x["peer"], x["case"], x["round"]) == (row["peer"], row["case"], row["round"])):
            label = "" if h["side"] == "harness" else f" ({h['side']}, max {h['max_ms']:.1f})"
            print(f"| {row['peer']} | {row['case']} | {row['round']}{label} | {row['median_ms']:.2f} ({row['iqr_ms']:.2f}) "
                  f"| {h['median_ms']:.2f} ({h['iqr_ms']:.2f}) | {h['median_ms'] / row['median_ms']:.3f} |")


if __name__ == "__main__":
    main()
