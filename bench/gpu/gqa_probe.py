"""Do the CUDA SDPA backends take GQA K/V (fewer heads than the queries) as they are, forward and
backward? Exact against the expanded heads? Faster? (issue 20; the evidence for ``SdpaBackend.gqa``)

    python bench/gpu/gqa_probe.py            # on one GPU, from the checkout; prints one line per case

Per backend (cuDNN, flash, efficient) and case (4K causal, 8K non-causal, 8K causal; 32 query
heads, 8 kv heads of 128, bf16): the backend's forward+backward with K/V expanded to 32 heads (dK, dV
summed back over each group) against the same with K/V of 8 heads; the largest absolute difference
of out, LSE, dQ, dK, dV, and the median of 20 CUDA-event timings of each. A backend that refuses
8-head K/V says so."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from sweepbench.attention.ops import expand_kv, get_backend  # noqa: E402

HEADS, KV_HEADS, DIM = 32, 8, 128


def median_ms(fn, n: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(n):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[n // 2]


def main() -> None:
    torch.manual_seed(0)
    group = HEADS // KV_HEADS
    for name in ("cudnn", "flash", "efficient"):
        be = get_backend(name)
        for seq, causal in ((4096, True), (8192, False), (8192, True)):
            q, dout = (torch.randn(1, HEADS, seq, DIM, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            k, v = (torch.randn(1, KV_HEADS, seq, DIM, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            scale = DIM ** -0.5

            def expanded():
                ke, ve = expand_kv(k, HEADS).contiguous(), expand_kv(v, HEADS).contiguous()
                o, lse, aux = be.forward(q, ke, ve, causal, scale)
                dq, dk, dv = be.backward(dout, q, ke, ve, o, lse, aux, causal, scale)[:3]
                return o, lse, dq, dk.unflatten(1, (KV_HEADS, group)).sum(2), dv.unflatten(1, (KV_HEADS, group)).sum(2)

            def native():
                o, lse, aux = be.forward(q, k, v, causal, scale)
                return (o, lse, *be.backward(dout, q, k, v, o, lse, aux, causal, scale)[:3])

            want = expanded()
            try:
                got = native()
                torch.cuda.synchronize()
                err = [round(float((x.float() - y.float()).abs().max()), 6) for x, y in zip(want, got)]
                t_native = f"{median_ms(native):.3f} ms"
            except RuntimeError as exc:
                err, t_native = f"native refused: {str(exc).splitlines()[0][:120]}", "-"
            print(f"{name} L={seq} causal={causal}: expanded {median_ms(expanded):.3f} ms, native {t_native}, "
                  f"max abs diff out/lse/dq/dk/dv {err}", flush=True)


if __name__ == "__main__":
    main()
