"""The in-harness torch_cp next to its standalone twin on one machine: the same shape (Llama-3 8B
attention, 32 heads of 128, --kv-heads 32 = MHA or 8 = GQA-8), bf16, batch 1, causal fwd+bwd, the
same SDPA backend, ranks (--nproc), warm-up and iterations; prints harness / twin per length.

    python bench/peers/torch_cp_pair.py --out DIR                          # MHA, 16K-128K, 2 ranks
    python bench/peers/torch_cp_pair.py --out DIR --kv-heads 8 16384 32768
    python bench/peers/torch_cp_pair.py --out DIR --nproc 4 --rounds 3 16384 32768 65536

--rounds R interleaves the two sides, twin then harness, R times, so that a drift of the machine
falls on both. Writes DIR/peer_kv{N}_r{i}.csv (bench/peers/torch_cp.py), DIR/harness_kv{N}_r{i}/
(the sweep: results.csv) and DIR/pair_kv{N}.csv (seq_len, harness_ms, peer_ms, ratio, and each
round's two medians); a side's figure is the median of its rounds' medians. Exit 1 if a side
failed or a ratio is off by more than --tolerance (the target: 3%)."""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def harness_command(args: argparse.Namespace, sweep_dir: Path) -> list[str]:
    return [sys.executable, "-m", "sweepbench", "-m", "benchmark=attention", "model=llama3_8b",
            f"model.num_kv_heads={args.kv_heads}", f"parallelism=cp{args.nproc}", "backend=nccl", "benchmark.impl=torch_cp",
            "benchmark.batch_size=1", "benchmark.dtype=bfloat16", f"benchmark.sdpa_backend={args.backend}",
            f"benchmark.warmup={args.warmup}", f"benchmark.iters={args.iters}", "benchmark.t1_iters=2",
            f"benchmark.seq_len={','.join(map(str, args.seq_lens))}", f"hydra.sweep.dir={sweep_dir}"]


def peer_command(args: argparse.Namespace, out: Path) -> list[str]:
    return [sys.executable, str(HERE / "torch_cp.py"), *map(str, args.seq_lens), "--kv-heads", str(args.kv_heads),
            "--backend", args.backend, "--nproc", str(args.nproc), "--warmup", str(args.warmup), "--iters", str(args.iters), "--out", str(out)]


def medians(path: Path, column: str) -> dict[int, float]:
    with path.open() as f:
        return {int(r["seq_len"]): float(r[column]) for r in csv.DictReader(f) if r.get("status", "ok") == "ok"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("seq_lens", type=int, nargs="*", default=[16384, 32768, 65536, 131072])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--kv-heads", type=int, default=32)
    p.add_argument("--backend", default="cudnn")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--nproc", type=int, default=2, help="ranks on each side (the harness's parallelism=cp<N>)")
    p.add_argument("--rounds", type=int, default=1, help="twin then harness, this many times")
    p.add_argument("--tolerance", type=float, default=0.03)
    args = p.parse_args()
    for name, value, least in (("--rounds", args.rounds, 1), ("--nproc", args.nproc, 2), ("--iters", args.iters, 1)):
        if value < least:
            p.error(f"{name} {value}: valid is an integer >= {least}")
    if not args.seq_lens or any(n <= 0 or n % (2 * args.nproc) for n in args.seq_lens):
        p.error(f"sequence lengths {args.seq_lens}: valid are positive multiples of 2 x --nproc ({2 * args.nproc})")
    args.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **GPU_ENV}
    peer: dict[int, list[float]] = {n: [] for n in args.seq_lens}
    harness: dict[int, list[float]] = {n: [] for n in args.seq_lens}
    for r in range(1, args.rounds + 1):
        peer_csv, sweep_dir = args.out / f"peer_kv{args.kv_heads}_r{r}.csv", args.out / f"harness_kv{args.kv_heads}_r{r}"
        for cmd in (peer_command(args, peer_csv), harness_command(args, sweep_dir)):
            print("+", " ".join(cmd), flush=True)
            rc = subprocess.run(cmd, env=env).returncode
            if rc:
                print(f"exit {rc}: {' '.join(cmd)}", file=sys.stderr)
                return 1
        got_peer, got_harness = medians(peer_csv, "median_ms"), medians(sweep_dir / "results.csv", "total_median_ms")
        for n in args.seq_lens:
            peer[n].append(got_peer[n])
            harness[n].append(got_harness[n])
    rows, off = [], []
    for n in args.seq_lens:
        h, t = statistics.median(harness[n]), statistics.median(peer[n])
        ratio = h / t
        rounds = {f"r{i + 1}_{side}_ms": ms for i in range(args.rounds) for side, ms in
                  (("harness", harness[n][i]), ("peer", peer[n][i]))}
        rows.append({"seq_len": n, "harness_ms": h, "peer_ms": t, "ratio": ratio, **rounds})
        each = ", ".join(f"{a:.3f}/{b:.3f}" for a, b in zip(harness[n], peer[n]))
        print(f"L={n}: harness {h:.3f} ms, twin {t:.3f} ms, ratio {ratio:.4f} (rounds, harness/twin: {each})",
              flush=True)
        if abs(ratio - 1) > args.tolerance:
            off.append(n)
    pair = args.out / f"pair_kv{args.kv_heads}.csv"
    with pair.with_name(f".{pair.name}.tmp").open("w", newline="") as f:  # renamed whole: atomic
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    os.replace(pair.with_name(f".{pair.name}.tmp"), pair)
    if off:
        print(f"off by more than {args.tolerance:.0%}: {off}", file=sys.stderr)
    return 1 if off else 0


if __name__ == "__main__":
    sys.exit(main())
