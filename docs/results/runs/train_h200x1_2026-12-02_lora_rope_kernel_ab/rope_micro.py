"""One attention's q/k/v LoRA projections and their rotary embedding, forward and backward, at the
1B step's shapes (4 x 4096 tokens, hidden 2048, 32 heads and 8 k/v heads of 64, rank 16 on q, k and
v, bf16, frozen bases): the engine's fused path before (``model.lora_group``, then liger's RoPE
through ``fused.LigerRope``) against ``lora_rope_kernel.LoRARopeQKV`` (the low-rank updates of q and
k inside the rotation's kernels), at 64, 128 and 32 tokens per program. Every variant checked
against the textbook formula in fp32 first (outputs and the gradients of x, each A and each B);
only those within 2e-2 relative error are timed.
Device time of one forward + backward: 20 back to back between two CUDA events, after 5, in five
interleaved rounds (each round: every variant once).

    python rope_micro.py OUT.json"""
from __future__ import annotations

import json
import statistics
import sys

import torch

import sweepbench.train.lora_rope_kernel as lrk
from sweepbench.train.fused import LigerRope, to_rotate_half
from sweepbench.train.model import LoRALinear, lora_group, rope_tables

B, S, D, HD, H, KV, R = 4, 4096, 2048, 64, 32, 8, 16
dev = torch.device("cuda", 0)


def rotate(t, cos, sin):
    h1, h2 = t.chunk(2, dim=-1)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat((h1 * c - h2 * s, h2 * c + h1 * s), dim=-1)


def main() -> None:
    g = torch.Generator(device=dev).manual_seed(0)
    layers = [LoRALinear(D, o, rank=R, alpha=32.0).to(dev) for o in (H * HD, KV * HD, KV * HD)]
    with torch.no_grad():
        for m in layers:
            m.weight.normal_(0, D**-0.5, generator=g)
            m.lora_a.normal_(0, D**-0.5, generator=g)
            m.lora_b.normal_(0, 0.05, generator=g)
        for m in layers[:2]:  # as fused.apply leaves them
            m.weight.copy_(to_rotate_half(m.weight, HD))
            m.lora_b.copy_(to_rotate_half(m.lora_b, HD))
    for m in layers:
        m.bfloat16()
    cos, sin = rope_tables(HD, torch.arange(S, device=dev))
    x = torch.randn(B, S, D, device=dev, generator=g).bfloat16().requires_grad_()
    grads = [torch.randn(B, S, o // HD, HD, device=dev, generator=g).bfloat16() for o in (H * HD, KV * HD, KV * HD)]
    params = [p for m in layers for p in (m.lora_a, m.lora_b)]
    liger = LigerRope()

    def before():
        q, k, v = (t.view(B, S, -1, HD) for t in lora_group(x, layers))
        q, k = liger(q, k, cos, sin)
        return q, k, v

    def after():
        ps = [t for m in layers for t in (m.weight, m.lora_a, m.lora_b)]
        return lrk.LoRARopeQKV.apply(x, tuple(m.scale for m in layers), cos, sin, HD, *ps)

    def step(fn):
        for t in (x, *params):
            t.grad = None
        outs = fn()
        torch.autograd.backward(outs, grads)
        return outs

    def textbook():
        xf = x.detach().float().requires_grad_()
        ps = [p.detach().float().requires_grad_() for p in params]
        ys = [(xf @ m.weight.float().t() + m.scale * (xf @ a.t()) @ b.t()).view(B, S, -1, HD)
              for m, a, b in zip(layers, ps[::2], ps[1::2])]
        outs = [rotate(ys[0], cos, sin), rotate(ys[1], cos, sin), ys[2]]
        torch.autograd.backward(outs, [t.float() for t in grads])
        return outs, [xf.grad] + [p.grad for p in ps]

    ref_outs, ref_grads = textbook()
    variants = {"kernel_rows64": (after, 64), "kernel_rows128": (after, 128), "before": (before, None),
                "kernel_rows32": (after, 32)}
    rows = {}
    for name, (fn, bm) in variants.items():
        if bm:
            lrk.ROWS = bm
        outs = step(fn)
        got = [o.detach() for o in outs] + [x.grad] + [p.grad for p in params]
        errs = [((a.float() - r).norm() / r.norm()).item() for a, r in zip(got, [*ref_outs, *ref_grads])]
        rows[name] = {"variant": name, "max_rel_err": max(errs), "rel_errs": errs, "ms": []}
        print(name, "max rel err", max(errs), errs, flush=True)
    timed = {n: v for n, v in variants.items() if rows[n]["max_rel_err"] < 2e-2}  # only what checked out
    for name in set(variants) - set(timed):
        del rows[name]["ms"]
    for _ in range(5):
        for name, (fn, bm) in timed.items():
            if bm:
                lrk.ROWS = bm
            for _ in range(5):
                step(fn)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(20):
                step(fn)
            b.record()
            b.synchronize()
            rows[name]["ms"].append(a.elapsed_time(b) / 20)
    for r in rows.values():
        if "ms" not in r:
            continue
        r["median_ms"] = statistics.median(r["ms"])
        print(r["variant"], "ms per fwd+bwd, rounds:", r["ms"], "median", r["median_ms"], flush=True)
    with open(sys.argv[1], "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": list(rows.values())}, f, indent=1)


if __name__ == "__main__":
    main()
