"""Check every registered SDPA backend's forward (out, LSE) and backward (dq, dk, dv), called the way the
attention engine calls them (contiguous (B, H, L, D) tensors, the merged output and LSE handed back to the
backward), against a float32 reference computed by plain matmul and softmax on the same device.

    python bench/gpu/check_sdpa_backends.py --out DIR        # on a GPU: cudnn, flash, efficient
    python bench/gpu/check_sdpa_backends.py --out DIR --cpu  # the CPU backend, tiny shapes

Writes DIR/sdpa_backends.csv (backend, shape, causal, relative errors) and exits 1 if any backend misses
the bf16 bound (relative Frobenius error 2e-2) or raises. The shapes include (16, 12, 2048, 64), the
branch shape at which the seed's dilated grid hit an illegal memory access at 16K (efficient backward)."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import torch

from sweepbench.attention.ops import SDPA_BACKENDS, backends_for

SHAPES = [(2, 4, 256, 64), (16, 12, 2048, 64), (1, 32, 4096, 128), (4, 12, 2048, 64)]
CPU_SHAPES = [(2, 4, 64, 16), (1, 2, 128, 32)]
BOUND = 2e-2


def reference(q, k, v, dout, causal: bool, scale: float):
    q, k, v = (x.float().detach().requires_grad_() for x in (q, k, v))
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    out = torch.softmax(s, dim=-1) @ v
    out.backward(dout.float())
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()
    device = torch.device("cpu" if args.cpu else "cuda")
    dtype = torch.float32 if args.cpu else torch.bfloat16
    rows, bad = [], 0
    for shape in CPU_SHAPES if args.cpu else SHAPES:
        for causal in (True, False):
            g = torch.Generator(device=device).manual_seed(0)
            q, k, v, dout = (torch.randn(shape, generator=g, device=device, dtype=dtype) for _ in range(4))
            scale = shape[-1] ** -0.5
            want = reference(q, k, v, dout, causal, scale)
            for name in backends_for(device.type, dtype):
                be = SDPA_BACKENDS[name]
                try:
                    out, lse, aux = be.forward(q, k, v, causal, scale)
                    grads = be.backward(dout, q, k, v, out, lse, aux, causal, scale)
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    errs = [rel(a, b) for a, b in zip((out, lse, *grads), want)]
                    note = ""
                except Exception as err:  # noqa: BLE001 - recorded, and it fails the check
                    errs, note = [float("nan")] * 5, str(err).splitlines()[0][:160]
                ok = all(e <= BOUND for e in errs)
                bad += not ok
                rows.append({"backend": name, "shape": "x".join(map(str, shape)), "causal": causal,
                             **dict(zip(("out", "lse", "dq", "dk", "dv"), errs)), "ok": ok, "error": note})
                print(f"{name:10s} {rows[-1]['shape']:16s} causal={causal!s:5s} "
                      + " ".join(f"{k} {rows[-1][k]:.1e}" for k in ("out", "lse", "dq", "dk", "dv"))
                      + ("" if ok else f"  FAIL {note}"), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "sdpa_backends.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"{len(rows) - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
