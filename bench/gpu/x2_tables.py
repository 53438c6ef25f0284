"""The CSVs and Markdown tables of a results page from the sweeps and twin outputs that
bench/gpu/x2_wave2.sh brought back (its archives unpacked into one or more folders ``.../w``).

    python bench/gpu/x2_tables.py OUT_DIR W_DIR [W_DIR ...]

Writes OUT_DIR/{attention_cp2,attention_cp4,torch_cp_peer_vs_twin,megatron_peer_vs_twin,collective_vs_nccl_tests,
train,refit,fms}.csv for what the folders hold, and prints each table in Markdown (the page's tables
are these, pasted). Every number comes from a verified job's metrics.json or a twin's CSV."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from sweepbench.record.recorder import WALL_PHASES


def jobs(sweep: Path) -> list[dict]:
    """metrics.json of every job of a sweep, in the order results.csv lists them."""
    out = []
    for tag in pd.read_csv(sweep / "results.csv")["tag"].dropna():
        m = sweep / str(tag) / "metrics.json"
        if m.is_file():
            out.append(json.loads(m.read_text()))
    return out


def find(dirs: list[Path], name: str) -> list[Path]:
    return [d / name for d in dirs if (d / name / "results.csv").is_file()]


def md(df: pd.DataFrame) -> str:
    cols = list(df.columns)
    rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    rows += ["| " + " | ".join(str(v) for v in r) + " |" for r in df.itertuples(index=False)]
    return "\n".join(rows)


def attention(dirs: list[Path]) -> pd.DataFrame:
    """One row per verified job; where a job's metrics.json did not come back (a call cut off before
    its archive was written), its results.csv row (no IQR)."""
    rows = []
    sweeps = sorted({d / f.parent.name for d in dirs for f in d.glob("attn*/results.csv")})  # every attention step
    for sweep in sweeps:
        for r in pd.read_csv(sweep / "results.csv").itertuples():
            if r.status != "ok":
                continue
            m = sweep / str(r.tag) / "metrics.json"
            record = json.loads(m.read_text()) if m.is_file() else {}
            c = record["results"]["cases"][0] if record else {}
            # where the job's wall time (records from 0a056c5 on) and its case's went
            went = {**{f"wall_{k}_s": v for k, v in (record.get("wall_phases_s") or {}).items()},
                    **{f"case_{k}_s": v for k, v in (c.get("phase_s") or {}).items()}}
            rows.append({"sweep": sweep.name, "impl": r.impl, "world_size": int(r.world_size),
                         "kv_heads": c["kv_heads"] if c else _kv(sweep),
                         "seq_len": int(r.seq_len), "median_ms": r.total_median_ms,
                         "iqr_ms": c["iqr_s"] * 1e3 if c else float("nan"), "t1_ms": r.t1_ms,
                         "efficiency": r.efficiency, "exposed_comm": r.exposed_comm_fraction,
                         "context_entry_ms": getattr(r, "context_entry_ms", float("nan")), "t1_reused": bool(r.t1_reused),
                         "job_wall_s": r.wall_time_s, "timed_s": r.timed_s, **went})
    return pd.DataFrame(rows)


def _kv(sweep: Path) -> int:
    """kv heads of a job without its metrics.json: the sweep's multirun.yaml override."""
    for line in (sweep / "multirun.yaml").read_text().splitlines():
        if "model.num_kv_heads=" in line:
            return int(line.split("model.num_kv_heads=")[1].split(",")[0].strip(" '\"]"))
    raise ValueError(f"{sweep}: no model.num_kv_heads override")


def attention_table(df: pd.DataFrame) -> pd.DataFrame:
    out = []
    for (kv, seq), g in sorted(df.groupby(["kv_heads", "seq_len"]), key=lambda kg: (-kg[0][0], kg[0][1])):
        by = {r.impl: r for r in g.itertuples()}
        ring = by.get("ring")
        row = {"heads (kv)": f"32 ({kv})", "tokens": f"{seq // 1024}K"}
        for impl in ("ring", "ulysses", "usp", "torch_cp", "allgather"):
            r = by.get(impl)
            if impl == "usp" and not any(i == "usp" for i in df.impl):
                continue  # the hybrid runs at W=4 only
            iqr = "" if r is None or pd.isna(r.iqr_ms) else f" ±{r.iqr_ms:.2f}"
            row[impl] = f"{r.median_ms:.2f} ms{iqr}, {r.efficiency:.3f}" if r else "-"
        for impl in ("ulysses", "usp", "torch_cp"):
            r = by.get(impl)
            if impl == "usp" and "usp" not in row:
                continue
            row[f"{impl} / ring"] = f"{r.median_ms / ring.median_ms:.3f}×" if r and ring else "-"
        row["exposed comm (ring)"] = f"{ring.exposed_comm:.1%}" if ring else "-"
        out.append(row)
    return pd.DataFrame(out)


def torch_cp(dirs: list[Path]) -> pd.DataFrame:
    rows = []
    for d in dirs:
        for twin in sorted(d.glob("torch_cp_twin_r*.csv")):
            r = twin.stem.split("_")[-1]
            peer = d / f"torch_cp_{r}"
            if not (peer / "results.csv").is_file():
                continue
            got = {m["results"]["cases"][0]["seq_len"]: m["results"]["cases"][0]
                   for m in jobs(peer) if m["status"] == "ok"}
            for t in pd.read_csv(twin).itertuples():
                if t.seq_len in got:
                    p = got[t.seq_len]
                    rows.append({"round": r, "seq_len": t.seq_len, "twin_median_ms": t.median_ms,
                                 "twin_iqr_ms": t.iqr_ms, "peer_median_ms": p["median_s"] * 1e3,
                                 "peer_iqr_ms": p["iqr_s"] * 1e3, "peer_context_entry_ms": p["context_entry_s"] * 1e3,
                                 "peer_over_twin": p["median_s"] * 1e3 / t.median_ms})
    return pd.DataFrame(rows)


def megatron(dirs: list[Path]) -> pd.DataFrame:
    rows = []
    for d in dirs:
        for twin in sorted(d.glob("megatron*_twin_r*.csv")):
            case, r = twin.stem.split("_twin_")
            peer = d / f"{case}_{r}"
            ok = [m for m in jobs(peer) if m["status"] == "ok"] if (peer / "results.csv").is_file() else []
            for t in pd.read_csv(twin).itertuples():
                if ok:
                    s = ok[0]["results"]["summary"]
                    rows.append({"case": t.case, "round": r, "twin_median_ms": t.median_s * 1e3,
                                 "twin_iqr_ms": t.iqr_s * 1e3, "peer_median_ms": s["refit_median_s"] * 1e3,
                                 "peer_iqr_ms": s["refit_iqr_s"] * 1e3,
                                 "peer_over_twin": s["refit_median_s"] / t.median_s})
    return pd.DataFrame(rows)


def collective(dirs: list[Path]) -> pd.DataFrame:
    by: dict[tuple, dict] = {}
    for sweep in find(dirs, "coll_vs_nccl_tests"):
        for m in jobs(sweep):
            for c in m["results"]["cases"] if m["status"] == "ok" else []:
                row = by.setdefault((c["op"], c["size_bytes"]), {"op": c["op"], "size_bytes": c["size_bytes"],
                                                                 "dtype": c["dtype"]})
                row[f"{c['impl']}_us"] = c["median_s"] * 1e6
                row[f"{c['impl']}_iqr_us"] = c["iqr_s"] * 1e6
                row[f"{c['impl']}_busbw_gbps"] = c["busbw_gbps"]
    df = pd.DataFrame(sorted(by.values(), key=lambda r: (r["op"], r["size_bytes"])))
    for impl in ("torch", "torch_graph"):
        if f"{impl}_busbw_gbps" in df and "nccl_tests_busbw_gbps" in df:
            df[f"{impl}_ratio"] = df[f"{impl}_busbw_gbps"] / df["nccl_tests_busbw_gbps"]
    return df


def collective_table(df: pd.DataFrame) -> pd.DataFrame:
    def size(b: int) -> str:
        return f"{b >> 30} GiB" if b >= 1 << 30 else f"{b >> 20} MiB"
    out = []
    for op, g in df.groupby("op"):
        row = {"op": op}
        for r in g.itertuples():
            row[size(r.size_bytes)] = (f"{r.torch_busbw_gbps:.1f} / {r.torch_graph_busbw_gbps:.1f} / "
                                       f"{r.nccl_tests_busbw_gbps:.1f} ({r.torch_ratio:.2f}, {r.torch_graph_ratio:.2f})")
        out.append(row)
    return pd.DataFrame(out)


def flat(dirs: list[Path], names: list[str], cols: list[str]) -> pd.DataFrame:
    frames = [pd.read_csv(s / "results.csv").assign(sweep=s.name) for n in names for s in find(dirs, n)]
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    return df[[c for c in ["sweep", *cols] if c in df.columns]]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("dirs", type=Path, nargs="+")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    att = attention(a.dirs)
    tables = {
        **{f"attention_cp{w}": (g, attention_table(g))  # launch.preload=false's rerun: in the phases alone
           for w, g in (att[~att.sweep.str.endswith("_fresh")].groupby("world_size") if len(att) else [])},
        "torch_cp_peer_vs_twin": (t := torch_cp(a.dirs), t.round(3)),
        "megatron_peer_vs_twin": (t := megatron(a.dirs), t.round(3)),
        "collective_vs_nccl_tests": (c := collective(a.dirs), collective_table(c) if "torch_ratio" in c else c),
        "train": (t := flat(a.dirs, ["train_8b", "train_8b_ac_none"],
                            ["parallelism", "ac", "compile", "status", "step_median_s", "step_iqr_s", "mfu_pct",
                             "tokens_per_s_per_gpu", "mem_torch_peak_reserved_gib", "mem_alloc_retries", "loss_first",
                             "loss_last", "verified", "wall_time_s"]), t.round(3)),
        "refit": (t := flat(a.dirs, ["refit_tp2-tp1", "refit_noncoll_tp1-tp1", "refit_tp2-tp1_left",
                                     "refit_tp2-tp1_meg_broadcast", "refit_moe_ep2-ep1", "refit_moe_tp2-tp1",
                                     "refit_moe_tp2-tp1_bcast"],
                            ["mode", "parallelism", "inference", "strategy", "impl", "status", "refit_median_s",
                             "refit_iqr_s", "refit_link_floor_s", "verified", "error"]), t.round(5)),
        "fms": (t := flat(a.dirs, ["fms", "fms_1b", "fms_1b_compile"],
                          ["parallelism", "lora_rank", "ac", "compile", "status", "step_median_s", "step_iqr_s", "mfu_pct",
                           "tokens_per_s_per_gpu", "mem_torch_peak_reserved_gib", "loss_first", "loss_last",
                           "wall_time_s"]), t.round(3)),
    }
    order = [f"wall_{k}_s" for k in WALL_PHASES] + [f"case_{k}_s" for k in (
        "t1_and_reference", "t1_children", "t1_child_start")] + sorted(
        c for c in att.columns if c.startswith("case_t1_first_call_")) + [f"case_{k}_s" for k in (
            "t1_child_reference", "t1_reference_load", "t1_reference", "t1_reference_save", "verify",
            "verify_first_run", "timing")]
    went = [c for c in order if c in att.columns]
    if went:  # where the attention jobs' wall time went (issue 18 section 3)
        phases = att[["sweep", "impl", "seq_len", "t1_reused", "job_wall_s", *went]]
        tables["attention_phases"] = (phases, phases.round(2))
    for name, (data, table) in tables.items():
        if len(data):
            data.to_csv(a.out / f"{name}.csv", index=False)
            print(f"## {name}\n\n{md(table.round(3) if hasattr(table, 'round') else table)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
