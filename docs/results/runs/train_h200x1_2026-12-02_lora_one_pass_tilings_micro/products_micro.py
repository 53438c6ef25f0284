"""LoRA's two backward products over an output gradient g (s g B into a column block of the group's
[tokens, sum of ranks] matrix; B's gradient s g^T xa), at the 1B step's shapes (16384 tokens, rank 16,
out 2048 for q and o, 512 for k and v; xa and the product as column blocks of [16384, 48]):
cuBLAS' two GEMMs as the engine runs them against sweepbench/train/lora_kernel.py's one pass over g
at several tilings. Every variant checked against fp64 first. Device time per call from a CUDA graph
of 20 calls replayed 15 times (median, IQR, min, max of the replays / 20); g rotated over buffers
that together exceed L2 ("cold") and one buffer ("warm": what a 16 MiB g just written may find).

    python products_micro.py OUT.json"""
from __future__ import annotations

import itertools
import json
import statistics
import sys

import torch

from sweepbench.train.lora_kernel import g_products
from sweepbench.train.model import _mm_scaled

T, R, WIDTH, S = 16384, 16, 48, 2.0
dev = torch.device("cuda", 0)


def graph_time(fn, calls: int = 20, replays: int = 15) -> dict:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    q = statistics.quantiles(times, n=4)
    return {"median_us": statistics.median(times), "iqr_us": q[2] - q[0], "min_us": min(times), "max_us": max(times)}


def main() -> None:
    rows = []
    gen = torch.Generator(device=dev).manual_seed(0)
    for out in (2048, 512):
        nbuf = {2048: 3, 512: 8}[out]
        gs = [torch.randn(T, out, device=dev, generator=gen).bfloat16() for _ in range(nbuf)]
        b = (torch.randn(out, R, device=dev, generator=gen) * 0.05).bfloat16()
        xa_all = torch.randn(T, WIDTH, device=dev, generator=gen).bfloat16()
        xa = xa_all[:, 16:32]
        gxa_all = torch.zeros(T, WIDTH, device=dev, dtype=torch.bfloat16)
        ref_gxa = S * (gs[0].double() @ b.double())
        ref_gb = S * (gs[0].double().t() @ xa.double())

        def err(gb) -> float:
            e1 = ((gxa_all[:, 16:32].double() - ref_gxa).norm() / ref_gxa.norm()).item()
            e2 = ((gb.double() - ref_gb).norm() / ref_gb.norm()).item()
            return max(e1, e2)

        def cublas(g):
            _mm_scaled(g, b, S, out=gxa_all[:, 16:32])
            return _mm_scaled(g.t(), xa, S)

        variants = {"cublas": cublas}
        for bm, bn, w, st in itertools.product((64, 128, 256), (64, 128), (4, 8), (3, 4)):
            variants[f"kernel_{bm}x{bn}_w{w}_s{st}"] = (
                lambda g, bm=bm, bn=bn, w=w, st=st: g_products(g, b, xa, S, out=gxa_all[:, 16:32], block_rows=bm,
                                                               block_cols=bn, warps=w, stages=st))
        for name, fn in variants.items():
            gxa_all.zero_()
            try:
                e = err(fn(gs[0]))
                assert e < 1e-2, e
                it = itertools.cycle(gs)
                cold = graph_time(lambda: fn(next(it)))
                warm = graph_time(lambda: fn(gs[0]))
            except Exception as exc:  # noqa: BLE001 -- a tiling that does not compile is reported
                row = {"out": out, "variant": name, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            else:
                row = {"out": out, "variant": name, "rel_err": e, "cold": cold, "warm": warm}
            rows.append(row)
            print(json.dumps(row), flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    for out in (2048, 512):
        ok = [r for r in rows if r["out"] == out and "cold" in r]
        best = min(ok, key=lambda r: r["cold"]["median_us"])
        base = next(r for r in ok if r["variant"] == "cublas")
        print(f"out {out}: cublas cold {base['cold']['median_us']:.2f} warm {base['warm']['median_us']:.2f} us; "
              f"best {best['variant']} cold {best['cold']['median_us']:.2f} warm {best['warm']['median_us']:.2f} us")


if __name__ == "__main__":
    main()
