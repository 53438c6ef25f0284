"""torch's context-parallel SDPA timed on its own, without sweepbench: the standalone twin of the
harness's ``benchmark.impl=torch_cp``, timed as torch's users run it.

    python bench/peers/torch_cp.py 16384 32768 65536 131072 --out torch_cp.csv          # spawns 2 ranks
    torchrun --standalone --nproc-per-node 2 bench/peers/torch_cp.py 16384 --out torch_cp.csv
    python bench/peers/torch_cp.py 16384 32768 --kv-heads 8 --out torch_cp_gqa.csv        # GQA-8

Per sequence length: q, k, v and the output gradient of the whole sequence (batch 1, 32 heads of
128 by default, bf16, the same on every rank from --seed) are handed to
``context_parallel(mesh, buffers=[q, k, v, dout])``, which shards them in place (its head-tail
load balancer); inside that one open context (and one ``sdpa_kernel(--backend)``) come --warmup
iterations, then --iters timed ones of causal forward+backward, each between CUDA events after a
synchronize and a barrier (host clock on CPU); an iteration's time is the slowest rank's. GQA kv
heads are repeated to the query heads inside the step (torch's ring then rotates all heads), as
the harness does. Prints median/IQR/min/max per length; --out gets a CSV.

The harness's backend for torch_cp is ``benchmark.sdpa_backend``; its default ``auto`` takes T1's
fastest single-device backend (cuDNN on an H200): pass the backend the harness's metrics.json
shows as ``sdpa_backend`` (or pin both: ``benchmark.sdpa_backend=cudnn`` and ``--backend cudnn``).
``--device cpu`` checks the plumbing on gloo at tiny sizes (torch's CP attention has no CPU
kernel: see ``plumbing_attention``)."""

from __future__ import annotations

import argparse
import csv
import os
import socket
import statistics
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

KERNELS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
           "math": "MATH"}
COLUMNS = ["seq_len", "world_size", "heads", "kv_heads", "head_dim", "batch", "dtype", "backend", "rotate_method",
           "warmup", "iters", "median_ms", "iqr_ms", "p25_ms", "p75_ms", "min_ms", "max_ms", "times_ms"]


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("seq_lens", type=int, nargs="+", help="tokens of the whole sequence (each divisible by 2*ranks)")
    p.add_argument("--nproc", type=int, default=2, help="ranks to spawn when not started by torchrun")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=0, help="GQA kv heads (default: --heads, MHA)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--backend", default="cudnn", choices=list(KERNELS),
                   help="SDPA kernel (the harness's sdpa_backend; auto there = T1's fastest, cudnn on H200)")
    p.add_argument("--rotate-method", default="allgather", choices=["allgather", "alltoall"])
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--out", default="", help="CSV file to write (rank 0)")
    args = p.parse_args(argv)
    args.kv_heads = args.kv_heads or args.heads
    if args.heads % args.kv_heads:
        p.error(f"--kv-heads {args.kv_heads} must divide --heads {args.heads}")
    return args


def quantile(xs: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), as the harness's statistics."""
    xs = sorted(xs)
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def plumbing_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool) -> torch.Tensor:
    """--device cpu only: torch's CP attention has no CPU kernel (no sharding strategy for the CPU
    flash op), so the CPU check runs everything else (ranks, the context and its in-place sharding,
    the timing loop, the slowest rank, the CSV) around this rank-local causal attention in matmuls."""
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    mask = torch.ones(s.shape[-2:], dtype=torch.bool).tril() if is_causal else None
    return (s.masked_fill(~mask, float("-inf")) if is_causal else s).softmax(-1) @ v


def time_one(args: argparse.Namespace, seq_len: int, device: torch.device) -> list[float]:
    """Per-iteration seconds of causal fwd+bwd, slowest rank, under one open context."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method
    from torch.nn.attention import SDPBackend, sdpa_kernel

    world = dist.get_world_size()
    dtype = getattr(torch, args.dtype)
    g = torch.Generator(device=device).manual_seed(args.seed)
    b, h, kv, d = args.batch, args.heads, args.kv_heads, args.head_dim
    q, k, v, dout = (torch.randn(s, generator=g, device=device, dtype=dtype)
                     for s in ((b, h, seq_len, d), (b, kv, seq_len, d), (b, kv, seq_len, d), (b, h, seq_len, d)))
    mesh = init_device_mesh(device.type, (world,))
    set_rotate_method(args.rotate_method)
    cuda = device.type == "cuda"

    attend = F.scaled_dot_product_attention if cuda else plumbing_attention

    def step() -> None:
        for x in (q, k, v):
            x.grad = None
        ke, ve = (x if kv == h else x.repeat_interleave(h // kv, dim=1) for x in (k, v))
        out = attend(q, ke, ve, is_causal=True)
        out.backward(dout)

    times = []
    buffers = [q, k, v, dout]
    with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2] * 4, no_restore_buffers=set(buffers)), \
            sdpa_kernel(getattr(SDPBackend, KERNELS[args.backend])):
        q, k, v = (x.detach().requires_grad_() for x in (q, k, v))  # sharded in place on entry: this rank's tokens
        for _ in range(args.warmup):
            step()
        for _ in range(args.iters):
            if cuda:
                torch.cuda.synchronize(device)
            dist.barrier()
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                step()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                import time

                tic = time.perf_counter()
                step()
                times.append(time.perf_counter() - tic)
        assert q.shape[2] == seq_len // world and all(torch.isfinite(x.grad).all() for x in (q, k, v))
    t = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def row(args: argparse.Namespace, seq_len: int, times: list[float]) -> dict[str, object]:
    ms = [t * 1e3 for t in times]
    p25, p75 = quantile(ms, 0.25), quantile(ms, 0.75)
    return {"seq_len": seq_len, "world_size": dist.get_world_size(), "heads": args.heads, "kv_heads": args.kv_heads,
            "head_dim": args.head_dim, "batch": args.batch, "dtype": args.dtype, "backend": args.backend,
            "rotate_method": args.rotate_method, "warmup": args.warmup, "iters": args.iters,
            "median_ms": statistics.median(ms), "iqr_ms": p75 - p25, "p25_ms": p25, "p75_ms": p75,
            "min_ms": min(ms), "max_ms": max(ms), "times_ms": " ".join(f"{x:.4f}" for x in ms)}


def write_csv(path: str, rows: list[dict[str, object]]) -> None:
    """Atomically: a reader sees the old file or the whole new one."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    with os.fdopen(fd, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def run(rank: int, world: int, args: argparse.Namespace) -> None:
    cuda = args.device == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world, timeout=timedelta(minutes=10),
                            device_id=device if cuda else None)
    rows = []
    try:
        for seq_len in args.seq_lens:
            r = row(args, seq_len, time_one(args, seq_len, device))
            rows.append(r)
            if rank == 0:
                print(f"torch_cp W={world} L={seq_len} {args.heads}x{args.head_dim} kv={args.kv_heads} "
                      f"{args.dtype} {args.backend}: median {r['median_ms']:.3f} ms, IQR {r['iqr_ms']:.3f} ms "
                      f"(min {r['min_ms']:.3f}, max {r['max_ms']:.3f}; {args.iters} iters after {args.warmup} "
                      f"warm-up)", flush=True)
            if cuda:
                torch.cuda.empty_cache()
        if rank == 0 and args.out:
            write_csv(args.out, rows)
            print(f"wrote {args.out}", flush=True)
    finally:
        dist.destroy_process_group()


def main(argv: list[str]) -> None:
    args = parse(argv)
    world = int(os.environ.get("WORLD_SIZE", args.nproc))
    for n in args.seq_lens:
        if n <= 0 or n % (2 * world):
            print(f"torch_cp.py: error: sequence length {n} must be a positive multiple of 2 x ranks = {2 * world}",
                  file=sys.stderr)
            sys.exit(2)
    if "RANK" in os.environ:  # started by torchrun
        run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    mp.spawn(run, args=(world, args), nprocs=world)


if __name__ == "__main__":
    main(sys.argv[1:])
