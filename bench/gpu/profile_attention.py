"""Profile and time fwd+bwd of context-parallel attention impls at given sequence lengths, in one launch.

    torchrun --nproc-per-node 2 bench/gpu/profile_attention.py --seq-len 16384,32768 \
        --impls ring,ulysses,torch_cp --kv-heads 32,8 --out DIR
    # on a CPU (gloo, tiny): --device cpu --seq-len 256 --heads 4 --head-dim 16 --dtype float32
    # the seed's dilated grid (model small): --pattern dilated --segment-lengths 2048,4096,8192 \
    #     --dilation-rates 1,2,4 --impls ring --heads 12 --kv-heads 12 --head-dim 64 --batch 2

For each sequence length x kv-heads x impl (one launch: start-up paid once): rank 0 checks the
gathered output against the single-device result (forward only); fwd+bwd is timed (median of
--iters after --warmup, slowest rank) with real communication and, where the impl communicates
through sweepbench's Comm, with it replaced by local copies (exposed comm = the difference); at
the first sequence length, --profile-iters steps are recorded with torch.profiler, one Chrome
trace per rank: DIR/<impl>_<seq>_kv<kv>.rank<r>.pt.trace.json.gz. Rank 0 prints a table (T1 = one
device, same SDPA backend; efficiency = T1 / (W * T_W)) and writes DIR/summary.txt with
bench/gpu/trace_top.py's summary of each rank-0 trace. The verified numbers for results pages come
from the benchmark (bench/gpu/attention_2gpu.yaml); this is the quick look."""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
from pathlib import Path

GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
for _k, _v in GPU_ENV.items():
    os.environ.setdefault(_k, _v)  # NVLink multicast stays off on lent machines

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from sweepbench.attention import cp_attention, cp_context, default_sdpa_backend  # noqa: E402
from sweepbench.attention.comm import Comm, LocalComm  # noqa: E402
from sweepbench.attention.dilated import branches_of  # noqa: E402
from sweepbench.attention.placement import shard_sequence, unshard_sequence  # noqa: E402
from sweepbench.attention.registry import get_impl, why_not  # noqa: E402
from sweepbench.attention.scaling import Shape, make_inputs, mismatch, single_device  # noqa: E402
from sweepbench.measure import summarize, time_iterations  # noqa: E402
from sweepbench.record.atomic import write_atomic  # noqa: E402

HERE = Path(__file__).resolve().parent


def _step(fn, leaves, dout):
    def run():
        for x in leaves:
            x.grad = None
        out = fn()
        out.backward(dout)
        return out
    return run


def _median_ms(step, args, device) -> float:
    times = time_iterations(step, warmup=args.warmup, iters=args.iters, device=device)
    return summarize(times)["median_s"] * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-len", required=True, help="tokens of the whole sequence, comma-separated (traced: the first)")
    p.add_argument("--impls", default="ring,ulysses,torch_cp")
    p.add_argument("--kv-heads", default="32,8", help="comma-separated: one run per value (32 = MHA)")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--sdpa-backend", default="", help="default: the fastest registered for the device")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--profile-iters", type=int, default=2, help="profiled steps (0: no traces)")
    p.add_argument("--pattern", default="dense", choices=["dense", "dilated"])
    p.add_argument("--segment-lengths", default="", help="dilated: comma-separated, one per branch")
    p.add_argument("--dilation-rates", default="", help="dilated: comma-separated, one per branch")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    segments = [int(x) for x in args.segment_lengths.split(",") if x]
    rates = [int(x) for x in args.dilation_rates.split(",") if x]
    if args.pattern == "dilated" and (not segments or len(segments) != len(rates)):
        p.error(f"--pattern dilated needs as many --segment-lengths as --dilation-rates, not {segments} and {rates}")
    branches = branches_of(segments, rates)

    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, w = dist.get_rank(), dist.get_world_size()
    device = torch.device(args.device, int(os.environ.get("LOCAL_RANK", 0)) if args.device == "cuda" else None)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dtype = getattr(torch, args.dtype)
    backend = args.sdpa_backend or default_sdpa_backend(device, dtype)
    impls = args.impls.split(",")
    for impl in impls:
        if reason := why_not(impl, device_type=device.type, world_size=w, num_heads=args.heads, pattern=args.pattern,
                             causal=True):
            p.error(reason)
    args.out.mkdir(parents=True, exist_ok=True)
    rows, traces = [], []
    cases = [(int(n), int(kv)) for n in args.seq_len.split(",") for kv in args.kv_heads.split(",")]
    if bad := [kv for _, kv in cases if kv < 1 or args.heads % kv]:
        p.error(f"--kv-heads {bad[0]} does not divide --heads {args.heads}; use a divisor of {args.heads}")
    for seq_len, kv in cases:
        shape = Shape(args.batch, args.heads, kv, seq_len, args.head_dim)
        inputs = make_inputs(shape, dtype=dtype, device=device, seed=0)
        scale = 1.0 / math.sqrt(args.head_dim)
        full = [x.detach().clone().requires_grad_() for x in inputs[:3]]
        t1_step = _step(lambda: single_device(*full, backend=backend, causal=True, pattern=args.pattern,
                                                    branches=branches),
                        full, inputs[3])
        t1 = _median_ms(t1_step if rank == 0 else (lambda: None), args, device)
        want = t1_step().detach() if rank == 0 else None
        del full
        dilated = dict(pattern=args.pattern, segment_lengths=segments, dilation_rates=rates)
        for impl in impls:
            spec = get_impl(impl)
            mine = [shard_sequence(x, dim=2, rank=rank, world_size=w, placement=spec.placement_for(args.pattern))
                    for x in inputs]
            leaves = [x.detach().clone().requires_grad_() for x in mine[:3]]
            comm = Comm()

            def attend(c: Comm, impl=impl, leaves=leaves, seq_len=seq_len):
                with cp_context(impl, comm=comm, seq_len=seq_len, device=device):
                    return cp_attention(*leaves, impl=impl, causal=True, scale=scale, sdpa_backend=backend, comm=c,
                                        **dilated)

            def fwd_bwd(c: Comm, impl=impl, leaves=leaves, dout=mine[3], seq_len=seq_len):
                with cp_context(impl, comm=comm, seq_len=seq_len, device=device):
                    return _step(lambda: cp_attention(*leaves, impl=impl, causal=True, scale=scale,
                                                      sdpa_backend=backend, comm=c, **dilated), leaves, dout)()

            out = attend(comm).detach()
            got = unshard_sequence(list(comm.all_gather(out)), dim=2, world_size=w,
                                   placement=spec.placement_for(args.pattern))
            bad = mismatch("out", got, want) if rank == 0 else None
            if bad:
                print(f"{impl} kv={kv}: {bad}", flush=True)
            total = _median_ms(lambda: fwd_bwd(comm), args, device)
            no_comm = _median_ms(lambda: fwd_bwd(LocalComm()), args, device) if spec.own_comm else float("nan")
            trace = args.out / f"{impl}_{seq_len}_kv{kv}.rank{rank}.pt.trace.json.gz"
            if args.profile_iters and seq_len == cases[0][0]:
                acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
                with profile(activities=acts) as prof:
                    for _ in range(args.profile_iters):
                        fwd_bwd(comm)
                        prof.step()
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                prof.export_chrome_trace(str(trace))
                traces.append(trace)
            rows.append((impl, seq_len, kv, t1, total, t1 / (w * total), (total - no_comm) / total,
                         "FAIL" if bad else "ok"))
            del leaves, mine, out, got
        del inputs, want
        if device.type == "cuda":
            torch.cuda.empty_cache()
    dist.barrier()
    if rank == 0:
        lines = [f"W={w} heads={args.heads}x{args.head_dim} batch={args.batch} {args.dtype} causal fwd+bwd, "
                 f"{args.pattern}{f' {segments} x {rates}' if segments else ''}, "
                 f"sdpa={backend}, T1 = one device, median of {args.iters}",
                 f"{'impl':<10} {'seq':>7} {'kv':>3} {'T1 ms':>9} {'ms':>9} {'eff':>6} {'exposed':>8} check"]
        lines += [f"{i:<10} {n:>7} {kv:>3} {t1:9.2f} {ms:9.2f} {eff:6.3f} {exp:8.1%} {ok}"
                  for i, n, kv, t1, ms, eff, exp, ok in rows]
        for trace in traces:
            if trace.name.endswith(".rank0.pt.trace.json.gz"):
                top = subprocess.run([sys.executable, str(HERE / "trace_top.py"), str(trace), "--top", "12"],
                                     capture_output=True, text=True, check=True).stdout
                lines += [f"== {trace.name}", top]
        text = "\n".join(lines)
        write_atomic(args.out / "summary.txt", text + "\n")
        print(text, flush=True)
    dist.destroy_process_group()
    return 1 if any(r[-1] != "ok" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
