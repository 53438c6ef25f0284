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
the harness does. The last timed output is checked before the times count: gathered from every
rank into sequence order and compared with one device's SDPA on the whole sequence (same kernel,
--atol); a run that attended only its own shard fails there. Prints median/IQR/min/max and the
error per length; --out gets a CSV.

The harness's backend for torch_cp is ``benchmark.sdpa_backend``; its default ``auto`` takes T1's
fastest single-device backend (cuDNN on an H200): pass the backend the harness's metrics.json
shows as ``sdpa_backend`` (or pin both: ``benchmark.sdpa_backend=cudnn`` and ``--backend cudnn``).
``--device cpu`` checks the plumbing on gloo at tiny sizes (torch's CP attention has no CPU
kernel: see ``plumbing_attention``, an exact all-gather CP attention in its place)."""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import socket
import statistics
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

KERNELS = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
           "math": "MATH"}
COLUMNS = ["seq_len", "world_size", "heads", "kv_heads", "head_dim", "batch", "dtype", "backend", "rotate_method",
           "warmup", "iters", "max_abs_err", "median_ms", "iqr_ms", "p25_ms", "p75_ms", "min_ms", "max_ms", "times_ms"]


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
    p.add_argument("--atol", type=float, default=None,
                   help="largest absolute error of the output against one device's SDPA (default 2e-2; fp32 1e-4)")
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


def head_tail(xs: list[torch.Tensor], dim: int = 2) -> torch.Tensor:
    """The whole sequence from each rank's shard under torch's head-tail load balancer: the sequence
    is cut in 2W chunks, rank r holds chunks r and 2W-1-r (in that order)."""
    world = len(xs)
    c = xs[0].shape[dim] // 2
    return torch.cat([xs[j].narrow(dim, 0, c) if j < world else xs[2 * world - 1 - j].narrow(dim, c, c)
                      for j in range(2 * world)], dim)


def plumbing_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool) -> torch.Tensor:
    """--device cpu only: torch's CP attention has no CPU kernel (no sharding strategy for the CPU
    flash op), so the CPU check runs everything else (ranks, the context and its in-place sharding,
    the timing loop, the slowest rank, the check, the CSV) around this all-gather CP attention in
    matmuls: K/V of every rank gathered (differentiably) into sequence order, this rank's queries
    masked by their head-tail positions. Its output is exact, so the same check as on CUDA holds."""
    import torch.distributed._functional_collectives as fc

    gather = getattr(fc, "all_gather_single_autograd", None) or fc.all_gather_tensor_autograd  # renamed in torch 2.13
    world, rank, n = dist.get_world_size(), dist.get_rank(), q.shape[2]
    k, v = (head_tail(list(gather(x.contiguous(), 0, dist.group.WORLD).chunk(world)))
            for x in (k, v))
    c = n // 2
    qpos = torch.cat([torch.arange(rank * c, (rank + 1) * c), torch.arange((2 * world - 1 - rank) * c, (2 * world - rank) * c)])
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if is_causal:
        s = s.masked_fill(torch.arange(k.shape[2])[None] > qpos[:, None], float("-inf"))
    return s.softmax(-1) @ v


def check(out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, atol: float) -> float:
    """The timed output, gathered from every rank into sequence order, against one device's SDPA on the
    whole sequence (outside the context, the same kernel): a run that attended only its own shard
    fails here. Returns the largest absolute error."""
    parts = [torch.empty_like(out) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, out.contiguous())
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    err = (head_tail(parts).float() - ref.float()).abs().max().item()
    if not err <= atol:
        raise AssertionError(f"torch_cp output differs from one device's SDPA on the whole sequence by {err:.3g} "
                             f"(tolerance {atol:g})")
    return err


def time_one(args: argparse.Namespace, seq_len: int, device: torch.device) -> tuple[list[float], float]:
    """Per-iteration seconds of causal fwd+bwd, slowest rank, under one open context; and the checked
    output's largest error against the whole sequence on one device."""
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
    expand = (lambda x: x) if kv == h else (lambda x: x.repeat_interleave(h // kv, dim=1))
    whole = [q.clone(), expand(k).clone(), expand(v).clone()]  # the reference's inputs: the context shards q, k, v in place
    mesh = init_device_mesh(device.type, (world,))
    set_rotate_method(args.rotate_method)
    cuda = device.type == "cuda"
    # a fresh sdpa_kernel context per `with` (a generator context cannot be entered twice); on CPU the
    # math kernel, so the CPU check goes through the same two entries
    def kernel() -> contextlib.AbstractContextManager:
        return sdpa_kernel(getattr(SDPBackend, KERNELS[args.backend] if cuda else "MATH"))

    def step() -> torch.Tensor:
        for x in (q, k, v):
            x.grad = None
        # F.scaled_dot_product_attention looked up here, at call time: the context swaps in torch's CP
        # attention while it is open (a reference taken before it opens would attend the local shard only).
        out = (F.scaled_dot_product_attention if cuda else plumbing_attention)(q, expand(k), expand(v), is_causal=True)
        out.backward(dout)
        return out.detach()

    times = []
    buffers = [q, k, v, dout]
    with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2] * 4, no_restore_buffers=set(buffers)), kernel():
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
                out = step()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                tic = time.perf_counter()
                out = step()
                times.append(time.perf_counter() - tic)
        assert q.shape[2] == seq_len // world and all(torch.isfinite(x.grad).all() for x in (q, k, v))
    with kernel():
        err = check(out, *whole, atol=args.atol if args.atol is not None else (2e-2 if dtype != torch.float32 else 1e-4))
    del whole
    t = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist(), err


def row(args: argparse.Namespace, seq_len: int, times: list[float], err: float) -> dict[str, object]:
    ms = [t * 1e3 for t in times]
    p25, p75 = quantile(ms, 0.25), quantile(ms, 0.75)
    return {"seq_len": seq_len, "world_size": dist.get_world_size(), "heads": args.heads, "kv_heads": args.kv_heads,
            "head_dim": args.head_dim, "batch": args.batch, "dtype": args.dtype, "backend": args.backend,
            "rotate_method": args.rotate_method, "warmup": args.warmup, "iters": args.iters,
            "max_abs_err": err, "median_ms": statistics.median(ms), "iqr_ms": p75 - p25, "p25_ms": p25, "p75_ms": p75,
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
    # No try/finally around the group (as the harness's ranks): a rank that fails leaves its group to
    # its own exit. On success every rank meets at a barrier before any destroys it: a rank that tore
    # its gloo pairs down while its peer was still in the last collective (or rank 0, the store's
    # host, exiting first) aborts the peer ("terminate called without an active exception").
    for seq_len in args.seq_lens:
        r = row(args, seq_len, *time_one(args, seq_len, device))
        rows.append(r)
        if rank == 0:
            print(f"torch_cp W={world} L={seq_len} {args.heads}x{args.head_dim} kv={args.kv_heads} "
                  f"{args.dtype} {args.backend}: median {r['median_ms']:.3f} ms, IQR {r['iqr_ms']:.3f} ms "
                  f"(min {r['min_ms']:.3f}, max {r['max_ms']:.3f}; {args.iters} iters after {args.warmup} "
                  f"warm-up; checked: max abs err {r['max_abs_err']:.2g})", flush=True)
        if cuda:
            torch.cuda.empty_cache()
    if rank == 0 and args.out:
        write_csv(args.out, rows)
        print(f"wrote {args.out}", flush=True)
    dist.barrier()
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
