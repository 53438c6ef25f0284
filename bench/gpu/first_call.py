"""Where a new process's first attention call spends its seconds (issue 18 section 3): in a fresh
interpreter, time CUDA's start, cuDNN SDPA's first forward+backward at one shape, the same shape
again, a second new shape, and flash at the first shape; list the shared libraries that the first
call loaded. Then the same in a process forked from a parent that loaded those libraries (dlopen,
no CUDA context) before the fork, as a fork server could.
Measured on 2x H100 (docs/results/gpu_2026-11-26_eve/README.md): a fresh process's first cuDNN call
takes 2.5 s (4.9 s the first time on a machine, with the PTX JIT), the next new shape 0.1 s, and
the libraries loaded before the fork save nothing (2.6 s): the cost is per CUDA context, which no
fork can carry, so launch.keep_ranks keeps the processes instead.
    python bench/gpu/first_call.py --out first_call.json
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import multiprocessing
import os
import time

from sweepbench.record.atomic import write_atomic


def _maps() -> set[str]:
    with open("/proc/self/maps") as f:
        return {line.split()[-1] for line in f if ".so" in line}


def _probe(q, heads: int, dim: int, seqs: list[int]) -> None:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out: dict = {}
    before = _maps()
    t = time.perf_counter()
    torch.cuda.init()
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    out["cuda_init_s"] = time.perf_counter() - t
    after_init = _maps()

    def call(seq: int, backend) -> float:
        q_, k_, v_ = (torch.randn(1, heads, seq, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                      for _ in range(3))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with sdpa_kernel([backend]):
            o = F.scaled_dot_product_attention(q_, k_, v_, is_causal=True)
            o.backward(torch.ones_like(o))
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    a, b = seqs
    out[f"cudnn_first_{a}_s"] = call(a, SDPBackend.CUDNN_ATTENTION)
    out["libs_loaded_by_first_call"] = sorted(_maps() - after_init)
    out[f"cudnn_again_{a}_s"] = call(a, SDPBackend.CUDNN_ATTENTION)
    out[f"cudnn_first_{b}_s"] = call(b, SDPBackend.CUDNN_ATTENTION)
    out[f"flash_first_{a}_s"] = call(a, SDPBackend.FLASH_ATTENTION)
    out[f"flash_first_{b}_s"] = call(b, SDPBackend.FLASH_ATTENTION)
    out["libs_loaded_by_cuda_init"] = sorted(after_init - before)
    q.put(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--seqs", type=int, nargs=2, default=[8192, 16384])
    p.add_argument("--out", default="first_call.json")
    args = p.parse_args()
    import torch  # noqa: F401  (the parent's imports, as in the fork server)

    result: dict = {}
    for mode in ("fresh", "fresh_again", "forked_after_dlopen"):
        if mode == "forked_after_dlopen":
            # every cuDNN/NVRTC library in the folders of those the first call loaded, not mapped here yet
            mapped = _maps()
            libs = sorted({p for lib in result["fresh"]["libs_loaded_by_first_call"] if "cudnn" in lib or "nvrtc" in lib
                           for p in glob.glob(os.path.join(os.path.dirname(lib), "lib*.so*"))
                           if ("cudnn" in p or "nvrtc" in p) and p not in mapped})
            t = time.perf_counter()
            for lib in libs:
                try:
                    ctypes.CDLL(lib)
                except OSError:
                    continue
            result["dlopen_s"] = time.perf_counter() - t
            result["dlopened"] = libs
            ctx = multiprocessing.get_context("fork")
        else:
            ctx = multiprocessing.get_context("spawn")
        q = ctx.Queue()
        t = time.perf_counter()
        proc = ctx.Process(target=_probe, args=(q, args.heads, args.dim, args.seqs))
        proc.start()
        try:
            result[mode] = q.get(timeout=300)
        except Exception as e:  # noqa: BLE001
            result[mode] = {"error": repr(e)}
        proc.join()
        result[mode]["process_wall_s"] = time.perf_counter() - t
        result[mode]["exitcode"] = proc.exitcode
        print(mode, json.dumps({k: v for k, v in result[mode].items() if not k.startswith("libs")}), flush=True)
    print("dlopen_s", result.get("dlopen_s"), "libs", [os.path.basename(l) for l in result.get("dlopened", [])])
    write_atomic(args.out, json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
