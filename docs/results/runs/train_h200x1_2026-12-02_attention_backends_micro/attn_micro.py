"""The 1B train step's attention (batch 4, 32 query heads, 8 KV heads, seq 4096, head dim 64, causal,
bf16), forward + backward, through each SDPA backend and FlexAttention, in the engine's layout
(q, k, v as [B, H, S, D] views of [B, S, H, D] projections)."""
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

torch.manual_seed(0)
dev, bf = "cuda", torch.bfloat16
B, H, KV, S, D = 4, 32, 8, 4096, 64


def inputs():
    q = torch.randn(B, S, H, D, device=dev, dtype=bf).transpose(1, 2).requires_grad_()
    k = torch.randn(B, S, KV, D, device=dev, dtype=bf).transpose(1, 2).requires_grad_()
    v = torch.randn(B, S, KV, D, device=dev, dtype=bf).transpose(1, 2).requires_grad_()
    return q, k, v


q, k, v = inputs()
dout = torch.randn(B, H, S, D, device=dev, dtype=bf)


def sdpa(backend, expand=False):
    def fn():
        with sdpa_kernel([backend]):
            kk, vv = (k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)) if expand else (k, v)
            o = F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=not expand)
        o.backward(dout)
        return o
    return fn


fns = {
    "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
    "cudnn_expanded": sdpa(SDPBackend.CUDNN_ATTENTION, expand=True),
    "flash": sdpa(SDPBackend.FLASH_ATTENTION),
    "flash_expanded": sdpa(SDPBackend.FLASH_ATTENTION, expand=True),
}
try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, S, S, device=dev)
    flex = torch.compile(flex_attention, dynamic=False)

    def flex_fn():
        o = flex(q, k, v, block_mask=mask, enable_gqa=True)
        o.backward(dout)
        return o

    fns["flex"] = flex_fn
except Exception as e:  # noqa: BLE001
    print("flex unavailable:", repr(e))


def grads(fn):
    for t in (q, k, v):
        t.grad = None
    o = fn()
    return [o.detach().float(), q.grad.float(), k.grad.float(), v.grad.float()]


ref = None
ok = {}
for name, fn in list(fns.items()):
    try:
        g = grads(fn)
    except Exception as e:  # noqa: BLE001
        print(name, "failed:", repr(e)[:300])
        fns.pop(name)
        continue
    if ref is None:
        ref = g
    err = [((a - b).norm() / b.norm()).item() for a, b in zip(g, ref)]
    print(name, "relative error against cudnn (o, dq, dk, dv):", err)
    ok[name] = err


def t(fn, n):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(n):
        for x in (q, k, v):
            x.grad = None
        fn()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / n


res = {name: [] for name in fns}
names = list(fns)
for rnd in range(4):
    for name in (names if rnd % 2 == 0 else names[::-1]):
        res[name].append(t(fns[name], 30))
flops = 4 * B * H * S * S * D / 2 * 3.5  # causal forward (2 GEMMs) + backward (2.5x)
for name, v_ in res.items():
    print(name, "ms per forward+backward:", v_, "TFLOP/s at the median:", flops / sorted(v_)[len(v_) // 2] / 1e9)
json.dump({"times_ms": res, "errors": ok}, open(sys.argv[1], "w"), indent=1)
